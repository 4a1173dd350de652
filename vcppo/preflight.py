"""Pre-flight: what a command's config needs of this machine, checked before any engine starts (a typo
must not cost a vLLM start-up), above the config (which checks the config alone) and below the
commands and benches that load it (:func:`load_command_config`): paths that must exist, outputs
that must be writable, the model's context against the prompt and response budget, reward models
and functions that load, LoRA targets and sequence-parallel sizes that fit the model, the env class
that imports, the sandbox the python tool and the code reward need. Every error names the config key."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from typing import Sequence

from vcppo.config.critic_start import check_critic_start
from vcppo.config.load import load_config, split_command_line
from vcppo.config.parallel import sequence_parallel_sections
from vcppo.config.schema import Config
from vcppo.errors import ConfigError
from vcppo.methods import uses_critic
from vcppo.models.hub import resolve_model_keys


def load_command_config(argv: Sequence[str], command: str, default_config: str | None = "base") -> Config:
    """The config of ``vcppo COMMAND [CONFIG] [key=value ...]``, with what the command needs of this
    machine checked (ConfigError naming the key otherwise)."""
    config, overrides = split_command_line(argv, default_config)
    if config is None:
        raise ConfigError("a CONFIG (preset name or YAML file) is required")
    cfg = load_config(config, overrides)
    check_host(cfg)
    resolve_model_keys(cfg, command)  # hub ids -> snapshot directories, before any path is checked
    if command in commands_with_paths():
        check_paths(cfg, command)
    return cfg


def check_host(cfg: Config) -> None:
    """What any command of ``cfg`` needs here, whatever its paths: the env class imports and its tools
    start (the python tool's sandbox), and the code reward's sandbox starts."""
    _check_env(cfg)
    r = cfg.reward
    sandboxed = [(f"reward.functions_by_source.{src}", fn) for src, fn in r.functions_by_source.items()]
    for key, fn in [("reward.function", r.function), *sandboxed]:
        if isinstance(fn, str) and fn.startswith("vcppo.rewards.code"):
            from vcppo.sandbox.bwrap import sandbox_problem
            if problem := sandbox_problem():
                raise ConfigError(f"config key '{key}': the code reward runs programs in a sandbox, which cannot "
                                  f"start here: {problem}")


def _check_env(cfg: Config) -> None:
    """``rollout.env``: the env class imports; the tools env's tool list, its python tool's limits and
    sandbox."""
    r = cfg.rollout
    if not r.env:
        return
    from vcppo.envs.base import env_class
    try:
        env_class(r.env)
    except (ImportError, AttributeError, TypeError, ValueError) as e:
        raise ConfigError(f"config key 'rollout.env': {r.env!r} is neither a built-in env (guess, tools) nor an "
                          f"importable 'module:Class' ({str(e).splitlines()[0][:160]})") from None
    if r.env == "tools":
        from vcppo.envs.tools import ToolEnv
        try:
            ToolEnv(**dict(r.env_args))
        except (TypeError, ValueError, ImportError, AttributeError) as e:
            raise ConfigError(f"config key 'rollout.env_args': {str(e).splitlines()[0]}") from None


def check_sequence_parallel_heads(cfg: Config) -> None:
    """Ulysses splits the attention heads over the group: the model's query heads must be divisible
    by the SP size, its key/value heads divisible by it or dividing it (then replicated)."""
    from vcppo.engines.sequence_parallel import head_problem

    for section, size in sequence_parallel_sections(cfg):
        model = cfg.model.policy_path if section == "actor" or cfg.model.critic_init == "policy" \
            else cfg.model.critic_path
        path = os.path.join(model or "", "config.json")
        if not os.path.isfile(path):
            continue
        c = json.load(open(path))
        c = c.get("text_config", c)
        heads = c.get("num_attention_heads")
        if not heads:
            continue
        problem = head_problem(size, int(heads), int(c.get("num_key_value_heads") or heads))
        if problem:
            raise ConfigError(f"config key '{section}.sequence_parallel_size' ({size}): {problem} (model "
                              f"{os.path.dirname(path)})")

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
