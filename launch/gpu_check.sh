#!/usr/bin/env bash
# GPU verification of the path a GPU cluster takes, on one or two GPUs with no internet
# (budget: about 10 minutes).
#   launch/gpu_check.sh [OUT_DIR]             OUT_DIR: the argument, else $GPU_CHECK_OUT, else $OUT,
#                                             else runs/gpu_check
#   DRY_RUN=1 launch/gpu_check.sh [OUT_DIR]   print the plan (every command, the TP size, the steps that
#                                             would be skipped) into OUT_DIR/summary.txt and run nothing
#                                             (CPU-safe; tested)
# Steps, each writing its figures under OUT_DIR (everything printed also lands in summary.txt), with
# the Python packages each needs besides torch:
#   1. bf16          bf16 supported; bf16 matmul / log-softmax error against fp32      bf16.json
#   2. gpu tests     pytest -m gpu (Triton GAE kernel on CUDA, DeepSpeed on CUDA, the actor in bf16
#                    under ZeRO-0 and ZeRO-3, packed passes; what needs vllm skips itself)  gpu_tests.log
#   2b. logprob mem  the actor's full-logits vs chunked response-logprob path at the Qwen2.5-0.5B shape:
#                    peak memory of a long micro-batch's train step (tests/gpu/test_logprob_memory.py;
#                    deepspeed)                                                        logprob_memory.json
#   3. GAE kernel    vcppo bench gae: Triton vs fused torch vs the loop vs a copy floor, and the
#                    achieved GB/s of each against the floor's                         bench_gae.json, gae_bandwidth.json
#   3b. vcppo_plan   vcppo plan of the 7B shape on 8 x H200 (estimates; no GPU needed)   plan_7b_h200.json
#   4. sleep / wake  vLLM (bf16, via RolloutEngine) frees memory on sleep(); the same greedy
#                    outputs after wake_up() (vllm, deepspeed)                         sleep_wake.json
#   5. mismatch      vLLM vs the DeepSpeed actor logprobs, fp32 vs bf16 (vcppo bench mismatch; vllm,
#                    deepspeed)                                                        mismatch.json
#   6. training      a short VC-PPO run of the GPU_CHECK_MODEL (default tiny) model in bf16, with
#                    TIS on (mismatch/ metrics): TP=2 over 2 ranks when 2+ GPUs are visible, else TP=1
#                    (vllm, deepspeed)                                                 train_summary.json
#   6b. 7B preset    two steps of the vcppo_7b_1node preset's settings on the same model   train_7b_preset_summary.json
# A step whose packages $PY cannot import (install the `gpu` extra: `make install` on a CUDA machine does)
# is skipped, not failed: its line in summary.txt says which package is missing and why, and a last
# `skipped:` line lists every skipped step. Every other step still runs (no vLLM: steps 1-3b). Exit
# status: 0 when every step that ran passed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${1:-${GPU_CHECK_OUT:-${OUT:-runs/gpu_check}}}"
mkdir -p "$OUT_DIR"
PY="${PY:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
export PYTHONUNBUFFERED=1 VLLM_ENABLE_V1_MULTIPROCESSING=0 WANDB_MODE=offline
# DeepSpeed's accelerator, for every step and the processes they start (the check stops below without
# CUDA): a leftover DS_ACCELERATOR=cpu would train the "GPU" steps on DeepSpeed's CPU accelerator.
export DS_ACCELERATOR=cuda
NUM_GPUS="${NUM_GPUS:-$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU' )}"
TP=1
[ "$NUM_GPUS" -ge 2 ] && TP=2
MODEL_SIZE="${GPU_CHECK_MODEL:-tiny}"
W="$OUT_DIR/work"
STATUS=0
log() { echo "[gpu_check $(date +%H:%M:%S)] $*" | tee -a "$OUT_DIR/summary.txt"; }

SKIPPED=""
declare -A IMPORT_RC=() IMPORT_WHY=()

# importable MODULE: whether $PY imports MODULE (asked once per module). DRY_RUN only looks it up
# (importlib.util.find_spec), importing nothing.
importable() {
  local m=$1 out rc
  if [ -z "${IMPORT_RC[$m]+set}" ]; then
    if [ -n "${DRY_RUN:-}" ]; then
      out=$("$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$m') is None)" 2>&1)
      rc=$?
      [ "$rc" -eq 0 ] || out="not found by $PY"
    else
      out=$("$PY" -c "import $m" 2>&1)
      rc=$?
    fi
    IMPORT_RC[$m]=$rc
    IMPORT_WHY[$m]=$(printf '%s\n' "$out" | grep -v '^[[:space:]]*$' | tail -1)
  fi
  return "${IMPORT_RC[$m]}"
}

