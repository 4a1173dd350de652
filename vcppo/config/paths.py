"""Pre-flight: the files each command reads or writes, checked before any engine starts (a typo must
not cost a vLLM start-up): paths that must exist, outputs that must be writable, the model's
context against the prompt and response budget, reward models and functions that load, LoRA
targets that fit the model. Every error names the config key."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from vcppo.config.critic_start import check_critic_start
from vcppo.config.parallel import check_sequence_parallel_heads
from vcppo.methods import uses_critic
from vcppo.config.schema import Config, ConfigError

# The paths each command reads; checked before any engine starts (a typo must not cost a
# vLLM start-up). Optional ones are checked only when set.
_PATHS = {
    "train": (["model.policy_path", "model.tokenizer_path", "data.train_files"], ["data.val_files"]),
    "sft": (["sft.init_model", "data.train_files"], ["data.val_files"]),
    "rm": (["rm.policy_path", "data.train_files"], []),
    "eval": (["eval.model_path", "eval.data_files"], []),
}


_PATH_LISTS = ("eval.data_files",)  # keys that take several paths, separated by commas


def commands_with_paths() -> tuple[str, ...]:
    """The commands whose paths :func:`check_paths` knows."""
    return tuple(_PATHS)


def split_paths(value: str) -> list[str]:
    """A key of ``_PATH_LISTS``: its paths, in order (spaces around a comma and empty entries dropped)."""
    return [p.strip() for p in value.split(",") if p.strip()]


def _get(cfg: Config, key: str) -> Any:
    section, name = key.split(".")
    return getattr(getattr(cfg, section), name)


def check_paths(cfg: Config, command: str = "train") -> None:
    """Fail at start-up on files ``command`` needs but that don't exist; the error names the key."""
    required, optional = _PATHS[command]
    required = list(required)
    if command == "eval" and cfg.eval.benchmark:  # the benchmark's files come from the cache without it
        from vcppo.data.hub_sources import benchmark

        for name in split_paths(cfg.eval.benchmark):
            benchmark(name)
        required, optional = ["eval.model_path"], ["eval.data_files"]
    if command == "train" and uses_critic(cfg.algorithm.advantage_estimator) and cfg.model.critic_init != "policy":
        required.append("model.critic_path")
    for cmd, key in (("rm", "rm.output_dir"), ("sft", "sft.output_dir")):  # outputs: set, need not exist
        if command == cmd and not _get(cfg, key):
            raise ConfigError(f"config key '{key}' is required")
    for key in required + [k for k in optional if _get(cfg, k)]:
        value = _get(cfg, key)
        if not value:
            raise ConfigError(f"config key '{key}' is required")
        for path in (split_paths(value) if key in _PATH_LISTS else [value]):
            if not os.path.exists(path):
                raise ConfigError(f"config key '{key}': path does not exist: {path}")
    for key in _OUTPUTS[command]:
        check_writable(key, _get(cfg, key))
    check_context_length(cfg, *_SAMPLING_MODEL[command])
    if command == "train" and cfg.reward.model_path:
        _check_reward_model(cfg.reward.model_path)
    if command == "train":
        _check_lora_targets(cfg)
        check_sequence_parallel_heads(cfg)
        check_critic_start(cfg)
    if cfg.reward.function:
        _check_reward_function(cfg.reward.function)
    for source, path in cfg.reward.functions_by_source.items():
        _check_reward_function(path, f"reward.functions_by_source.{source}")


# Where each command writes; the model its vLLM engine samples from, and whether its context is
# sized by data.max_prompt_tokens (sft and rm size it by their longest prompt instead).
_OUTPUTS = {"train": ["trainer.output_root"], "sft": ["sft.output_dir"], "rm": ["rm.output_dir"], "eval": []}
_SAMPLING_MODEL = {"train": ("model.policy_path", True), "sft": ("sft.init_model", False),
                   "rm": ("rm.policy_path", False), "eval": ("eval.model_path", True)}


def check_writable(key: str, path: str) -> None:
    """``path`` (which need not exist yet) can be created and written: probed in its nearest
    existing ancestor, without creating anything (an empty policy directory would pass later
    existence checks)."""
    probe = Path(path).absolute()
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise ConfigError(f"config key '{key}': cannot create {path}: {probe} is not a directory")
    try:
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as e:
        raise ConfigError(f"config key '{key}': cannot write into {probe} (for {path}): {e.strerror or e}") from None


def check_context_length(cfg: Config, model_key: str, with_prompt_budget: bool = True) -> None:
    """A prompt plus a response must fit the model's context (vLLM would fail only after start-up)."""
    config_file = Path(_get(cfg, model_key) or "") / "config.json"
    if not config_file.is_file():
        return
    try:
        limit = json.loads(config_file.read_text()).get("max_position_embeddings")
    except (ValueError, OSError, AttributeError) as e:
        raise ConfigError(f"config key '{model_key}': cannot read {config_file}: {e}") from None
    needed = cfg.rollout.max_response_tokens + (cfg.data.max_prompt_tokens if with_prompt_budget else 0)
    keys = "'data.max_prompt_tokens' + 'rollout.max_response_tokens'" if with_prompt_budget \
        else "'rollout.max_response_tokens'"
    if isinstance(limit, int) and needed > limit:
        raise ConfigError(f"config key{'s' if with_prompt_budget else ''} {keys} ({needed}) exceed"
                          f"{'' if with_prompt_budget else 's'} the context of {model_key} ({limit} tokens, "
                          f"max_position_embeddings in {config_file})")


def _check_reward_model(path: str) -> None:
    from vcppo.models.reward_model import reward_model_format

    if not os.path.exists(path):
        raise ConfigError(f"config key 'reward.model_path': path does not exist: {path}")
    try:
        reward_model_format(path)
    except ValueError as e:
        raise ConfigError(f"config key 'reward.model_path': {e}") from None


def _check_lora_targets(cfg: Config) -> None:
    """LoRA adapters must fit the model they go on: named linear layers, a rank within their width."""
    from vcppo.engines.lora import enabled, linear_layer_shapes, target_problem

    models = [("actor", cfg.model.policy_path, True)]
    if uses_critic(cfg.algorithm.advantage_estimator):
        init = cfg.model.critic_init
        models.append(("critic", cfg.model.policy_path if init == "policy" else cfg.model.critic_path, False))
    for role, path, causal_lm in models:
        lora = getattr(cfg, role).lora
        if not enabled(lora) or not os.path.isfile(os.path.join(path, "config.json")):
            continue
        problem = target_problem(lora, *linear_layer_shapes(path, causal_lm))
        if problem:
            raise ConfigError(f"config key '{role}.lora': {problem} (model {path})")


def _check_reward_function(path: str, key: str = "reward.function") -> None:
    from vcppo.rewards.verifier import load_reward_fn

    try:
        load_reward_fn(path)
    except Exception as e:  # ImportError, AttributeError, TypeError, or the module's own error
        raise ConfigError(f"config key '{key}': cannot load {path!r}: {e}") from None
