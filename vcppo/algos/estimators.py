"""Critic-free advantage estimators beside GRPO (:func:`vcppo.algos.stats.grpo_advantages`): RLOO,
REINFORCE++ and REINFORCE++-baseline. Pure tensor math; :mod:`vcppo.driver.step.advantages` selects them
by ``algorithm.advantage_estimator`` (:mod:`vcppo.methods` says what each needs).

Notation
--------
    B, T        batch size, padded response length
    rewards     (B, T) per-token reward r_t: the outcome on a response's last token, minus the KL
                penalty per token when it is in the reward (``algorithm.kl_in: reward``)
    mask        (B, T) 1 on response tokens, 0 on padding (a valid prefix per row)
    R_i         sum_t r_{i,t}: sample i's return (gamma = 1)
    G_{i,t}     sum_{s >= t} gamma^(s - t) r_{i,s}: the discounted return-to-go
    group       (B,) the prompt each sample belongs to; g(i) its group, n_g its size
"""
from __future__ import annotations

import torch

from vcppo.algos.gae import decoupled_gae

__all__ = ["group_mean", "rloo_advantages", "returns_to_go", "reinforce_pp_baseline_returns"]


def group_mean(values: torch.Tensor, group: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B,) float values, (B,) group ids (any values, any order) -> ((B,) mean of each sample's
    group, (B,) size of its group), float32."""
    values = values.float()
    _, gid = torch.unique(group, return_inverse=True)
    n = int(gid.max()) + 1 if gid.numel() else 0
    count = torch.zeros(n, device=values.device).index_add_(0, gid, torch.ones_like(values))
    total = torch.zeros(n, device=values.device).index_add_(0, gid, values)
    return (total / count)[gid], count[gid]


def rloo_advantages(returns: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """RLOO's leave-one-out advantage (Ahmadian et al. 2024, arXiv 2402.14740, eq. 6):

        A_i = R_i - 1 / (n_g - 1) * sum_{j in g(i), j != i} R_j  =  n_g / (n_g - 1) * (R_i - mean_g R)

    The baseline of each sample is the mean of the OTHER samples of its prompt, so it does not
    depend on the sample's own action (unbiased, unlike the group mean). Not whitened.

    Args:
        returns: (B,) R_i. group: (B,) group ids.
    Returns:
        (B,) float32; 0 for a sample alone in its group (no other sample to compare with) and for
        every sample of a group whose returns are all equal. Broadcast over tokens with
        ``adv[:, None] * mask``.
    """
    returns = returns.float()
    mean, count = group_mean(returns, group)
    adv = (returns - mean) * count / (count - 1).clamp(min=1)
    return torch.where(count > 1, adv, torch.zeros_like(adv))


def returns_to_go(rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """REINFORCE++'s token-level return (Hu et al. 2025, arXiv 2501.03262, sec. 3):

        G_{i,t} = sum_{s >= t} gamma^(s - t) r_{i,s}

    with the KL penalty inside r (a token-level penalty: every token's return carries the KL of
    the tokens after it). Computed as GAE at lambda = 1 with V = 0, which telescopes to it, so it
    is bit for bit the Monte-Carlo target a critic would get. REINFORCE++ then normalises G over
    every valid token of the global batch, (G - mean) / std: the caller's whitening
    (:func:`vcppo.algos.stats.masked_whiten`, over all ranks).

    Args:
        rewards, mask: (B, T). gamma: discount.
    Returns:
        (B, T) float32, 0 on padding.
    """
    _, g = decoupled_gae(rewards, torch.zeros_like(rewards), mask, gamma=gamma, lam_actor=1.0, lam_critic=1.0)
    return g


def reinforce_pp_baseline_returns(rewards: torch.Tensor, mask: torch.Tensor, scores: torch.Tensor,
                                  group: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """REINFORCE++-baseline (Hu et al. 2025, arXiv 2501.03262; OpenRLHF's ``reinforce_baseline``):
    the group's mean outcome as the baseline, then the token-level return:

        A_{i,t} = G_{i,t} - mean_{j in g(i)} s_j

    ``scores`` s are the outcome rewards WITHOUT the KL penalty (OpenRLHF subtracts the group mean
    from the outcome before adding the per-token KL). With gamma = 1 and no KL every token of sample
    i gets s_i - mean_g s. The caller then normalises over the global batch (as REINFORCE++).
    A group of one sample gets G - s (its own outcome as the baseline: nothing to learn from it).

    Args:
        rewards, mask: (B, T). scores: (B,). group: (B,) group ids. gamma: discount.
    Returns:
        (B, T) float32, 0 on padding.
    """
    baseline, _ = group_mean(scores, group)
    return (returns_to_go(rewards, mask, gamma) - baseline[:, None]) * mask.float()
