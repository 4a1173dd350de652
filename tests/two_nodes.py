"""Two nodes on this machine for tests: launch/two_nodes.sh driven from Python (up, commands on a node,
what runs or lies in a node's /dev/shm, a node's link down, down with its leftover check).

    with two_nodes(tmp_path / "nodes") as nodes:     # skips the test where namespaces are not allowed
        nodes.run("b", ["hostname"])                  # node-b
The run directory and everything else outside ``nodes.local`` is shared by both nodes."""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "launch/two_nodes.sh"
ADDRESSES = {"a": "10.213.7.1", "b": "10.213.7.2"}


def skip_reason() -> str | None:
    """Why two nodes cannot be made here, or None."""
    if os.geteuid() != 0:
        return "two nodes need root (network and mount namespaces)"
    missing = [tool for tool in ("ip", "unshare", "nsenter") if shutil.which(tool) is None]
    if missing:
        return f"two nodes need {', '.join(missing)} (iproute2, util-linux)"
    probe = subprocess.run(["unshare", "--net", "--mount", "--uts", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"namespaces are not allowed here: {probe.stderr.strip()}"
    return None


class TwoNodes:
    def __init__(self, state: Path):
        self.state = state
        self.local = state / "local"  # the node-local directory: one path, each node its own contents

    def up(self) -> str:
        return subprocess.run([str(SCRIPT), "up", str(self.state)], check=True, capture_output=True, text=True,
                              timeout=60).stdout

    def ssh(self) -> str:
        """An sshd on each node's address; root on either node reaches both by name (pdsh, DeepSpeed's check)."""
        return subprocess.run([str(SCRIPT), "ssh", str(self.state)], check=True, capture_output=True, text=True,
                              timeout=60).stdout

    def down(self) -> subprocess.CompletedProcess:
        return subprocess.run([str(SCRIPT), "down", str(self.state)], capture_output=True, text=True, timeout=120)

    def command(self, node: str, cmd: list[str]) -> list[str]:
        return [str(SCRIPT), "on", str(self.state), node, *map(str, cmd)]

    def start(self, node: str, cmd: list[str], env: dict, log: Path, cwd: Path = REPO) -> subprocess.Popen:
        """``cmd`` on ``node`` in the background, stdout and stderr into ``log``."""
        with open(log, "w") as out:
            return subprocess.Popen(self.command(node, cmd), cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)

    def run(self, node: str, cmd: list[str], env: dict | None = None, timeout: float = 60,
            cwd: Path = REPO) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(node, cmd), cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=timeout)

    def netns(self, node: str) -> str:
        return f"vcppo-{(self.state / 'tag').read_text().strip()}-{node}"

    def pids(self, node: str) -> list[int]:
        """The processes running on ``node``, but its sshd (a service of the node, see :meth:`ssh`)."""
        out = subprocess.run(["ip", "netns", "pids", self.netns(node)], capture_output=True, text=True).stdout
        sshd = self.state / "ssh" / f"sshd-{node}.pid"
        service = {int(sshd.read_text())} if sshd.exists() else set()
        return [int(p) for p in out.split() if int(p) not in service]

    def wait_idle(self, timeout: float = 15) -> dict[str, list[int]]:
        """Wait until no process runs on either node; what still runs after ``timeout``."""
        deadline = time.time() + timeout
        while True:
            left = {node: self.pids(node) for node in ADDRESSES}
            if not any(left.values()) or time.time() > deadline:
                return {node: pids for node, pids in left.items() if pids}
            time.sleep(0.2)

    def shm(self, node: str) -> list[str]:
        """What lies in ``node``'s own /dev/shm."""
        return sorted(self.run(node, ["ls", "-A", "/dev/shm"]).stdout.split())

    def set_link(self, node: str, up: bool) -> None:
        link = f"vc{(self.state / 'tag').read_text().strip()}{node}"
        subprocess.run(["ip", "-n", self.netns(node), "link", "set", link, "up" if up else "down"], check=True)


@contextmanager
def two_nodes(state: Path):
    """node-a and node-b for the test's duration; torn down after it, also when it fails, and the teardown
    must find nothing left (no process on a node, no /dev/shm segment, namespace, link or mount)."""
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    nodes = TwoNodes(state)
    nodes.up()
    failed = False
    try:
        yield nodes
    except BaseException:
        failed = True
        raise
    finally:
        res = nodes.down()
        if not failed:  # a failing test's own error comes first; its leftovers were removed all the same
            assert res.returncode == 0, res.stdout + res.stderr
