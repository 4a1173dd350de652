"""Peak memory of the actor's response-logprob path at Qwen2.5-0.5B's shape, on CUDA.

A long micro-batch (ROWS sequences of PROMPT + RESPONSE tokens) through the real :class:`ActorEngine`
(bf16, one rank, packed, gradient checkpointing so the LM head's logits, not the layers' activations,
are what a long response costs): ``torch.cuda.max_memory_allocated`` above what was allocated before
the pass, for the forward alone and for a train step (forward + backward of the response tokens'
token-mean NLL, i.e. their summed logprobs over a constant, then the optimizer step), with
``logprob_chunk_size: 0`` (every response position's fp32 logits and log-softmax at once) against the
default chunked path. The chunked train step must peak at least MIN_RATIO times lower.

The figures go to ``logprob_memory.json`` under ``$GPU_CHECK_OUT`` (else ``$OUT``) when either is set:
launch/gpu_check.sh runs this file as its ``logprob_memory`` step. Skipped without CUDA (tests/conftest.py,
which skips everything under tests/gpu there); the helpers that need no GPU are tested on the CPU in
tests/bench/test_gpu_check.py.
"""
from __future__ import annotations

import gc
import json
import os
import time
from pathlib import Path

import pytest
import torch

SIZE = "qwen2.5-0.5b-shape"  # `vcppo model make --size qwen2.5-0.5b-shape` (vcppo/models/factory.py)
# 4 x 4096 response positions: the full path's fp32 logits alone are 9.3 GiB (x ~3 in the backward),
# which fits one H100 beside the rest; 8 rows would need ~70 GiB and leave no headroom there.
ROWS, PROMPT, RESPONSE = 4, 512, 4096
CHUNKED = 1024  # EngineConfig.logprob_chunk_size's default (checked below)
MIN_RATIO = 2.5
JSON_NAME = "logprob_memory.json"
FIRST_ID = 8  # token ids drawn above the tokenizer's special tokens
GIB = 2 ** 30


def figures_path(env=None) -> Path | None:
    """Where the figures go: ``$GPU_CHECK_OUT/logprob_memory.json``, else ``$OUT/...``; None: nowhere."""
    env = os.environ if env is None else env
    out = env.get("GPU_CHECK_OUT") or env.get("OUT")
    return Path(out) / JSON_NAME if out else None


def write_figures(figures: dict, env=None) -> Path | None:
    path = figures_path(env)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(figures, indent=2) + "\n")
    return path


def shape_config():
    """The Qwen2Config `vcppo model make --size qwen2.5-0.5b-shape` writes (the published 151,936-row
    vocabulary, tied), with room for PROMPT + RESPONSE positions."""
    from vcppo.models.factory import model_config
    from vcppo.models.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    return model_config(SIZE, tokenizer, max_position_embeddings=PROMPT + RESPONSE), tokenizer


def token_lists(vocab_size: int, rows: int = ROWS, prompt: int = PROMPT, response: int = RESPONSE, seed: int = 0):
    """(prompts, responses): ``rows`` random sequences, every one PROMPT + RESPONSE long (no padding)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(FIRST_ID, vocab_size, (rows, prompt + response), generator=g)
    return ids[:, :prompt].tolist(), ids[:, prompt:].tolist()


def fp32_logits_gib(config, rows: int = ROWS, response: int = RESPONSE) -> float:
    """The size of one fp32 (response positions x vocabulary) tensor: what the full path holds
    several of (its log-softmax, kept for the backward, and the gradient of it)."""
    return rows * response * config.vocab_size * 4 / GIB


def _peak(fn):
    """(figures, fn()): fn's peak allocated CUDA memory above what was allocated when it started."""
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    start = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    return {"peak_above_start_gib": round((peak - start) / GIB, 3), "start_gib": round(start / GIB, 3),
            "peak_gib": round(peak / GIB, 3), "peak_reserved_gib": round(torch.cuda.max_memory_reserved() / GIB, 3),
            "seconds": round(time.perf_counter() - t0, 3)}, out


