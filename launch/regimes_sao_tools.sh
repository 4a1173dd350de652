#!/usr/bin/env bash
# Single-rollout RL on episodes (docs/results.md, "Single-rollout RL: does SAO's recipe pay here?"): chain_tools/
# built as `vcppo demo demo_chain_tools` builds it (data, the small model, SFT), then the sweep regimes_sao_tools:
# `sao` and VC-PPO at 64 prompts x 1 episode against GRPO at 16 x 4, then `sao` with the full critic, 3 seeds
# (vcppo/configs/sweeps/regimes_sao_tools.yaml). Everything goes under chain_tools/ and runs/ in the working
# directory; a finished stage or run is skipped on a rerun.
#   launch/regimes_sao_tools.sh [--dry-run]
# One run at a time (12 runs).
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
VCPPO="${VCPPO:-$( [ -x "$REPO/.venv/bin/vcppo" ] && echo "$REPO/.venv/bin/vcppo" || echo vcppo )}"
[[ " $* " == *" --dry-run "* ]] || "$REPO/launch/episodes_build.sh" chain_tools
"$VCPPO" sweep regimes_sao_tools --keep-going "$@"
