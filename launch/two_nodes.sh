#!/usr/bin/env bash
# Two nodes on one machine, to rehearse a multi-node launch before a cluster job (needs root, `ip`,
# `unshare` and `nsenter`). Each node is a network namespace with an address of its own on a private
# veth link (node-a 10.213.7.1, node-b 10.213.7.2, names in each node's /etc/hosts), a hostname, a
# private /dev/shm and a node-local directory, STATE/local (one path, other contents on each node).
# Everything else (the repository, the venv, the run directory) is shared, as a cluster's shared storage.
#   launch/two_nodes.sh up STATE              # make both nodes; STATE (a new directory) holds their state
#   launch/two_nodes.sh on STATE a CMD ...    # run CMD on node a (or b), in the current directory (from the
#                                             # host: inside a node the other node's namespaces are not seen)
#   launch/two_nodes.sh ssh STATE             # an sshd on each node's address; root on either node reaches
#                                             # both by name with a key made for them (DeepSpeed's pdsh launch)
#   launch/two_nodes.sh down STATE            # end what still runs there, tear down, check nothing is left
#   launch/two_nodes.sh run STATE CMD ...     # up, CMD here (TWO_NODES=STATE), down on exit or failure
# `down` exits 1 naming each thing it found left (a process on a node, a /dev/shm segment on a node,
# a namespace, a link, a mount); it removes them anyway. Traffic stays inside the two namespaces.
set -Eeuo pipefail
SUBNET=10.213.7
NODES=(a b)

die() { echo "two_nodes.sh: $*" >&2; exit 2; }
need() {
  [ "$(id -u)" = 0 ] || die "needs root (network and mount namespaces)"
  local tool
  for tool in ip unshare nsenter mount umount; do
    command -v "$tool" >/dev/null || die "needs \`$tool\` (iproute2 / util-linux)"
  done
}
addr() { [ "$1" = a ] && echo "$SUBNET.1" || echo "$SUBNET.2"; }
tag() { cat "$1/tag" 2>/dev/null || die "$1 holds no two-node state (run \`up\` first)"; }
netns() { echo "vcppo-$(tag "$1")-$2"; }
link() { echo "vc$(tag "$1")$2"; }

on() {  # on STATE NODE CMD...: CMD inside that node's network, mount and UTS namespaces
  local state="$1" node="$2"; shift 2
  [ -e "$state/ns/mnt-$node" ] || die "no node $node in $state"
  exec nsenter --net="/run/netns/$(netns "$state" "$node")" --mount="$state/ns/mnt-$node" \
    --uts="$state/ns/uts-$node" --wd="$PWD" -- "$@"
}

make_node() {  # the node's namespaces: network (with its end of the link), mount (shm, local dir, hosts), UTS
  local state="$1" node="$2" ns
  ns=$(netns "$state" "$node")
  ip -n "$ns" addr add "$(addr "$node")/24" dev "$(link "$state" "$node")"
  ip -n "$ns" link set lo up
  ip -n "$ns" link set "$(link "$state" "$node")" up
  mkdir -p "$state/local-$node"
  touch "$state/ns/mnt-$node" "$state/ns/uts-$node"
  unshare --mount="$state/ns/mnt-$node" --uts="$state/ns/uts-$node" --propagation private sh -ec "
    mount -t tmpfs -o size=1g,mode=1777 tmpfs /dev/shm
    mount --bind '$state/local-$node' '$state/local'
    mount --bind '$state/hosts' /etc/hosts
    hostname node-$node"
}

up() {
  local state="$1" node
  need
  [ ! -e "$state/tag" ] || die "$state already holds two nodes (\`down\` it first)"
  mkdir -p "$state/ns" "$state/local"
  state="$(cd "$state" && pwd)"
  od -An -N3 -tx1 /dev/urandom | tr -d ' \n' > "$state/tag"
  trap "down '$state' >/dev/null 2>&1 || true" ERR
  printf '127.0.0.1 localhost\n%s node-a\n%s node-b\n' "$(addr a)" "$(addr b)" > "$state/hosts"
  # a namespace is kept by a bind mount of its file; that needs a mount point of private propagation
  mount --bind "$state/ns" "$state/ns"
  mount --make-private "$state/ns"
  for node in "${NODES[@]}"; do ip netns add "$(netns "$state" "$node")"; done
  ip link add "$(link "$state" a)" netns "$(netns "$state" a)" type veth \
    peer name "$(link "$state" b)" netns "$(netns "$state" b)"
  for node in "${NODES[@]}"; do make_node "$state" "$node"; done
  trap - ERR
  for node in "${NODES[@]}"; do
    echo "node-$node $(addr "$node") netns $(netns "$state" "$node") link $(link "$state" "$node")"
  done
}

