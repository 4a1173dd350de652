"""balance_across_ranks with two real gloo ranks (torch.distributed, no engines): whole prompt groups
move so every rank trains on about the same real tokens, and no sample is lost or duplicated."""
import pytest
import torch

from tests.gloo_ranks import cpu_info, run_on_two_ranks
from vcppo.driver.step.sampler import balance_across_ranks
from vcppo.experience import Rollout, make_layout


def _rank_batch(rank):
    # rank 0 sampled 2 prompts with long responses, rank 1 two with short ones; 2 samples per prompt
    lengths = [[300, 280, 250, 260], [10, 12, 8, 9]][rank]
    b = Rollout.unscored(make_layout([[1, 2, 3]] * 4, [[7] * n for n in lengths], pad_id=0))
    return Rollout(**{**vars(b), "group": torch.tensor([2 * rank, 2 * rank, 2 * rank + 1, 2 * rank + 1]),
                      "scores": torch.tensor([float(n) for n in lengths])})


def _worker(rank, out):
    b = balance_across_ranks(_rank_batch(rank), cpu_info(rank))
    out[rank] = (b.group.tolist(), b.scores.tolist(), int(b.attention_mask.sum()), tuple(b.responses.shape),
                 [int(x) for x in b.policy_mask.sum(1)], b.prompt_len)


@pytest.mark.distributed
def test_two_ranks_get_balanced_whole_groups():
    out = run_on_two_ranks(_worker)
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
    assert balance_across_ranks(b, cpu_info(0, world_size=1)) is b
