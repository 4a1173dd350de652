#!/usr/bin/env bash
# Does split placement learn as well? (docs/results.md): VC-PPO on `chain` at lambda_actor 0.8, colocated
# synchronous against split with staleness 1, both over 2 ranks of one thread (torchrun), and split with
# staleness 1 and the critic on a rank of its own (3 ranks: actor, critic, rollout), 3 seeds, 50 PPO steps
# after 80 value-pretraining steps (one cached critic for every run). Builds chain/ with
# launch/chain_build.sh (skipped where it exists); runs go to runs/split_chain/. A finished run is skipped.
# SEEDS and MODES (sync split1 split1c) choose a subset.
#   launch/split_chain.sh
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
VCPPO="${VCPPO:-$( [ -x "$REPO/.venv/bin/vcppo" ] && echo "$REPO/.venv/bin/vcppo" || echo vcppo )}"
PY="$(dirname "$(command -v "$VCPPO" || echo "$VCPPO")")/python"
export VLLM_ENABLE_V1_MULTIPROCESSING=0 WANDB_MODE=offline
"$REPO/launch/chain_build.sh"
COMMON=(model.policy_path=chain/sft model.tokenizer_path=chain/sft model.critic_path=chain/rm
  data.train_files=chain/data/train.parquet data.val_files=chain/data/val.parquet trainer.total_steps=50
  trainer.prompts_per_step=16 rollout.n_samples_per_prompt=4 rollout.max_response_tokens=128 trainer.val_every=10
  trainer.val_max_prompts=128 trainer.save_every=25 value_pretrain.early_stop=false value_pretrain.steps=80
  value_pretrain.cache_dir=chain/critic_cache algorithm.lambda_actor=0.8 logging.wandb=false
  logging.progress_bar=false trainer.output_root=runs/split_chain)
for seed in ${SEEDS:-0 1 2}; do
  for mode in ${MODES:-sync split1 split1c}; do
    placement=(placement.mode=colocated) ranks=2
    [ "$mode" != sync ] && placement=(placement.mode=split trainer.max_staleness=1 algorithm.rollout_is_cap=2)
    [ "$mode" = split1c ] && placement+=(placement.critic_ranks=1) ranks=3
    name="vcppo-$mode-seed$seed"
    [ -f "runs/split_chain/$name/final/actor/config.json" ] && continue
    echo "[$(date +%T)] $name"
    OMP_NUM_THREADS=1 "$PY" -m torch.distributed.run --nproc_per_node "$ranks" --master_port "${MASTER_PORT:-29700}" \
      -m vcppo.cli train vcppo "${COMMON[@]}" "${placement[@]}" trainer.seed="$seed" trainer.run_name="$name"
  done
done
"$VCPPO" report runs/split_chain/vcppo-*-seed* --out runs/split_chain/report \
  --title "chain, lambda_actor 0.8: colocated synchronous vs split, staleness 1 (+ critic rank)"
