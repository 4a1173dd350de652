#!/usr/bin/env bash
# Single-rollout RL (docs/results.md, "Single-rollout RL: does SAO's recipe pay here?"): chain/ built as for
# the ablation (launch/chain_build.sh), then the sweep regimes_sao: `sao` (frozen-attention critic and full
# critic) and VC-PPO at 64 prompts x 1 sample against Dr. GRPO at 16 x 4, 3 seeds
# (vcppo/configs/sweeps/regimes_sao.yaml). Everything goes under chain/ and runs/ in the working
# directory; a finished stage or run is skipped on a rerun.
#   launch/regimes_sao.sh [--dry-run]
# One run at a time (12 runs).
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
VCPPO="${VCPPO:-$( [ -x "$REPO/.venv/bin/vcppo" ] && echo "$REPO/.venv/bin/vcppo" || echo vcppo )}"
[[ " $* " == *" --dry-run "* ]] || "$REPO/launch/chain_build.sh"
"$VCPPO" sweep regimes_sao --keep-going "$@"
