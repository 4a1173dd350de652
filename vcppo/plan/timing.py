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
out), 2 N more per token when gradient checkpointing recomputes the forward, spread evenly over the
training GPUs. With LoRA the frozen weights get no weight gradients, so backward costs 2 N (the input
gradients) instead of 4 N: 4 N per token per training pass (the adapters' own FLOPs, r (in + out)
per layer, are left out). Which passes a step runs follows the driver's step plan
(vcppo.driver.step.step_plan; :func:`step_passes`): with one optimizer step per update the old logprobs and
values come from the updates' own forwards, not from passes of their own.

How fast those FLOPs run: not a constant. On one H100 80GB (bf16, the Qwen2.5-0.5B shape, one rank,
the real ActorEngine / CriticEngine of the ``vcppo`` preset and four long-CoT variants of it; the
raw figures are in tests/plan/data/) a pass over a micro-batch took a fixed time plus a time
proportional to its FLOPs:

    t_mb = a_kind x (layers / 24) + F_mb / (peak x e_kind)

with F_mb = 2 N (forward) or 6 N / 8 N (update, without / with checkpointing) x the micro-batch's
tokens. :data:`H100_MEASURED` holds the fifteen measured phases; :func:`fit_pass_model` fits a and e
by least squares per kind: forward a ~54 ms, e ~0.36; update (forward, backward and the optimizer
step, shared out over the micro-batches) a ~158 ms, e ~0.30; every measured MFU is reproduced within
-19%/+16% (tests/plan/test_mfu.py). So MFU is ~7% at 5k tokens per micro-batch and ~16-25% at 15-41k:
short micro-batches pay the fixed cost (kernel launches, per-sequence attention calls of the packed
layout, the optimizer step) on few FLOPs.

Extrapolation to larger models, assumed and not measured: the fixed cost grows with the number of
layers (kernel launches per layer; hidden size and sequence count left out), and the FLOP-bound part
keeps the 0.5B model's efficiency e. A 7B or 32B model multiplies its matmuls by 4-6x in width,
which on an H100 reaches a higher fraction of peak than the 0.5B model's (hidden 896) does, so e is
a lower bound there and the planned training time an upper bound on compute; what it leaves out
works the other way: ZeRO-3's all-gathers and reduce-scatters across GPUs (the measurement ran ZeRO-0
on one GPU), the CPU Adam step under optimizer offload, the attention's s^2 FLOPs (~20% more at 8k
for 7B). A 7B update over 10k-token micro-batches comes out at ~27% MFU, a forward at ~32%. ``--mfu``
replaces the curve by a constant. On a CPU "device" nothing was measured: a constant
(:data:`CPU_MFU`) stands, and ``vcppo plan --measure`` times the real engines instead
(vcppo.plan.measure).

Sequence parallelism (``sequence_parallel_size: sp``). The data-parallel degree is training ranks /
sp: a group of sp ranks takes the sequences of its sp ranks together and runs every micro-batch of
them on all its ranks, each on a 1/sp slice of the tokens, so a rank's FLOPs are unchanged while it
runs sp times as many micro-batches of 1/sp the tokens (the fixed cost per micro-batch grows: short
slices run at a lower MFU). On top comes Ulysses' all-to-all, which attention waits for (not
overlapped). Per layer and per token of a rank's slice, forward: q, k and v (q_dim + 2 kv_dim
elements; KV heads fewer than sp are replicated to sp heads first, so kv_dim counts max(kv_heads,
sp) heads) go out, the attention output (q_dim) comes back; of each the rank keeps its own 1/sp
share and sends (sp - 1) / sp of it. So a forward sends d (2 q_dim + 2 kv_dim) (sp - 1) / sp
bytes per layer per token (:func:`alltoall_bytes_per_token`); the backward sends the same again
(the output's gradient one way, q's, k's and v's the other), and checkpointing's recomputed forward
once more: 1, 2 or 3 such exchanges for a forward, an update, an update with checkpointing. At the
link of the group's GPUs (:meth:`vcppo.plan.advise.Cluster.group_link`: NVLink when the group is
within a node, the InfiniBand adapter when it spans nodes), at its datasheet peak: a lower bound.
The logprobs / values gathered after the head (a few floats per token) are left out.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from vcppo.plan.hardware import Hardware


# ---------------------------------------------------------------------------------------------
# Measured pass speed

CPU_MFU = 0.35      # a guess, the old constant: no CPU figure backs it (use --measure there)
ROLLOUT_MFU = 0.35  # vLLM's prefill and compute-bound decode: not measured (no vLLM on the GPU machine)
REFERENCE_LAYERS = 24  # the measured model's layers (Qwen2.5-0.5B)
REFERENCE_PARAMS = 494_032_768


