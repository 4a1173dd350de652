"""The pretrained-critic cache: value pretraining's result, reused by every run it would be the
same for.

A pretrained critic is determined by the policy, the data, the critic's init and optimiser, the
pretraining and sampling settings, and the reward -- not by the RL algorithm or the seed. So every
preset and seed of a sweep that starts from the same SFT model reuses one critic, stored under
``value_pretrain.cache_dir/<key>`` and published atomically (concurrent runs never read half a
model).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from pathlib import Path

from vcppo.config.rules import combine_mode
from vcppo.config.schema import Config, CriticConfig

COMPLETE_MARKER = "vcppo_pretrain.json"


def fingerprint_path(path: str) -> dict:
    """Cheap identity of a file or directory (names, sizes, mtimes) for cache keys: hashing a 60 GB
    checkpoint to decide whether to reuse a critic would cost more than it saves."""
    p = Path(path)
    files = [p] if p.is_file() else sorted(x for x in p.rglob("*") if x.is_file())
    return {"path": str(p.resolve()),
            "files": [(str(f.relative_to(p)) if p.is_dir() else f.name, f.stat().st_size,
                       int(f.stat().st_mtime)) for f in files]}


PLACEMENT_KEYS = ("zero_stage", "offload_params", "offload_optimizer")
# critic fields newer than the cache format: they enter the key only when set away from their default
LATER_DEFAULTS = {k: getattr(CriticConfig(), k) for k in ("head_lr_scale", "confidence_features", "confidence_lr_scale")}
LATER_DEFAULTS["lora"] = dataclasses.asdict(CriticConfig().lora)  # a LoRA critic learns other weights


def critic_source(cfg: Config) -> tuple[str, str]:
    """(init, directory) the critic is built from: the policy's backbone for ``critic_init: policy``
    (``model.critic_path`` names the RM / checkpoint of the other two kinds and is ignored here, even
    when a preset sets it: the demo's does, for ``critic_init=reward_model``)."""
    init = cfg.model.critic_init
    return init, (cfg.model.policy_path if init == "policy" else cfg.model.critic_path)


def critic_init_key(cfg: Config) -> list:
    init, path = critic_source(cfg)
    # a policy-initialised critic's directory is the policy, fingerprinted in the key already
    return [init, None if init == "policy" or not path else fingerprint_path(path)]


def cache_key(cfg: Config) -> str:
    relevant = {
        "policy": fingerprint_path(cfg.model.policy_path),
        "data": fingerprint_path(cfg.data.train_files),
        # the chat-template switch spelled as the key always held it, so existing caches stay valid
        "data_fields": [cfg.data.prompt_field, cfg.data.answer_field, cfg.data.max_prompt_tokens,
                        {None: "auto", True: "true", False: "false"}[cfg.data.use_chat_template]],
        # what the critic is built from (a policy-initialised critic ignores model.critic_path)
        "critic_init": critic_init_key(cfg),
        # where the critic's weights live (ZeRO stage, offload) does not change what it learns
        "critic": {k: v for k, v in dataclasses.asdict(cfg.critic).items()
                   # fields added later count only when set, so the keys of existing caches stay valid
                   if k not in PLACEMENT_KEYS and not (k in LATER_DEFAULTS and v == LATER_DEFAULTS[k])},
        "value_pretrain": {k: getattr(cfg.value_pretrain, k) for k in
                           ("steps", "lambda_critic", "early_stop", "min_steps", "window", "ev_tolerance",
                            "loss_tolerance")},
        "rollout": [cfg.rollout.n_samples_per_prompt, cfg.rollout.temperature, cfg.rollout.top_p,
                    cfg.rollout.max_response_tokens, cfg.rollout.stop],
        "prompts_per_step": cfg.trainer.prompts_per_step,
        "gamma": cfg.algorithm.gamma,
        "reward": [cfg.reward.function, cfg.reward.correct_score, cfg.reward.wrong_score],
    }
    if cfg.reward.functions_by_source:  # only when set, like the overlong keys below
        relevant["reward_by_source"] = [dict(cfg.reward.functions_by_source), cfg.data.reward_info_fields]
    if cfg.reward.verl_parity:  # verl's scorers give other rewards on the same data (only when set)
        relevant["verl_parity"] = True
    if cfg.reward.model_path:  # the critic learns the reward the model gives (only when set, like the rest)
        r = cfg.reward
        relevant["reward_model"] = [fingerprint_path(r.model_path), combine_mode(cfg), r.rule_weight, r.model_weight,
                                    r.normalize_model_scores]
    if cfg.reward.overlong_buffer_tokens:  # only when on, so the keys of existing caches stay valid
        relevant["overlong"] = [cfg.reward.overlong_buffer_tokens, cfg.reward.overlong_penalty]
    blob = json.dumps(relevant, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def cache_path(cfg: Config) -> Path:
    return Path(cfg.value_pretrain.cache_dir) / cache_key(cfg)


def cached_critic(cfg: Config) -> Path | None:
    """The complete pretrained critic for ``cfg``, if the cache has one."""
    path = cache_path(cfg)
    return path if (path / COMPLETE_MARKER).exists() else None


def staging_path(cfg: Config, run_name: str) -> Path:
    """Where a run writes the critic before publishing it (the same path on every rank)."""
    target = cache_path(cfg)
    return target.with_name(f"{target.name}.tmp-{run_name}")


def publish(stage: Path, target: Path, info: dict) -> None:
    """Main rank, after the critic was exported into ``stage``: mark it complete and move it into
    place, unless another run got there first (then ours is dropped: both are the same critic)."""
    (stage / COMPLETE_MARKER).write_text(json.dumps(info, indent=1))
    if target.exists():
        shutil.rmtree(stage)
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(stage, target)