def _measure(model_dir: str, chunk: int, batch, dist) -> tuple[dict, torch.Tensor]:
    from vcppo.engines.loss_contract import ResponseNLL
    from vcppo.engines.actor import ActorEngine
    from vcppo.config.schema import ActorConfig

    cfg = ActorConfig(lr=1e-6, micro_batch_size=ROWS, gradient_checkpointing=True, logprob_chunk_size=chunk)
    eng = ActorEngine(model_dir, cfg, dist, total_optimizer_steps=4, dtype="bfloat16")
    try:
        fig = {"logprob_chunk_size": chunk, "zero_stage": eng.zero_stage, "packed": cfg.packed,
               "attention": getattr(eng, "attention", None), "gradient_checkpointing": True,
               "chunked_head": getattr(eng, "head", None) is not None}
        fig["forward"], (logprobs, _) = _peak(lambda: eng.forward_logprobs(batch))
        eng.train_step(batch, ResponseNLL())  # AdamW's states and DeepSpeed's buffers exist from here on
        fig["train_step"], metrics = _peak(lambda: eng.train_step(batch, ResponseNLL()))
        fig["grad_norm"] = metrics["grad_norm"]
        return fig, logprobs.float().cpu()
    finally:
        eng.close()
        del eng
        gc.collect()
        torch.cuda.empty_cache()


@pytest.mark.gpu
def test_chunked_logprobs_cut_the_train_step_peak(tmp_path):
    pytest.importorskip("deepspeed")
    from transformers import Qwen2ForCausalLM

    from vcppo.runtime.dist import init_distributed
    from vcppo.experience import make_layout
    from vcppo.config.schema import EngineConfig

    assert EngineConfig().logprob_chunk_size == CHUNKED
    t0 = time.perf_counter()
    config, tokenizer = shape_config()
    torch.manual_seed(0)
    with torch.device("cuda"):  # random weights, initialised on the GPU (seconds, not a CPU init)
        model = Qwen2ForCausalLM(config)
    n_params = sum(p.numel() for p in model.parameters())
    model.to(torch.bfloat16).save_pretrained(str(tmp_path / "m"))
    tokenizer.save_pretrained(str(tmp_path / "m"))
    del model
    dist = init_distributed("cuda")
    prompts, responses = token_lists(config.vocab_size)
    batch = make_layout(prompts, responses, pad_id=tokenizer.pad_token_id)
    figures = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
               "model": {"size": SIZE, "params": n_params, "hidden_size": config.hidden_size,
                         "num_hidden_layers": config.num_hidden_layers, "vocab_size": config.vocab_size,
                         "tied": bool(config.tie_word_embeddings), "dtype": "bfloat16"},
               "batch": {"rows": ROWS, "prompt_tokens": PROMPT, "response_tokens": RESPONSE,
                         "tokens": ROWS * (PROMPT + RESPONSE), "response_positions": ROWS * RESPONSE},
               "fp32_logits_gib": round(fp32_logits_gib(config), 3), "min_ratio": MIN_RATIO,
               "peak": "torch.cuda.max_memory_allocated above what was allocated when the pass started"}
    try:
        figures["full"], full_lp = _measure(str(tmp_path / "m"), 0, batch, dist)
        figures["chunked"], chunked_lp = _measure(str(tmp_path / "m"), CHUNKED, batch, dist)
        diff = (full_lp - chunked_lp).abs()
        figures["logprob_abs_diff_mean"], figures["logprob_abs_diff_max"] = float(diff.mean()), float(diff.max())
        for phase in ("forward", "train_step"):
            figures[f"{phase}_peak_ratio"] = (figures["full"][phase]["peak_above_start_gib"]
                                              / max(figures["chunked"][phase]["peak_above_start_gib"], 1e-9))
        figures["ok"] = figures["train_step_peak_ratio"] >= MIN_RATIO and figures["logprob_abs_diff_mean"] < 1e-2
    except BaseException as exc:  # the figures so far still go out, with what stopped them
        figures["error"] = f"{type(exc).__name__}: {exc}"[:2000]
        figures["ok"] = False
        raise
    finally:
        figures["seconds"] = round(time.perf_counter() - t0, 1)
        write_figures(figures)
        print(json.dumps(figures, indent=1))
    assert all(torch.isfinite(torch.tensor(figures[k]["grad_norm"])) for k in ("full", "chunked"))
    # the same weights and tokens: the two paths score them alike (bf16 logits either way)
    assert figures["logprob_abs_diff_mean"] < 1e-2, figures
    assert figures["train_step_peak_ratio"] >= MIN_RATIO, figures

