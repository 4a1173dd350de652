"""A step's reward, assembled in one place, in the order it is built (each term applied once and
logged):

    1. the rule's score            ``rollout.scores``: the verifier's reward of each sample, as the
                                   sampler scored it (``reward/mean`` before shaping)
    2. the soft overlong shaping   DAPO (arXiv 2503.14476, sec. 3.4): a length penalty, added on top
                                   of whatever judges the answer (``reward/overlong_*``)
    3. the reward model            its score, standardised by running moments if asked, combined
                                   with the rule's as ``reward.combine`` says (``reward/model_*``,
                                   ``reward/rule_mean``)
    4. the KL in the reward        -kl_coef * KL(pi_old || pi_ref) per token (``algorithm.kl_in:
                                   reward``; ``reward/kl_penalty`` in the step's KL metrics)

Terms 1-3 give the outcome (:meth:`RewardAssembly.outcome`): the rollout's ``scores`` and the
reward on each sample's last token. Term 4 needs the models' passes, so the step asks for it after
them (:meth:`RewardAssembly.per_token`). ``correct`` stays the verifier's, so ``reward/accuracy``
keeps measuring the truth.
"""
from __future__ import annotations

import dataclasses
from contextlib import nullcontext

import torch

from vcppo.algos.dapo import overlong_penalty
from vcppo.algos.rewards import combine_rewards
from vcppo.driver.state import RunState
from vcppo.driver.step.model_reward import ModelReward
from vcppo.engines import collectives
from vcppo.experience import Rollout, last_token_index, last_token_rewards
from vcppo.config.schema import Config


def overlong_shaping(batch: Rollout, cfg: Config) -> torch.Tensor | None:
    """(B,) DAPO's soft overlong punishment of each sample under the config, by its length against
    ``rollout.max_response_tokens`` (an episode's observation tokens count, as in the budget:
    :func:`vcppo.experience.response_lengths`); None when ``reward.overlong_buffer_tokens`` is 0."""
    buffer = cfg.reward.overlong_buffer_tokens
    if not buffer:
        return None
    return overlong_penalty(batch.response_lengths, cfg.rollout.max_response_tokens, buffer,
                            cfg.reward.overlong_penalty)


def overlong_metrics(penalty: torch.Tensor) -> dict:
    """The shaping's share of the global batch: its mean and the fraction of samples it touched."""
    n = collectives.global_sum(float(penalty.numel()))
    return {"reward/overlong_penalty_mean": collectives.global_sum(penalty.sum()) / max(n, 1.0),
            "reward/overlong_penalised_frac": collectives.global_sum((penalty < 0).sum()) / max(n, 1.0)}


def add_on_last_token(token_rewards: torch.Tensor, response_mask: torch.Tensor, extra: torch.Tensor) -> torch.Tensor:
    """(B, R) ``token_rewards`` with ``extra`` (B,) added on each row's last response token."""
    last = last_token_index(response_mask)
    out = token_rewards.clone()
    out[torch.arange(out.shape[0], device=out.device), last] += extra
    return out


class RewardAssembly:
    """The terms of the module docstring, for one run (``model``: the reward model, or None)."""

    def __init__(self, cfg: Config, model: ModelReward | None):
        self.cfg, self.model = cfg, model

    def outcome(self, rollout: Rollout, state: RunState, timer=None) -> tuple[Rollout, dict]:
        """Terms 1-3: ``rollout`` with its final ``scores`` and ``token_rewards``, and each term's
        metrics. ``state``: the run's, whose reward-model moments the step advances; ``timer``: the
        step's :class:`~vcppo.driver.step.timeline.PhaseTimer` (the reward model's pass is timed)."""
        metrics: dict = {}
        rule, token_rewards = rollout.scores, rollout.token_rewards           # 1. the rule's score
        shaping = overlong_shaping(rollout, self.cfg)                         # 2. the overlong shaping
        if shaping is not None:
            metrics.update(overlong_metrics(shaping))
        final = rule
        if self.model is not None:                                            # 3. the reward model
            with timer("reward_model") if timer is not None else nullcontext():
                combined, model_metrics = self.combined(rollout, state)
            metrics.update(model_metrics)
            if combined is not None:
                final, token_rewards = combined, last_token_rewards(combined, rollout.response_mask)
        if shaping is None and final is rule:
            return rollout, metrics
        if shaping is not None:
            final = final + shaping
            token_rewards = add_on_last_token(token_rewards, rollout.response_mask, shaping)
        return dataclasses.replace(rollout, scores=final, token_rewards=token_rewards), metrics

    def combined(self, rollout: Rollout, state: RunState) -> tuple[torch.Tensor | None, dict]:
        """The reward model's scores combined with the rule's (B,), or None where ``reward.combine``
        is ``rule`` (the model is only watched); its metrics."""
        r = self.cfg.reward
        model, metrics = self.model.scores(rollout, state)
        rule = rollout.scores
        metrics["reward/rule_mean"] = collectives.gather_cat(rule).mean().item()
        if self.model.mode == "rule":
            return None, metrics
        metrics["reward/model_minus_rule"] = collectives.gather_cat(model - rule).mean().item()
        return combine_rewards(rule, model, self.model.mode, r.rule_weight, r.model_weight, rollout.has_rule), metrics

    @staticmethod
    def per_token(rollout: Rollout, kl: torch.Tensor | None, kl_coef: float) -> torch.Tensor:
        """Term 4: (B, R) the per-token rewards advantage estimation reads: the outcome's, minus
        ``kl_coef`` x the KL (B, R) when the KL is in the reward (``kl`` None: it is not)."""
        return rollout.token_rewards if kl is None else rollout.token_rewards - kl_coef * kl
