"""Stats: masked moments, whitening, explained variance, position diagnostics, GRPO, pass@k."""
import math

import numpy as np
import pytest
import torch

from vcppo.algos.stats import (
    advantage_position_correlation,
    advantage_position_profile,
    explained_variance,
    grpo_advantages,
    masked_mean,
    masked_var,
    masked_whiten,
    pass_at_k,
)


def test_masked_mean_and_var_ignore_masked_entries():
    x = torch.tensor([[1.0, 2.0, 3.0, float("nan")]])
    m = torch.tensor([[1, 1, 1, 0]])
    assert masked_mean(x, m).item() == pytest.approx(2.0)
    assert masked_var(x, m).item() == pytest.approx(1.0)                 # (1 + 0 + 1) / 2
    assert masked_var(x, m, unbiased=False).item() == pytest.approx(2 / 3)
    torch.testing.assert_close(masked_mean(torch.tensor([[1.0, 3.0], [5.0, 7.0]]),
                                           torch.tensor([[1, 1], [1, 0]]), dim=1),
                               torch.tensor([2.0, 5.0]))
    assert math.isnan(masked_mean(x, torch.zeros_like(m)).item())


def test_masked_whiten_zero_mean_flag():
    x = torch.tensor([[1.0, 3.0, 5.0, 100.0]])
    m = torch.tensor([[1, 1, 1, 0]])
    # mean 3, unbiased var 4, std 2
    torch.testing.assert_close(masked_whiten(x, m), torch.tensor([[-1.0, 0.0, 1.0, 0.0]]))
    torch.testing.assert_close(masked_whiten(x, m, zero_mean=False), torch.tensor([[2.0, 3.0, 4.0, 0.0]]))


def test_explained_variance():
    returns = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    m = torch.ones(1, 4)
    assert explained_variance(returns, returns, m).item() == pytest.approx(1.0)
    assert explained_variance(torch.zeros_like(returns), returns, m).item() == pytest.approx(0.0)
    # residual R - V = [0, 0, 0, 4] -> Var = 4 ; Var(R) = 5/3 -> 1 - 12/5 = -1.4
    assert explained_variance(torch.tensor([[1.0, 2.0, 3.0, 0.0]]), returns, m).item() == pytest.approx(-1.4)
    assert math.isnan(explained_variance(returns, torch.ones_like(returns), m).item())


def test_advantage_position_profile_and_correlation():
    adv = torch.tensor([[4.0, 3.0, 2.0, 1.0], [8.0, 6.0, 99.0, 99.0]])
    m = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    prof = advantage_position_profile(adv, m, num_buckets=2)
    assert prof.edges.tolist() == [0, 2, 4]
    assert prof.counts.tolist() == [4, 2]
    torch.testing.assert_close(prof.means, torch.tensor([(4 + 3 + 8 + 6) / 4, 1.5]))
    # Early tokens with larger advantages -> negative correlation (the VC-PPO collapse sign).
    decreasing = torch.arange(10.0, 0.0, -1.0)[None]
    assert advantage_position_correlation(decreasing, torch.ones(1, 10)).item() == pytest.approx(-1.0)
    assert advantage_position_correlation(-decreasing, torch.ones(1, 10)).item() == pytest.approx(1.0)
    empty_bucket = advantage_position_profile(adv, torch.tensor([[1, 0, 0, 0], [1, 0, 0, 0]]), 2)
    assert empty_bucket.counts.tolist() == [2, 0] and math.isnan(empty_bucket.means[1].item())


def test_grpo_advantages():
    scores = torch.tensor([1.0, 0.0, 1.0, 1.0, 5.0])
    adv = grpo_advantages(scores, group_ids=torch.tensor([0, 0, 1, 1, 2]))
    s = 1 / math.sqrt(0.5)  # group 0: mean .5, unbiased std sqrt(.5)
    torch.testing.assert_close(adv, torch.tensor([0.5 * s, -0.5 * s, 0.0, 0.0, 0.0]), atol=1e-4, rtol=1e-5)
    adv_by_n = grpo_advantages(scores[:4], n_samples=2, scale_by_std=False)
    torch.testing.assert_close(adv_by_n, torch.tensor([0.5, -0.5, 0.0, 0.0]))
    with pytest.raises(ValueError):
        grpo_advantages(scores, n_samples=2)


def test_pass_at_k_hand_computed_and_vectorised():
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(10, 3, 2) == pytest.approx(1 - 21 / 45)       # 1 - C(7,2)/C(10,2)
    assert pass_at_k(10, 0, 5) == 0.0
    assert pass_at_k(10, 8, 3) == 1.0                                # n - c = 2 < k
    assert pass_at_k(1000, 500, 10) == pytest.approx(1 - math.comb(500, 10) / math.comb(1000, 10), rel=1e-12)
    got = pass_at_k(np.array([10, 10, 16]), np.array([3, 0, 16]), 2)
    np.testing.assert_allclose(got, [1 - 21 / 45, 0.0, 1.0])
    with pytest.raises(ValueError):
        pass_at_k(5, 6, 1)
