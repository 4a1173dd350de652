#!/usr/bin/env bash
# Reuse of each batch (docs/results.md, "Which method for which regime?"): chain/ built as for the ablation
# (launch/chain_build.sh), then the sweep regimes_reuse: VC-PPO, GRPO and GSPO at 16 x 4 with the actor's
# update in 4 and in 8 optimizer steps a batch, 3 seeds (vcppo/configs/sweeps/regimes_reuse.yaml).
# Everything goes under chain/ and runs/ in the working directory; a finished stage or run is skipped on
# a rerun.
#   launch/regimes_reuse.sh [--dry-run]
# One run at a time (18 runs).
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
VCPPO="${VCPPO:-$( [ -x "$REPO/.venv/bin/vcppo" ] && echo "$REPO/.venv/bin/vcppo" || echo vcppo )}"
[[ " $* " == *" --dry-run "* ]] || "$REPO/launch/chain_build.sh"
"$VCPPO" sweep regimes_reuse --keep-going "$@"
