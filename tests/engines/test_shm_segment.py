"""DeepSpeed's CPU shm all-reduce buffer (~66 MiB a rank in /dev/shm, used where the deepspeed launcher
started the ranks): a clean shutdown removes this rank's segment, where before every such run left one
per rank until reboot."""
import os

import pytest
import torch.multiprocessing as mp

from vcppo.engines.launch_env import free_port, shm_segment, unlink_shm_segment


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


def _rank(rank, port, out):
    # LOCAL_SIZE: what the deepspeed launcher sets, and what turns DeepSpeed's shm all-reduce on
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2", LOCAL_SIZE="2")
    from vcppo.engines import dist
    from vcppo.engines import collectives
    from vcppo.engines import launch_env
    dist.init_distributed("cpu")
    segment = launch_env.shm_segment(rank)
    collectives.barrier()
    out[f"during{rank}"] = segment.exists()
    dist.shutdown(wait_for_peers=True)
    collectives.barrier()  # a no-op now: the group is gone
    out[f"after{rank}"] = segment.exists()


@pytest.mark.distributed
def test_a_clean_two_rank_cpu_shutdown_leaves_no_segment():
    out = mp.get_context("spawn").Manager().dict()  # never a fork of this (large) process
    mp.start_processes(_rank, args=(free_port(), out), nprocs=2, start_method="spawn", join=True)
    assert out["during0"] and out["during1"], "DeepSpeed's shm all-reduce did not create its segments"
    assert not out["after0"] and not out["after1"]
