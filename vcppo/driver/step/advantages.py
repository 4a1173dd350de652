"""From rewards and values to the actor's advantages and the critic's targets, for one step.

GAE presets (VC-PPO, PPO, VAPO) use Decoupled-GAE: advantages with ``lambda_actor`` (or VAPO's
length-adaptive lambda), value targets with ``lambda_critic`` (VC-PPO sec. 4.2). The critic-free
estimators give every token a group- or batch-relative return: GRPO (and Dr. GRPO without the std),
RLOO, REINFORCE++ and its group-baseline variant (:mod:`vcppo.methods` lists them, what each needs,
and its paper). The estimators return raw advantages; whitening touches only the actor's advantages
(never the critic's targets, which stay on the return's scale) and runs over the GLOBAL batch (every
rank), so the result does not depend on how many ranks share the batch. REINFORCE++'s global normalisation is that whitening.
"""
from __future__ import annotations

import torch

from vcppo.algos import estimators
from vcppo.algos.gae import decoupled_gae, length_adaptive_lambda
from vcppo.algos.stats import grpo_advantages, masked_whiten
from vcppo.engines.collectives import global_sum
from vcppo.experience import Advantages, Rollout
from vcppo.schema import AlgorithmConfig


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
    """(B, R) the critic's regression targets: GAE with ``lambda_critic`` plus V_old (Decoupled-GAE's
    second output; each lambda is its own scan, so these are the bits a joint call gives)."""
    _, returns = decoupled_gae(rewards, values, rollout.response_mask, gamma=alg.gamma,
                               lam_actor=lambda_critic, lam_critic=lambda_critic)
    return returns


# Every estimator: (rollout, rewards (B, R), values (B, R) or None, alg, for_update) ->
# (raw advantages (B, R), per-sequence lambda (B,) or None).
Estimated = tuple


def _gae(rollout: Rollout, rewards: torch.Tensor, values: torch.Tensor | None, alg: AlgorithmConfig,
         for_update: bool) -> Estimated:
    lam_actor = None
    if for_update and alg.length_adaptive_lambda:
        # VAPO: longer responses get lambda closer to 1 (less bias on long sequences).
        lam_actor = length_adaptive_lambda(rollout.response_mask.sum(1), alg.length_adaptive_alpha)
    lam = alg.lambda_actor if lam_actor is None else lam_actor
    raw, _ = decoupled_gae(rewards, values, rollout.response_mask, gamma=alg.gamma, lam_actor=lam, lam_critic=lam)
    return raw, lam_actor


def _grpo(rollout: Rollout, rewards: torch.Tensor, values, alg: AlgorithmConfig, *unused) -> Estimated:
    # a sample's reward is the sum of its per-token rewards (verl's): the outcome, minus the KL
    # penalty when it is in the reward
    seq_adv = grpo_advantages(rewards.sum(-1), group_ids=rollout.group, scale_by_std=alg.grpo_scale_by_std)
    return seq_adv[:, None] * rollout.response_mask, None


def _rloo(rollout: Rollout, rewards: torch.Tensor, *unused) -> Estimated:
    seq_adv = estimators.rloo_advantages(rewards.sum(-1), rollout.group)  # the sample's return, as GRPO's
    return seq_adv[:, None] * rollout.response_mask, None


def _reinforce_pp(rollout: Rollout, rewards: torch.Tensor, values, alg: AlgorithmConfig, *unused) -> Estimated:
    return estimators.returns_to_go(rewards, rollout.response_mask, alg.gamma), None


def _reinforce_pp_baseline(rollout: Rollout, rewards: torch.Tensor, values, alg: AlgorithmConfig,
                           *unused) -> Estimated:
    # the baseline is the group's mean OUTCOME; the KL penalty stays per token (OpenRLHF's)
    raw = estimators.reinforce_pp_baseline_returns(rewards, rollout.response_mask, rollout.token_rewards.sum(-1),
                                                   rollout.group, alg.gamma)
    return raw, None


# algorithm.advantage_estimator -> its computation (vcppo.methods.ESTIMATORS declares the same names)
ESTIMATE = {"gae": _gae, "grpo": _grpo, "rloo": _rloo, "reinforce_plus_plus": _reinforce_pp,
            "reinforce_plus_plus_baseline": _reinforce_pp_baseline}


def estimate(rollout: Rollout, rewards: torch.Tensor, values: torch.Tensor | None, alg: AlgorithmConfig,
             for_update: bool = True) -> Advantages:
    """The actor's :class:`~vcppo.experience.Advantages` from ``rewards`` (B, R) (the outcome reward,
    minus the KL penalty when there is one) and ``values`` (B, R) V_old (None without a critic), by
    ``alg.advantage_estimator`` (the critic's targets: :func:`critic_targets`).

    ``for_update``: the actor trains on them: VAPO's length-adaptive lambda and whitening apply.
    Otherwise (value pretraining, actor frozen) they are only the position-profile diagnostic:
    plain ``lambda_actor``, not whitened."""
    raw, lam_actor = ESTIMATE[alg.advantage_estimator](rollout, rewards, values, alg, for_update)
    advantages = raw
    if for_update and alg.whiten_advantages:
        advantages = global_whiten(raw, rollout.response_mask, zero_mean=alg.zero_mean_advantages)
    return Advantages(advantages=advantages, raw_advantages=raw, lambda_actor=lam_actor)
