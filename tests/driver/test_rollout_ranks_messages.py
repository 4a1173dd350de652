"""The staleness rule of split placement (vcppo.driver.placement.rollout_ranks): which batch may be sampled
when, and which batches a checkpoint must hold."""
import pytest

from vcppo.driver.state import Phase
from vcppo.driver.placement.rollout_ranks import held_after_checkpoint, lookahead, may_sample


@pytest.mark.parametrize("staleness", [0, 1, 2])
def test_a_ppo_batch_lags_the_training_weights_by_at_most_max_staleness(staleness):
    ahead = lookahead(Phase.PPO, staleness)
    for step in range(1, 8):
        # the earliest the trainer's progress lets batch `step` be sampled
        earliest = min(done for done in range(0, step) if may_sample(step, done, ahead))
        # sampled with the weights after step `earliest`; trained on after step - 1
        assert (step - 1) - earliest == min(staleness, step - 1)


def test_synchronous_ppo_samples_only_the_next_batch():
    assert may_sample(4, 3, lookahead(Phase.PPO, 0)) and not may_sample(5, 3, lookahead(Phase.PPO, 0))


@pytest.mark.parametrize("staleness", [0, 1, 2])
def test_value_pretraining_always_runs_ahead(staleness):
    # the policy is frozen: running ahead is free of off-policy error
    assert lookahead(Phase.VALUE_PRETRAIN, staleness) == max(1, staleness)


def test_a_checkpoint_holds_the_ppo_batches_sampled_with_older_weights():
    assert list(held_after_checkpoint(Phase.PPO, 4, 10, 0)) == []
    assert list(held_after_checkpoint(Phase.PPO, 4, 10, 2)) == [5, 6]
    assert list(held_after_checkpoint(Phase.PPO, 9, 10, 2)) == [10]  # none past the last step
    assert list(held_after_checkpoint(Phase.PPO, 10, 10, 2)) == []
    assert list(held_after_checkpoint(Phase.VALUE_PRETRAIN, 4, 10, 2)) == []  # sampled again from their seeds
