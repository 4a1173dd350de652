"""The config's cross-key rules: ranges and choices from the schema's metadata, and the rules between
keys (a method and its critic, the sampler's logprobs, LoRA sync, placement, reward sources). Pure
config logic, no files: :func:`validate` runs on every loaded config."""
from __future__ import annotations

import dataclasses
import math
from typing import Any

from vcppo.config.placement import Placement
from vcppo.config.provenance import check_allow_list
from vcppo.methods import ESTIMATORS, POLICY_LOSSES, uses_critic
from vcppo.config.freeze_spec import parse
from vcppo.config.schema import Config
from vcppo.errors import ConfigError


def _check_range(key: str, value: Any, m: dict) -> None:
    if m.get("choices") is not None and value not in m["choices"]:
        raise ConfigError(f"config key '{key}' must be one of {list(m['choices'])}, got {value!r}")
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"config key '{key}' must be finite, got {value}")
    low, high = m.get("low"), m.get("high")
    if low is not None and (value < low or (m.get("low_open") and value == low)):
        raise ConfigError(f"config key '{key}' must be {'>' if m.get('low_open') else '>='} {low}, got {value}")
    if high is not None and value > high:
        raise ConfigError(f"config key '{key}' must be <= {high}, got {value}")


def _walk(obj: Any, prefix: str = ""):
    """(dotted key, value, field metadata) of every leaf field."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            yield from _walk(value, f"{prefix}{f.name}.")
        else:
            yield prefix + f.name, value, f.metadata


def logprob_users(cfg: Config) -> list[str]:
    """The config keys whose setting makes the run read the sampler's logprobs."""
    alg, users = cfg.algorithm, []
    if alg.rollout_is_cap is not None:
        users.append("algorithm.rollout_is_cap")
    if alg.old_logprobs_from_sampler:
        users.append("algorithm.old_logprobs_from_sampler")
    if POLICY_LOSSES[alg.policy_loss].sampler_ratio:
        users.append(f"algorithm.policy_loss={alg.policy_loss}")
    if cfg.critic.confidence_features and uses_critic(alg.advantage_estimator):
        users.append("critic.confidence_features")
    return users


def validate(cfg: Config) -> None:
    """Range and choice checks from the schema metadata, plus cross-field rules."""
    for key, value, meta in _walk(cfg):
        if value is not None:
            _check_range(key, value, meta)
    for section in ("actor", "critic", "sft", "rm"):
        betas = getattr(cfg, section).betas
        if len(betas) != 2:
            raise ConfigError(f"config key '{section}.betas' must have two entries")
        if not all(math.isfinite(b) and 0.0 <= b < 1.0 for b in betas):  # Adam's moment decay rates
            raise ConfigError(f"config key '{section}.betas' entries must be in [0, 1), got {list(betas)}")
    for key, ks, n in (("trainer.val_k", cfg.trainer.val_k, cfg.trainer.val_n_samples),
                       ("eval.k", cfg.eval.k, cfg.eval.n_samples)):
        if n > 0 and any(k < 1 or k > n for k in ks):  # n = 0: greedy only, k unused
            raise ConfigError(f"config key '{key}' entries must be integers in [1, {n}] (the samples per "
                              f"prompt), got {ks}")
    if cfg.model.critic_init in ("reward_model", "checkpoint") and not cfg.model.critic_path \
            and uses_critic(cfg.algorithm.advantage_estimator):
        raise ConfigError(f"config key 'model.critic_path' is required when model.critic_init="
                          f"'{cfg.model.critic_init}'")
    _check_method(cfg)
    _check_critic_start(cfg)
    if cfg.trainer.dynamic_sampling and cfg.rollout.n_samples_per_prompt < 2:
        raise ConfigError("config key 'rollout.n_samples_per_prompt' must be >= 2 with trainer.dynamic_sampling "
                          "(a group of one sample always has equal rewards and would be dropped)")
    users = logprob_users(cfg)
    if users and cfg.rollout.sampler_logprobs is False:
        raise ConfigError(f"config key 'rollout.sampler_logprobs' is false but {', '.join(users)} "
                          "need(s) the sampler's logprobs: set it to null (auto) or true")
    _check_truncated_sampling(cfg, users)
    check_allow_list(cfg.trainer.resume_allow_changes)
    _check_lora_sync(cfg)
    _check_placement(cfg, Placement.of(cfg))
    _check_reward_sources(cfg)
    _check_episodes(cfg)
    if cfg.algorithm.kl_target is not None and cfg.algorithm.kl_coef == 0:
        raise ConfigError("config key 'algorithm.kl_target' needs algorithm.kl_coef > 0: the adaptive controller "
                          "scales the coefficient, and one that starts at 0 stays 0 (verl / OpenRLHF start at "
                          "e.g. 0.001 - 0.05)")
    if cfg.reward.overlong_buffer_tokens > cfg.rollout.max_response_tokens:
        raise ConfigError(f"config key 'reward.overlong_buffer_tokens' ({cfg.reward.overlong_buffer_tokens}) "
                          f"must be <= rollout.max_response_tokens ({cfg.rollout.max_response_tokens})")


