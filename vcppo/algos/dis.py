"""SAO's policy loss: direct double-sided importance sampling (DIS) against the sampler's own
token logprobs (SAO, arXiv 2607.07508 sec. 3.1; ``algorithm.policy_loss: dis``).

There is no pi_old: the behaviour policy mu is the rollout engine's, read from the logprobs it
returned with each sampled token, so the step runs no old-logprob forward pass and the
sampler/trainer mismatch is part of the same ratio (no separate TIS weight).

Notation
--------
    B, T          batch size, padded response length
    logprobs      (B, T) log pi_theta(a_t | s_t), the current policy (differentiable)
    old_logprobs  (B, T) log mu(a_t | s_t), the SAMPLER's logprobs of the same tokens (a constant)
    A_t           (B, T) advantages
    mask          (B, T) the policy's tokens (observation tokens of an episode are 0)
    r_t           exp(log pi_theta - log mu)
    [lo, hi]      the two-sided trust region, lo = 1 - eps_low, hi = 1 + eps_high
                  (ports of the paper: [0.2, 4.0], i.e. eps_low 0.8, eps_high 3.0)

    l_t = -A_t r_t 1[lo <= r_t <= hi]

Inside the region the ratio is the importance weight itself (gradient -A_t r_t d log pi_theta, the
REINFORCE gradient re-weighted to mu's samples); outside it, on EITHER side, the token is masked
out (zero loss, zero gradient) whatever the sign of A_t. PPO's clip instead keeps the gradient of a
token whose ratio left the range in the direction that brings it back, and clips one side per sign
of A_t.
"""
from __future__ import annotations

from typing import Optional

import torch

from vcppo.algos.losses import aggregate_loss
from vcppo.algos.stats import _valid, masked_mean

__all__ = ["dis_loss"]


def dis_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float = 0.8,
    eps_high: float = 3.0,
    agg: str = "token-mean",
    global_token_count: Optional[float] = None,
    global_seq_count: Optional[float] = None,
    norm_constant: Optional[float] = None,
    is_weights: Optional[torch.Tensor] = None,
    dual_clip_c: Optional[float] = None,
) -> tuple[torch.Tensor, dict]:
    """DIS (module docstring), as a loss to minimise; the signature of
    :func:`vcppo.algos.losses.policy_loss` (the methods table calls both alike).

    Args:
        logprobs: (B, T) current policy. old_logprobs: (B, T) the sampler's logprobs (mu).
        advantages, mask: (B, T).
        eps_low, eps_high: the trust region [1 - eps_low, 1 + eps_high] of r_t (default [0.2, 4.0]).
        agg, global_token_count, global_seq_count, norm_constant: see `losses.aggregate_loss`; a
            masked-out token still counts in the denominator (its loss is 0, as a clipped PPO token's).
        is_weights: must be None (the ratio is already against the sampler: no TIS on top).
        dual_clip_c: must be None (the region is two-sided already).

    Returns:
        loss (0-d), metrics over valid tokens:
            clip_frac_low   share with r < 1 - eps_low (masked out); clip_frac_high: r > 1 + eps_high
            approx_kl       k3 estimate of KL(mu || pi_theta) = (r - 1) - log r
            ratio_mean, ratio_max
    """
    if is_weights is not None or dual_clip_c is not None:
        raise ValueError("DIS's ratio is against the sampler and its region two-sided: is_weights "
                         "(algorithm.rollout_is_cap) and dual_clip_c must be None")
    if eps_low < 0 or eps_high < 0:
        raise ValueError(f"DIS's region [1 - eps_low, 1 + eps_high] needs eps >= 0, got {eps_low}, {eps_high}")
    valid = _valid(mask)
    log_ratio = torch.where(valid, logprobs.float() - old_logprobs.float(), torch.zeros((), device=logprobs.device))
    ratio = torch.exp(log_ratio)
    low, high = ratio.detach() < 1.0 - eps_low, ratio.detach() > 1.0 + eps_high
    kept = valid & ~low & ~high
    adv = torch.where(valid, advantages.float(), torch.zeros_like(ratio))
    per_token = torch.where(kept, -adv * ratio, torch.zeros_like(ratio))
    loss = aggregate_loss(per_token, valid, agg, global_token_count, global_seq_count, norm_constant)
    with torch.no_grad():
        metrics = {
            "clip_frac_low": masked_mean((low & valid).float(), valid),
            "clip_frac_high": masked_mean((high & valid).float(), valid),
            "approx_kl": masked_mean((ratio - 1.0) - log_ratio, valid),
            "ratio_mean": masked_mean(ratio, valid),
            "ratio_max": torch.where(valid, ratio, torch.zeros_like(ratio)).max() if ratio.numel() else torch.zeros(()),
        }
    return loss, {k: v.detach() for k, v in metrics.items()}
