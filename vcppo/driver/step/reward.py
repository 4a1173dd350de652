"""A step's reward: a list of terms (:data:`REWARD_TERMS`), each applied once, in the table's order,
and logged:

    rule            ``rollout.scores``: the verifier's reward of each sample, as the sampler scored it
                    (``reward/mean`` before shaping); nothing left to apply here
    reward_model    its score, standardised by running moments if asked, combined with the rule's as
                    ``reward.combine`` says (:mod:`vcppo.driver.step.model_reward`: ``reward/model_*``,
                    ``reward/rule_mean``)
    overlong        DAPO's soft overlong punishment (arXiv 2503.14476, sec. 3.4): a length penalty,
                    added on top of whatever judged the answer (``reward/overlong_*``)
    kl              -kl_coef * KL(pi_old || pi_ref) per token (``algorithm.kl_in: reward``;
                    ``reward/kl_penalty`` in the step's KL metrics)

A term has two places to act: :meth:`RewardTerm.outcome` (a sample's reward: its ``scores`` and the
reward on its last token, before the models' passes) and :meth:`RewardTerm.per_token` (the (B, R)
rewards advantage estimation reads, after them: the KL needs the passes). ``correct`` stays the
verifier's, so ``reward/accuracy`` keeps measuring the truth.

A row names the config keys its term reads. A term that also acts in value pretraining
(``pretraining``) shapes what the pretrained critic learns, so each of its keys must be in the
critic cache's key: the schema's tags say which keys are (:data:`vcppo.config.provenance.CRITIC_CACHE_KEYS`),
and :func:`check_term` refuses a row that disagrees (a changed key would reuse a stale critic), on import
and again when a step assembles the reward. A term with ``pretraining`` False never runs in value
pretraining. A new term is one module (the term) and one row here (docs/architecture.md, "A reward
term").
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from vcppo.algos.dapo import overlong_penalty
from vcppo.config.provenance import CRITIC_CACHE_KEYS, schema_tags
from vcppo.driver.state import Phase, RunState
from vcppo.runtime import collectives
from vcppo.experience import Rollout, last_token_index
from vcppo.methods import load_fn
from vcppo.config.schema import Config


class RewardTerm:
    """One term of the reward; both places default to leaving the reward as it is."""

    def outcome(self, rollout: Rollout, state: RunState, timer=None) -> tuple[Rollout, dict]:
        """``rollout`` with this term in its ``scores`` and ``token_rewards`` (a new rollout: the input is
        not written to; the same one when the term changes nothing), and its metrics. ``state``: the
        run's (a term may keep running figures there); ``timer``: the step's
        :class:`~vcppo.driver.step.timeline.PhaseTimer`, or None."""
        return rollout, {}

    def per_token(self, rollout: Rollout, rewards: torch.Tensor, kl: torch.Tensor | None,
                  kl_coef: float) -> torch.Tensor:
        """(B, R) ``rewards`` with this term's per-token part; ``kl`` (B, R): the KL of pi_old to the
        reference when the KL is in the reward, else None."""
        return rewards


@dataclass(frozen=True)
class RewardTermRow:
    """A row of :data:`REWARD_TERMS`.

    ``keys``: the config keys the term reads. ``pretraining``: it acts in value pretraining too, so
    its keys must reach the critic cache's key (:func:`check_term`). ``build``: ``"module:function"``,
    ``(cfg, reward_model) -> RewardTerm | None`` (None: the config leaves the term off).
    """
    name: str
    keys: tuple[str, ...]
    pretraining: bool
    build: str
    source: str


def check_term(row: RewardTermRow) -> None:
    """A ValueError naming the row and key when a key is not in the schema, or a term that acts in
    value pretraining reads a key the critic cache's key leaves out."""
    tags = schema_tags()
    for key in row.keys:
        if key not in tags:
            raise ValueError(f"reward term {row.name!r}: {key!r} is not a config key")
        if row.pretraining and key not in CRITIC_CACHE_KEYS:
            raise ValueError(f"reward term {row.name!r} acts in value pretraining, but its key {key!r} is not in the "
                             f"critic cache's key (schema: resume={tags[key].get('resume')!r}, critic_cache="
                             f"{tags[key].get('critic_cache')!r}): a run that changes it would reuse a stale critic")


