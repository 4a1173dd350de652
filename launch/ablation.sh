#!/usr/bin/env bash
# The paper's ablation at small scale: ppo / vcppo_no_dgae / vcppo / grpo / vapo x 3 seeds, plus a
# lambda_actor sweep for vcppo, and ppo vs vcppo with a slow critic (the paper's regime), from
# the demo's SFT model. The sweeps ship with the package (vcppo/configs/sweeps/, run by name).
# Run it where `make demo` ran (the presets point at artifacts/ relative to the working
# directory); results go to runs/ there.
#   launch/ablation.sh [--dry-run]
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
VCPPO="${VCPPO:-$( [ -x "$REPO/.venv/bin/vcppo" ] && echo "$REPO/.venv/bin/vcppo" || echo vcppo )}"
# The `ppo` preset's critic starts from the reward model; `vcppo demo` trains one only when its
# own preset needs it, so build it here once (from the demo's SFT model and settings).
if [ ! -f artifacts/rm/rm_summary.json ] && [[ " $* " != *" --dry-run "* ]]; then
  "$VCPPO" rm artifacts/demo_config.yaml
fi
"$VCPPO" sweep ablation --keep-going "$@"
"$VCPPO" sweep lambda_actor --keep-going "$@"
"$VCPPO" sweep slow_critic --keep-going "$@"
