#!/usr/bin/env bash
# GPU verification on the machine as it is lent (one GPU, no package registry, 64 MiB carried per call,
# no vLLM): the whole RL step runs there with the transformers rollout engine. About 6-8 minutes.
#   launch/gpu_check.sh [OUT_DIR]              OUT_DIR: the argument, else $GPU_CHECK_OUT, else $OUT,
#                                              else runs/gpu_check
#   launch/gpu_check.sh --install-only         install the carried wheels present (.gpu_carry/part<i>) into
#                                              .gpu_carry/site and stop: the call that carries part 1
#   DRY_RUN=1 launch/gpu_check.sh [OUT_DIR]    print the plan (every command, the TP size, the steps that
#                                              would be skipped) into OUT_DIR/summary.txt and run nothing
#   DRY_RUN=tiny launch/gpu_check.sh [OUT_DIR] the CPU rehearsal: the carry list, then the same commands at
#                                              the tiny shape on this machine's CPU (tested)
#   GPU_CHECK_PROFILE=full ...                 also the cluster steps below (vLLM, 2 GPUs; ~15 minutes)
#   GPU_CHECK_SKIP=name,name ...               steps not to run (logged as skipped)
# Carried wheels: `python -m vcppo.bench.gpu_carry build .gpu_carry` (here, with PyPI) writes the wheels
# vcppo needs beyond the lent image into .gpu_carry/part1, part2 (each under 64 MiB with the tree;
# docs/launching.md lists them); carry part1 in a call running `launch/gpu_check.sh --install-only`, then
# part2 in the call running the check. Both install into .gpu_carry/site, put first on PYTHONPATH.
# Steps of the lent profile, each writing its figures under OUT_DIR (everything printed also lands in
# summary.txt), with the Python packages each needs besides torch:
#   carry            install the carried wheels (DRY_RUN=tiny: only what this venv lacks)  carry.json
#   bf16             bf16 supported; bf16 matmul / log-softmax error against fp32      bf16.json
#   gpu tests        pytest -m gpu (Triton GAE kernel on CUDA, DeepSpeed on CUDA, the actor in bf16
#                    under ZeRO-0 and ZeRO-3, packed passes; what needs vllm skips itself)  gpu_tests.log
#   logprob mem      the actor's full-logits vs chunked logprob path at the Qwen2.5-0.5B shape
#                    (tests/gpu/test_logprob_memory.py; deepspeed)                      logprob_memory.json
#   train            `vcppo train` a few steps at GPU_CHECK_MODEL (default the Qwen2.5-0.5B shape, random
#                    weights): bf16, ZeRO-3 forced, chunked logprobs, packing, rollout.engine=auto (hf
#                    where vLLM does not import), sampler logprobs on (mismatch/*) (deepspeed)
#                                                                                      train_summary.json
#   plan_train       `vcppo plan` of the same config on one GPU                         plan_train.json
#   bench_step       `vcppo bench step --trl` on the same shape: vcppo's step against TRL's (deepspeed, trl)
#                                                                                      bench_step.json
#   summary          ONE JSON: each phase's median time and MFU, peak memory next to the plan's need,
#                    the TRL ratios; printed                                           gpu_check.json
# The full profile adds: GAE kernel (vcppo bench gae + bandwidth), vcppo plan of the 7B shape on 8 x H200,
# vLLM sleep / wake, the vLLM mismatch bench, the 7B preset's settings, and split placement on 2+ GPUs.
# A step whose packages $PY cannot import is skipped, not failed: its line in summary.txt says which
# package is missing and why, and a last `skipped:` line lists every skipped step. Exit status: 0 when
# every step that ran passed.
set -uo pipefail
cd "$(dirname "$0")/.."
INSTALL_ONLY=""
if [ "${1:-}" = "--install-only" ]; then INSTALL_ONLY=1; shift; fi
OUT_DIR="${1:-${GPU_CHECK_OUT:-${OUT:-runs/gpu_check}}}"
mkdir -p "$OUT_DIR"
PY="${PY:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
CARRY=.gpu_carry
SITE="$PWD/$CARRY/site"   # the carried wheels, installed; first on the path of every step
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 VLLM_ENABLE_V1_MULTIPROCESSING=0 WANDB_MODE=offline
PROFILE="${GPU_CHECK_PROFILE:-lent}"
TINY=""
[ "${DRY_RUN:-}" = tiny ] && TINY=1
PLAN_ONLY=""   # DRY_RUN=1: print the plan, run nothing
[ -n "${DRY_RUN:-}" ] && [ -z "$TINY" ] && PLAN_ONLY=1
# DeepSpeed's accelerator, for every step and the processes they start (the check stops below without
# CUDA): a leftover DS_ACCELERATOR=cpu would train the "GPU" steps on DeepSpeed's CPU accelerator.
if [ -n "$TINY" ]; then export DS_ACCELERATOR=cpu; else export DS_ACCELERATOR=cuda; fi
NUM_GPUS="${NUM_GPUS:-$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU' )}"
TP=1
[ "$NUM_GPUS" -ge 2 ] && TP=2
MODEL_SIZE="${GPU_CHECK_MODEL:-$( [ -n "$TINY" ] && echo tiny || echo qwen2.5-0.5b-shape )}"
PLAN_GPU="${GPU_CHECK_PLAN_GPU:-$( (nvidia-smi -L 2>/dev/null || true) | grep -q H200 && echo h200 || echo h100 )}"
ENGINE="${GPU_CHECK_ENGINE:-auto}"
# Sizes: the GPU run's, or the CPU rehearsal's (the same commands, smaller)
if [ -n "$TINY" ]; then
  DATA_N=200 DATA_EVAL=16 STEPS=3 PROMPTS=8 SAMPLES=2 TOKENS=32 MB=8 BENCH="--prompts 4 --n 2 --max-tokens 16 --steps 2 --micro-batch 8 --threads 2"
