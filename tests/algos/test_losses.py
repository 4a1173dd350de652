"""Losses: hand-computed policy / value / KL / entropy values, aggregation modes, micro-batching."""
import math

import pytest
import torch

from vcppo.algos.losses import (
    aggregate_loss,
    entropy_from_logits,
    policy_loss,
    positive_example_nll,
    value_loss,
)
from vcppo.algos.mismatch import tis_weights


def _policy_case():
    # token:        t0     t1     t2     t3     t4 (masked, garbage)
    ratio = torch.tensor([[1.5, 0.5, 1.1, 4.0, 50.0]])
    adv = torch.tensor([[1.0, -1.0, 2.0, -1.0, float("nan")]])
    mask = torch.tensor([[1, 1, 1, 1, 0]], dtype=torch.bool)
    old = torch.full_like(ratio, -2.0)
    return old + ratio.log(), old, adv, mask


def test_policy_loss_hand_computed():
    logprobs, old, adv, mask = _policy_case()
    # eps = 0.2. per token max(-A r, -A clip(r, .8, 1.2)):
    #   t0 A=+1 r=1.5: max(-1.5, -1.2) = -1.2  (clip high active)
    #   t1 A=-1 r=0.5: max( 0.5,  0.8) =  0.8  (clip low active)
    #   t2 A=+2 r=1.1: max(-2.2, -2.2) = -2.2
    #   t3 A=-1 r=4.0: max( 4.0,  1.2) =  4.0  -> dual clip c=3: min(4.0, 3.0) = 3.0
    # token-mean: (-1.2 + .8 - 2.2 + 4) / 4 = .35 ; with dual clip (.. + 3) / 4 = .1
    loss, metrics = policy_loss(logprobs, old, adv, mask, eps_low=0.2, eps_high=0.2)
    assert loss.item() == pytest.approx(0.35, abs=1e-6)
    assert metrics["clip_frac_high"].item() == pytest.approx(0.25)
    assert metrics["clip_frac_low"].item() == pytest.approx(0.25)
    assert metrics["dual_clip_frac"].item() == 0.0
    k3 = [(r - 1) - math.log(r) for r in (1.5, 0.5, 1.1, 4.0)]
    assert metrics["approx_kl"].item() == pytest.approx(sum(k3) / 4, rel=1e-5)
    assert metrics["ratio_mean"].item() == pytest.approx((1.5 + 0.5 + 1.1 + 4.0) / 4, rel=1e-6)
    loss_dc, metrics_dc = policy_loss(logprobs, old, adv, mask, dual_clip_c=3.0)
    assert loss_dc.item() == pytest.approx(0.1, abs=1e-6)
    assert metrics_dc["dual_clip_frac"].item() == pytest.approx(0.25)


def test_policy_loss_clip_higher():
    logprobs, old, adv, mask = _policy_case()
    # eps_high = .28: t0 becomes max(-1.5, -1.28) = -1.28 ; the rest unchanged -> (.35*4 - .08)/4
    loss, metrics = policy_loss(logprobs, old, adv, mask, eps_low=0.2, eps_high=0.28)
    assert loss.item() == pytest.approx((1.4 - 0.08) / 4, abs=1e-6)
    assert metrics["clip_frac_high"].item() == pytest.approx(0.25)
    with pytest.raises(ValueError):
        policy_loss(logprobs, old, adv, mask, dual_clip_c=1.0)


def test_policy_loss_gradient_is_zero_on_clipped_tokens():
    logprobs, old, adv, mask = _policy_case()
    logprobs = logprobs.clone().requires_grad_(True)
    loss, _ = policy_loss(logprobs, old, adv, mask, dual_clip_c=3.0)
    loss.backward()
    grad = logprobs.grad[0]
    # t0, t1 clipped, t3 dual-clipped (constant -c*A), t4 masked -> no gradient; t2: -A r / 4
    assert grad[0] == 0 and grad[1] == 0 and grad[3] == 0 and grad[4] == 0
    assert grad[2].item() == pytest.approx(-2.0 * 1.1 / 4, rel=1e-5)


