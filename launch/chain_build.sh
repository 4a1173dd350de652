#!/usr/bin/env bash
# The `chain` experiments' shared inputs in ./chain (docs/results.md): data (2..8 one-digit operands), the demo's
# small model, SFT with the demo preset's recipe (constant lr after warm-up) run to 1000 steps instead of a
# target, and the reward model. A stage that exists is skipped. Called by chain_ablation.sh and split_chain.sh.
#   launch/chain_build.sh
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
VCPPO="${VCPPO:-$( [ -x "$REPO/.venv/bin/vcppo" ] && echo "$REPO/.venv/bin/vcppo" || echo vcppo )}"
[ -f chain/data/train.parquet ] || "$VCPPO" data make --task chain --out chain/data --n 20000 --n-eval 300 \
  --difficulty 1 --operands 8 --seed 0
[ -f chain/init-small/config.json ] || "$VCPPO" model make --size small --out chain/init-small
[ -f chain/sft/sft_summary.json ] || "$VCPPO" sft demo demo.workdir=chain sft.steps=1000 \
  sft.target_accuracy=0 sft.max_minutes=0 sft.eval_every=100 logging.wandb=false
[ -f chain/rm/rm_summary.json ] || "$VCPPO" rm demo demo.workdir=chain logging.wandb=false
