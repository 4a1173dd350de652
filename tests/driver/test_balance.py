"""balance_across_ranks with two real gloo ranks (torch.distributed, no engines): whole prompt groups
move so every rank trains on about the same real tokens, and no sample is lost or duplicated."""
import os
import socket

import pytest
import torch
import torch.distributed as tdist
import torch.multiprocessing as mp

from vcppo.driver.sampling import balance_across_ranks
from vcppo.engines.dist import DistInfo
from vcppo.experience import make_experience


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_batch(rank):
    # rank 0 sampled 2 prompts with long responses, rank 1 two with short ones; 2 samples per prompt
    lengths = [[300, 280, 250, 260], [10, 12, 8, 9]][rank]
    b = make_experience([[1, 2, 3]] * 4, [[7] * n for n in lengths], pad_id=0)
    b.group = torch.tensor([2 * rank, 2 * rank, 2 * rank + 1, 2 * rank + 1])
    b.scores = torch.tensor([float(n) for n in lengths])
    return b


def _worker(rank, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    tdist.init_process_group("gloo", rank=rank, world_size=2)
    info = DistInfo(rank=rank, world_size=2, local_rank=rank, device=torch.device("cpu"), backend="gloo",
                    is_main=rank == 0)
    b = balance_across_ranks(_rank_batch(rank), info)
    out[rank] = (b.group.tolist(), b.scores.tolist(), int(b.attention_mask.sum()), tuple(b.responses.shape),
                 [int(x) for x in b.response_mask.sum(1)], b.prompt_len)
    tdist.barrier()
    tdist.destroy_process_group()


@pytest.mark.distributed
def test_two_ranks_get_balanced_whole_groups():
    out = mp.Manager().dict()
    mp.start_processes(_worker, args=(_port(), out), nprocs=2, start_method="spawn", join=True)
    (g0, s0, t0, shape0, len0, p0), (g1, s1, t1, shape1, len1, p1) = out[0], out[1]
    # every sample exactly once, groups whole, lengths travel with their rows
    assert sorted(s0 + s1) == sorted([300, 280, 250, 260, 10, 12, 8, 9])
    assert len0 == [int(s) for s in s0] and len1 == [int(s) for s in s1]
    for g in set(g0):
        assert g not in g1 and g0.count(g) == 2
    # each rank now holds one long group: 586 vs 516 + 28 + 23 real tokens instead of 1102 vs 51
    assert max(t0, t1) < 700 and min(t0, t1) > 500
    # trimmed to what the rank holds
    assert shape0[1] == max(len0) and shape1[1] == max(len1) and p0 == p1 == 3


def test_one_rank_is_untouched():
    b = _rank_batch(0)
    info = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend="gloo", is_main=True)
    assert balance_across_ranks(b, info) is b