def add_on_last_token(token_rewards: torch.Tensor, policy_mask: torch.Tensor, extra: torch.Tensor) -> torch.Tensor:
    """(B, R) ``token_rewards`` with ``extra`` (B,) added on each row's last policy token."""
    last = last_token_index(policy_mask)
    out = token_rewards.clone()
    out[torch.arange(out.shape[0], device=out.device), last] += extra
    return out


class RuleScore(RewardTerm):
    """The rule's score is the sampler's (:mod:`vcppo.rewards.verifier`): the row names its keys."""


def rule_score(cfg: Config, model) -> RewardTerm:
    return RuleScore()


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


class OverlongShaping(RewardTerm):
    def __init__(self, cfg: Config):
        self.cfg = cfg

    def outcome(self, rollout: Rollout, state: RunState, timer=None) -> tuple[Rollout, dict]:
        shaping = overlong_shaping(rollout, self.cfg)
        return dataclasses.replace(rollout, scores=rollout.scores + shaping, token_rewards=add_on_last_token(
            rollout.token_rewards, rollout.policy_mask, shaping)), overlong_metrics(shaping)


def overlong_term(cfg: Config, model) -> RewardTerm | None:
    return OverlongShaping(cfg) if cfg.reward.overlong_buffer_tokens else None


class KLPenalty(RewardTerm):
    def per_token(self, rollout: Rollout, rewards: torch.Tensor, kl: torch.Tensor | None,
                  kl_coef: float) -> torch.Tensor:
        return rewards if kl is None else rewards - kl_coef * kl


def kl_term(cfg: Config, model) -> RewardTerm:
    return KLPenalty()


_HERE = "vcppo.driver.step.reward"
REWARD_TERMS = {row.name: row for row in (
    RewardTermRow("rule", ("reward.function", "reward.functions_by_source", "reward.verl_parity",
                           "reward.correct_score", "reward.wrong_score"), pretraining=True,
                  build=f"{_HERE}:rule_score", source="the verifier (VC-PPO: +1 / -1)"),
    RewardTermRow("reward_model", ("reward.model_path", "reward.combine", "reward.rule_weight", "reward.model_weight",
                                   "reward.normalize_model_scores"), pretraining=True,
                  build="vcppo.driver.step.model_reward:model_term", source="a reward model"),
    RewardTermRow("overlong", ("reward.overlong_buffer_tokens", "reward.overlong_penalty",
                               "rollout.max_response_tokens"), pretraining=True,
                  build=f"{_HERE}:overlong_term", source="DAPO's soft overlong punishment (arXiv 2503.14476)"),
    RewardTermRow("kl", ("algorithm.kl_coef", "algorithm.kl_in", "algorithm.kl_estimator", "algorithm.kl_target",
                         "algorithm.kl_horizon"), pretraining=False,
                  build=f"{_HERE}:kl_term", source="PPO-RLHF's KL penalty (verl use_kl_in_reward)"),
)}
for _row in REWARD_TERMS.values():  # a row of the table is checked on import; one added later when assembled
    check_term(_row)


class RewardAssembly:
    """The run's reward terms of ``phase`` (``model``: the reward model, or None), in table order."""

    def __init__(self, cfg: Config, model, phase: Phase = Phase.PPO):
        rows = [row for row in REWARD_TERMS.values() if row.pretraining or phase == Phase.PPO]
        for row in rows:
            check_term(row)
        self.terms = [term for row in rows if (term := load_fn(row.build)(cfg, model)) is not None]

    def outcome(self, rollout: Rollout, state: RunState, timer=None) -> tuple[Rollout, dict]:
        """``rollout`` with its final ``scores`` and ``token_rewards``, and each term's metrics."""
        metrics: dict = {}
        for term in self.terms:
            rollout, m = term.outcome(rollout, state, timer)
            metrics.update(m)
        return rollout, metrics

    def per_token(self, rollout: Rollout, kl: torch.Tensor | None, kl_coef: float) -> torch.Tensor:
        """(B, R) the per-token rewards advantage estimation reads: the outcome's, with each term's
        per-token part (``kl`` None: the KL is not in the reward)."""
        rewards = rollout.token_rewards
        for term in self.terms:
            rewards = term.per_token(rollout, rewards, kl, kl_coef)
        return rewards
