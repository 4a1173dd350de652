"""DeepSpeed's CPU shm all-reduce buffer (~66 MiB a rank in /dev/shm, used where the deepspeed launcher
started the ranks): its name is removed as soon as every rank has mapped it, so no end of a run (clean,
an error exit, SIGKILL) leaves one until reboot."""
import os
from pathlib import Path

import pytest
import torch.multiprocessing as mp

from vcppo.runtime.launch_env import free_port, shm_segment, unlink_shm_segment


def test_the_segment_is_named_as_deepspeed_names_it(monkeypatch, tmp_path):
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29731")
    assert shm_segment(1, root=tmp_path) == tmp_path / f"deepspeed_allreduce_buffer_{os.getuid()}_127.0.0.1_29731_1"


def test_unlink_removes_the_name_and_tolerates_a_missing_one(tmp_path):
    segment = tmp_path / "deepspeed_allreduce_buffer_0_a_1_0"
    segment.write_bytes(b"x")
    unlink_shm_segment(segment)
    assert not segment.exists()
    unlink_shm_segment(segment)  # gone already
    unlink_shm_segment(None)     # the op never ran (one rank)


def _rank(rank, port, out, end):
    # LOCAL_SIZE: what the deepspeed launcher sets, and what turns DeepSpeed's shm all-reduce on
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2", LOCAL_SIZE="2")
    from vcppo.runtime import dist
    from vcppo.runtime import collectives
    from vcppo.runtime import launch_env
    dist.init_distributed("cpu")
    segment = launch_env.shm_segment(rank)
    with open("/proc/self/maps") as f:  # mapped by this rank, its name already gone
        out[f"mapped{rank}"] = f"{segment} (deleted)" in f.read()
    out[f"named{rank}"] = segment.exists()
    import deepspeed.comm
    import torch
    summed = torch.full((1024,), rank + 1.0)
    deepspeed.comm.inference_all_reduce(summed)  # DeepSpeed's shm all-reduce, through the mapped segments
    out[f"sum{rank}"] = summed.tolist() == [3.0] * 1024
    collectives.barrier()
    if end == "error":  # an error exit, as the CLI's: no shutdown, no teardown
        os._exit(1)
    dist.shutdown(wait_for_peers=True)


@pytest.mark.distributed
@pytest.mark.parametrize("end", ["clean", "error"])
def test_a_two_rank_cpu_run_leaves_no_segment_however_it_ends(end):
    out, port = mp.get_context("spawn").Manager().dict(), free_port()  # never a fork of this (large) process
    ctx = mp.start_processes(_rank, args=(port, out, end), nprocs=2, start_method="spawn", join=False)
    try:
        for p in ctx.processes:
            p.join(timeout=600)  # a loaded 2-core host starts two ranks slowly
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
    assert [p.exitcode for p in ctx.processes] == ([0, 0] if end == "clean" else [1, 1])
    assert out["mapped0"] and out["mapped1"], "DeepSpeed's shm all-reduce did not map its segments"
    assert not out["named0"] and not out["named1"]  # removed once both ranks had mapped both
    assert out["sum0"] and out["sum1"]  # and the all-reduce works without the names
    left = [p for p in Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_{os.getuid()}_127.0.0.1_{port}_*")]
    assert left == []