def check_critic_keys(cfg: Config, set_critic_keys: dict[str, str]) -> None:
    """A key only a critic reads (``critic`` in the schema), set by the user (``{key: where}``) for a
    method that builds no critic, is an error naming it: it would be ignored without a word."""
    name = cfg.algorithm.advantage_estimator
    if set_critic_keys and not ESTIMATORS[name].critic:
        key, where = next(iter(set_critic_keys.items()))
        raise ConfigError(f"config key '{key}' configures a critic, but algorithm.advantage_estimator={name!r} "
                          f"reads none (no critic is built): drop {key} ({where})")


def _check_method(cfg: Config) -> None:
    """What the advantage estimator and the policy loss need (:mod:`vcppo.methods`): groups of
    samples, a critic only where one is read, their own normalisation and aggregation."""
    alg = cfg.algorithm
    name, est = alg.advantage_estimator, ESTIMATORS[alg.advantage_estimator]
    if est.groups and cfg.rollout.n_samples_per_prompt < 2:
        raise ConfigError(f"config key 'rollout.n_samples_per_prompt' must be >= 2 for advantage_estimator={name!r} "
                          "(its baseline comes from the other samples of the same prompt: a group)")
    if not est.critic:
        unread = [key for key, on in (("model.critic_init", cfg.model.critic_init != "policy"),
                                      ("critic.confidence_features", cfg.critic.confidence_features)) if on]
        if unread:
            raise ConfigError(f"config key '{unread[0]}' configures a critic, but algorithm.advantage_estimator="
                              f"{name!r} reads none (no critic is built): drop {unread[0]}")
    if est.whitens and not (alg.whiten_advantages and alg.zero_mean_advantages):
        key = "whiten_advantages" if not alg.whiten_advantages else "zero_mean_advantages"
        raise ConfigError(f"config key 'algorithm.{key}' must be true for advantage_estimator={name!r}: the method "
                          "normalises its returns over the global batch ((G - mean) / std); drop the override")
    loss = POLICY_LOSSES[alg.policy_loss]
    if loss.aggregations is not None and alg.loss_agg not in loss.aggregations:
        raise ConfigError(f"config key 'algorithm.loss_agg' ({alg.loss_agg!r}) is not defined for "
                          f"algorithm.policy_loss={alg.policy_loss!r}, which averages each sequence's tokens, then "
                          f"the sequences: set algorithm.loss_agg={loss.aggregations[0]}")
    if loss.sampler_ratio and alg.rollout_is_cap is not None:
        raise ConfigError(f"config key 'algorithm.rollout_is_cap' has no meaning for algorithm.policy_loss="
                          f"{alg.policy_loss!r} (its ratio is against the sampler already): drop algorithm.rollout_is_cap")
    if alg.dual_clip_c is not None and not loss.dual_clip:
        raise ConfigError(f"config key 'algorithm.dual_clip_c' has no meaning for algorithm.policy_loss="
                          f"{alg.policy_loss!r} (it clips whole sequences): drop algorithm.dual_clip_c")


def _check_critic_start(cfg: Config) -> None:
    """``critic.freeze``'s syntax; ``critic.init_from`` against another critic source."""
    for spec in cfg.critic.freeze:
        try:
            parse(str(spec))
        except ValueError as e:
            raise ConfigError(f"config key 'critic.freeze': {e}") from None
    if cfg.critic.init_from and cfg.model.critic_init != "policy":
        raise ConfigError(f"config key 'critic.init_from' and model.critic_init={cfg.model.critic_init!r} both name "
                          "the critic's start: keep one")


def _check_truncated_sampling(cfg: Config, users: list[str]) -> None:
    """top-p < 1: vLLM's processed logprobs are those of the renormalised nucleus, while the trainer
    scores the full softmax, so every reader of the sampler's logprobs would see a gap that is the
    truncation, not a mismatch (importance weights biased low at every step; docs/robustness.md)."""
    top_p = cfg.rollout.top_p
    if top_p >= 1.0:
        return
    readers = users + (["rollout.sampler_logprobs"] if cfg.rollout.sampler_logprobs else [])
    if readers:
        raise ConfigError(f"config key 'rollout.top_p' ({top_p}) must be 1.0 with {', '.join(readers)}: the "
                          "sampler's logprobs are then those of the truncated (nucleus) distribution, which the "
                          "trainer's full-softmax logprobs never match, so importance weights and mismatch/* "
                          "metrics would be biased; sample with rollout.top_p=1.0 or drop " + readers[0])


