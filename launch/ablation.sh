#!/usr/bin/env bash
# The paper's ablation at small scale: ppo / vcppo_no_dgae / vcppo / grpo / vapo x 3 seeds, plus a
# lambda_actor sweep for vcppo, from the demo's SFT model (run `make demo` first).
#   launch/ablation.sh [--dry-run]
set -euo pipefail
cd "$(dirname "$0")/.."
VCPPO="${VCPPO:-$( [ -x .venv/bin/vcppo ] && echo .venv/bin/vcppo || echo vcppo )}"
"$VCPPO" sweep configs/sweeps/ablation.yaml --keep-going "$@"
"$VCPPO" sweep configs/sweeps/lambda_actor.yaml --keep-going "$@"
