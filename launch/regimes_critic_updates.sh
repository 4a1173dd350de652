#!/usr/bin/env bash
# Critic updates per policy update (docs/results.md, "Which method for which regime?"): chain/ built as
# for the ablation (launch/chain_build.sh), then the sweep regimes_critic_updates: VC-PPO at 64 prompts x
# 1 sample with critic.ppo_epochs 2 and 4 and with the critic's lr x3, 3 seeds
# (vcppo/configs/sweeps/regimes_critic_updates.yaml). Everything goes under chain/ and runs/ in the working
# directory; a finished stage or run is skipped on a rerun.
#   launch/regimes_critic_updates.sh [--dry-run]
# One run at a time (9 runs).
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
VCPPO="${VCPPO:-$( [ -x "$REPO/.venv/bin/vcppo" ] && echo "$REPO/.venv/bin/vcppo" || echo vcppo )}"
[[ " $* " == *" --dry-run "* ]] || "$REPO/launch/chain_build.sh"
"$VCPPO" sweep regimes_critic_updates --keep-going "$@"
