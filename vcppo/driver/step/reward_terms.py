"""A step's reward: a list of terms (:data:`REWARD_TERMS`), each applied once, in the table's order,
and logged:

    rule            ``rollout.scores``: the verifier's reward of each sample, as the sampler scored it
                    (``reward/mean`` before shaping); nothing left to apply here
    reward_model    its score, standardised by running moments if asked, combined with the rule's as
                    ``reward.combine`` says (:class:`ModelReward`: ``reward/model_*``,
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

**The reward model** as a term of the reward (:class:`ModelReward`): a step's rollout
scored on the training ranks, the scores optionally standardised by their running moments
(``reward.normalize_model_scores``, kept in the run state so a resume continues them), and combined
with the rule's as ``reward.combine`` says. A reward model with its own tokenizer scores the decoded
text re-tokenized with it.
"""
from __future__ import annotations

import dataclasses
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from vcppo.algos.dapo import overlong_penalty
from vcppo.algos.rewards import Moments, batch_moments, combine_rewards, normalise
from vcppo.config.provenance import CRITIC_CACHE_KEYS, schema_tags
from vcppo.config.rules import combine_mode
from vcppo.config.schema import Config
from vcppo.driver.state import Phase, RunState
from vcppo.engines.reward_model import RewardModelEngine
from vcppo.errors import ConfigError
from vcppo.experience import Layout, Rollout, last_token_index, last_token_rewards, make_layout
from vcppo.methods import load_fn
from vcppo.runtime import collectives
from vcppo.runtime.collectives import gather_cat
from vcppo.runtime.dist import DistInfo


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


