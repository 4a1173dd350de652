"""DeepSpeed (ZeRO-3 by default) causal-LM policy: logprobs, one optimizer step, save / load.

The DeepSpeed plumbing (config, AdamW, LR schedule, gradient-accumulation contract, checkpoints,
gathered parameters) lives in :class:`DeepSpeedModelEngine`, shared with the critic.

Gradient contract of :meth:`DeepSpeedModelEngine.train_step`: the ``loss_fn`` already normalises
by GLOBAL counts (over all micro-batches on all ranks), so the gradient we apply must be
d(sum of loss_fn values over all micro-batches on all ranks)/dθ. DeepSpeed 0.19.8 instead
(a) divides by gradient_accumulation_steps -- we use gas=1 in the DeepSpeed config, mark the
accumulation boundary ourselves (``set_gradient_accumulation_boundary``) and call
``engine.backward(loss, scale_wrt_gas=False)`` (engine.backward also registers the graph so the
per-tensor GAS hook of ``register_output_backward_hooks`` does not rescale), and
(b) averages gradients over the data-parallel ranks in the ZeRO reduce-scatter -- we multiply
the loss by ``world_size`` before backward. Tested against 1 rank in
tests/engines/test_distributed.py.
"""
from __future__ import annotations

import math
import os
import shutil
from contextlib import nullcontext
from typing import Any, Callable, Iterator

import torch

from vcppo.engines.batch import micro_batches
from vcppo.engines.dist import DistInfo

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                   "merges.txt", "chat_template.jinja", "generation_config.json", "added_tokens.json")


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]


def lr_lambda_factory(warmup_steps: int, total_steps: int, schedule: str, min_lr_ratio: float) -> Callable:
    """Multiplier of the peak lr after ``s`` optimizer steps (LambdaLR semantics).

    Linear warm-up reaching the peak on step ``warmup_steps`` ((s+1)/warmup: the first step
    is not wasted at lr 0), then constant / cosine / linear decay to ``min_lr_ratio`` at
    ``total_steps``.
    """
    def f(s: int) -> float:
        if warmup_steps > 0 and s < warmup_steps:
            return (s + 1) / warmup_steps
        if schedule == "constant":
            return 1.0
        span = max(1, total_steps - warmup_steps)
        p = min(1.0, max(0.0, (s - warmup_steps) / span))
        if schedule == "cosine":
            return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * p))
        if schedule == "linear":
            return 1.0 - (1 - min_lr_ratio) * p
        raise ValueError(f"unknown lr_schedule {schedule!r}")
    return f


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    try:  # the algos module owns the canonical one
        from vcppo.algos.losses import entropy_from_logits as f
        return f(logits)
    except ImportError:
        logp = torch.log_softmax(logits.float(), dim=-1)
        return -(logp.exp() * logp).sum(-1)


