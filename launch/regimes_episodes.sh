#!/usr/bin/env bash
# Episodes with feedback (docs/results.md, "Which method for which regime?"): guess/ and chain_tools/ built
# as `vcppo demo demo_guess` and `vcppo demo demo_chain_tools` build them (data, the small model, SFT), then
# the sweep regimes_episodes (VC-PPO at 16 x 4 and 64 x 1, PPO, GRPO, RLOO and REINFORCE++-baseline on
# `guess`) and the sweep regimes_tools (VC-PPO at 16 x 4 and 64 x 1, GRPO and RLOO on `chain_tools`), 3
# seeds each (vcppo/configs/sweeps/). Everything goes under guess/, chain_tools/ and runs/ in the working
# directory; a finished stage or run is skipped on a rerun.
#   launch/regimes_episodes.sh [--dry-run]
# One run at a time (18 + 12 runs).
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
VCPPO="${VCPPO:-$( [ -x "$REPO/.venv/bin/vcppo" ] && echo "$REPO/.venv/bin/vcppo" || echo vcppo )}"
if [[ " $* " != *" --dry-run "* ]]; then
  "$REPO/launch/episodes_build.sh" guess
  "$REPO/launch/episodes_build.sh" chain_tools
fi
rc=0  # a failed run of the first sweep does not keep the second from running
"$VCPPO" sweep regimes_episodes --keep-going "$@" || rc=$?
"$VCPPO" sweep regimes_tools --keep-going "$@" || rc=$?
exit $rc
