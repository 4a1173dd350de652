"""DeepSpeed (ZeRO-3 with several ranks, plain data parallel on one) wrapper shared by the actor, critic and reference engines: config,
AdamW + LR schedule, the gradient contract of one optimizer step, gathered parameters, checkpoints.

Gradient contract of :meth:`DeepSpeedModelEngine.train_step`, owned here and nowhere else:
the caller hands over its rank's share of a mini-batch and an :class:`EngineLoss`. The engine
  1. counts the tokens / sequences the loss averages over on EVERY rank (:class:`GlobalCounts`),
  2. runs the micro-batches; each loss value is its share of the loss of the whole global
     mini-batch (normalised by those global counts), so the values sum to that loss,
  3. rescales for data parallelism: DeepSpeed 0.19.8 averages gradients over ranks in the ZeRO
     reduce-scatter, so the loss is multiplied by ``world_size`` before backward; and it divides
     by gradient_accumulation_steps, so gas=1 in the DeepSpeed config, the accumulation boundary
     is marked here and ``backward(..., scale_wrt_gas=False)`` is used,
  4. keeps ZeRO-3's collectives in step: every rank runs the same number of backward passes
     (a rank with fewer micro-batches runs zero-weight passes).
The gradient applied is then d(loss on the global mini-batch)/dθ, whatever the number of ranks
or micro-batches (tests/engines/test_distributed.py: 2 ranks == 1 rank).
  5. never applies a non-finite step: when any rank's loss or advantages are non-finite, that
     rank back-propagates NaN, so the global gradient norm is NaN on every rank; ZeRO 1-3 then
     discard the gradients and skip the step themselves (DeepSpeed's overflow path: no update,
     no LR-scheduler step, ``skipped_steps`` + 1), and without ZeRO the engine skips ``step()``
     after zeroing the gradients. Every rank therefore skips the same steps; ``train_step``
     reports ``nonfinite_skipped`` = 1.0 for such a step (tests/engines/test_nonfinite.py).
Weights are checked before they are written: :meth:`DeepSpeedModelEngine.check_finite_weights`.
"""
from __future__ import annotations

import math
import os
from contextlib import nullcontext
from typing import Any, Iterator

import torch

from vcppo.runtime import collectives
from vcppo.engines import lora as L
from vcppo.engines import sequence_parallel as SP
from vcppo.runtime.dist import DistInfo
from vcppo.engines.engine_setup import (CHECKPOINT_TAG, lr_lambda_factory, resolve_dtype, resolve_zero_stage,
                                        skip_lone_allreduce)
from vcppo.engines.loss_contract import EngineLoss, GlobalCounts, ModelOutputs
from vcppo.engines.master_weights import full_masters, masters_from_checkpoint
from vcppo.engines.packing import sequence_lengths, token_budget_groups, use_packed_attention
from vcppo.experience import Layout
from vcppo.config.schema import EngineConfig, OptimConfig, UpdateConfig
from vcppo.errors import ConfigError


# -------------------------------------------------------------------------------------------------
# The engine


class NonFiniteError(ConfigError):
    """Training met non-finite values it cannot step past (weights, or too many skipped steps).
    A ConfigError, like CheckpointError: the user must act (lower the lr, fix the data or the
    reward), and the CLI prints the one-line reason and exits 2 instead of a traceback."""


def nonfinite_inputs(minibatch: Layout) -> bool:
    """Any NaN/inf in the inputs a loss trains on (advantages, value targets, old logprobs/values)."""
    for name in ("advantages", "returns", "old_logprobs", "old_values"):
        t = getattr(minibatch, name, None)
        if torch.is_tensor(t) and t.is_floating_point() and not bool(torch.isfinite(t).all()):
            return True
    return False


def _local_data(p: torch.nn.Parameter) -> torch.Tensor:
    """This rank's share of a parameter (its ZeRO-3 partition, else the whole tensor)."""
    return p.ds_tensor if hasattr(p, "ds_tensor") else p.data


def _strip_prefixes(name: str) -> str:
    for pre in ("module.", "_orig_mod."):
        while name.startswith(pre):
            name = name[len(pre):]
    return name