@dataclass(frozen=True)
class MeasuredPass:
    """One phase of the H100 probe: a role's passes over a step's 64 sequences, per micro-batch."""
    workload: str
    role: str                 # "actor" | "critic"
    kind: str                 # "forward" | "update"
    flops_per_token: int      # x N: 2 (forward), 6 (update), 8 (update with checkpointing)
    tokens_per_micro_batch: float
    seconds_per_micro_batch: float

    @property
    def flops(self) -> float:
        return self.flops_per_token * REFERENCE_PARAMS * self.tokens_per_micro_batch

    @property
    def mfu(self) -> float:
        return self.flops / self.seconds_per_micro_batch / H100_BF16_PEAK


H100_BF16_PEAK = 989e12
# Measured on one H100 80GB (SXM, bf16), the Qwen2.5-0.5B shape (random weights), one rank (ZeRO-0),
# the real engines of the `vcppo` preset with packed micro-batches; median of 2 timed calls after a
# warm-up. Workloads: `vcppo` (prompts 128, responses evenly up to 384, micro-batches of 16
# sequences), `long*` (prompts 512, responses up to 4096: `long` / `longckpt` without / with
# checkpointing, `longfit` actor micro-batch 8, `longpacked` 16,384-token budgets). Tokens and
# seconds are per micro-batch (the phase's real tokens and median time over its micro-batches).
H100_MEASURED: tuple[MeasuredPass, ...] = tuple(MeasuredPass(*row) for row in (
    ("vcppo", "actor", "forward", 2, 5168, 0.07557),
    ("vcppo", "critic", "forward", 2, 5168, 0.06872),
    ("vcppo", "actor", "update", 6, 5168, 0.21660),
    ("vcppo", "critic", "update", 6, 5168, 0.18868),
    ("long", "critic", "forward", 2, 41472, 0.16716),
    ("longckpt", "critic", "forward", 2, 41472, 0.17507),
    ("longckpt", "critic", "update", 8, 41472, 0.74024),
    ("longfit", "actor", "forward", 2, 20736, 0.12442),
    ("longfit", "critic", "forward", 2, 41472, 0.16332),
    ("longfit", "actor", "update", 8, 20736, 0.50847),
    ("longfit", "critic", "update", 8, 41472, 0.67310),
    ("longpacked", "actor", "forward", 2, 15081, 0.09433),
    ("longpacked", "critic", "forward", 2, 15081, 0.07778),
    ("longpacked", "actor", "update", 8, 15081, 0.37055),
    ("longpacked", "critic", "update", 8, 15081, 0.31634),
))


@dataclass(frozen=True)
class PassModel:
    """t_mb = overhead_s x layers / 24 + F_mb / (peak x efficiency) (see the module docstring)."""
    overhead_s: float
    efficiency: float

    def seconds(self, flops: float, layers: int, peak: float) -> float:
        return self.overhead_s * layers / REFERENCE_LAYERS + flops / (peak * self.efficiency)

    def mfu(self, flops: float, layers: int, peak: float) -> float:
        return flops / peak / self.seconds(flops, layers, peak)


