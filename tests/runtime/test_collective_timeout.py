"""trainer.collective_timeout_s reaches the process group: a rank whose peer is alive but never
arrives (hung) fails after the timeout instead of waiting the default 30 minutes."""
import os
import subprocess
import sys
import textwrap

import pytest

from vcppo.runtime.launch_env import free_port

pytestmark = [pytest.mark.distributed]

SCRIPT = textwrap.dedent("""
    import os, sys, time, torch
    from vcppo.runtime import dist
    info = dist.init_distributed("cpu", timeout_s=3)
    if info.rank == 1:
        time.sleep(40)  # alive, but never reaches the barrier in time
        os._exit(0)
    t = time.time()
    try:
        torch.distributed.barrier()
    except Exception as e:
        print(f"FAILED after {time.time() - t:.1f} s: {type(e).__name__}", flush=True)
        os._exit(3)
    os._exit(0)
""")


def test_a_hung_peer_fails_the_waiting_rank_after_the_collective_timeout():
    env = dict(os.environ, OMP_NUM_THREADS="1", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    procs = [subprocess.Popen([sys.executable, "-c", SCRIPT], env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    try:
        out, err = procs[0].communicate(timeout=120)
    finally:
        for p in procs:
            p.kill()
    assert procs[0].returncode == 3, err[-3000:]
    waited = float(out.split("FAILED after ")[1].split(" s")[0])
    assert 2.5 <= waited < 30, out  # the 3 s timeout, not the 30 min default
