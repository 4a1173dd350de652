#!/usr/bin/env bash
# The `chain` experiments' shared inputs in ./DIR (docs/results.md): data (2..OPERANDS one-digit operands), the
# demo's small model, SFT with the demo preset's recipe (constant lr after warm-up) run to 1000 steps instead of a
# target, and the reward model. A stage that exists is skipped. Called by chain_ablation.sh, split_chain.sh and the
# regimes launchers; regimes_length.sh builds chain_long/ with 24 operands.
#   launch/chain_build.sh [DIR [OPERANDS]]      (default: chain 8)
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
VCPPO="${VCPPO:-$( [ -x "$REPO/.venv/bin/vcppo" ] && echo "$REPO/.venv/bin/vcppo" || echo vcppo )}"
DIR="${1:-chain}"
OPERANDS="${2:-8}"
[ -f "$DIR/data/train.parquet" ] || "$VCPPO" data make --task chain --out "$DIR/data" --n 20000 --n-eval 300 \
  --difficulty 1 --operands "$OPERANDS" --seed 0
[ -f "$DIR/init-small/config.json" ] || "$VCPPO" model make --size small --out "$DIR/init-small"
[ -f "$DIR/sft/sft_summary.json" ] || "$VCPPO" sft demo "demo.workdir=$DIR" sft.steps=1000 \
  sft.target_accuracy=0 sft.max_minutes=0 sft.eval_every=100 logging.wandb=false
[ -f "$DIR/rm/rm_summary.json" ] || "$VCPPO" rm demo "demo.workdir=$DIR" logging.wandb=false
