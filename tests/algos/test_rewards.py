"""Rule and reward-model rewards combined, and the running moments that normalise model scores."""
import numpy as np
import pytest
import torch

from vcppo.algos.rewards import Moments, batch_moments, combine_rewards, normalise

RULE = torch.tensor([1.0, -1.0, 1.0, -1.0])
MODEL = torch.tensor([0.5, 0.25, -2.0, 3.0])


def test_each_mode_hand_computed():
    assert combine_rewards(RULE, None, "rule").tolist() == RULE.tolist()
    assert combine_rewards(RULE, MODEL, "model").tolist() == MODEL.tolist()
    assert combine_rewards(RULE, MODEL, "weighted_sum", 0.5, 2.0).tolist() == [1.5, 0.0, -3.5, 5.5]
    has_rule = torch.tensor([1.0, 0.0, 0.0, 1.0])
    assert combine_rewards(RULE, MODEL, "model_without_rule", has_rule=has_rule).tolist() == [1.0, 0.25, -2.0, -1.0]


def test_modes_that_lack_an_input_say_so():
    with pytest.raises(ValueError, match="reward model"):
        combine_rewards(RULE, None, "model")
    with pytest.raises(ValueError, match="has_rule"):
        combine_rewards(RULE, MODEL, "model_without_rule")
    with pytest.raises(ValueError, match="combine mode"):
        combine_rewards(RULE, MODEL, "average")


def test_moments_merged_batch_by_batch_equal_those_of_all_values():
    rng = np.random.default_rng(0)
    batches = [rng.normal(3.0, 2.0, size=n) for n in (5, 1, 17, 8)]
    m = Moments()
    for b in batches:
        m = m.merged(*batch_moments(torch.tensor(b)))
    every = np.concatenate(batches)
    assert m.count == len(every)
    assert m.mean == pytest.approx(every.mean(), rel=1e-12)
    assert m.std == pytest.approx(every.std(), rel=1e-12)  # population std
    assert m.merged(*batch_moments(torch.tensor([]))) == m


def test_normalise_standardises():
    m = Moments().merged(*batch_moments(MODEL))
    z = normalise(MODEL, m)
    assert z.mean().item() == pytest.approx(0.0, abs=1e-6)
    assert z.std(unbiased=False).item() == pytest.approx(1.0, rel=1e-5)
    assert Moments().std == 0.0 and Moments(1.0, 2.0, 0.0).std == 0.0
