"""The actor / critic losses as the engine uses them: split into micro-batches (and, by the same
arithmetic, ranks), with the global counts the engine computes, they add up to the loss of the
whole mini-batch. Fast: plain tensors, no engine."""
import pytest
import torch

from vcppo.algos import losses
from vcppo.algos.mismatch import tis_weights
from vcppo.driver.step.update import PolicyLoss, ValueLoss
from vcppo.engines.loss_contract import GlobalCounts, ModelOutputs
from vcppo.experience import ActorBatch, CriticBatch, Rollout, make_layout
from vcppo.config.schema import AlgorithmConfig, CriticConfig


def _batch(seed=0, critic=False):
    """The actor's batch, or (``critic``) the critic's batch of the same rollout."""
    g = torch.Generator().manual_seed(seed)
    lengths = [1, 5, 3, 7, 2, 6]
    r = Rollout.unscored(make_layout([[1, 2]] * len(lengths), [[3] * n for n in lengths], pad_id=0))
    mask = r.policy_mask
    old_logprobs = -torch.rand(mask.shape, generator=g) * mask
    advantages = torch.randn(mask.shape, generator=g) * mask
    old_values = torch.randn(mask.shape, generator=g) * mask
    returns = torch.randn(mask.shape, generator=g) * mask
    r = Rollout(**{**vars(r), "correct": torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 1.0]),
                   "sampler_logprobs": (old_logprobs + 0.5 * torch.randn(mask.shape, generator=g)) * mask,
                   "truncated": torch.tensor([0.0, 1.0, 0.0, 0.0, 1.0, 0.0])})
    if critic:
        return CriticBatch(**vars(r), returns=returns, old_values=old_values)
    return ActorBatch(**vars(r), advantages=advantages, old_logprobs=old_logprobs)


def _loss_of(loss, b, params, counts):
    outputs = ModelOutputs(logprobs=params * b.policy_mask, entropy=params.abs() * b.policy_mask,
                           values=params * b.policy_mask)
    value, metrics = loss(outputs, b, counts)
    return value


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
@pytest.mark.parametrize("make_loss", [
    lambda agg: PolicyLoss(AlgorithmConfig(loss_agg=agg, entropy_coef=0.01, positive_lm_coef=0.1, dual_clip_c=3.0)),
    lambda agg: PolicyLoss(AlgorithmConfig(loss_agg=agg, rollout_is_cap=1.5, mask_truncated=True,
                                           positive_lm_coef=0.1)),
    lambda agg: ValueLoss(CriticConfig(value_clip=0.2), agg),
])
def test_micro_batch_losses_sum_to_the_full_batch_loss(agg, make_loss):
    loss = make_loss(agg)
    b = _batch(critic=isinstance(loss, ValueLoss))
    counts = GlobalCounts.over_ranks(loss.count_masks(b))
    base = (_batch().old_logprobs + 0.1 * torch.randn(b.policy_mask.shape, generator=torch.Generator().manual_seed(1)))
    full_params = base.clone().requires_grad_(True)
    full = _loss_of(loss, b, full_params, counts)
    full.backward()
    parts_params = base.clone().requires_grad_(True)
    total = 0.0
    for idx in ([0, 1], [2], [3, 4, 5]):
        total = total + _loss_of(loss, b.select(idx), parts_params[idx], counts)
    total.backward()
    torch.testing.assert_close(total, full, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(parts_params.grad, full_params.grad, rtol=1e-6, atol=1e-7)


def test_counts_cover_the_positive_samples_for_vapo():
    b = _batch()
    loss = PolicyLoss(AlgorithmConfig(positive_lm_coef=0.1))
    counts = GlobalCounts.over_ranks(loss.count_masks(b))
    assert counts.tokens == {"response": 24.0, "positive": 1.0 + 3.0 + 6.0}
    assert counts.sequences == {"response": 6.0, "positive": 3.0}
    assert set(PolicyLoss(AlgorithmConfig()).count_masks(b)) == {"response"}
    assert PolicyLoss(AlgorithmConfig(entropy_coef=0.1)).needs_entropy


def _grad_of(loss, b, base):
    params = base.clone().requires_grad_(True)
    counts = GlobalCounts.over_ranks(loss.count_masks(b))
    value = _loss_of(loss, b, params, counts)
    value.backward()
    return value, params.grad


def test_truncated_importance_sampling_through_the_policy_loss():
    """The loss the engine optimises with ``algorithm.rollout_is_cap`` is the clipped surrogate with
    every token weighted by min(pi_old / pi_sampler, cap); off (or sampler == trainer) it is the
    plain one."""
    b = _batch()
    base = b.old_logprobs + 0.1 * torch.randn(b.policy_mask.shape, generator=torch.Generator().manual_seed(2))
    plain, g_plain = _grad_of(PolicyLoss(AlgorithmConfig()), b, base)
    tis, g_tis = _grad_of(PolicyLoss(AlgorithmConfig(rollout_is_cap=1.5)), b, base)
    w, m = tis_weights(b.old_logprobs, b.sampler_logprobs, b.policy_mask, cap=1.5)
    assert 0 < m["truncated_frac"].item() < 1 and (w[b.policy_mask > 0] < 1).any()
    expected, _ = losses.policy_loss(base * b.policy_mask, b.old_logprobs, b.advantages, b.policy_mask,
                                     is_weights=w)
    torch.testing.assert_close(tis, expected)
    torch.testing.assert_close(g_tis, w * g_plain)
    assert not torch.allclose(tis, plain)
    b.sampler_logprobs = b.old_logprobs.clone()
    same, g_same = _grad_of(PolicyLoss(AlgorithmConfig(rollout_is_cap=1.5)), b, base)
    torch.testing.assert_close(same, plain)
    torch.testing.assert_close(g_same, g_plain)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_mask_truncated_is_the_loss_without_the_truncated_samples(agg):
    """DAPO's overlong filtering: the loss (value and gradient) equals the loss of the batch with the
    truncated samples removed, and truncated samples get no gradient."""
    b = _batch()
    base = b.old_logprobs + 0.1 * torch.randn(b.policy_mask.shape, generator=torch.Generator().manual_seed(3))
    cfg = dict(loss_agg=agg, entropy_coef=0.01, positive_lm_coef=0.1)
    masked, g_masked = _grad_of(PolicyLoss(AlgorithmConfig(mask_truncated=True, **cfg)), b, base)
    kept = (b.truncated == 0).nonzero().flatten()
    sub, g_sub = _grad_of(PolicyLoss(AlgorithmConfig(**cfg)), b.select(kept), base[kept])
    torch.testing.assert_close(masked, sub)
    torch.testing.assert_close(g_masked[kept], g_sub)
    assert torch.count_nonzero(g_masked[b.truncated > 0]) == 0
    full, _ = _grad_of(PolicyLoss(AlgorithmConfig(**cfg)), b, base)
    assert not torch.allclose(full, masked)
