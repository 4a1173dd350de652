"""`vcppo bench <benchmark> [args]`: the benchmarks, in one place.

    vcppo bench gae [--shapes 256x1024,...] [--repeats 5] [--threads N] [--json PATH]
    vcppo bench rollout [--model DIR] [--prompts 64 --n 4 --max-tokens 128] [--json PATH]

``gae`` (:mod:`vcppo.bench.gae`): the fused Decoupled-GAE vs the reference loop vs a copy floor.
``rollout`` (:mod:`vcppo.bench.rollout`): vLLM vs HF generate tokens/s, weight sync time and one
training step split into its parts, on one rank. ``vcppo bench <benchmark> -h`` lists its options.
"""
from __future__ import annotations

import sys

from vcppo.cli import pick

# benchmark -> (module with `main(argv)`, one-line help)
BENCHMARKS: dict[str, tuple[str, str]] = {
    "gae": ("vcppo.bench.gae", "fused Decoupled-GAE vs the reference loop vs a memory-copy floor"),
    "rollout": ("vcppo.bench.rollout", "vLLM vs HF generate tokens/s, weight sync, training step split"),
}


def main(argv: list[str] | None = None) -> int:
    picked = pick("vcppo bench", BENCHMARKS, list(sys.argv[1:] if argv is None else argv), "benchmarks")
    if isinstance(picked, int):
        return picked
    module, rest = picked
    result = module.main(rest)
    return result if isinstance(result, int) else 0  # rollout's main returns its figures (a dict)
