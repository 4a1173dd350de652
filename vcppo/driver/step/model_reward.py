"""The reward model as a term of the reward (:mod:`vcppo.driver.step.reward`): a step's rollout
scored on the training ranks, the scores optionally standardised by their running moments
(``reward.normalize_model_scores``, kept in the run state so a resume continues them), and combined
with the rule's as ``reward.combine`` says. A reward model with its own tokenizer scores the decoded
text re-tokenized with it.
"""
from __future__ import annotations

import dataclasses
from contextlib import nullcontext

import torch

from vcppo.algos.rewards import Moments, batch_moments, combine_rewards, normalise
from vcppo.config.rules import combine_mode
from vcppo.driver.state import RunState
from vcppo.driver.step.reward import RewardTerm
from vcppo.runtime.dist import DistInfo
from vcppo.runtime.collectives import gather_cat
from vcppo.engines.reward_model import RewardModelEngine
from vcppo.experience import Layout, Rollout, last_token_rewards, make_layout
from vcppo.config.schema import Config
from vcppo.errors import ConfigError


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
