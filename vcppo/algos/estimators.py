"""Every advantage estimator a config can name, in one signature: ``fn(EstimatorInput) -> EstimatorOutput``.
:mod:`vcppo.methods` is their table (each row names its function here and what it needs);
:mod:`vcppo.driver.step.update` builds the input from a step and whitens the output. Pure tensor
math: GAE with Decoupled-GAE (:mod:`vcppo.algos.gae`), GRPO (:func:`vcppo.algos.stats.grpo_advantages`),
RLOO, REINFORCE++ and REINFORCE++-baseline.

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

from dataclasses import dataclass
from typing import Optional, Union

import torch

from vcppo.algos.gae import decoupled_gae
from vcppo.algos.stats import grpo_advantages

__all__ = ["EstimatorInput", "EstimatorOutput", "gae", "grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline",
           "group_mean", "rloo_advantages", "returns_to_go", "reinforce_pp_baseline_returns"]


@dataclass
class EstimatorInput:
    """What every estimator reads (one signature for all of them).

        rewards     (B, T) float  r_t: the per-token reward (the outcome, minus the KL penalty when
                                  it is in the reward)
        mask        (B, T) float  1 on the tokens the policy produced
        group       (B,)   long   the prompt each sample belongs to
        outcomes    (B,)   float  each sample's reward WITHOUT the KL penalty (its scores' sum over tokens)
        values      (B, T) float  V_old, or None for a critic-free run
        gamma       float         discount per valid step
        lam_actor   float or (B,) the actor's GAE lambda (VAPO's per-sequence lambda as a tensor)
        lam_critic  float or None the critic's lambda: the targets are computed in the same pass;
                                  None when no critic in this process trains on them
        scale_by_std bool         GRPO divides by the group's std (Dr. GRPO: not)
    """
    rewards: torch.Tensor
    mask: torch.Tensor
    group: torch.Tensor
    outcomes: torch.Tensor
    values: Optional[torch.Tensor] = None
    gamma: float = 1.0
    lam_actor: Union[float, torch.Tensor] = 1.0
    lam_critic: Optional[float] = None
    scale_by_std: bool = True


@dataclass
class EstimatorOutput:
    """advantages (B, T) raw (not whitened), 0 off the mask; returns (B, T) the critic's targets
    at ``lam_critic`` from the same pass, or None (critic-free, or no ``lam_critic`` asked)."""
    advantages: torch.Tensor
    returns: Optional[torch.Tensor] = None


def _per_token(seq_adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return seq_adv[:, None] * mask


def gae(x: EstimatorInput) -> EstimatorOutput:
    """GAE (Schulman et al. 2016) with Decoupled-GAE (VC-PPO sec. 4.2): ONE pass gives the actor's
    advantages at ``lam_actor`` and, when ``lam_critic`` is set, the critic's targets."""
    lam_critic = x.lam_actor if x.lam_critic is None else x.lam_critic
    adv, returns = decoupled_gae(x.rewards, x.values, x.mask, gamma=x.gamma, lam_actor=x.lam_actor,
                                 lam_critic=lam_critic)
    return EstimatorOutput(adv, returns if x.lam_critic is not None else None)


def grpo(x: EstimatorInput) -> EstimatorOutput:
    """GRPO's group-normalised return (Dr. GRPO without the std) on every token; a sample's return
    is the sum of its per-token rewards (verl's): the outcome, minus the KL penalty when it is in
    the reward."""
    seq = grpo_advantages(x.rewards.sum(-1), group_ids=x.group, scale_by_std=x.scale_by_std)
    return EstimatorOutput(_per_token(seq, x.mask))


def rloo(x: EstimatorInput) -> EstimatorOutput:
    """RLOO's leave-one-out advantage of the sample's return (as GRPO's) on every token."""
    return EstimatorOutput(_per_token(rloo_advantages(x.rewards.sum(-1), x.group), x.mask))


def reinforce_pp(x: EstimatorInput) -> EstimatorOutput:
    """REINFORCE++: the discounted return-to-go (the caller's whitening is the method's normalisation)."""
    return EstimatorOutput(returns_to_go(x.rewards, x.mask, x.gamma))


def reinforce_pp_baseline(x: EstimatorInput) -> EstimatorOutput:
    """REINFORCE++-baseline: the group's mean OUTCOME as the baseline; the KL penalty stays per token."""
    return EstimatorOutput(reinforce_pp_baseline_returns(x.rewards, x.mask, x.outcomes, x.group, x.gamma))


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
