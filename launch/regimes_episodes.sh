#!/usr/bin/env bash
# Episodes with feedback (docs/results.md, "Which method for which regime?"): guess/ built as `vcppo demo
# demo_guess` builds it (data, the small model, SFT until greedy validation solves half the numbers), then
# the sweep regimes_episodes: VC-PPO at 16 x 4 and 64 x 1, PPO, GRPO, RLOO and REINFORCE++-baseline on
# `guess` episodes, 3 seeds (vcppo/configs/sweeps/regimes_episodes.yaml). Everything goes under guess/ and
# runs/ in the working directory; a finished stage or run is skipped on a rerun.
#   launch/regimes_episodes.sh [--dry-run]
# One run at a time (18 runs).
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
VCPPO="${VCPPO:-$( [ -x "$REPO/.venv/bin/vcppo" ] && echo "$REPO/.venv/bin/vcppo" || echo vcppo )}"
if [[ " $* " != *" --dry-run "* ]]; then
  [ -f guess/data/train.parquet ] || "$VCPPO" data make --task guess --out guess/data
  [ -f guess/init-small/config.json ] || "$VCPPO" model make --size small --out guess/init-small
  [ -f guess/sft/sft_summary.json ] || "$VCPPO" sft demo_guess demo.workdir=guess logging.wandb=false
fi
"$VCPPO" sweep regimes_episodes --keep-going "$@"
