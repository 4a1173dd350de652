"""From rewards and values to the actor's advantages and the critic's targets, for one step.

GAE presets (VC-PPO, PPO, VAPO) use Decoupled-GAE: advantages with ``lambda_actor`` (or VAPO's
length-adaptive lambda), value targets with ``lambda_critic`` (VC-PPO sec. 4.2), both from one
pass wherever the actor and the critic share a process. The critic-free
estimators give every token a group- or batch-relative return: GRPO (and Dr. GRPO without the std),
RLOO, REINFORCE++ and its group-baseline variant (:mod:`vcppo.methods` lists them, what each needs,
and its paper). The estimators return raw advantages; whitening touches only the actor's advantages
(never the critic's targets, which stay on the return's scale) and runs over the GLOBAL batch (every
rank), so the result does not depend on how many ranks share the batch. REINFORCE++'s global normalisation is that whitening.
"""
from __future__ import annotations

import torch

from vcppo.algos import estimators
from vcppo.algos.estimators import EstimatorInput
from vcppo.algos.gae import length_adaptive_lambda
from vcppo.algos.stats import masked_whiten
from vcppo.runtime.collectives import global_sum
from vcppo.experience import Advantages, Rollout
from vcppo.methods import estimator_fn
from vcppo.config.schema import AlgorithmConfig


def global_whiten(advantages: torch.Tensor, mask: torch.Tensor, zero_mean: bool = True,
                  eps: float = 1e-8) -> torch.Tensor:
    """Whiten (B, R) advantages over the valid tokens of the GLOBAL batch (all ranks), so the result
    does not depend on how many ranks the batch is split over. Masked positions stay 0."""
    return masked_whiten(advantages, mask, zero_mean=zero_mean, eps=eps, sum_fn=global_sum)


def returns_to_go(rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """(B, R) discounted returns-to-go: the lambda = 1 GAE target, which telescopes to
    sum_k gamma^k r_{t+k} whatever the values (computed with V = 0, so without their rounding)."""
    return estimators.returns_to_go(rewards, mask, gamma)


def critic_targets(rollout: Rollout, rewards: torch.Tensor, values: torch.Tensor, alg: AlgorithmConfig,
                   lambda_critic: float) -> torch.Tensor:
    """(B, R) the critic's regression targets alone: GAE with ``lambda_critic`` plus V_old. Only where
    the critic lives on ranks of its own (the actor's rank computes only its advantages there);
    a process that holds both takes them from :func:`estimate`'s one pass."""
    return estimators.gae(EstimatorInput(rewards=rewards, mask=rollout.policy_mask, group=rollout.group,
                                         outcomes=rollout.token_rewards.sum(-1), values=values, gamma=alg.gamma,
                                         lam_actor=lambda_critic, lam_critic=lambda_critic)).returns


def estimate(rollout: Rollout, rewards: torch.Tensor, values: torch.Tensor | None, alg: AlgorithmConfig,
             for_update: bool = True, lambda_critic: float | None = None) -> Advantages:
    """The actor's :class:`~vcppo.experience.Advantages` from ``rewards`` (B, R) (the outcome reward,
    minus the KL penalty when there is one) and ``values`` (B, R) V_old (None without a critic), by
    the methods table's function for ``alg.advantage_estimator``, in ONE call.

    ``lambda_critic``: the critic trains in this process on targets at this lambda; the same call
    gives them (``Advantages.returns``; Decoupled-GAE's two outputs of one pass). None: no targets.
    ``for_update``: the actor trains on them: VAPO's length-adaptive lambda and whitening apply.
    Otherwise (value pretraining, actor frozen) they are only the position-profile diagnostic:
    plain ``lambda_actor``, not whitened."""
    lam_actor = None
    if for_update and alg.length_adaptive_lambda:
        # VAPO: longer responses get lambda closer to 1 (less bias on long sequences); an episode's
        # length counts its observation tokens (vcppo.experience.response_lengths says why)
        lam_actor = length_adaptive_lambda(rollout.response_lengths, alg.length_adaptive_alpha)
    x = EstimatorInput(rewards=rewards, mask=rollout.policy_mask, group=rollout.group,
                       outcomes=rollout.token_rewards.sum(-1), values=values, gamma=alg.gamma,
                       lam_actor=alg.lambda_actor if lam_actor is None else lam_actor, lam_critic=lambda_critic,
                       scale_by_std=alg.grpo_scale_by_std)
    out = estimator_fn(alg.advantage_estimator)(x)
    advantages = out.advantages
    if for_update and alg.whiten_advantages:
        advantages = global_whiten(out.advantages, rollout.policy_mask, zero_mean=alg.zero_mean_advantages)
    return Advantages(advantages=advantages, raw_advantages=out.advantages, lambda_actor=lam_actor,
                      returns=out.returns)
