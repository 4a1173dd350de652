"""Seconds per RL step: vLLM decoding (memory-bandwidth bound) and DeepSpeed training (FLOP bound).

Rollout. Each decode step of a vLLM replica reads its weights once and the KV cache of every active
sequence (Pope et al. 2022, "Efficiently Scaling Transformer Inference": small-batch decoding is
memory-bound), so a step takes max(bytes read / HBM bandwidth, 2 N x active sequences / (peak x
MFU)). The length assumption: response lengths spread evenly between 0 and
``rollout.max_response_tokens`` (mean = half the maximum), so every replica's batch runs for the
full maximum number of decode steps, its longest response, while the active sequences thin out
linearly. When a replica has more sequences than it can run at once (vLLM's ``max_num_seqs``, or
the KV cache), continuous batching keeps the slots full until the queue drains, then the last
batch drains like the one-batch case. Peak bandwidth, no scheduling overhead, no preemption: a
lower bound on decode time.

Training. 6 N FLOPs per token for a forward + backward pass and 2 N for a forward pass (Kaplan et
al. 2020, "Scaling Laws for Neural Language Models", sec. 2.1; the attention's own s^2 term is left
out), 2 N more per token when gradient checkpointing recomputes the forward, at ``mfu`` of the
dense peak, spread evenly over the training GPUs. With LoRA the frozen weights get no weight gradients, so backward
costs 2 N (the input gradients) instead of 4 N: 4 N per token per training pass (the adapters' own
FLOPs, r (in + out) per layer, are left out).

Not modelled: the CPU Adam step under optimizer offload, the weight sync to vLLM, vLLM's sleep /
wake, and the optimizer step itself.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from vcppo.plan.shape import Hardware


@dataclass(frozen=True)
class DecodeSetup:
    """One vLLM replica (``tensor_parallel`` GPUs) and the sequences it samples in one step."""
    n_params: int
    weights_bytes_per_gpu: float
    kv_bytes_per_token_per_gpu: int
    tensor_parallel: int
    sequences: int           # responses this replica samples per step
    concurrency: int         # sequences it runs at once
    prompt_tokens: int
    max_response_tokens: int


def decode_step_seconds(s: DecodeSetup, hw: Hardware, dtype_bytes: int, mfu: float,
                        active: float, context: float) -> float:
    """One decode step of ``active`` sequences of mean length ``context``: the roofline maximum of
    reading weights + KV and computing 2 N FLOPs per sequence, per GPU of the group."""
    bytes_read = s.weights_bytes_per_gpu + active * context * s.kv_bytes_per_token_per_gpu
    flops = 2 * s.n_params * active / s.tensor_parallel
    return max(bytes_read / hw.bandwidth, flops / (hw.flops(dtype_bytes) * mfu))


def drain_seconds(s: DecodeSetup, hw: Hardware, dtype_bytes: int, mfu: float, batch: int,
                  segments: int = 64) -> float:
    """``batch`` sequences decoded together to the longest one: R steps, with the active count falling
    linearly from ``batch`` to 0 and each active sequence at prompt + t tokens at step t (midpoint
    rule over ``segments`` spans of steps)."""
    R = s.max_response_tokens
    total = 0.0
    for i in range(segments):
        t = (i + 0.5) * R / segments
        active = batch * (1 - t / R)
        total += decode_step_seconds(s, hw, dtype_bytes, mfu, active, s.prompt_tokens + t) * R / segments
    return total


def rollout_seconds(s: DecodeSetup, hw: Hardware, dtype_bytes: int, mfu: float) -> float:
    """Wall time of one replica's rollout: prefill, a steady phase with every slot busy while the
    queue lasts, then the drain of the last full batch (see the module docstring)."""
    batch = max(1, min(s.sequences, s.concurrency))
    prefill = 2 * s.n_params * s.prompt_tokens * s.sequences / s.tensor_parallel / (hw.flops(dtype_bytes) * mfu)
    queued = s.sequences - batch
    steady_steps = queued * (s.max_response_tokens / 2) / batch  # tokens left in the queue / slots
    steady = steady_steps * decode_step_seconds(s, hw, dtype_bytes, mfu, batch,
                                                s.prompt_tokens + s.max_response_tokens / 2)
    return prefill + steady + drain_seconds(s, hw, dtype_bytes, mfu, batch)


@dataclass(frozen=True)
class TrainedModel:
    """FLOP accounting of one engine in one step."""
    role: str
    n_params: int
    forward_passes: int        # forward-only passes over the step's tokens (old logprobs, values)
    train_passes: int          # forward + backward passes (PPO epochs)
    checkpointing: bool
    frozen_weights: bool = False  # LoRA: no weight gradients for the base weights


def training_flops(model: TrainedModel, tokens: float) -> float:
    per_train_pass = ((4 if model.frozen_weights else 6) + (2 if model.checkpointing else 0)) * model.n_params * tokens
    return model.forward_passes * 2 * model.n_params * tokens + model.train_passes * per_train_pass


def training_seconds(models: list[TrainedModel], tokens: float, hw: Hardware, dtype_bytes: int,
                     gpus: int, mfu: float) -> float:
    """All engines' FLOPs of a step over ``gpus`` GPUs at ``mfu`` of the dense peak."""
    flops = sum(training_flops(m, tokens) for m in models)
    return flops / (gpus * hw.flops(dtype_bytes) * mfu)


def replica_sequences(total_sequences: int, replicas: int) -> int:
    """Sequences of the busiest replica when the step's sequences are dealt out evenly."""
    return math.ceil(total_sequences / max(1, replicas))
