"""`vcppo bench <benchmark> [args]`: the benchmarks, in one place.

    vcppo bench gae [--shapes 256x1024,...] [--repeats 5] [--threads N] [--json PATH]
    vcppo bench rollout [--model DIR] [--prompts 64 --n 4 --max-tokens 128] [--json PATH]
    vcppo bench mismatch [--model DIR | --size small] [--dtypes float32,bfloat16] [--json PATH]
    vcppo bench reward [--samples 512] [--hostile 4] [--workers 1,2] [--timeout 5] [--json PATH]
    vcppo bench train [--models small,medium] [--batch 8] [--budget 4096] [--json PATH]
    vcppo bench logprobs [--size qwen2.5-0.5b-shape] [--shapes 1x512+4096] [--chunks 0,1024] [--json PATH]
    vcppo bench step [--size small] [--micro-batch 16,64] [--steps 6] [--trl] [--json PATH]
    vcppo bench precision [--model DIR | --size small] [--data FILE] [--lr 5e-6] [--epochs 3] [--json PATH]
    vcppo bench grpo-trl CONFIG [section.key=value ...] [--save-at 10,20] [--eval] [--out DIR] [--json PATH]
    vcppo bench split [--workload tail|demo] [--modes colocated,split0,split1] [--png PATH] [--json PATH]
    vcppo bench lora [--sizes small,medium] [--rank 16] [--syncs 3] [--rounds 3] [--json PATH]
    vcppo bench shape [--ranks 2] [--steps 2] [--lora-rank 16] [--json PATH]
    vcppo bench sp [--sizes 1,2] [--layers 24] [--tokens 8192] [--dtype float32] [--lora 0] [--json PATH]
    vcppo bench episodes [--size small] [--turns 4 --turn-tokens 32] [--env-latency-ms 0,50] [--json PATH]

``gae`` (:mod:`vcppo.bench.gae`): the fused Decoupled-GAE vs the reference loop vs a copy floor.
``rollout`` (:mod:`vcppo.bench.rollout`): vLLM vs HF generate tokens/s, weight sync time and one
training step split into its parts, on one rank. ``train`` (:mod:`vcppo.bench.train`): padded vs
packed (padding-free) actor forward and train step on a long-tailed batch. ``logprobs``
(:mod:`vcppo.bench.logprobs`): the full-logits path against the chunked logprob path, peak memory and
tokens/s of the actor's forward and train step. ``step``
(:mod:`vcppo.bench.step`): the driver's real ``rl_step`` timed by phase, with ``--trl`` side by
side with TRL's PPOTrainer on the same model, prompts and batch. ``precision``
(:mod:`vcppo.bench.precision`): how far the same AdamW steps move the policy in fp32, bf16 (from an fp32
or a bf16 checkpoint) and bf16 autocast. ``grpo-trl``
(:mod:`vcppo.bench.trl_grpo`): TRL's GRPOTrainer on a grpo / drgrpo run's own model, data, reward and
settings, its policies scored by ``vcppo eval``. ``lora`` (:mod:`vcppo.bench.lora`):
a LoRA actor's sync into vLLM as merged weights vs as vLLM's own LoRA, and decode speed with each.
``shape`` (:mod:`vcppo.bench.shape`): Qwen2.5-0.5B's shape on 2 CPU ranks: peak memory per rank against
`vcppo plan`, weight sync against a plain copy, checkpoint size, write and restore time. ``sp``
(:mod:`vcppo.bench.sp`): the actor's train step on one long sequence per CPU rank at each
sequence-parallel size, peak memory per rank and tokens/s. ``episodes`` (:mod:`vcppo.bench.episodes`):
model tokens/s of K-turn episodes against one-turn samples of the same length on one engine.
``vcppo bench <benchmark> -h`` lists its options.
"""
from __future__ import annotations

import json
import os
import sys

from vcppo.cli import pick

# benchmark -> (module with `main(argv)`, one-line help)
BENCHMARKS: dict[str, tuple[str, str]] = {
    "gae": ("vcppo.bench.gae", "fused Decoupled-GAE vs the reference loop vs a memory-copy floor"),
    "rollout": ("vcppo.bench.rollout", "vLLM vs HF generate tokens/s, weight sync, training step split"),
    "mismatch": ("vcppo.bench.mismatch", "vLLM vs trainer logprobs by dtype: |delta|, KL, TIS weights"),
    "reward": ("vcppo.bench.reward", "reward scoring: serial vs the process pool, with hostile answers"),
    "train": ("vcppo.bench.train", "padded vs packed actor passes on a long-tailed batch: tokens/s, peak memory"),
    "logprobs": ("vcppo.bench.logprobs", "full logits vs the chunked logprob path: actor peak memory and tokens/s"),
    "step": ("vcppo.bench.step", "one real PPO step by phase (median of steps 2-N); --trl: vs TRL's PPOTrainer"),
    "precision": ("vcppo.bench.precision", "how far the same AdamW steps move the policy: fp32, bf16, bf16 checkpoint, autocast"),
    "grpo-trl": ("vcppo.bench.trl_grpo", "TRL's GRPOTrainer on a grpo run's model, data, reward and settings"),
    "split": ("vcppo.bench.split", "colocated vs split placement (staleness 0 / 1): steps/h, per-rank timeline"),
    "lora": ("vcppo.bench.lora", "a LoRA actor into vLLM: merged weights vs vLLM's LoRA, sync time and decode tok/s"),
    "sp": ("vcppo.bench.sp", "sequence parallelism on CPU ranks: the actor's train step on one long sequence per rank, memory and tokens/s"),
    "episodes": ("vcppo.bench.episodes", "K-turn episodes vs one-turn samples of the same model tokens: tok/s, env latency"),
    "shape": ("vcppo.bench.shape", "Qwen2.5-0.5B's shape on 2 CPU ranks: memory vs `vcppo plan`, sync, checkpoints"),
}


def main(argv: list[str] | None = None) -> int:
    picked = pick("vcppo bench", BENCHMARKS, list(sys.argv[1:] if argv is None else argv), "benchmarks")
    if isinstance(picked, int):
        return picked
    module, rest = picked
    result = module.main(rest)
    return result if isinstance(result, int) else 0  # rollout's / step's main return their figures (a dict)


def write_json(path: str | None, results: dict) -> None:
    """A benchmark's ``--json PATH`` (nothing when None), its folder created."""
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump(results, f, indent=1)
