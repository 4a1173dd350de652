"""Sampler/trainer mismatch: truncated importance weights (hand-computed), mismatch statistics, and
the weighted policy gradient."""
import math

import pytest
import torch

from vcppo.algos.losses import policy_loss
from vcppo.algos.mismatch import mismatch_stats, tis_weights


def _case():
    # rho = pi_old / mu per token:  0.5   1.0   3.0   e^5   (masked: garbage)
    sampler = torch.tensor([[-1.0, -2.0, -3.0, -6.0, 0.0]])
    old = sampler + torch.tensor([[math.log(0.5), 0.0, math.log(3.0), 5.0, 40.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]], dtype=torch.float32)
    return old, sampler, mask


def test_weights_are_one_when_sampler_and_trainer_agree():
    old, _, mask = _case()
    w, m = tis_weights(old, old.clone(), mask, cap=2.0)
    assert torch.equal(w, torch.ones_like(w))
    assert m["weight_mean"].item() == 1.0 and m["weight_max"].item() == 1.0
    assert m["truncated_frac"].item() == 0.0


def test_cap_truncates_large_ratios_only():
    old, sampler, mask = _case()
    w, m = tis_weights(old, sampler, mask, cap=2.0)
    torch.testing.assert_close(w, torch.tensor([[0.5, 1.0, 2.0, 2.0, 1.0]]))  # masked position: 1
    assert m["weight_mean"].item() == pytest.approx((0.5 + 1 + 2 + 2) / 4)
    assert m["weight_max"].item() == pytest.approx(2.0)
    assert m["truncated_frac"].item() == pytest.approx(0.5)
    w10, m10 = tis_weights(old, sampler, mask, cap=10.0)
    torch.testing.assert_close(w10[0, :4], torch.tensor([0.5, 1.0, 3.0, 10.0]))
    assert m10["truncated_frac"].item() == pytest.approx(0.25)
    with pytest.raises(ValueError, match=">= 1"):
        tis_weights(old, sampler, mask, cap=0.5)


def test_weights_carry_no_gradient():
    old, sampler, mask = _case()
    old = old.clone().requires_grad_(True)
    w, _ = tis_weights(old, sampler, mask, cap=2.0)
    assert not w.requires_grad


def test_mismatch_stats_hand_computed():
    old, sampler, mask = _case()
    d = [math.log(0.5), 0.0, math.log(3.0), 5.0]
    m = mismatch_stats(old, sampler, mask)
    assert m["logprob_abs_mean"].item() == pytest.approx(sum(abs(x) for x in d) / 4, rel=1e-6)
    assert m["logprob_abs_max"].item() == pytest.approx(5.0, rel=1e-6)  # the masked 40 is ignored
    assert m["kl_k3"].item() == pytest.approx(sum(math.expm1(x) - x for x in d) / 4, rel=1e-5)
    zero = mismatch_stats(old, old, mask)
    assert zero["kl_k3"].item() == 0.0 and zero["logprob_abs_max"].item() == 0.0


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_policy_gradient_is_the_weighted_gradient(agg):
    g = torch.Generator().manual_seed(0)
    B, T = 3, 6
    mask = (torch.arange(T)[None, :] < torch.tensor([[6], [2], [4]])).float()
    old = -torch.rand(B, T, generator=g)
    sampler = old + 0.7 * torch.randn(B, T, generator=g)
    adv = torch.randn(B, T, generator=g)
    base = old + 0.1 * torch.randn(B, T, generator=g)
    w, _ = tis_weights(old, sampler, mask, cap=1.5)
    assert (w[mask > 0] < 1).any() and (w[mask > 0] == 1.5).any()  # both sides of 1 are exercised

    plain = base.clone().requires_grad_(True)
    policy_loss(plain, old, adv, mask, eps_high=0.28, agg=agg)[0].backward()
    weighted = base.clone().requires_grad_(True)
    loss_w, _ = policy_loss(weighted, old, adv, mask, eps_high=0.28, agg=agg, is_weights=w.requires_grad_(True))
    loss_w.backward()
    # Each token's loss depends on its own logprob only: the gradient is w_t times the plain one.
    torch.testing.assert_close(weighted.grad, w.detach() * plain.grad)
    assert w.grad is None  # detached inside the loss
    assert not torch.allclose(weighted.grad, plain.grad)
    ones, _ = policy_loss(base, old, adv, mask, agg=agg, is_weights=torch.ones(B, T))
    assert ones.item() == pytest.approx(policy_loss(base, old, adv, mask, agg=agg)[0].item())
