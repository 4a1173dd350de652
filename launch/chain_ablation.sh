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
[[ " $* " == *" --dry-run "* ]] || "$REPO/launch/chain_build.sh"
"$VCPPO" sweep chain_ablation --keep-going "$@"
"$VCPPO" sweep chain_lambda --keep-going "$@"
"$VCPPO" sweep chain_vp_budget --keep-going "$@"