def response_logprobs(logits: torch.Tensor, responses: torch.Tensor, temperature: float = 1.0):
    """logits (b, R, V) aligned with responses (b, R) -> logprobs (b, R) float32."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1)
    return logp.gather(-1, responses.unsqueeze(-1)).squeeze(-1), logits


def _strip_prefixes(name: str) -> str:
    for pre in ("module.", "_orig_mod."):
        while name.startswith(pre):
            name = name[len(pre):]
    return name


class DeepSpeedModelEngine:
    """A module wrapped by ``deepspeed.initialize`` with AdamW + LambdaLR; shared by actor and critic.

    Subclasses build the module (:meth:`_build_module`) and compute ``outputs`` for a micro-batch
    (:meth:`_forward_outputs`).
    """

    def __init__(self, cfg, dist: DistInfo, total_optimizer_steps: int, dtype: str = "auto",
                 train: bool = True):
        import deepspeed

        self.cfg = cfg
        self.dist = dist
        self.train_mode = train
        self.dtype = resolve_dtype(dtype, dist.device)
        self.total_optimizer_steps = int(total_optimizer_steps)
        stage = int(getattr(cfg, "zero_stage", 3)) if cfg is not None else 3
        self.zero_stage = stage
        self.ds_config = self._ds_config(cfg, train)
        self._hf_ds_config = None
        if stage == 3:
            # While this object is alive, transformers' from_pretrained builds the model under
            # deepspeed.zero.Init (partitioned at load, never fully materialised per rank).
            # Needs `accelerate`; without it the full model is loaded per rank and partitioned by
            # deepspeed.initialize (fine for small models, memory-hungry for big ones).
            try:
                from transformers.integrations import HfDeepSpeedConfig
                self._hf_ds_config = HfDeepSpeedConfig(self.ds_config)
            except Exception:  # noqa: BLE001 - PackageNotFoundError (accelerate) or version check
                self._hf_ds_config = None
        module = self._build_module()
        if self._hf_ds_config is not None:
            # Only construction needs it. Left registered (a process-wide weak reference in
            # transformers), it makes every later from_pretrained / from_config in the process
            # build partitioned, empty-tensor models -- exports, evaluation, other tests.
            from transformers.integrations.deepspeed import unset_hf_deepspeed_config
            unset_hf_deepspeed_config()
            self._hf_ds_config = None
        if train and getattr(cfg, "gradient_checkpointing", False):
            self._enable_gradient_checkpointing(module)
        if train:
            params = [p for p in module.parameters() if p.requires_grad]
            sched = lr_lambda_factory(cfg.warmup_steps, self.total_optimizer_steps, cfg.lr_schedule,
                                      cfg.min_lr_ratio)
            self.engine, self.optimizer, _, self.lr_scheduler = deepspeed.initialize(
                model=module, model_parameters=params, config=self.ds_config,
                lr_scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, sched))
        else:
            # Frozen (reference policy, value pretraining's frozen actor): ZeRO-3 without optimizer.
            module.requires_grad_(False)
            self.engine = deepspeed.initialize(model=module, config=self.ds_config)[0]
            self.optimizer = self.lr_scheduler = None
        self.module = self.engine.module

    # --- construction ----------------------------------------------------------------------
    def _ds_config(self, cfg, train: bool) -> dict:
        world = self.dist.world_size
        mbs = int(getattr(cfg, "micro_batch_size", 1)) if cfg is not None else 1
        zero: dict[str, Any] = {"stage": self.zero_stage}
        if self.zero_stage == 3:
            zero.update({"stage3_gather_16bit_weights_on_model_save": False,
                         "stage3_param_persistence_threshold": 1e4 if self.dist.device.type == "cuda" else 0,
                         "overlap_comm": self.dist.device.type == "cuda"})
        if cfg is not None and getattr(cfg, "offload_optimizer", False):
            zero["offload_optimizer"] = {"device": "cpu", "pin_memory": self.dist.device.type == "cuda"}
        if cfg is not None and getattr(cfg, "offload_params", False) and self.zero_stage == 3:
            zero["offload_param"] = {"device": "cpu", "pin_memory": self.dist.device.type == "cuda"}
        c: dict[str, Any] = {
            "train_micro_batch_size_per_gpu": mbs,
            "gradient_accumulation_steps": 1,  # we mark accumulation boundaries ourselves
            "train_batch_size": mbs * world,
            "zero_optimization": zero,
            "bf16": {"enabled": self.dtype == torch.bfloat16},
            "fp16": {"enabled": self.dtype == torch.float16},
            "steps_per_print": 10 ** 12,
            "wall_clock_breakdown": False,
            "zero_allow_untested_optimizer": True,
        }
        if train:
            c["gradient_clipping"] = float(cfg.grad_clip) if cfg.grad_clip > 0 else 0.0
            c["optimizer"] = {"type": "AdamW", "params": {
                "lr": float(cfg.lr), "betas": [float(b) for b in cfg.betas], "eps": 1e-8,
                "weight_decay": float(cfg.weight_decay),
                # torch's AdamW (no JIT-built fused kernel); ZeRO-Offload needs DeepSpeedCPUAdam.
                "torch_adam": not getattr(cfg, "offload_optimizer", False)}}
        return c

    def _build_module(self) -> torch.nn.Module:
        raise NotImplementedError

    @staticmethod
    def _enable_gradient_checkpointing(module):
        target = module.backbone if hasattr(module, "backbone") else module
        target.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if hasattr(target, "config"):
            target.config.use_cache = False

    def _forward_outputs(self, micro: dict, with_grad_extras: bool, need_entropy: bool) -> dict:
        raise NotImplementedError

    # --- training --------------------------------------------------------------------------
    def train_step(self, minibatch: dict, loss_fn, micro_batch_size: int) -> dict:
        """ONE optimizer step over this rank's share of a mini-batch (see module docstring)."""
        if self.optimizer is None:
            raise RuntimeError("engine built with train=False")
        self.engine.train()
        micros = micro_batches(minibatch, micro_batch_size)
        need_entropy = bool(getattr(loss_fn, "needs_entropy", False))
        world = self.dist.world_size
        # Every rank must run the same number of backward passes (ZeRO-3 collectives in backward).
        n_local = len(micros)
        n_max = n_local
        if world > 1:
            t = torch.tensor([n_local], dtype=torch.long, device=self.dist.device)
            torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
            n_max = int(t.item())
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}
        for i in range(n_max):
            dummy = i >= n_local  # this rank ran out: a zero-weight pass keeps collectives in step
            micro = micros[min(i, n_local - 1)]
            self.engine.set_gradient_accumulation_boundary(i == n_max - 1)
            outputs = self._forward_outputs(micro, True, need_entropy)
            loss, metrics = loss_fn(outputs, micro)
            if dummy:
                loss = loss * 0.0
            self.engine.backward(loss * world, scale_wrt_gas=False)
            if not dummy:
                for k, v in (metrics or {}).items():
                    v = float(v.detach().float().mean()) if isinstance(v, torch.Tensor) else float(v)
                    sums[k] = sums.get(k, 0.0) + v
                    counts[k] = counts.get(k, 0) + 1
        lr = self.get_lr()  # lr used by this step
        manual_gn = None
        if self.zero_stage == 0:  # DeepSpeed reports no global grad norm without ZeRO
            grads = [p.grad.detach().float() for p in self.module.parameters() if p.grad is not None]
            manual_gn = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))
        self.engine.step()
        # Metrics: mean over this rank's micro-batches, then mean over ranks (same keys everywhere).
        keys = sorted(sums)
        out = {k: sums[k] / counts[k] for k in keys}
        if world > 1 and keys:
            t = torch.tensor([out[k] for k in keys], dtype=torch.float64, device=self.dist.device)
            torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.SUM)
            out = {k: float(v) / world for k, v in zip(keys, t.tolist())}
        gn = manual_gn if manual_gn is not None else self.engine.get_global_grad_norm()
        out["grad_norm"] = float(gn) if gn is not None else float("nan")
        out["lr"] = lr
        return out

    def get_lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"]) if self.optimizer is not None else 0.0

    @property
    def global_steps(self) -> int:
        return int(self.engine.global_steps)

    # --- parameters ------------------------------------------------------------------------
    def _gather_ctx(self, params):
        if self.zero_stage == 3:
            import deepspeed
            return deepspeed.zero.GatheredParameters(params, modifier_rank=None)
        return nullcontext()

    def named_parameters_gathered(self, bucket_bytes: int = 256 * 2 ** 20,
                                  to_cpu: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
        """Full (un-partitioned) parameters with HF names, gathered a bucket at a time.

        Yields clones (safe to keep after the bucket is re-partitioned). ``to_cpu`` moves them.
        """
        named = list(self.module.named_parameters())
        i = 0
        while i < len(named):
            bucket, size = [], 0
            while i < len(named) and (not bucket or size < bucket_bytes):
                n, p = named[i]
                numel = p.ds_numel if hasattr(p, "ds_numel") else p.numel()
                size += numel * p.element_size()
                bucket.append((n, p))
                i += 1
            with self._gather_ctx([p for _, p in bucket]):
                out = [(self._hf_name(n), (p.data.detach().to("cpu") if to_cpu else p.data.detach()).clone())
                       for n, p in bucket]
            yield from out

    def _hf_name(self, name: str) -> str:
        return _strip_prefixes(name)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        return dict(self.named_parameters_gathered(to_cpu=True))

    # --- checkpoints -----------------------------------------------------------------------
    def save_checkpoint(self, directory: str) -> None:
        """DeepSpeed checkpoint (partitioned weights + optimizer + LR scheduler), all ranks call."""
        os.makedirs(directory, exist_ok=True)
        self.engine.save_checkpoint(directory, tag="ds", save_latest=True)

    def load_checkpoint(self, directory: str) -> None:
        path, _ = self.engine.load_checkpoint(directory, tag="ds", load_optimizer_states=self.optimizer is not None,
                                              load_lr_scheduler_states=self.optimizer is not None)
        if path is None:
            raise FileNotFoundError(f"no DeepSpeed checkpoint in {directory}")

    def close(self) -> None:
        self.engine = self.module = self.optimizer = self.lr_scheduler = None
        self._hf_ds_config = None


class ActorEngine(DeepSpeedModelEngine):
    """The policy: ``AutoModelForCausalLM`` under DeepSpeed."""

    def __init__(self, model_path: str, cfg, dist: DistInfo, total_optimizer_steps: int,
                 dtype: str = "auto", train: bool = True):
        self.model_path = model_path
        super().__init__(cfg, dist, total_optimizer_steps, dtype=dtype, train=train)

    def _build_module(self):
        from transformers import AutoModelForCausalLM
        m = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=self.dtype)
        m.config.use_cache = False
        return m

    def _logits(self, micro: dict) -> torch.Tensor:
        """Logits predicting each response token: (b, R, V)."""
        dev = self.dist.device
        R = micro["responses"].shape[1]
        out = self.engine(input_ids=micro["input_ids"].to(dev), attention_mask=micro["attention_mask"].to(dev),
                          position_ids=micro["position_ids"].to(dev), use_cache=False, logits_to_keep=R + 1)
        return out.logits[:, :-1]

    def _forward_outputs(self, micro: dict, with_grad_extras: bool, need_entropy: bool,
                         temperature: float = 1.0) -> dict:
        logits = self._logits(micro)
        responses = micro["responses"].to(logits.device)
        logp, scaled = response_logprobs(logits, responses, temperature)
        mask = micro["response_mask"].to(logp.device)
        out = {"logprobs": logp * mask}
        if need_entropy:
            out["entropy"] = entropy_from_logits(scaled) * mask
        return out

    @torch.no_grad()
    def forward_logprobs(self, batch: dict, micro_batch_size: int | None = None, with_entropy: bool = False,
                         temperature: float = 1.0):
        """(logprobs (B, R), entropy (B, R) or None); zeros at padded response positions."""
        self.engine.eval()
        lps, ents = [], []
        for micro in micro_batches(batch, micro_batch_size or getattr(self.cfg, "micro_batch_size", None)):
            o = self._forward_outputs(micro, False, with_entropy, temperature)
            lps.append(o["logprobs"])
            if with_entropy:
                ents.append(o["entropy"])
        return torch.cat(lps), (torch.cat(ents) if with_entropy else None)

    def export_hf(self, directory: str) -> None:
        """Full weights via ``save_pretrained`` on rank 0 (+ tokenizer files); all ranks call."""
        state = self.full_state_dict()  # collective: every rank gathers
        if self.dist.is_main:
            from transformers import AutoConfig, AutoModelForCausalLM
            os.makedirs(directory, exist_ok=True)
            config = AutoConfig.from_pretrained(self.model_path)
            model = AutoModelForCausalLM.from_config(config, dtype=self.dtype)
            missing, unexpected = model.load_state_dict(state, strict=False)
            if unexpected or [k for k in missing if k != "lm_head.weight"]:
                raise RuntimeError(f"export_hf: missing {missing}, unexpected {unexpected}")
            model.save_pretrained(directory)
            copy_tokenizer_files(self.model_path, directory)
        from vcppo.engines.dist import barrier
        barrier()


def copy_tokenizer_files(src: str, dst: str) -> None:
    for f in TOKENIZER_FILES:
        p = os.path.join(src, f)
        if os.path.exists(p) and not os.path.exists(os.path.join(dst, f)):
            shutil.copy(p, os.path.join(dst, f))
