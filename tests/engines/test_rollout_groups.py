"""Rollout groups (tensor-parallel vLLM replicas) and which prompts each rank samples and trains on."""
import pytest

from vcppo.engines.rollout_groups import RolloutGroups, contiguous_share


@pytest.mark.parametrize("world", [1, 2, 4, 8])
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_groups_partition_ranks_and_prompts(world, tp):
    if world % tp:
        with pytest.raises(ValueError, match="tensor_parallel_size"):
            RolloutGroups(world, tp)
        return
    g = RolloutGroups(world, tp)
    assert g.num_groups == world // tp
    # every rank is in exactly one group of tp consecutive ranks
    assert sorted(r for k in range(g.num_groups) for r in g.members(k)) == list(range(world))
    for r in range(world):
        assert r in g.members(g.group_of(r)) and len(g.members(g.group_of(r))) == tp
    n_prompts = 8 * world  # prompts_per_step is divisible by the number of ranks
    sampled = [g.group_prompts(n_prompts, k) for k in range(g.num_groups)]
    assert [i for s in sampled for i in s] == list(range(n_prompts))  # groups split the prompts
    trained = [g.train_prompts(n_prompts, r) for r in range(world)]
    assert [i for t in trained for i in t] == list(range(n_prompts))  # ranks split them again
    assert {len(t) for t in trained} == {n_prompts // world}           # evenly
    for r in range(world):  # a rank trains only on what its group sampled
        share = g.group_prompts(n_prompts, g.group_of(r))
        assert set(trained[r]) <= set(share)
        # all ranks of a group sample the same prompts (identical requests)
        assert all(g.group_prompts(n_prompts, g.group_of(m)) == share for m in g.members(g.group_of(r)))


def test_tp1_is_the_per_rank_split():
    g = RolloutGroups(4, 1)
    for r in range(4):
        assert g.group_prompts(10, r) == g.train_prompts(10, r) == contiguous_share(10, r, 4)
    assert [len(contiguous_share(10, r, 4)) for r in range(4)] == [3, 3, 3, 1]


def test_rollout_share_is_relative_to_the_group_rows():
    from vcppo.driver.step.sampler import rollout_share
    from vcppo.runtime.dist import DistInfo
    import torch
    info = DistInfo(rank=3, world_size=4, local_rank=3, device=torch.device("cpu"), backend="gloo", is_main=False)
    sampled, kept = rollout_share(16, info, tp_size=2)
    assert sampled == range(8, 16) and kept == range(4, 8)   # group 1 samples 8-15, rank 3 keeps 12-15
    sampled, kept = rollout_share(16, info, tp_size=1)
    assert sampled == range(12, 16) and kept == range(0, 4)