def test_value_loss_hand_computed():
    values = torch.tensor([[1.0, 0.9, 7.0]])
    old = torch.tensor([[0.5, 0.5, 0.0]])
    returns = torch.tensor([[0.0, 1.0, 0.0]])
    mask = torch.tensor([[1, 1, 0]])
    # t0: (1 - 0)^2 = 1 vs clipped V = .5 + .2 = .7 -> .49 ; 0.5 * max = .5
    # t1: (.9 - 1)^2 = .01 vs clipped V = .7 -> .09 (clip active) ; 0.5 * .09 = .045
    loss, metrics = value_loss(values, old, returns, mask, clip_range=0.2)
    assert loss.item() == pytest.approx((0.5 + 0.045) / 2, abs=1e-6)
    assert metrics["value_clip_frac"].item() == pytest.approx(0.5)
    loss_nc, metrics_nc = value_loss(values, old, returns, mask, clip_range=None)
    assert loss_nc.item() == pytest.approx((0.5 + 0.005) / 2, abs=1e-6)
    assert metrics_nc["value_clip_frac"].item() == 0.0
    # the values' statistics are the step's, pooled over the global batch: a micro-batch's own
    # (merged into the step's record after them) would overwrite them with a mean of micro-batches
    assert set(metrics) == {"value_clip_frac"}


def test_entropy_from_logits():
    logits = torch.tensor([[
        [0.0, 0.0, 0.0, 0.0],                                      # uniform: log 4
        [math.log(0.5), math.log(0.25), math.log(0.25), -math.inf],  # 1.5 log 2
        [1000.0, 1000.0, -math.inf, -math.inf],                    # huge logits: log 2
        [5.0, -math.inf, -math.inf, -math.inf],                    # one-hot: 0
    ]])
    h = entropy_from_logits(logits)
    expected = torch.tensor([[math.log(4), 1.5 * math.log(2), math.log(2), 0.0]])
    torch.testing.assert_close(h, expected)
    assert h.shape == (1, 4)


def test_aggregation_modes_hand_computed():
    loss_mat = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0], [7.0, 7.0, 7.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])   # last row empty: ignored
    assert aggregate_loss(loss_mat, mask, "token-mean").item() == pytest.approx(10 / 4)
    assert aggregate_loss(loss_mat, mask, "seq-mean-token-mean").item() == pytest.approx((2 + 4) / 2)
    assert aggregate_loss(loss_mat, mask, "seq-mean-token-sum").item() == pytest.approx((6 + 4) / 2)
    empty = torch.zeros_like(mask)
    for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        assert aggregate_loss(loss_mat, empty, agg).item() == 0.0
    with pytest.raises(ValueError):
        aggregate_loss(loss_mat, mask, "mean")


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_global_counts_make_micro_batches_equal_full_batch(agg):
    g = torch.Generator().manual_seed(0)
    B, T = 8, 12
    logprobs = torch.randn(B, T, generator=g).requires_grad_(True)
    old = logprobs.detach() + 0.1 * torch.randn(B, T, generator=g)
    adv = torch.randn(B, T, generator=g)
    lengths = torch.tensor([1, 12, 5, 0, 7, 3, 12, 2])          # unequal lengths, one empty
    mask = torch.arange(T)[None, :] < lengths[:, None]
    full, _ = policy_loss(logprobs, old, adv, mask, agg=agg)
    (full_grad,) = torch.autograd.grad(full, logprobs)

    counts = dict(global_token_count=int(mask.sum()), global_seq_count=int((lengths > 0).sum()))
    total, grad = 0.0, torch.zeros_like(logprobs)
    for rows in (slice(0, 3), slice(3, 4), slice(4, 8)):           # 3 uneven micro-batches
        part, _ = policy_loss(logprobs[rows], old[rows], adv[rows], mask[rows], agg=agg, **counts)
        (g_part,) = torch.autograd.grad(part, logprobs)
        total, grad = total + part.item(), grad + g_part
    assert total == pytest.approx(full.item(), rel=1e-6, abs=1e-7)
    torch.testing.assert_close(grad, full_grad)
    # Without the global count each micro-batch normalises by itself: not equal in general.
    naive = sum(policy_loss(logprobs[r], old[r], adv[r], mask[r], agg=agg)[0].item()
                for r in (slice(0, 3), slice(3, 4), slice(4, 8)))
    assert naive != pytest.approx(full.item(), rel=1e-3)


