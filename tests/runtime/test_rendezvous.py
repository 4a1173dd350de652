"""The ranks' meeting at MASTER_ADDR:MASTER_PORT is bounded by trainer.rendezvous_timeout_s: a rank that
cannot reach the master, or a master whose peers never come, exits with one line naming both and what it
found there, instead of waiting out the 30-minute collective timeout. (Across two nodes, with the master's
link down: tests/launch/test_two_nodes.py.)"""
import socket
import subprocess
import time

import pytest

from tests.conftest import ENV, start_process
from vcppo.runtime.launch_env import free_port

pytestmark = [pytest.mark.distributed]


def join_alone(rank: int, port: int, tmp_path) -> tuple[subprocess.CompletedProcess, float]:
    """Rank ``rank`` of 2 started with no other rank (tests/runtime/rendezvous_probe.py, a fork of the warm
    interpreter as the tests' ranks are); (its exit code and output, seconds it took)."""
    env = dict(ENV, OMP_NUM_THREADS="1", WORLD_SIZE="2", RANK=str(rank), LOCAL_RANK="0",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    out, err = tmp_path / f"rank{rank}.out", tmp_path / f"rank{rank}.err"
    start = time.time()
    proc = start_process(cwd=tmp_path, env=env, module="tests.runtime.rendezvous_probe", out=str(out), err=str(err))
    code = proc.wait(timeout=120)
    return subprocess.CompletedProcess(proc.args, code, out.read_text(), err.read_text()), time.time() - start


def test_a_rank_whose_master_is_not_listening_names_it_and_exits(tmp_path):
    port = free_port()  # nothing listens there
    res, took = join_alone(1, port, tmp_path)
    assert res.returncode == 2, res.stderr[-3000:]
    line, = res.stdout.strip().splitlines()
    assert line.startswith(f"rank 1 of 2 could not join the rendezvous at MASTER_ADDR=127.0.0.1 MASTER_PORT={port} "
                           "within 3 s (trainer.rendezvous_timeout_s)"), line
    assert f"tried 127.0.0.1:{port}" in line and "refuses the connection: nothing listens" in line, line
    assert took < 60, took  # not the collective timeout's 30 minutes


@pytest.mark.extended
def test_a_master_whose_peers_never_come_names_the_address_and_exits(tmp_path):
    port = free_port()
    res, took = join_alone(0, port, tmp_path)
    assert res.returncode == 2, res.stderr[-3000:]
    line, = res.stdout.strip().splitlines()
    assert line.startswith(f"rank 0 hosted the rendezvous at MASTER_ADDR=127.0.0.1 MASTER_PORT={port} for 3 s"), line
    assert "not all 2 ranks joined" in line, line
    assert took < 60, took


@pytest.mark.extended
def test_a_taken_port_is_named(tmp_path):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        res, _ = join_alone(0, held.getsockname()[1], tmp_path)
    assert res.returncode == 2, res.stderr[-3000:]
    assert "the port is taken on this node" in res.stdout, res.stdout
