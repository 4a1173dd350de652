#!/usr/bin/env bash
# What `make test-nodes` needs beyond the venv, from Debian's packages: iproute2 (`ip netns`), util-linux
# (`unshare`, `nsenter`), and for DeepSpeed's pdsh launch an sshd per node and pdsh. Root only; a machine
# that has them all is left alone. The tests skip, naming what is missing, where this could not run.
set -euo pipefail
need=()
command -v ip >/dev/null || need+=(iproute2)
command -v nsenter >/dev/null || need+=(util-linux)
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v ssh >/dev/null || need+=(openssh-client)
command -v pdsh >/dev/null || need+=(pdsh)
[ "${#need[@]}" -gt 0 ] || exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "install_node_tools.sh: ${need[*]} missing, and no root apt-get here to install them" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# policy-rc.d 101: the package must not start a system-wide sshd (each node runs its own, on its address)
had_policy=0; [ -e /usr/sbin/policy-rc.d ] && had_policy=1
[ "$had_policy" = 1 ] || { printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; }
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
[ "$had_policy" = 1 ] || rm -f /usr/sbin/policy-rc.d
echo "install_node_tools.sh: installed ${need[*]}"
