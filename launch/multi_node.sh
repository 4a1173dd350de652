#!/usr/bin/env bash
# Several nodes via the deepspeed launcher and a hostfile (pdsh/ssh starts the ranks):
#   HOSTFILE=launch/hostfile launch/multi_node.sh vcppo model.policy_path=/shared/ckpt ...
# hostfile lines:  node-01 slots=8
# DRY_RUN=1 prints the per-node commands instead of launching (what a scheduler would run).
# Paths in the config must be on storage every node sees (model, data, output_root).
set -euo pipefail
cd "$(dirname "$0")/.."
HOSTFILE="${HOSTFILE:?set HOSTFILE=path/to/hostfile}"
DEEPSPEED="${DEEPSPEED:-$( [ -x .venv/bin/deepspeed ] && echo .venv/bin/deepspeed || echo deepspeed )}"
[ -f "$HOSTFILE" ] || { echo "multi_node.sh: no hostfile at $HOSTFILE" >&2; exit 2; }
mapfile -t HOSTS < <(grep -v '^\s*#' "$HOSTFILE" | awk 'NF {print $1}')
MASTER_ADDR="${MASTER_ADDR:-${HOSTS[0]}}"
MASTER_PORT="${MASTER_PORT:-29500}"
export VLLM_ENABLE_V1_MULTIPROCESSING=0
if [ "${DRY_RUN:-0}" = 1 ]; then
  n=${#HOSTS[@]}
  for i in "${!HOSTS[@]}"; do
    slots=$(grep -E "^\s*${HOSTS[$i]}\s" "$HOSTFILE" | sed -n 's/.*slots=\([0-9]*\).*/\1/p')
    echo "[node $i/${n} ${HOSTS[$i]}] python -m torch.distributed.run --nnodes=$n --node_rank=$i" \
         "--nproc_per_node=${slots:-1} --master_addr=$MASTER_ADDR --master_port=$MASTER_PORT" \
         "-m vcppo.cli train $*"
  done
  exit 0
fi
EXTRA=()
# One host: DeepSpeed launches locally anyway, so its passwordless-ssh check only gets in the way.
[ "${#HOSTS[@]}" -eq 1 ] && EXTRA+=(--no_ssh_check)
exec "$DEEPSPEED" --hostfile "$HOSTFILE" --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" \
  "${EXTRA[@]}" --module vcppo.cli train "$@"