def stitch_rows(groups: list[list[int]], results: list[tuple]) -> list[torch.Tensor | None]:
    """Per micro-batch tuples of (b, R) tensors (``groups[i]``: the rows of micro-batch i) ->
    (B, R) tensors in the batch's row order (None stays None)."""
    order = torch.tensor([r for rows in groups for r in rows])
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(len(order))
    stitched = []
    for k in range(len(results[0])):
        if results[0][k] is None:
            stitched.append(None)
            continue
        cat = torch.cat([r[k] for r in results])
        stitched.append(cat if len(groups) == 1 else cat[inverse.to(cat.device)])
    return stitched


class DeepSpeedModelEngine:
    """A module wrapped by ``deepspeed.initialize``; with an :class:`OptimConfig` and
    ``train=True`` it gets AdamW + LambdaLR, otherwise it is frozen (no optimizer).

    Subclasses build the module (:meth:`_build_module`) and compute :class:`ModelOutputs` for a
    micro-batch (:meth:`_forward_outputs`). ``sp``: this rank's sequence-parallel group (None: off;
    :mod:`vcppo.engines.sequence_parallel`), from ``<CONFIG_SECTION>.sequence_parallel_size``.
    """

    CONFIG_SECTION = "engine"  # the config section that configures it, for errors

    def __init__(self, cfg: EngineConfig, dist: DistInfo, total_optimizer_steps: int, dtype: str = "auto",
                 train: bool = True):
        import deepspeed

        if train and not isinstance(cfg, OptimConfig):
            raise TypeError(f"a trained engine needs an OptimConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        self.dist = dist
        self.dtype = resolve_dtype(dtype, dist.device)
        self.total_optimizer_steps = int(total_optimizer_steps)
        self.zero_stage = resolve_zero_stage(cfg.zero_stage, dist.world_size)
        # the engines PPO trains (UpdateConfig: actor, critic) shard sequences; SFT, RM and reference do not
        sp_size = cfg.sequence_parallel_size if isinstance(cfg, UpdateConfig) else 1
        self.sp = SP.build_group(int(sp_size), dist.rank, dist.world_size, f"{self.CONFIG_SECTION}.sequence_parallel_size")
        self.ds_config = self._ds_config(cfg, train)
        module = self._build_under_zero_init()
        self.lora = getattr(cfg, "lora", None) if train else None
        if L.enabled(self.lora):
            module = self._with_adapters(module)
        if cfg.packed or self.sp is not None:  # sequence parallelism always runs packed rows
            self.attention = use_packed_attention(module, dist.device, self.dtype)
        if self.sp is not None:
            self.attention = SP.use_ulysses_attention(module, self.sp, self.attention)
        if train and cfg.gradient_checkpointing:
            self._enable_gradient_checkpointing(module)
        if train:
            params = self._param_groups(module)
            sched = lr_lambda_factory(cfg.warmup_steps, self.total_optimizer_steps, cfg.lr_schedule,
                                      cfg.min_lr_ratio)
            self.engine, self.optimizer, _, self.lr_scheduler = deepspeed.initialize(
                model=module, model_parameters=params, config=self.ds_config,
                lr_scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, sched))
            skip_lone_allreduce(self.engine, self.zero_stage)
            # a bf16 module's masters start from the checkpoint's fp32 values, not its bf16 cast
            self.masters_seeded = masters_from_checkpoint(self.engine.module, self.engine.optimizer,
                                                         self._weights_source())
        else:
            module.requires_grad_(False)
            self.engine = deepspeed.initialize(model=module, config=self.ds_config)[0]
            self.optimizer = self.lr_scheduler = None
            self.masters_seeded = 0
        self.module = self.engine.module
        # {LoRA layer: alpha / r}, names as the gathered parameters carry them ({} without LoRA)
        self.lora_scalings = L.adapter_scalings(self.module, _strip_prefixes) if L.enabled(self.lora) else {}

    # --- construction ----------------------------------------------------------------------
    def _param_groups(self, module: torch.nn.Module) -> list:
        """What the optimizer trains: the trainable parameters, or param groups (dicts with their
        own ``lr``; the first group's lr is the one logged)."""
        return [p for p in module.parameters() if p.requires_grad]

    def _build_under_zero_init(self) -> torch.nn.Module:
        """Build the module; under ZeRO-3, transformers' from_pretrained partitions it at load
        (deepspeed.zero.Init, needs `accelerate`), so it is never fully materialised per rank."""
        if self.zero_stage != 3:
            return self._build_module()
        try:
            from transformers.integrations import HfDeepSpeedConfig
            hf_ds_config = HfDeepSpeedConfig(self.ds_config)
        except Exception:  # noqa: BLE001 - no accelerate / version check: load whole, partition later
            return self._build_module()
        try:
            return self._build_module()
        finally:
            # Only construction needs it. Left registered (a process-wide weak reference in
            # transformers), it makes every later from_pretrained / from_config in the process
            # build partitioned, empty-tensor models -- exports, evaluation, other tests.
            from transformers.integrations.deepspeed import unset_hf_deepspeed_config
            unset_hf_deepspeed_config()
            del hf_ds_config

    def _ds_config(self, cfg: EngineConfig, train: bool) -> dict:
        cuda = self.dist.device.type == "cuda"
        zero: dict[str, Any] = {"stage": self.zero_stage}
        if self.zero_stage == 3:
            zero.update({"stage3_gather_16bit_weights_on_model_save": False,
                         "stage3_param_persistence_threshold": 1e4 if cuda else 0, "overlap_comm": cuda})
            if cfg.offload_params:
                zero["offload_param"] = {"device": "cpu", "pin_memory": cuda}
        if train and cfg.offload_optimizer:
            zero["offload_optimizer"] = {"device": "cpu", "pin_memory": cuda}
        c: dict[str, Any] = {
            "train_micro_batch_size_per_gpu": cfg.micro_batch_size,
            "gradient_accumulation_steps": 1,  # accumulation boundaries are marked in train_step
            "train_batch_size": cfg.micro_batch_size * self.dist.world_size,
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
                "torch_adam": not cfg.offload_optimizer}}
        return c

    def _build_module(self) -> torch.nn.Module:
        raise NotImplementedError

    def _weights_source(self) -> str | None:
        """The directory the module's weights were loaded from (its fp32 values seed the masters)."""
        return None

    # peft's task type of the adapted model (an actor's is a causal LM; a value model's backbone has none)
    ADAPTER_TASK: str | None = None

    def _with_adapters(self, module: torch.nn.Module) -> torch.nn.Module:
        """LoRA adapters on ``module`` (on a value model's backbone: its heads stay fully trained),
        its own weights frozen. Under ZeRO-3 the new adapter tensors are whole until
        ``deepspeed.initialize`` partitions them with the rest."""
        if hasattr(module, "backbone"):
            module.backbone = L.add_adapters(module.backbone, self.lora)
            return module
        return L.add_adapters(module, self.lora, self.ADAPTER_TASK)

    @staticmethod
    def _enable_gradient_checkpointing(module):
        target = module.backbone if hasattr(module, "backbone") else module
        target.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if hasattr(target, "config"):
            target.config.use_cache = False

    def _forward_outputs(self, micro: Layout, need_entropy: bool) -> ModelOutputs:
        raise NotImplementedError

    def micro_batch_rows(self, batch: Layout) -> list[list[int]]:
        """Rows of each micro-batch: by the token budget when one is set
        (``max_tokens_per_micro_batch``), else ``micro_batch_size`` rows at a time, in order."""
        if self.cfg.max_tokens_per_micro_batch > 0:
            return token_budget_groups(sequence_lengths(batch).tolist(), self.cfg.max_tokens_per_micro_batch)
        size = self.cfg.micro_batch_size or batch.size
        return [list(range(s, min(s + size, batch.size))) for s in range(0, batch.size, size)]

    def micro_batches(self, batch: Layout) -> list[Layout]:
        rows = self.micro_batch_rows(batch)
        return [batch] if len(rows) == 1 else [batch.select(r) for r in rows]

    def passes_on_every_rank(self, n_local: int) -> int:
        """The most micro-batches any rank has: ZeRO-3 gathers parameters with collectives inside
        every forward, so all ranks must run the same number of passes (the ones short of it run
        extra passes whose outputs they throw away). A collective itself: call it before the
        passes, on every rank."""
        if self.dist.world_size == 1:
            return n_local
        return int(collectives.all_reduce_max(torch.tensor([n_local], dtype=torch.long, device=self.dist.device)).item())

    def per_token_outputs(self, batch: Layout, fn) -> list[torch.Tensor | None]:
        """``fn(micro) -> tuple of (b, R) tensors`` over the micro-batches, stitched back into
        (B, R) tensors in the batch's row order (a token budget reorders rows). With sequence
        parallelism the passes run over the SP group's union batch; this rank's rows come back."""
        if self.sp is not None:
            union, back = SP.group_batch(batch, self.sp)
            return [back(t) for t in self._per_token_outputs(union, fn)]
        return self._per_token_outputs(batch, fn)

    def _per_token_outputs(self, batch: Layout, fn) -> list[torch.Tensor | None]:
        groups = self.micro_batch_rows(batch)
        n_passes = self.passes_on_every_rank(len(groups))  # agreed BEFORE any pass's collectives
        results = [fn(batch if len(groups) == 1 else batch.select(rows)) for rows in groups]
        for _ in range(n_passes - len(groups)):
            fn(batch.select(groups[-1]))  # keeps the collectives in step; output unused
        return stitch_rows(groups, results)

    def train_step_outputs(self, minibatch: Layout, kept: list[tuple]) -> list[torch.Tensor | None]:
        """What a loss kept from the last :meth:`train_step`'s passes over ``minibatch`` (one tuple of
        (b, R) tensors per micro-batch; rank-padding passes last) as (B, R) tensors in its row order;
        with SP the passes ran over the group's union, and this rank's rows come back."""
        if self.sp is None:
            groups = self.micro_batch_rows(minibatch)
            return stitch_rows(groups, kept[:len(groups)])
        groups = self.micro_batch_rows(self._union)
        return [self._union_back(t) for t in stitch_rows(groups, kept[:len(groups)])]

    # --- training --------------------------------------------------------------------------
    def train_step(self, minibatch: Layout, loss: EngineLoss) -> dict:
        """ONE optimizer step over this rank's share of a mini-batch (see the module docstring)."""
        if self.optimizer is None:
            raise RuntimeError("this engine is frozen (built with train=False)")
        self.engine.train()
        counts = GlobalCounts.over_ranks(loss.count_masks(minibatch))  # each rank its own rows
        if self.sp is not None:  # every rank of the group runs the group's micro-batches (module docstring
            minibatch, self._union_back = SP.group_batch(minibatch, self.sp)  # of vcppo.engines.sequence_parallel)
            self._union = minibatch
        micros = self.micro_batches(minibatch)
        world = self.dist.world_size
        n_local = len(micros)
        n_max = self.passes_on_every_rank(n_local)
        sums: dict[str, float] = {}
        counts_by_key: dict[str, int] = {}
        bad_inputs, poisoned = nonfinite_inputs(minibatch), False
        for i in range(n_max):
            dummy = i >= n_local  # this rank ran out: a zero-weight pass keeps collectives in step
            micro = micros[min(i, n_local - 1)]
            self.engine.set_gradient_accumulation_boundary(i == n_max - 1)
            value, metrics = loss(self._forward_outputs(micro, loss.needs_entropy), micro, counts)
            if dummy:
                value = value * 0.0
            elif bad_inputs or not bool(torch.isfinite(value.detach()).all()):
                # contract 5: NaN gradients make the global norm NaN, so every rank skips the step
                # (an inf loss can have finite gradients; NaN times any gradient is NaN)
                value, poisoned = value * float("nan"), True
            self.engine.backward(value * world, scale_wrt_gas=False)
            if not dummy:
                for k, v in (metrics or {}).items():
                    sums[k] = sums.get(k, 0.0) + (float(v.detach().float().mean()) if torch.is_tensor(v) else float(v))
                    counts_by_key[k] = counts_by_key.get(k, 0) + 1
        lr = self.get_lr()  # the lr this step uses
        manual_gn = self._grad_norm_without_zero() if self.zero_stage == 0 else None
        if manual_gn is not None and not math.isfinite(manual_gn):
            self.engine.zero_grad()  # without ZeRO nothing else would keep NaN out of the weights
            applied = False
        else:
            self.engine.step()
            applied = manual_gn is not None or self.engine.was_step_applied()
        # Metrics: mean over this rank's micro-batches, then mean over ranks (same keys everywhere).
        keys = sorted(sums)
        local = torch.tensor([sums[k] / counts_by_key[k] for k in keys], dtype=torch.float64,
                             device=self.dist.device)
        out = dict(zip(keys, (collectives.all_reduce_sum(local) / world).tolist())) if keys else {}
        gn = manual_gn if manual_gn is not None else self.engine.get_global_grad_norm()
        out["grad_norm"] = float(gn) if gn is not None else float("nan")
        out["lr"] = lr
        out["nonfinite_skipped"] = 0.0 if applied else 1.0
        if poisoned and applied:  # DeepSpeed applied a step from NaN gradients: never expected
            raise RuntimeError("a step with non-finite loss/advantages was applied by DeepSpeed")
        return out

    def check_finite_weights(self, what: str) -> None:
        """Raise :class:`NonFiniteError` when any weight is NaN/inf (collective: every rank
        checks its own partition, the verdict is summed over ranks); called before anything
        holding these weights is written."""
        local = sum(int(not bool(torch.isfinite(_local_data(p)).all())) for p in self.module.parameters())
        bad = int(collectives.all_reduce_sum(torch.tensor([local], dtype=torch.float64, device=collectives.comm_device())).item())
        if bad:
            raise NonFiniteError(f"refusing to write {what}: {bad} weight tensor(s) hold NaN/inf "
                                 "(the last good checkpoint is kept)")

    def _grad_norm_without_zero(self) -> float:
        """DeepSpeed reports no global grad norm without ZeRO: compute it from the local grads."""
        grads = [p.grad.detach().float() for p in self.module.parameters() if p.grad is not None]
        return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))

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
        """Full (un-partitioned) parameters with HF names, gathered a bucket at a time: the plain
        model's, so with LoRA each adapted layer comes once with its adapter merged
        (:func:`vcppo.engines.lora.merge_adapters`).

        Yields clones (safe to keep after the bucket is re-partitioned). ``to_cpu`` moves them.
        """
        raw = self._gathered(list(self.module.named_parameters()), bucket_bytes, to_cpu)
        return L.merge_adapters(raw, self.lora_scalings) if self.lora_scalings else raw

    def adapter_state_dict(self) -> dict[str, torch.Tensor]:
        """The LoRA adapters' full tensors on the CPU, peft's names (collective: every rank gathers)."""
        named = [(n, p) for n, p in self.module.named_parameters() if L.is_adapter_param(n)]
        return dict(self._gathered(named, 256 * 2 ** 20, to_cpu=True))

    def _gathered(self, named: list, bucket_bytes: int, to_cpu: bool) -> Iterator[tuple[str, torch.Tensor]]:
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
                out = [(_strip_prefixes(n), (p.data.detach().to("cpu") if to_cpu else p.data.detach()).clone())
                       for n, p in bucket]
            yield from out

    def full_state_dict(self, masters: bool = False) -> dict[str, torch.Tensor]:
        """Every parameter, whole, on the CPU (collective). ``masters``: a half-precision module's trained
        parameters as their fp32 masters (not with LoRA, whose export merges adapters)."""
        state = dict(self.named_parameters_gathered(to_cpu=True))
        if masters and self.optimizer is not None and self.dtype != torch.float32 and not self.lora_scalings:
            for name, m in full_masters(self.engine.module, self.engine.optimizer).items():
                if _strip_prefixes(name) in state:
                    state[_strip_prefixes(name)] = m
        return state

    # --- checkpoints -----------------------------------------------------------------------
    def save_checkpoint(self, directory: str) -> None:
        """DeepSpeed checkpoint (partitioned weights + optimizer + LR scheduler), all ranks call;
        refused (:class:`NonFiniteError`) when a weight is non-finite."""
        self.check_finite_weights(f"checkpoint {directory}")
        os.makedirs(directory, exist_ok=True)
        self.engine.save_checkpoint(directory, tag=CHECKPOINT_TAG, save_latest=True)

    def load_checkpoint(self, directory: str, universal: bool = False) -> None:
        """``universal``: ``directory`` holds DeepSpeed's universal checkpoint (written on another
        number of ranks, converted by :mod:`vcppo.driver.durability.conversion`); each rank takes its partition."""
        self.engine._config.load_universal_checkpoint = universal  # read by DeepSpeed at load time only
        path, _ = self.engine.load_checkpoint(directory, tag=CHECKPOINT_TAG, load_optimizer_states=self.optimizer is not None,
                                              load_lr_scheduler_states=self.optimizer is not None)
        if path is None:
            raise FileNotFoundError(f"no DeepSpeed checkpoint in {directory}")

    def close(self) -> None:
        self.engine = self.module = self.optimizer = self.lr_scheduler = None
