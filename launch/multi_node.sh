#!/usr/bin/env bash
# Several nodes via the deepspeed launcher and a hostfile (pdsh/ssh starts the ranks):
#   HOSTFILE=launch/hostfile launch/multi_node.sh vcppo model.policy_path=/shared/ckpt ...
# hostfile lines:  node-01 slots=8
# Without passwordless ssh, start it on every node yourself with that node's line number in the hostfile:
#   NODE_RANK=0 HOSTFILE=launch/hostfile launch/multi_node.sh vcppo ...   # on node-01, and NODE_RANK=1 on node-02
# DRY_RUN=1 prints the nodes and the deepspeed command it would run, and runs nothing.
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
EXTRA=()
# One host: DeepSpeed launches locally anyway, so its passwordless-ssh check only gets in the way.
[ "${#HOSTS[@]}" -eq 1 ] && [ -z "${NODE_RANK:-}" ] && EXTRA+=(--no_ssh_check)
# NODE_RANK: this node's ranks only, no ssh (the same command runs on every node, each with its own NODE_RANK)
[ -n "${NODE_RANK:-}" ] && EXTRA+=(--no_ssh --node_rank "$NODE_RANK")
CMD=("$DEEPSPEED" --hostfile "$HOSTFILE" --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT"
     "${EXTRA[@]}" --module vcppo.cli train "$@")
if [ "${DRY_RUN:-0}" = 1 ]; then
  # the nodes the launcher will reach, then the one command it is given (shell-quoted)
  for i in "${!HOSTS[@]}"; do
    slots=$(grep -E "^\s*${HOSTS[$i]}\s" "$HOSTFILE" | sed -n 's/.*slots=\([0-9]*\).*/\1/p')
    here=""; [ "${NODE_RANK:-}" = "$i" ] && here=" (this node: it starts these)"
    echo "# node $i/${#HOSTS[@]}: ${HOSTS[$i]}, ${slots:-1} rank(s)$here"
  done
  printf '%q ' "${CMD[@]}"; echo
  exit 0
fi
exec "${CMD[@]}"
