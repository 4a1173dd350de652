#!/usr/bin/env bash
# The paper's experiments on `chain`, the task whose reasoning length the policy chooses (docs/results.md,
# "Does VC-PPO beat PPO here"): data (2..8 one-digit operands), the demo's
# small model, SFT at a constant lr for 1000 steps (val greedy ~0.84, T=1 accuracy ~0.4, oracle EV
# ~0.26), the reward model for `ppo`, then every preset x 3 seeds, the lambda_actor sweep and the
# value-pretraining budgets (vcppo/configs/sweeps/chain_*.yaml). Everything goes under chain/ and
# runs/ in the working directory; a finished stage is skipped on a rerun, and a sweep resumes its runs.
#   launch/chain_ablation.sh [--dry-run]
# The sweeps run one run at a time (~5 min each on 2 CPU cores). To use more cores, start each
# sweep in its own process: a run directory is locked while it trains, so two processes never share one.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
VCPPO="${VCPPO:-$( [ -x "$REPO/.venv/bin/vcppo" ] && echo "$REPO/.venv/bin/vcppo" || echo vcppo )}"
if [[ " $* " != *" --dry-run "* ]]; then
  [ -f chain/data/train.parquet ] || "$VCPPO" data make --task chain --out chain/data --n 20000 --n-eval 300 \
    --difficulty 1 --operands 8 --seed 0
  [ -f chain/init-small/config.json ] || "$VCPPO" model make --size small --out chain/init-small
  # the demo preset's SFT recipe (constant lr after warm-up), run to 1000 steps instead of a target
  [ -f chain/sft/sft_summary.json ] || "$VCPPO" sft demo demo.workdir=chain sft.steps=1000 \
    sft.target_accuracy=0 sft.max_minutes=0 sft.eval_every=100 logging.wandb=false
  [ -f chain/rm/rm_summary.json ] || "$VCPPO" rm demo demo.workdir=chain logging.wandb=false
fi
"$VCPPO" sweep chain_ablation --keep-going "$@"
"$VCPPO" sweep chain_lambda --keep-going "$@"
"$VCPPO" sweep chain_vp_budget --keep-going "$@"
