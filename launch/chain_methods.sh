#!/usr/bin/env bash
# VC-PPO against the critic-free methods on `chain` (docs/results.md, "Which method learns `chain` fastest
# here?"): chain/ built as for the ablation (launch/chain_build.sh), then the sweep chain_methods: VC-PPO, PPO,
# GRPO, RLOO, REINFORCE++-baseline, Dr. GRPO and GSPO x 3 seeds (vcppo/configs/sweeps/chain_methods.yaml).
# Everything goes under chain/ and runs/ in the working directory; a finished stage or run is skipped on a rerun.
#   launch/chain_methods.sh [--dry-run]
# One run at a time (~2-5 min each on 2 idle CPU cores, 21 runs).
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
VCPPO="${VCPPO:-$( [ -x "$REPO/.venv/bin/vcppo" ] && echo "$REPO/.venv/bin/vcppo" || echo vcppo )}"
[[ " $* " == *" --dry-run "* ]] || "$REPO/launch/chain_build.sh"
"$VCPPO" sweep chain_methods --keep-going "$@"
