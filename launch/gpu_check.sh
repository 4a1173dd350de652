#!/usr/bin/env bash
# GPU verification on a single-GPU machine with no internet (budget: under 8 minutes).
#   launch/gpu_check.sh [OUT_DIR]
# 1. the `gpu`-marked tests (Triton GAE kernel on CUDA, bf16 paths)
# 2. the GAE benchmark: Triton kernel vs fused torch vs reference loop vs a device copy floor
# 3. a short real VC-PPO run of the `base` model (vLLM + DeepSpeed on CUDA): rollout tokens/s,
#    seconds per step by phase, GPU memory peak — skipped, with the reason, where vllm or
#    deepspeed is not importable (a CUDA vLLM wheel is far larger than what a bare GPU box can be
#    handed; install the `gpu` extra first: `make install` on a CUDA machine does).
# Everything it prints is also written under OUT_DIR (default: $OUT or runs/gpu_check).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${1:-${OUT:-runs/gpu_check}}"
mkdir -p "$OUT_DIR"
PY="${PY:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
export PYTHONUNBUFFERED=1 VLLM_ENABLE_V1_MULTIPROCESSING=0 WANDB_MODE=offline
log() { echo "[gpu_check $(date +%H:%M:%S)] $*" | tee -a "$OUT_DIR/summary.txt"; }

log "machine: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -1)"
"$PY" -c "import torch, sys; print('torch', torch.__version__, 'cuda', torch.cuda.is_available()); sys.exit(0 if torch.cuda.is_available() else 1)" \
  | tee -a "$OUT_DIR/summary.txt" || { log "no CUDA device visible: stopping"; exit 1; }

log "1/3 gpu tests"
timeout 120 "$PY" -m pytest -m gpu -q -p no:cacheprovider tests 2>&1 | tee "$OUT_DIR/gpu_tests.txt" | tail -5
log "gpu tests exit code ${PIPESTATUS[0]}"

log "2/3 GAE benchmark"
timeout 150 "$PY" -m vcppo.cli bench gae --json "$OUT_DIR/bench_gae.json" 2>&1 | tee "$OUT_DIR/bench_gae.txt"

log "3/3 short VC-PPO run of the base model"
if ! "$PY" -c "import vllm, deepspeed" >/dev/null 2>&1; then
  log "skipped: vllm and/or deepspeed are not importable here"
  exit 0
fi
W="$OUT_DIR/work"
"$PY" -m vcppo.cli data make --task add --out "$W/data" --n 2000 --n-eval 64 >/dev/null
"$PY" -m vcppo.cli model make --size base --out "$W/base" >/dev/null
timeout 240 "$PY" -m vcppo.cli train vcppo model.policy_path="$W/base" \
  data.train_files="$W/data/train.parquet" data.val_files="$W/data/val.parquet" \
  trainer.output_root="$W/runs" trainer.run_name=gpu-check trainer.total_steps=4 trainer.prompts_per_step=64 \
  rollout.n_samples_per_prompt=8 rollout.max_response_tokens=256 rollout.gpu_memory_utilization=0.4 \
  rollout.enforce_eager=false value_pretrain.steps=2 trainer.val_every=0 trainer.val_max_prompts=64 \
  trainer.save_every=0 actor.micro_batch_size=64 critic.micro_batch_size=64 logging.progress_bar=false \
  2>&1 | tail -20 | tee "$OUT_DIR/train_tail.txt"
"$PY" - "$W/runs/gpu-check" <<'PY' | tee -a "$OUT_DIR/summary.txt"
import sys
from vcppo.tracking import read_metrics
recs = sorted(read_metrics(sys.argv[1], "ppo"), key=lambda r: r["step"])
for r in recs:
    phases = {k[5:-2]: round(v, 2) for k, v in r.items() if k.startswith("time/") and k.endswith("_s")}
    print(f"step {r['step']}: rollout tok/s {r.get('perf/rollout_tokens_per_s', 0):.0f}, "
          f"gpu mem peak {r.get('perf/gpu_mem_peak_gb', float('nan')):.1f} GB, seconds by phase {phases}")
PY