ssh_nodes() {  # keys in STATE/ssh; each node's /etc/ssh/ssh_config (its own mount) uses them; an sshd per node
  local state="$1" node dir
  need
  state="$(cd "$state" && pwd)"; dir="$state/ssh"
  [ -x /usr/sbin/sshd ] && command -v ssh >/dev/null || die "needs openssh-server and ssh (scripts/install_node_tools.sh)"
  mkdir -p -m 700 "$dir"
  ssh-keygen -q -t ed25519 -N '' -f "$dir/host_key"
  ssh-keygen -q -t ed25519 -N '' -f "$dir/id"
  cp "$dir/id.pub" "$dir/authorized_keys"
  : > "$dir/known_hosts"
  for node in "${NODES[@]}"; do echo "node-$node,$(addr "$node") $(cat "$dir/host_key.pub")" >> "$dir/known_hosts"; done
  printf 'Host node-a node-b\n  IdentityFile %s\n  UserKnownHostsFile %s\n  StrictHostKeyChecking yes\n  BatchMode yes\n' \
    "$dir/id" "$dir/known_hosts" > "$dir/ssh_config"
  mkdir -p /run/sshd  # sshd's privilege-separation directory (its package's tmpfiles entry makes it at boot)
  for node in "${NODES[@]}"; do
    nsenter --mount="$state/ns/mnt-$node" mount --bind "$dir/ssh_config" /etc/ssh/ssh_config
    printf 'ListenAddress %s\nHostKey %s\nAuthorizedKeysFile %s\nPidFile %s\nPermitRootLogin prohibit-password\n%s\n' \
      "$(addr "$node")" "$dir/host_key" "$dir/authorized_keys" "$dir/sshd-$node.pid" \
      "PasswordAuthentication no
StrictModes no
UsePAM no
AcceptEnv none" > "$dir/sshd_config-$node"
    ( on "$state" "$node" /usr/sbin/sshd -f "$dir/sshd_config-$node" )
    echo "node-$node sshd on $(addr "$node"):22"
  done
}

stop_sshd() {  # the sshds `ssh` started: they are the nodes' services, not leftovers of a run
  local state="$1" node pid
  for node in "${NODES[@]}"; do
    pid=$(cat "$state/ssh/sshd-$node.pid" 2>/dev/null) || continue
    kill "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null && [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ]; do sleep 0.1; done
  done
}

leftovers() {  # what a clean end leaves on the nodes: none of their processes, no /dev/shm segment
  local state="$1" node ns pid
  for node in "${NODES[@]}"; do
    ns=$(netns "$state" "$node")
    for pid in $(ip netns pids "$ns" 2>/dev/null); do
      echo "left: process $pid on node-$node: $(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | cut -c1-160)"
    done
    if [ -e "$state/ns/mnt-$node" ]; then
      nsenter --mount="$state/ns/mnt-$node" ls -A /dev/shm | sed "s|^|left: /dev/shm segment on node-$node: |"
    fi
  done
  ls -A /dev/shm | grep -E "_(${SUBNET//./\\.}\.[12]|node-[ab])_" | sed 's|^|left: /dev/shm segment of a node on this host: |' || true
}

down() {
  local state="$1" node ns found pid
  need
  state="$(cd "$state" && pwd)"
  tag "$state" >/dev/null
  stop_sshd "$state"
  found=$(leftovers "$state")
  for node in "${NODES[@]}"; do  # kill what still runs there, by pid (all of it is ours: started on the node)
    ns=$(netns "$state" "$node")
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
  done
  for node in "${NODES[@]}"; do
    for pid in $(ip netns pids "$(netns "$state" "$node")" 2>/dev/null); do
      while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
    done
    umount "$state/ns/mnt-$node" "$state/ns/uts-$node" 2>/dev/null || true
    ip netns del "$(netns "$state" "$node")" 2>/dev/null || true
  done
  umount "$state/ns" 2>/dev/null || true
  for _ in $(seq 50); do  # a namespace's links go with it, a moment after
    ip -br link | grep -q "^vc$(tag "$state")" || break
    sleep 0.1
  done
  found+=$(ip netns list | grep -F "vcppo-$(tag "$state")-" | sed 's/^/\nleft: network namespace /' || true)
  found+=$(ip -br link | grep "^vc$(tag "$state")" | sed 's/^/\nleft: link /' || true)
  found+=$(grep -F "$state/" /proc/mounts | sed 's/^/\nleft: mount /' || true)
  rm -rf "$state/ns" "$state/ssh" "$state/local" "$state/local-a" "$state/local-b" "$state/hosts" "$state/tag"
  rmdir "$state" 2>/dev/null || true
  if [ -n "$found" ]; then echo "$found" | sed '/^$/d' >&2; return 1; fi
  echo "two nodes down: nothing left"
}

run() {
  local state="$1"; shift
  up "$state"
  state="$(cd "$state" && pwd)"
  trap 'exit 130' INT TERM
  trap "rc=\$?; down '$state' || rc=\$(( rc ? rc : 1 )); exit \$rc" EXIT
  TWO_NODES="$state" "$@"
}

[ $# -ge 2 ] || die "usage: $0 up|on|ssh|down|run STATE [NODE] [CMD ...]"
cmd="$1"; shift
case "$cmd" in
  up) up "$1" ;;
  on) [ $# -ge 3 ] || die "usage: $0 on STATE a|b CMD ..."; on "$@" ;;
  down) down "$1" ;;
  ssh) ssh_nodes "$1" ;;
  run) run "$@" ;;
  *) die "unknown command $cmd: up, on, ssh, down or run" ;;
esac
