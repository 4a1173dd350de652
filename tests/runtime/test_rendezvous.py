"""The ranks' meeting at MASTER_ADDR:MASTER_PORT is bounded by trainer.rendezvous_timeout_s: a rank that
cannot reach the master, or a master whose peers never come, exits with one line naming both and what it
found there, instead of waiting out the 30-minute collective timeout. (Across two nodes, with the master's
link down: tests/launch/test_two_nodes.py.)"""
import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from vcppo.runtime.launch_env import free_port

pytestmark = [pytest.mark.distributed]

SCRIPT = textwrap.dedent("""
    import sys
    from vcppo.runtime import dist
    from vcppo.runtime.launch_env import RendezvousError
    try:
        dist.init_distributed("cpu", rendezvous_timeout_s=3)
    except RendezvousError as e:
        print(e, flush=True)
        dist.exit_process(2)
    dist.exit_process(0)
""")


def join_alone(rank: int, port: int) -> tuple[subprocess.CompletedProcess, float]:
    """Rank ``rank`` of 2 started with no other rank; (its result, seconds it took)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", WORLD_SIZE="2", RANK=str(rank), LOCAL_RANK="0",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    start = time.time()
    res = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    return res, time.time() - start


def test_a_rank_whose_master_is_not_listening_names_it_and_exits():
    port = free_port()  # nothing listens there
    res, took = join_alone(1, port)
    assert res.returncode == 2, res.stderr[-3000:]
    line, = res.stdout.strip().splitlines()
    assert line.startswith(f"rank 1 of 2 could not join the rendezvous at MASTER_ADDR=127.0.0.1 MASTER_PORT={port} "
                           "within 3 s (trainer.rendezvous_timeout_s)"), line
    assert f"tried 127.0.0.1:{port}" in line and "refuses the connection: nothing listens" in line, line
    assert took < 60, took  # not the collective timeout's 30 minutes


@pytest.mark.extended
def test_a_master_whose_peers_never_come_names_the_address_and_exits():
    port = free_port()
    res, took = join_alone(0, port)
    assert res.returncode == 2, res.stderr[-3000:]
    line, = res.stdout.strip().splitlines()
    assert line.startswith(f"rank 0 hosted the rendezvous at MASTER_ADDR=127.0.0.1 MASTER_PORT={port} for 3 s"), line
    assert "not all 2 ranks joined" in line, line
    assert took < 60, took


@pytest.mark.extended
def test_a_taken_port_is_named():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        res, _ = join_alone(0, held.getsockname()[1])
    assert res.returncode == 2, res.stderr[-3000:]
    assert "the port is taken on this node" in res.stdout, res.stdout
