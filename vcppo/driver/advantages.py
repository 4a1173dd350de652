"""From rewards and values to the actor's advantages and the critic's targets, for one step.

GAE presets (VC-PPO, PPO, VAPO) use Decoupled-GAE: advantages with ``lambda_actor`` (or VAPO's
length-adaptive lambda), value targets with ``lambda_critic`` (VC-PPO sec. 4.2). GRPO uses the
group-normalised outcome reward on every token. The GAE functions return raw (advantages,
returns); whitening touches only the actor's advantages (DESIGN.md) and runs over the GLOBAL
batch (every rank), so the result does not depend on how many ranks share the batch.
"""
from __future__ import annotations

import torch

from vcppo.algos.gae import decoupled_gae, length_adaptive_lambda
from vcppo.algos.stats import grpo_advantages, masked_whiten
from vcppo.engines.dist import global_sum
from vcppo.experience import Advantages, Rollout
from vcppo.schema import AlgorithmConfig


def global_whiten(advantages: torch.Tensor, mask: torch.Tensor, zero_mean: bool = True,
                  eps: float = 1e-8) -> torch.Tensor:
    """Whiten (B, R) advantages over the valid tokens of the GLOBAL batch (all ranks), so the result
    does not depend on how many ranks the batch is split over. Masked positions stay 0."""
    return masked_whiten(advantages, mask, zero_mean=zero_mean, eps=eps, sum_fn=global_sum)


def returns_to_go(rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """(B, R) discounted returns-to-go: the lambda = 1 GAE target, which telescopes to
    sum_k gamma^k r_{t+k} whatever the values (computed here with V = 0, so without their rounding)."""
    _, returns = decoupled_gae(rewards, torch.zeros_like(rewards), mask, gamma=gamma, lam_actor=1.0,
                               lam_critic=1.0)
    return returns


def estimate(rollout: Rollout, rewards: torch.Tensor, values: torch.Tensor | None, alg: AlgorithmConfig,
             lambda_critic: float, for_update: bool = True) -> Advantages:
    """The step's :class:`~vcppo.experience.Advantages` from ``rewards`` (B, R) (the outcome reward,
    minus the KL penalty when there is one) and ``values`` (B, R) V_old (None for GRPO).

    ``for_update``: the actor trains on them: VAPO's length-adaptive lambda and whitening apply.
    Otherwise (value pretraining, actor frozen) they are only the position-profile diagnostic:
    plain ``lambda_actor``, not whitened."""
    mask = rollout.response_mask
    if alg.advantage_estimator == "grpo":
        # a sample's reward is the sum of its per-token rewards (verl's): the outcome, minus the KL
        # penalty when it is in the reward
        seq_adv = grpo_advantages(rewards.sum(-1), group_ids=rollout.group, scale_by_std=alg.grpo_scale_by_std)
        raw, returns, lam_actor = seq_adv[:, None] * mask, None, None
    else:
        lam_actor = None
        if for_update and alg.length_adaptive_lambda:
            # VAPO: longer responses get lambda closer to 1 (less bias on long sequences).
            lam_actor = length_adaptive_lambda(mask.sum(1), alg.length_adaptive_alpha)
        raw, returns = decoupled_gae(rewards, values, mask, gamma=alg.gamma,
                                     lam_actor=alg.lambda_actor if lam_actor is None else lam_actor,
                                     lam_critic=lambda_critic)
    advantages = raw
    if for_update and alg.whiten_advantages:
        advantages = global_whiten(raw, mask, zero_mean=alg.zero_mean_advantages)
    return Advantages(advantages=advantages, raw_advantages=raw, returns=returns, lambda_actor=lam_actor)
