#!/usr/bin/env bash
# One node, N GPUs (or N CPU ranks on gloo), every rank runs the same driver (SPMD):
#   launch/single_node.sh vcppo actor.lr=1e-6 ...          # all visible GPUs
#   NUM_GPUS=2 launch/single_node.sh vcppo ...              # CPU machine: 2 ranks on gloo
set -euo pipefail
cd "$(dirname "$0")/.."
DEEPSPEED="${DEEPSPEED:-$( [ -x .venv/bin/deepspeed ] && echo .venv/bin/deepspeed || echo deepspeed )}"
if [ -z "${NUM_GPUS:-}" ]; then
  NUM_GPUS=$( (nvidia-smi -L 2>/dev/null || true) | wc -l )
  [ "$NUM_GPUS" -gt 0 ] || NUM_GPUS=1
fi
if ! (nvidia-smi -L >/dev/null 2>&1); then
  export DS_ACCELERATOR=cpu
  # Keep freed large blocks instead of re-faulting fresh pages per step (docs/performance.md).
  export MALLOC_MMAP_THRESHOLD_="${MALLOC_MMAP_THRESHOLD_:-4294967296}" \
         MALLOC_TRIM_THRESHOLD_="${MALLOC_TRIM_THRESHOLD_:-4294967296}" MALLOC_TOP_PAD_="${MALLOC_TOP_PAD_:-536870912}"
fi
export VLLM_ENABLE_V1_MULTIPROCESSING=0   # one in-process vLLM engine per rank
exec "$DEEPSPEED" --num_gpus "$NUM_GPUS" --master_port "${MASTER_PORT:-29500}" \
  --module vcppo.cli train "$@"