def fit_pass_model(points: list[MeasuredPass]) -> PassModel:
    """Least squares of seconds per micro-batch against FLOPs per micro-batch (a line: intercept =
    the fixed cost, slope = 1 / (peak x efficiency))."""
    xs, ys = [p.flops for p in points], [p.seconds_per_micro_batch for p in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return PassModel(overhead_s=my - slope * mx, efficiency=1 / (slope * H100_BF16_PEAK))


PASS_MODELS: dict[str, PassModel] = {kind: fit_pass_model([p for p in H100_MEASURED if p.kind == kind])
                                     for kind in ("forward", "update")}


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


def step_passes(cfg) -> dict[str, tuple[int, int]]:
    """{role: (forward-only passes, training passes)} over one PPO step's tokens, read from the
    driver's own step plan (:func:`vcppo.driver.step.step_plan.ppo_plan`, which imports without torch): pi_old
    and V_old from a pass where the plan says so, a reference pass when a KL is on (through the
    actor's weights under LoRA), and the reward model's scoring every step."""
    from vcppo.driver.step.step_plan import Source, ppo_plan

    plan = ppo_plan(cfg)
    out = {"actor": (int(plan.pi_old is Source.PASS), cfg.actor.ppo_epochs)}
    if plan.v_old is not Source.NONE:
        out["critic"] = (int(plan.v_old is Source.PASS), cfg.critic.ppo_epochs)
    if plan.reference_pass:
        out["reference"] = (1, 0)
    if cfg.reward.model_path:
        out["reward_model"] = (1, 0)
    return out


@dataclass(frozen=True)
class TrainedModel:
    """FLOP accounting of one engine in one step, and the micro-batches its passes run in (per rank:
    ``micro_batches`` of ``micro_batch_tokens`` computed tokens each, padding included)."""
    role: str
    n_params: int
    forward_passes: int        # forward-only passes over the step's tokens (old logprobs, values)
    train_passes: int          # forward + backward passes (PPO epochs)
    checkpointing: bool
    frozen_weights: bool = False  # LoRA: no weight gradients for the base weights
    num_layers: int = REFERENCE_LAYERS
    micro_batches: int = 1
    micro_batch_tokens: float = 0.0    # one rank's tokens of a micro-batch (its slice under SP)
    sequence_parallel: int = 1
    exchange_bytes_per_token: float = 0.0  # the all-to-all bytes a rank sends per layer per token, forward
    link_bandwidth: float = math.inf       # bytes/s of the SP group's link

    @property
    def train_flops_per_token(self) -> int:
        """x N: 6 (4 with LoRA's frozen weights), 2 more with checkpointing."""
        return (4 if self.frozen_weights else 6) + (2 if self.checkpointing else 0)

    def exchange_seconds(self, kind: str) -> float:
        """Ulysses' all-to-all time of one pass over the rank's micro-batches (module docstring):
        1 exchange per layer for a forward, 2 for an update, 3 with checkpointing."""
        if self.sequence_parallel <= 1:
            return 0.0
        exchanges = 1 if kind == "forward" else 2 + int(self.checkpointing)
        volume = exchanges * self.num_layers * self.micro_batches * self.micro_batch_tokens
        return volume * self.exchange_bytes_per_token / self.link_bandwidth


def alltoall_bytes_per_token(shape, dtype_bytes: int, sp: int) -> float:
    """Bytes one rank of an SP group of ``sp`` sends per layer per token of its slice in a forward:
    d (2 q_dim + 2 kv_dim) (sp - 1) / sp, KV heads replicated to sp when fewer (module docstring);
    0 without SP."""
    if sp <= 1:
        return 0.0
    kv_dim = max(shape.num_kv_heads, sp) * shape.head_dim
    return dtype_bytes * (2 * shape.q_dim + 2 * kv_dim) * (sp - 1) / sp


def training_flops(model: TrainedModel, tokens: float) -> float:
    per_train_pass = model.train_flops_per_token * model.n_params * tokens
    return model.forward_passes * 2 * model.n_params * tokens + model.train_passes * per_train_pass


def phase_seconds(model: TrainedModel, kind: str, hw: Hardware, dtype_bytes: int) -> float:
    """One pass (``kind`` "forward" or "update") of ``model`` over its rank's micro-batches, by the
    measured pass model (:data:`PASS_MODELS`)."""
    mult = 2 if kind == "forward" else model.train_flops_per_token
    flops = mult * model.n_params * model.micro_batch_tokens
    return model.micro_batches * PASS_MODELS[kind].seconds(flops, model.num_layers, hw.flops(dtype_bytes))


def training_seconds(models: list[TrainedModel], tokens: float, hw: Hardware, dtype_bytes: int,
                     gpus: int, mfu: float | None = None) -> float:
    """All engines' passes of a step over ``gpus`` GPUs: at a constant ``mfu`` of the dense peak
    (``CPU_MFU`` on a CPU "device" when None), else by the measured pass model per micro-batch; plus
    the sequence-parallel all-to-all (:meth:`TrainedModel.exchange_seconds`)."""
    exchange = sum(m.forward_passes * m.exchange_seconds("forward") + m.train_passes * m.exchange_seconds("update")
                   for m in models)
    if mfu is not None or hw.is_cpu:
        flops = sum(training_flops(m, tokens) for m in models)
        return flops / (gpus * hw.flops(dtype_bytes) * (mfu if mfu is not None else CPU_MFU)) + exchange
    return exchange + sum(m.forward_passes * phase_seconds(m, "forward", hw, dtype_bytes)
                          + m.train_passes * phase_seconds(m, "update", hw, dtype_bytes) for m in models)


def replica_sequences(total_sequences: int, replicas: int) -> int:
    """Sequences of the busiest replica when the step's sequences are dealt out evenly."""
    return math.ceil(total_sequences / max(1, replicas))
