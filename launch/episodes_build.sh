#!/usr/bin/env bash
# An episodes task's shared inputs in ./TASK, as `vcppo demo demo_TASK` builds them: data, the demo's small model,
# SFT with the demo_TASK preset. A stage that exists is skipped. Called by regimes_episodes.sh (guess, chain_tools)
# and regimes_sao_tools.sh (chain_tools).
#   launch/episodes_build.sh TASK      (guess or chain_tools)
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
VCPPO="${VCPPO:-$( [ -x "$REPO/.venv/bin/vcppo" ] && echo "$REPO/.venv/bin/vcppo" || echo vcppo )}"
TASK="$1"
[ -f "$TASK/data/train.parquet" ] || "$VCPPO" data make --task "$TASK" --out "$TASK/data"
[ -f "$TASK/init-small/config.json" ] || "$VCPPO" model make --size small --out "$TASK/init-small"
[ -f "$TASK/sft/sft_summary.json" ] || "$VCPPO" sft "demo_$TASK" "demo.workdir=$TASK" logging.wandb=false
