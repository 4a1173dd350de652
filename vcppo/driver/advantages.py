"""From rewards and values to the actor's advantages and the critic's targets, for one step.

GAE presets (VC-PPO, PPO, VAPO) use Decoupled-GAE: advantages with ``lambda_actor`` (or VAPO's
length-adaptive lambda), value targets with ``lambda_critic`` (VC-PPO sec. 4.2). GRPO uses the
group-normalised outcome reward on every token. Whitening is the caller's job and touches only
the actor's advantages (DESIGN.md); it is done over the GLOBAL batch.
"""
from __future__ import annotations

import torch

from vcppo.algos.gae import decoupled_gae, length_adaptive_lambda
from vcppo.algos.stats import grpo_advantages
from vcppo.engines.dist import global_sum
from vcppo.experience import Experience
from vcppo.schema import AlgorithmConfig


def global_whiten(advantages: torch.Tensor, mask: torch.Tensor, zero_mean: bool = True,
                  eps: float = 1e-8) -> torch.Tensor:
    """Whiten (B, R) advantages over the valid tokens of the GLOBAL batch (all ranks), so the result
    does not depend on how many ranks the batch is split over. Masked positions stay 0."""
    n = global_sum(mask.sum())
    mean = global_sum((advantages * mask).sum()) / max(n, 1.0)
    var = global_sum((((advantages - mean) * mask) ** 2).sum()) / max(n - 1.0, 1.0)
    centred = advantages - mean if zero_mean else advantages
    return centred * torch.rsqrt(torch.tensor(var + eps, dtype=advantages.dtype)) * mask


def returns_to_go(rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """(B, R) discounted returns-to-go: the lambda = 1 GAE target, which telescopes to
    sum_k gamma^k r_{t+k} whatever the values (computed here with V = 0, so without their rounding)."""
    _, returns = decoupled_gae(rewards, torch.zeros_like(rewards), mask, gamma=gamma, lam_actor=1.0,
                               lam_critic=1.0)
    return returns


def compute_advantages(batch: Experience, rewards: torch.Tensor, alg: AlgorithmConfig,
                       keep_returns: bool = False) -> None:
    """Fill ``batch.returns`` (GAE only, unless ``keep_returns``: the critic already trained on
    them), ``lambda_actor`` (length-adaptive only), ``raw_advantages`` and ``advantages``.
    ``rewards`` (B, R): the per-token reward (outcome reward, minus the KL penalty when there is one)."""
    mask = batch.response_mask
    if alg.advantage_estimator == "gae":
        lam_actor = alg.lambda_actor
        if alg.length_adaptive_lambda:
            # VAPO: longer responses get lambda closer to 1 (less bias on long sequences).
            lam_actor = batch.lambda_actor = length_adaptive_lambda(mask.sum(1), alg.length_adaptive_alpha)
        advantages, returns = decoupled_gae(rewards, batch.old_values, mask, gamma=alg.gamma,
                                            lam_actor=lam_actor, lam_critic=alg.lambda_critic)
        if not keep_returns:
            batch.returns = returns
    else:
        seq_adv = grpo_advantages(batch.scores, group_ids=batch.group, scale_by_std=alg.grpo_scale_by_std)
        advantages = seq_adv[:, None] * mask
    batch.raw_advantages = advantages
    batch.advantages = (global_whiten(advantages, mask, zero_mean=alg.zero_mean_advantages)
                        if alg.whiten_advantages else advantages)