_HERE = "vcppo.driver.step.reward_terms"
REWARD_TERMS = {row.name: row for row in (
    RewardTermRow("rule", ("reward.function", "reward.functions_by_source", "reward.verl_parity",
                           "reward.correct_score", "reward.wrong_score"), pretraining=True,
                  build=f"{_HERE}:rule_score", source="the verifier (VC-PPO: +1 / -1)"),
    RewardTermRow("reward_model", ("reward.model_path", "reward.combine", "reward.rule_weight", "reward.model_weight",
                                   "reward.normalize_model_scores"), pretraining=True,
                  build=f"{_HERE}:model_term", source="a reward model"),
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


def same_tokenizer(a, b) -> bool:
    """Both map text to the same ids (vocabulary and special tokens)."""
    return (a.get_vocab() == b.get_vocab()
            and (a.bos_token_id, a.eos_token_id, a.pad_token_id) == (b.bos_token_id, b.eos_token_id, b.pad_token_id))


class Retokenizer:
    """A policy-token batch as the reward model's tokens: prompt and response decoded apart (special
    tokens dropped) and encoded with the reward model's tokenizer; a response that ended with the
    policy's end-of-sequence token ends with the reward model's.

    The rows carry tokens, not chat messages, so the prompt is not re-rendered in the reward
    model's chat template: what the policy's template adds besides special tokens (role words,
    a system prompt) reaches the reward model as plain text. For a reward model trained on its own
    template, share the policy's tokenizer, or train on prompts without a template."""

    def __init__(self, policy_tokenizer, rm_tokenizer):
        self.policy, self.rm = policy_tokenizer, rm_tokenizer
        self.pad_id = rm_tokenizer.pad_token_id if rm_tokenizer.pad_token_id is not None else rm_tokenizer.eos_token_id

    def __call__(self, batch: Layout) -> Layout:
        P, prompts, responses = batch.prompt_len, [], []
        for i in range(batch.size):
            prompt = batch.input_ids[i, :P][batch.attention_mask[i, :P].bool()].tolist()
            response = batch.responses[i][batch.policy_mask[i].bool()].tolist()
            ids = self.rm(self.policy.decode(prompt, skip_special_tokens=True))["input_ids"]
            prompts.append(ids or [self.rm.bos_token_id if self.rm.bos_token_id is not None else self.pad_id])
            r = self.rm(self.policy.decode(response, skip_special_tokens=True), add_special_tokens=False)["input_ids"]
            if response and response[-1] == self.policy.eos_token_id and self.rm.eos_token_id is not None:
                r = r + [self.rm.eos_token_id]
            responses.append(r)
        return make_layout(prompts, responses, pad_id=self.pad_id, device=batch.input_ids.device)


class ModelReward(RewardTerm):
    """Scores rollouts with the reward model (every training rank calls :meth:`scores` at the same
    point: the engine's passes are collective); ``mode``: ``reward.combine``."""

    def __init__(self, cfg: Config, engine: RewardModelEngine, retokenize: Retokenizer | None):
        self.cfg, self.engine, self.retokenize = cfg, engine, retokenize
        self.mode = combine_mode(cfg)

    @classmethod
    def build(cls, cfg: Config, dist: DistInfo, policy_tokenizer, say=print) -> "ModelReward | None":
        """The run's reward model (None without ``reward.model_path``)."""
        from transformers import AutoTokenizer
        path = cfg.reward.model_path
        if not path:
            return None
        say(f"starting reward model engine ({path}; reward.combine={combine_mode(cfg)})")
        try:
            rm_tokenizer = AutoTokenizer.from_pretrained(path)
        except Exception as e:  # noqa: BLE001 - OSError, ValueError: a directory without tokenizer files
            raise ConfigError(f"config key 'reward.model_path': cannot load a tokenizer from {path}: "
                              f"{str(e).splitlines()[0][:200]}") from None
        engine = RewardModelEngine(path, cfg.reward_model, dist, dtype=cfg.model.dtype)
        retokenize = None if same_tokenizer(policy_tokenizer, rm_tokenizer) else Retokenizer(policy_tokenizer, rm_tokenizer)
        return cls(cfg, engine, retokenize)

    def scores(self, rollout: Rollout, state: RunState) -> tuple[torch.Tensor, dict]:
        """(B,) the model's scores of ``rollout`` (standardised when ``reward.normalize_model_scores``,
        which advances ``state``'s moments), and their metrics."""
        raw = self.engine.score(self.retokenize(rollout) if self.retokenize else rollout)
        every_raw = gather_cat(raw)
        model = raw
        metrics = {"reward/model_score_mean": every_raw.mean().item(), "reward/model_score_std": every_raw.std().item(),
                   # the model's verdict (score > 0) against the verifier's: its accuracy on this policy's samples
                   "reward/model_accuracy": gather_cat(((raw > 0).float() == rollout.correct).float()).mean().item()}
        if self.cfg.reward.normalize_model_scores:
            moments = Moments(*state.model_score_moments).merged(*batch_moments(every_raw))
            state.model_score_moments = [moments.count, moments.mean, moments.m2]
            model = normalise(raw, moments)
            metrics.update({"reward/model_running_mean": moments.mean, "reward/model_running_std": moments.std})
        return model, metrics

    def outcome(self, rollout: Rollout, state: RunState, timer=None) -> tuple[Rollout, dict]:
        """The term: ``rollout``'s scores (the rule's so far) combined with the model's, the reward on
        each sample's last token; the same rollout where ``reward.combine`` is ``rule`` (the model
        is only watched). Its pass is timed as ``reward_model``."""
        with timer("reward_model") if timer is not None else nullcontext():
            model, metrics = self.scores(rollout, state)
            rule = rollout.scores
            metrics["reward/rule_mean"] = gather_cat(rule).mean().item()
            if self.mode == "rule":
                return rollout, metrics
            metrics["reward/model_minus_rule"] = gather_cat(model - rule).mean().item()
            r = self.cfg.reward
            combined = combine_rewards(rule, model, self.mode, r.rule_weight, r.model_weight, rollout.has_rule)
        return dataclasses.replace(rollout, scores=combined,
                                   token_rewards=last_token_rewards(combined, rollout.policy_mask)), metrics


def model_term(cfg: Config, model: ModelReward | None) -> ModelReward | None:
    """The run's reward model (built with the engines), or None without ``reward.model_path``."""
    return model