def test_positive_example_nll():
    logprobs = torch.tensor([[-1.0, -2.0, -3.0], [-4.0, -5.0, -6.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    loss, metrics = positive_example_nll(logprobs, mask, torch.tensor([True, False]))
    assert loss.item() == pytest.approx(1.5)                      # (1 + 2) / 2, row 1 ignored
    assert metrics["num_positive"].item() == 1
    none, _ = positive_example_nll(logprobs, mask, torch.tensor([False, False]))
    none.backward()
    assert none.item() == 0.0 and not torch.isnan(logprobs.grad).any()
    assert (logprobs.grad == 0).all()


def _decoupled(logprobs, proximal, behaviour, adv, mask, cap):
    """Decoupled PPO (AReaL, arXiv 2505.24298 eq. 5): the clip anchored on the proximal policy
    pi_old (recomputed by the current actor), the behaviour policy (the stale sampler) entering
    through the truncated weight min(pi_old / pi_behav, cap) -- policy_loss with tis_weights."""
    weights, stats = tis_weights(proximal, behaviour, mask, cap)
    loss, _ = policy_loss(logprobs, proximal, adv, mask, eps_low=0.2, eps_high=0.2, is_weights=weights)
    return loss, stats


def test_decoupled_loss_by_hand():
    # token 1: A=+1, pi=0.55, pi_old=0.5, pi_behav=0.25: r=1.1 (inside the clip), w=min(2, 1.5)=1.5
    #          l = -A r w = -1.65
    # token 2: A=-2, pi=0.3, pi_old=0.4, pi_behav=0.5: r=0.75 < 0.8, clipped: l = 2 * 0.8 = 1.6,
    #          w = 0.8 (not truncated): 1.28, and no gradient
    logprobs = torch.log(torch.tensor([[0.55, 0.3]])).requires_grad_()
    proximal, behaviour = torch.log(torch.tensor([[0.5, 0.4]])), torch.log(torch.tensor([[0.25, 0.5]]))
    adv, mask = torch.tensor([[1.0, -2.0]]), torch.ones(1, 2)
    loss, stats = _decoupled(logprobs, proximal, behaviour, adv, mask, cap=1.5)
    assert loss.item() == pytest.approx((-1.65 + 1.28) / 2, abs=1e-6)
    loss.backward()
    # d/dlogp of -A r w = -A r w (r = exp(logp - logp_old)); the clipped token gets none
    assert logprobs.grad[0].tolist() == pytest.approx([-1.65 / 2, 0.0], abs=1e-6)
    assert stats["truncated_frac"].item() == pytest.approx(0.5)
    assert stats["weight_max"].item() == pytest.approx(1.5)


def test_decoupled_loss_is_the_on_policy_loss_when_the_sampler_is_current():
    g = torch.Generator().manual_seed(3)
    logprobs = -torch.rand(4, 9, generator=g) * 3
    proximal = logprobs + 0.1 * torch.randn(4, 9, generator=g)
    adv, mask = torch.randn(4, 9, generator=g), (torch.rand(4, 9, generator=g) > 0.2).float()
    on_policy, _ = policy_loss(logprobs, proximal, adv, mask, eps_low=0.2, eps_high=0.2)
    decoupled, stats = _decoupled(logprobs, proximal, proximal.clone(), adv, mask, cap=2.0)
    assert torch.equal(decoupled, on_policy)  # w = exp(0) = 1 exactly
    assert stats["truncated_frac"].item() == 0.0
