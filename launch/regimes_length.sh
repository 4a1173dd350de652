#!/usr/bin/env bash
# Length (docs/results.md, "Which method for which regime?"): chain_long/ built like chain/ but with 2..24
# one-digit operands (launch/chain_build.sh chain_long 24), then the sweep regimes_length: VC-PPO at 64 x 1 and
# 16 x 4 against GRPO at 16 x 4, and VC-PPO 64 x 1 at lambda_actor 0.95
# and 1.0, 3 seeds (vcppo/configs/sweeps/regimes_length.yaml). Everything goes under
# chain_long/ and runs/ in the working directory; a finished stage or run is skipped on a rerun.
#   launch/regimes_length.sh [--dry-run]
# One run at a time (15 runs).
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
VCPPO="${VCPPO:-$( [ -x "$REPO/.venv/bin/vcppo" ] && echo "$REPO/.venv/bin/vcppo" || echo vcppo )}"
[[ " $* " == *" --dry-run "* ]] || "$REPO/launch/chain_build.sh" chain_long 24
"$VCPPO" sweep regimes_length --keep-going "$@"
