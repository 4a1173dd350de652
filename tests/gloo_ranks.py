"""Run a test function on two real gloo ranks (torch.distributed, spawned processes, no engines).

``worker(rank, out, *args)`` must be a module-level function (spawn imports it by name); it runs
between ``init_process_group`` and ``destroy_process_group`` and writes its results into ``out``
(a shared dict), which :func:`run_on_two_ranks` returns.
"""
import os

import torch
import torch.distributed as tdist
import torch.multiprocessing as mp

from vcppo.runtime.dist import DistInfo

from vcppo.runtime.launch_env import free_port


def cpu_info(rank: int, world_size: int = 2) -> DistInfo:
    return DistInfo(rank=rank, world_size=world_size, local_rank=rank, device=torch.device("cpu"),
                    backend="gloo", is_main=rank == 0)


def _entry(rank, port, out, worker, args):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    tdist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        worker(rank, out, *args)
        tdist.barrier()
    finally:
        tdist.destroy_process_group()


def run_on_two_ranks(worker, *args) -> dict:
    out = mp.get_context("spawn").Manager().dict()  # never a fork of this (large) process
    mp.start_processes(_entry, args=(free_port(), out, worker, args), nprocs=2, start_method="spawn", join=True)
    return dict(out)