VLLM_MAX_LORA_RANK = 512  # the largest max_lora_rank vLLM accepts


def _check_lora_sync(cfg: Config) -> None:
    """``rollout.lora_sync=adapter`` sends the actor's adapters to vLLM's own LoRA: there must be
    adapters, vLLM must hold their rank, and each rank's vLLM must sit beside the actor."""
    if cfg.rollout.lora_sync != "adapter":
        return
    rank = cfg.actor.lora.rank
    if rank == 0:
        raise ConfigError("config key 'rollout.lora_sync' is 'adapter' but actor.lora.rank is 0 (no adapters to "
                          "send): set actor.lora.rank > 0 or rollout.lora_sync=merged")
    if rank > VLLM_MAX_LORA_RANK:
        raise ConfigError(f"config key 'actor.lora.rank' ({rank}) exceeds vLLM's largest LoRA rank "
                          f"({VLLM_MAX_LORA_RANK}) with rollout.lora_sync=adapter: use rollout.lora_sync=merged")


def combine_mode(cfg: Config) -> str:
    """``reward.combine``, with null resolved: the model alone when there is one, else the rule."""
    if cfg.reward.combine is not None:
        return cfg.reward.combine
    return "model" if cfg.reward.model_path else "rule"


def _check_reward_sources(cfg: Config) -> None:
    """What ``reward.combine`` needs: a reward model, rules per data_source, and a rule's reward at
    sampling time for dynamic sampling."""
    mode, r = combine_mode(cfg), cfg.reward
    if mode != "rule" and not r.model_path:
        raise ConfigError(f"config key 'reward.combine' ({mode!r}) needs reward.model_path (a reward model dir)")
    if mode == "model_without_rule" and not (r.functions_by_source or r.verl_parity):
        raise ConfigError("config key 'reward.combine' ('model_without_rule') needs reward.functions_by_source "
                          "(or reward.verl_parity=true): it names the data_sources that have a rule; with none, "
                          "every row would go to the model (then say combine=model)")
    if mode != "rule" and cfg.trainer.dynamic_sampling:
        raise ConfigError(f"config key 'trainer.dynamic_sampling' cannot be true with reward.combine={mode!r}: "
                          "dynamic sampling keeps the groups whose RULE rewards differ (the reward model "
                          "scores later, on the training ranks), so it would drop groups the model tells apart")


def _check_placement(cfg: Config, placement: Placement) -> None:
    """The placement's own rules (:meth:`Placement.check`), then what a run ahead of training needs
    (docs/launching.md)."""
    placement.check(cfg)
    staleness = placement.max_staleness
    if staleness and cfg.algorithm.old_logprobs_from_sampler:
        raise ConfigError("config key 'algorithm.old_logprobs_from_sampler' cannot be true with "
                          "trainer.max_staleness > 0: the clip must be anchored on pi_old recomputed by the "
                          "current actor, not on the (stale) sampler")
    if staleness and cfg.algorithm.rollout_is_cap is None and not POLICY_LOSSES[cfg.algorithm.policy_loss].sampler_ratio:
        raise ConfigError("config key 'algorithm.rollout_is_cap' must be set with trainer.max_staleness > 0: the "
                          "stale sampler enters the loss through the truncated weight min(pi_old / pi_sampler, "
                          "cap) (decoupled PPO); e.g. algorithm.rollout_is_cap=2")
    if staleness and cfg.rollout.sampler_logprobs is False:
        raise ConfigError("config key 'rollout.sampler_logprobs' is false but trainer.max_staleness > 0 needs "
                          "the sampler's logprobs (the behaviour policy): set it to null (auto) or true")


def _check_episodes(cfg: Config) -> None:
    """``rollout.env``: the settings that do not run on episodes yet are named (docs/multiturn.md,
    "What works on episodes"); that the env class imports is the pre-flight's (:mod:`vcppo.preflight`)."""
    r = cfg.rollout
    if not r.env:
        return
    refused = (("rollout.tensor_parallel_size", r.tensor_parallel_size > 1, "a tensor-parallel sampler"),
               ("reward.model_path", bool(cfg.reward.model_path), "a reward model (it would score the episode's "
                                                                    "observations as the policy's text)"),
               ("critic.confidence_features", cfg.critic.confidence_features, "confidence features"))
    for key, on, what in refused:
        if on:
            raise ConfigError(f"config key '{key}': {what} does not run on multi-turn episodes (rollout.env="
                              f"{r.env!r}) yet; drop {key} or rollout.env")