else
  DATA_N=2000 DATA_EVAL=64 STEPS=4 PROMPTS=64 SAMPLES=4 TOKENS=256 MB=32 BENCH="--prompts 16 --n 4 --max-tokens 128 --steps 3 --micro-batch 16 --threads 8"
fi
W="$OUT_DIR/work"
STATUS=0
BUDGET_END=$((SECONDS + ${GPU_CHECK_BUDGET_S:-470}))   # the lent profile ends within 8 minutes
[ "$PROFILE" = full ] && BUDGET_END=$((SECONDS + ${GPU_CHECK_BUDGET_S:-1200}))
log() { echo "[gpu_check $(date +%H:%M:%S)] $*" | tee -a "$OUT_DIR/summary.txt"; }

SKIPPED=""
declare -A IMPORT_RC=() IMPORT_WHY=()

# importable MODULE: whether $PY imports MODULE (asked once per module). DRY_RUN=1 only looks it up
# (importlib.util.find_spec), importing nothing.
importable() {
  local m=$1 out rc
  if [ -z "${IMPORT_RC[$m]+set}" ]; then
    if [ -n "$PLAN_ONLY" ]; then
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
# "-": none). A step named in GPU_CHECK_SKIP, or whose NEEDS do not import, or with under 20 s of the
# budget left is skipped (logged with the reason; returns 0, so a step chained after it with && is
# reached and skips on its own). Otherwise logs the command and runs it (output in OUT_DIR/NAME.log)
# with the smaller of TIMEOUT_S and the budget left, unless DRY_RUN=1.
step() {
  local name=$1 limit=$2 needs=$3 missing="" why="" m left
  shift 3
  if [[ ",${GPU_CHECK_SKIP:-}," == *",$name,"* ]]; then
    log "$name: SKIPPED, named in GPU_CHECK_SKIP"
    SKIPPED="${SKIPPED:+$SKIPPED }$name"
    return 0
  fi
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
  left=$((BUDGET_END - SECONDS))
  if [ -z "$PLAN_ONLY" ] && [ "$left" -lt 20 ]; then
    log "$name: SKIPPED, out of the time budget"
    SKIPPED="${SKIPPED:+$SKIPPED }$name"
    return 0
  fi
  [ "$left" -lt "$limit" ] && limit=$left
  log "$name: $*"
  [ -n "$PLAN_ONLY" ] && return 0
  local t0=$SECONDS
  timeout "$limit" "$@" 2>&1 | tee "$OUT_DIR/$name.log" | tail -15
  local rc=${PIPESTATUS[0]}
  if [ "$rc" -eq 0 ]; then
    log "$name: ok ($((SECONDS - t0)) s)"
  else
    log "$name FAILED (exit $rc, see $OUT_DIR/$name.log)"
    STATUS=1
  fi
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

log "plan: ${NUM_GPUS} GPU(s) visible -> rollout.tensor_parallel_size=$TP over $TP rank(s); model $MODEL_SIZE; profile $PROFILE${TINY:+ (CPU rehearsal at the tiny shape)}; out $OUT_DIR"
step carry_list 60 - "$PY" -m vcppo.bench.gpu_carry list "$CARRY" --json "$OUT_DIR/carry_list.json"
step carry 180 - "$PY" -m vcppo.bench.gpu_carry install "$CARRY" "$SITE" --json "$OUT_DIR/carry.json"
[ -n "$INSTALL_ONLY" ] && finish
if [ -z "${DRY_RUN:-}" ]; then
  log "machine: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -2 | tr '\n' ';')"
  "$PY" -c "import torch, sys; print('torch', torch.__version__, 'cuda', torch.cuda.is_available()); sys.exit(0 if torch.cuda.is_available() else 1)" \
    | tee -a "$OUT_DIR/summary.txt" || { log "no CUDA device visible: stopping"; exit 1; }
fi

step bf16 60 - "$PY" -m vcppo.bench.gpu_check bf16 "$OUT_DIR/bf16.json"
# tests/gpu/test_logprob_memory.py has a step of its own (next), with its figures in OUT_DIR.
step gpu_tests 150 - "$PY" -m pytest -m gpu -q -p no:cacheprovider --ignore=tests/gpu/test_logprob_memory.py tests
step logprob_memory 150 deepspeed env GPU_CHECK_OUT="$OUT_DIR" "$PY" -m pytest -m gpu -q -rs -p no:cacheprovider \
  tests/gpu/test_logprob_memory.py
# its figures, also when it failed (written then too); fails where the test wrote none (it was skipped)
[ -z "$TINY" ] && step logprob_memory_json 10 deepspeed cat "$OUT_DIR/logprob_memory.json"

step make_data 120 - "$PY" -m vcppo.cli data make --task add --out "$W/data" --n "$DATA_N" --n-eval "$DATA_EVAL"
step make_model 120 - "$PY" -m vcppo.cli model make --size "$MODEL_SIZE" --out "$W/model"
# The step as a GPU user runs it: bf16, ZeRO-3 forced on every engine, chunked logprobs, packed passes, the
# sampler's logprobs (mismatch/*, TIS), the hf engine where vLLM does not import.
RUN_KEYS=(model.policy_path="$W/model" model.dtype=bfloat16 rollout.engine="$ENGINE" rollout.tensor_parallel_size="$TP"
  data.train_files="$W/data/train.parquet" data.val_files=null trainer.total_steps="$STEPS"
  trainer.prompts_per_step="$PROMPTS" rollout.n_samples_per_prompt="$SAMPLES" rollout.max_response_tokens="$TOKENS"
  rollout.gpu_memory_utilization=0.3 value_pretrain.steps=1 value_pretrain.reuse=false trainer.val_every=0
  trainer.save_every=0 actor.zero_stage=3 critic.zero_stage=3 reference.zero_stage=3 actor.logprob_chunk_size=1024
  reference.logprob_chunk_size=1024 actor.packed=true critic.packed=true reference.packed=true
  rollout.sampler_logprobs=true algorithm.rollout_is_cap=2.0 actor.micro_batch_size="$MB" critic.micro_batch_size="$MB"
  logging.progress_bar=false logging.wandb=false)
if [ "$TP" -ge 2 ]; then
  TRAIN=(env NUM_GPUS="$TP" MASTER_PORT="${MASTER_PORT:-29561}" launch/single_node.sh vcppo)
else
  TRAIN=("$PY" -m vcppo.cli train vcppo)
fi
step train 240 deepspeed "${TRAIN[@]}" "${RUN_KEYS[@]}" trainer.output_root="$W/runs" trainer.run_name=gpu-check \
  && step train_summary 30 - "$PY" -m vcppo.bench.gpu_check train-summary "$W/runs/gpu-check" "$OUT_DIR/train_summary.json"
step plan_train 60 - "$PY" -m vcppo.cli plan vcppo "${RUN_KEYS[@]}" --gpu "$PLAN_GPU" --gpus-per-node "$TP" \
  --json "$OUT_DIR/plan_train.json"
# shellcheck disable=SC2086
step bench_step 180 deepspeed,trl "$PY" -m vcppo.cli bench step --trl --size "$MODEL_SIZE" $BENCH \
  --set rollout.engine="$ENGINE" --workdir "$W/bench_step" --json "$OUT_DIR/bench_step.json"
step summary 30 - "$PY" -m vcppo.bench.gpu_check summary "$W/runs/gpu-check" "$OUT_DIR/plan_train.json" \
  "$OUT_DIR/bench_step.json" "$OUT_DIR/gpu_check.json"

if [ "$PROFILE" = full ]; then
  step bench_gae 150 - "$PY" -m vcppo.cli bench gae --json "$OUT_DIR/bench_gae.json" \
    && step gae_bandwidth 30 - "$PY" -m vcppo.bench.gpu_check gae-bandwidth "$OUT_DIR/bench_gae.json" "$OUT_DIR/gae_bandwidth.json"
  step vcppo_plan 60 - "$PY" -m vcppo.cli plan vcppo --model-shape qwen2.5-7b --gpu h200 --json "$OUT_DIR/plan_7b_h200.json"
  step sleep_wake 180 vllm,deepspeed "$PY" -m vcppo.bench.gpu_check sleep-wake "$OUT_DIR/sleep_wake.json"
  step mismatch 300 vllm,deepspeed "$PY" -m vcppo.cli bench mismatch --size small --prompts 64 --n 4 --max-tokens 256 \
    --json "$OUT_DIR/mismatch.json"
  # The one-node 7B preset's settings (gradient checkpointing, its micro-batches and mini-batches, bf16, no
  # KL) on the same model, so the preset a user launches has run on CUDA; sizes cut to a few minutes.
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
fi
[ -z "$PLAN_ONLY" ] && [ -f "$OUT_DIR/gpu_check.json" ] && log "result: $(tr -d '\n' < "$OUT_DIR/gpu_check.json" | tr -s ' ')"
finish