# step NAME TIMEOUT_S NEEDS CMD...: NEEDS: the packages CMD imports besides torch ("vllm,deepspeed";
# "-": none). A step whose NEEDS do not import is skipped (logged with the reason; returns 0, so a
# step chained after it with && is reached and skips on its own NEEDS). Otherwise logs the command and
# runs it (output in OUT_DIR/NAME.log) unless DRY_RUN.
step() {
  local name=$1 limit=$2 needs=$3 missing="" why="" m
  shift 3
  for m in ${needs//,/ }; do
    [ "$m" = "-" ] && continue
    if ! importable "$m"; then
      missing="${missing:+$missing, }$m"
      why="${why:+$why; }$m: ${IMPORT_WHY[$m]}"
    fi
  done
  if [ -n "$missing" ]; then
    log "$name: SKIPPED, needs $missing, not importable here ($why)"
    SKIPPED="${SKIPPED:+$SKIPPED }$name"
    return 0
  fi
  log "$name: $*"
  [ -n "${DRY_RUN:-}" ] && return 0
  timeout "$limit" "$@" 2>&1 | tee "$OUT_DIR/$name.log" | tail -15
  local rc=${PIPESTATUS[0]}
  [ "$rc" -eq 0 ] || { log "$name FAILED (exit $rc, see $OUT_DIR/$name.log)"; STATUS=1; }
  return "$rc"
}

# The last lines of summary.txt: the skipped steps with the packages that were missing, then the status.
finish() {
  local m
  if [ -n "$SKIPPED" ]; then
    log "skipped: $SKIPPED"
    for m in "${!IMPORT_RC[@]}"; do
      [ "${IMPORT_RC[$m]}" -eq 0 ] || log "not importable: $m (${IMPORT_WHY[$m]})"
    done
  fi
  log "done: status $STATUS"
  exit "$STATUS"
}

log "plan: ${NUM_GPUS} GPU(s) visible -> rollout.tensor_parallel_size=$TP over $TP rank(s); model $MODEL_SIZE; out $OUT_DIR"
if [ -z "${DRY_RUN:-}" ]; then
  log "machine: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -2 | tr '\n' ';')"
  "$PY" -c "import torch, sys; print('torch', torch.__version__, 'cuda', torch.cuda.is_available()); sys.exit(0 if torch.cuda.is_available() else 1)" \
    | tee -a "$OUT_DIR/summary.txt" || { log "no CUDA device visible: stopping"; exit 1; }
fi

step bf16 60 - "$PY" -m vcppo.bench.gpu_check bf16 "$OUT_DIR/bf16.json"
# tests/gpu/test_logprob_memory.py has a step of its own (next), with its figures in OUT_DIR.
step gpu_tests 180 - "$PY" -m pytest -m gpu -q -p no:cacheprovider --ignore=tests/gpu/test_logprob_memory.py tests
step logprob_memory 240 deepspeed env GPU_CHECK_OUT="$OUT_DIR" "$PY" -m pytest -m gpu -q -rs -p no:cacheprovider \
  tests/gpu/test_logprob_memory.py
# its figures, also when it failed (written then too); fails where the test wrote none (it was skipped)
step logprob_memory_json 10 deepspeed cat "$OUT_DIR/logprob_memory.json"
step bench_gae 150 - "$PY" -m vcppo.cli bench gae --json "$OUT_DIR/bench_gae.json" \
  && step gae_bandwidth 30 - "$PY" -m vcppo.bench.gpu_check gae-bandwidth "$OUT_DIR/bench_gae.json" "$OUT_DIR/gae_bandwidth.json"
step vcppo_plan 60 - "$PY" -m vcppo.cli plan vcppo --model-shape qwen2.5-7b --gpu h200 --json "$OUT_DIR/plan_7b_h200.json"

step sleep_wake 180 vllm,deepspeed "$PY" -m vcppo.bench.gpu_check sleep-wake "$OUT_DIR/sleep_wake.json"
step mismatch 300 vllm,deepspeed "$PY" -m vcppo.cli bench mismatch --size small --prompts 64 --n 4 --max-tokens 256 \
  --json "$OUT_DIR/mismatch.json"

step make_data 120 - "$PY" -m vcppo.cli data make --task add --out "$W/data" --n 2000 --n-eval 64
step make_model 120 - "$PY" -m vcppo.cli model make --size "$MODEL_SIZE" --out "$W/model"
step train 300 vllm,deepspeed env NUM_GPUS="$TP" MASTER_PORT="${MASTER_PORT:-29561}" launch/single_node.sh vcppo \
  model.policy_path="$W/model" model.dtype=bfloat16 rollout.tensor_parallel_size="$TP" \
  data.train_files="$W/data/train.parquet" data.val_files="$W/data/val.parquet" \
  trainer.output_root="$W/runs" trainer.run_name=gpu-check trainer.total_steps=4 trainer.prompts_per_step=64 \
  rollout.n_samples_per_prompt=8 rollout.max_response_tokens=256 rollout.gpu_memory_utilization=0.3 \
  rollout.enforce_eager=false value_pretrain.steps=2 value_pretrain.reuse=false trainer.val_every=0 \
  trainer.val_max_prompts=64 trainer.save_every=0 algorithm.rollout_is_cap=2.0 \
  actor.micro_batch_size=64 critic.micro_batch_size=64 logging.progress_bar=false \
  && step train_summary 30 vllm,deepspeed "$PY" -m vcppo.bench.gpu_check train-summary "$W/runs/gpu-check" "$OUT_DIR/train_summary.json"
# The one-node 7B preset's settings (gradient checkpointing, its micro-batches and mini-batches, bf16, no
# KL) on the small model, so the preset a user launches has run on CUDA; sizes cut to a few minutes.
step train_7b_preset 300 vllm,deepspeed env NUM_GPUS="$TP" MASTER_PORT="${MASTER_PORT:-29561}" launch/single_node.sh vcppo_7b_1node \
  model.policy_path="$W/model" rollout.tensor_parallel_size="$TP" \
  data.train_files="$W/data/train.parquet" data.val_files="$W/data/val.parquet" data.max_prompt_tokens=256 \
  trainer.output_root="$W/runs" trainer.run_name=gpu-check-7b-preset trainer.total_steps=2 trainer.prompts_per_step=64 \
  rollout.max_response_tokens=256 rollout.gpu_memory_utilization=0.3 value_pretrain.steps=2 value_pretrain.reuse=false \
  trainer.val_every=0 trainer.val_max_prompts=16 trainer.val_n_samples=4 "trainer.val_k=[1,4]" trainer.save_every=0 \
  logging.progress_bar=false \
  && step train_7b_preset_summary 30 vllm,deepspeed "$PY" -m vcppo.bench.gpu_check train-summary "$W/runs/gpu-check-7b-preset" \
    "$OUT_DIR/train_7b_preset_summary.json"
# Split placement (2+ GPUs): GPU 1 samples with vLLM (never asleep), GPU 0 trains; NCCL carries the weights.
if [ "$NUM_GPUS" -ge 2 ]; then
  step train_split 300 vllm,deepspeed env NUM_GPUS=2 MASTER_PORT="${MASTER_PORT:-29561}" launch/single_node.sh vcppo \
    model.policy_path="$W/model" model.dtype=bfloat16 placement.mode=split trainer.max_staleness=1 \
    data.train_files="$W/data/train.parquet" data.val_files="$W/data/val.parquet" \
    trainer.output_root="$W/runs" trainer.run_name=gpu-check-split trainer.total_steps=4 trainer.prompts_per_step=64 \
    rollout.n_samples_per_prompt=8 rollout.max_response_tokens=256 rollout.gpu_memory_utilization=0.6 \
    rollout.enforce_eager=false value_pretrain.steps=2 value_pretrain.reuse=false trainer.val_every=0 \
    trainer.val_max_prompts=64 trainer.save_every=0 algorithm.rollout_is_cap=2.0 logging.timeline=true \
    actor.micro_batch_size=64 critic.micro_batch_size=64 logging.progress_bar=false \
    && step train_split_summary 30 vllm,deepspeed "$PY" -m vcppo.bench.gpu_check train-summary "$W/runs/gpu-check-split" \
      "$OUT_DIR/train_split_summary.json"
fi
finish
