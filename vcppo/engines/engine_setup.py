"""What a DeepSpeed engine is built with: the training dtype, the ZeRO stage (and the one a checkpoint
was written with), the tag checkpoints are saved under, the learning-rate schedule, and the one
reduction it skips."""
from __future__ import annotations

import math
import os
from typing import Callable

import torch


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]


NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo flags of x86 CPUs with bf16 arithmetic


def cpu_has_native_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether this CPU computes in bf16 natively (AVX-512 BF16 or AMX): there a bf16 forward and
    backward ran 4.6-4.9x faster than fp32 (docs/performance.md); elsewhere (AVX2) oneDNN emulates it."""
    try:
        with open(cpuinfo) as f:
            flags = next((ln.split(":", 1)[1].split() for ln in f if ln.startswith("flags")), [])
    except OSError:
        return False
    return any(flag in flags for flag in NATIVE_BF16_FLAGS)


def skip_lone_allreduce(engine, zero_stage: int) -> None:
    """Without ZeRO on one data-parallel rank, DeepSpeed's backward still all-reduces the gradients:
    it copies every gradient into one flat bucket (up to 500M elements: all 1.9 GB of a 0.5B model's
    fp32 gradients), reduces it over the one rank and copies it back, an identity that doubles the
    gradients' memory at the end of each backward. Off in that case only; with ZeRO or several
    ranks the reduction is real and stays."""
    if zero_stage == 0 and engine.dp_world_size == 1:
        engine.enable_backward_allreduce = False


CHECKPOINT_TAG = "ds"  # the tag every engine checkpoint is saved and loaded under


def checkpoint_zero_stage(directory: str) -> int | None:
    """The ZeRO stage a DeepSpeed checkpoint (``save_checkpoint``'s layout) was written with, read
    from its file names: ZeRO-3 keeps per-rank model states, ZeRO-1/2 per-rank optimizer states next
    to one model-states file, stage 0 only that file. None: no checkpoint there."""
    ds = os.path.join(directory, CHECKPOINT_TAG)
    names = os.listdir(ds) if os.path.isdir(ds) else []
    if any(n.startswith("zero_pp_rank_") and n.endswith("_model_states.pt") for n in names):
        return 3
    if any(n.endswith("_optim_states.pt") for n in names):
        return 2
    return 0 if any(n.endswith("_model_states.pt") for n in names) else None


def resolve_zero_stage(requested: int | None, world_size: int, checkpoint_dir: str | None = None) -> int:
    """``zero_stage`` null means: the stage of the checkpoint the engine resumes from (its layout
    decides), else 3 on several ranks and 0 on one. On one rank ZeRO only adds work: its
    partitioning hooks gather every parameter before each layer and release it after, for nothing
    to share (docs/performance.md, "How fast is a PPO step?")."""
    if requested is not None:
        return int(requested)
    written = checkpoint_zero_stage(checkpoint_dir) if checkpoint_dir else None
    if written is not None:
        return written
    return 3 if world_size > 1 else 0


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
