#!/usr/bin/env bash
# Equal samples, no groups for the critic (docs/results.md, "Which method for which regime?"): chain/
# built as for the ablation (launch/chain_build.sh), then the sweep regimes_samples: VC-PPO and PPO at 64
# prompts x 1 sample against GRPO, RLOO, Dr. GRPO and VC-PPO at 16 x 4, 3 seeds
# (vcppo/configs/sweeps/regimes_samples.yaml). Everything goes under chain/ and runs/ in the working
# directory; a finished stage or run is skipped on a rerun.
#   launch/regimes_samples.sh [--dry-run]
# One run at a time (18 runs).
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
VCPPO="${VCPPO:-$( [ -x "$REPO/.venv/bin/vcppo" ] && echo "$REPO/.venv/bin/vcppo" || echo vcppo )}"
[[ " $* " == *" --dry-run "* ]] || "$REPO/launch/chain_build.sh"
"$VCPPO" sweep regimes_samples --keep-going "$@"
