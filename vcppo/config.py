"""Loading the config of any vcppo command: schema defaults <- YAML presets <- ``key=value``.

Layering, lowest to highest priority:
  1. the dataclass defaults of :mod:`vcppo.schema` (one doc line per field),
  2. YAML preset files (a file may name its parent with ``extends:``: a shipped preset's name, a
     path relative to the file, or an absolute path; :mod:`vcppo.config_extends`),
  3. ``key=value`` overrides from the command line (``actor.lr=1e-6``).

OmegaConf does the merging, the type coercion (``1e-6`` is a float, ``2.5`` is not an int) and
``${section.key}`` interpolation. On top of it we keep what users rely on: an unknown key is an
error that names it and suggests the closest valid key (OmegaConf names only the unknown
section), range and choice errors name the field, and everything is checked before any engine
starts. Derived fields are filled in one place, :func:`finalize`.
"""
from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Sequence

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from vcppo.config_extends import read_yaml_chain
from vcppo.config_parallel import check_sequence_parallel, check_sequence_parallel_heads
from vcppo.config_provenance import check_allow_list, resume_classes
from vcppo.models.hub import resolve_model_keys
from vcppo.methods import ESTIMATORS, POLICY_LOSSES, uses_critic
from vcppo.schema import RESUME_CLASSES, Config, ConfigError

# Presets ship inside the package (vcppo/configs/*.yaml), so an installed wheel has them too.
CONFIG_DIR = Path(__file__).resolve().parent / "configs"


# ---------------------------------------------------------------------------------------------
# Keys

def all_keys(cls: type = Config, prefix: str = "") -> list[str]:
    """Every dotted key of the schema (sections excluded)."""
    keys = []
    for f in dataclasses.fields(cls):
        if f.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(f.default_factory):
            keys += all_keys(f.default_factory, f"{prefix}{f.name}.")
        else:
            keys.append(prefix + f.name)
    return keys


def _unknown_key(key: str, where: str) -> ConfigError:
    known = all_keys()
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.5)
    if not close:  # also try the last component alone ("lamda_actor" -> "algorithm.lambda_actor")
        leaf = {k.rsplit(".", 1)[-1]: k for k in known}
        hit = difflib.get_close_matches(key.rsplit(".", 1)[-1], list(leaf), n=1, cutoff=0.6)
        close = [leaf[hit[0]]] if hit else []
    hint = f"; did you mean '{close[0]}'?" if close else ""
    return ConfigError(f"unknown config key '{key}' ({where}){hint}")


def _leaf_keys(data: Any, prefix: str = "") -> list[str]:
    if not isinstance(data, dict) or not data:
        return [prefix.rstrip(".")] if prefix else []
    return [k for key, value in data.items() for k in _leaf_keys(value, f"{prefix}{key}.")]


# Keys whose value is a mapping the user fills with names of their own.
_MAPPING_KEYS = ("reward.functions_by_source.",)


def _check_keys(data: DictConfig, where: str) -> None:
    """Name the full unknown key ('critc.lr', not OmegaConf's 'critc') and suggest the right one."""
    known = set(all_keys())
    sections = {k.rsplit(".", 1)[0] for k in known if "." in k}
    for key in _leaf_keys(OmegaConf.to_container(data, resolve=False)):
        if key.startswith(_MAPPING_KEYS):  # entries of a mapping (reward.functions_by_source.NAME)
            continue
        if key not in known and key not in sections:
            raise _unknown_key(key, where)


def _check_sections(data: DictConfig, where: str) -> None:
    """``actor=[]`` or ``actor: 3`` replaces a whole section: name it (OmegaConf names '?')."""
    sections = {f.name for f in dataclasses.fields(Config) if dataclasses.is_dataclass(f.default_factory)}
    for key, value in OmegaConf.to_container(data, resolve=False).items():
        if key in sections and not isinstance(value, dict):
            raise ConfigError(f"config key '{key}' is a section: set its keys (e.g. '{key}.<key>=...'), "
                              f"not {value!r} ({where})")


def _switch_keys(cls=Config, prefix: str = "") -> list[str]:
    """Dotted keys of the three-way switches: ``Optional[bool]`` fields, true / false / null (auto)."""
    out = []
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(f.default_factory if f.default_factory is not dataclasses.MISSING else None):
            out += _switch_keys(f.default_factory, f"{prefix}{f.name}.")
        elif f.type == "Optional[bool]":
            out.append(prefix + f.name)
    return out


SWITCH_KEYS = tuple(_switch_keys())  # read once: the schema does not change at run time


def _auto_as_null(data: DictConfig) -> None:
    """A switch written as 'auto' (the spelling of configs saved by earlier versions, and verl's) is
    null, its auto setting."""
    for key in SWITCH_KEYS:
        if OmegaConf.select(data, key, default=None) == "auto":
            OmegaConf.update(data, key, None, merge=False)


def _merge(base: DictConfig, data: DictConfig, where: str) -> DictConfig:
    _check_keys(data, where)
    _check_sections(data, where)
    _auto_as_null(data)
    try:
        return OmegaConf.merge(base, data)
    except OmegaConfBaseException as e:
        raise _config_error(e, where) from None


def _config_error(e: OmegaConfBaseException, where: str) -> ConfigError:
    key = getattr(e, "full_key", None) or "?"
    message = str(e).splitlines()[0]
    return ConfigError(f"config key '{key}': {message} ({where})")


# ---------------------------------------------------------------------------------------------
# Files and command lines

def resolve_named_file(name_or_path: str | Path, directory: Path, kind: str) -> Path:
    """An existing YAML file, or a bare name shipped in ``directory`` (``vcppo``, ``ablation``).

    Anything else that looks like a path (a directory part or a .yaml / .yml suffix) is a missing
    file; any other name is unknown. Both errors list the shipped names and suggest the closest.
    """
    text = str(name_or_path)
    path = Path(text)
    if path.is_file():
        return path
    looks_like_path = path.suffix in (".yaml", ".yml") or path.parent != Path(".")
    if not looks_like_path and (directory / f"{text}.yaml").is_file():
        return directory / f"{text}.yaml"
    names = sorted(p.stem for p in directory.glob("*.yaml"))
    close = difflib.get_close_matches(path.stem if looks_like_path else text, names, n=1, cutoff=0.5)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    what = f"no such {kind} file: {text}" if looks_like_path else f"no {kind} file or shipped {kind} named '{text}'"
    raise ConfigError(f"{what} (shipped {kind}s: {', '.join(names) or 'none'}){hint}")


def resolve_config_path(name_or_path: str | Path) -> Path:
    """A YAML path, or a bare preset name looked up in the shipped presets."""
    return resolve_named_file(name_or_path, CONFIG_DIR, "preset")


def parse_overrides(overrides: Sequence[str]) -> DictConfig:
    """``["actor.lr=1e-6", "rollout.stop=[a,b]"]`` -> a DictConfig (values parsed as YAML)."""
    items = []
    for item in overrides:
        key, sep, _ = item.partition("=")
        if not sep:
            raise ConfigError(f"override '{item}' is not of the form key=value")
        if not key.strip().lstrip("+"):
            raise ConfigError(f"override '{item}' has an empty key")
        items.append(item.strip().lstrip("+"))
    try:
        return OmegaConf.from_dotlist(items)
    except OmegaConfBaseException as e:
        raise _config_error(e, "command line") from None


def load_config(config: str | Path | None = None, overrides: Sequence[str] = ()) -> Config:
    """Defaults <- YAML chain <- overrides; validated and finalized."""
    merged = OmegaConf.structured(Config)
    preset = None
    if config:
        path = resolve_config_path(str(config))
        for p, data in read_yaml_chain(path, CONFIG_DIR):
            merged = _merge(merged, data, where=str(p))
        preset = path.stem
    if overrides:
        merged = _merge(merged, parse_overrides(overrides), where="command line")
    try:
        cfg: Config = OmegaConf.to_object(merged)  # resolves ${...} interpolations
    except OmegaConfBaseException as e:
        raise _config_error(e, "interpolation") from None
    if preset and cfg.preset == "custom":
        cfg.preset = preset
    validate(cfg)
    return finalize(cfg)


def split_command_line(argv: Sequence[str], default_config: str | None) -> tuple[str | None, list[str]]:
    """``[CONFIG] [key=value ...]``: the first argument is the config unless it holds a '='."""
    argv = list(argv)
    if argv and "=" not in argv[0]:
        return argv[0], argv[1:]
    return default_config, argv


def load_command_config(argv: Sequence[str], command: str, default_config: str | None = "base") -> Config:
    """The config of ``vcppo COMMAND [CONFIG] [key=value ...]``, with the paths the command reads
    checked (ConfigError naming the key otherwise)."""
    config, overrides = split_command_line(argv, default_config)
    if config is None:
        raise ConfigError("a CONFIG (preset name or YAML file) is required")
    cfg = load_config(config, overrides)
    resolve_model_keys(cfg, command)  # hub ids -> snapshot directories, before any path is checked
    if command in _PATHS:
        check_paths(cfg, command)
    return cfg


# ---------------------------------------------------------------------------------------------
# Checks

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
    _check_placement(cfg)
    check_sequence_parallel(cfg)
    _check_reward_sources(cfg)
    if cfg.algorithm.kl_target is not None and cfg.algorithm.kl_coef == 0:
        raise ConfigError("config key 'algorithm.kl_target' needs algorithm.kl_coef > 0: the adaptive controller "
                          "scales the coefficient, and one that starts at 0 stays 0 (verl / OpenRLHF start at "
                          "e.g. 0.001 - 0.05)")
    if cfg.reward.overlong_buffer_tokens > cfg.rollout.max_response_tokens:
        raise ConfigError(f"config key 'reward.overlong_buffer_tokens' ({cfg.reward.overlong_buffer_tokens}) "
                          f"must be <= rollout.max_response_tokens ({cfg.rollout.max_response_tokens})")


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
    if alg.dual_clip_c is not None and not loss.dual_clip:
        raise ConfigError(f"config key 'algorithm.dual_clip_c' has no meaning for algorithm.policy_loss="
                          f"{alg.policy_loss!r} (it clips whole sequences): drop algorithm.dual_clip_c")


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
    if cfg.placement.mode == "split":
        raise ConfigError("config key 'rollout.lora_sync' must be 'merged' with placement.mode=split (the rollout "
                          "ranks receive full weights)")


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


def _check_placement(cfg: Config) -> None:
    """Split placement and staleness: what a run ahead of training needs (docs/launching.md)."""
    staleness = cfg.trainer.max_staleness
    if cfg.placement.mode == "split" and cfg.rollout.tensor_parallel_size > 1:
        raise ConfigError(f"config key 'rollout.tensor_parallel_size' ({cfg.rollout.tensor_parallel_size}) must be 1 "
                          "with placement.mode=split: tensor-parallel rollout groups are not built on rollout ranks "
                          "yet (each rollout rank runs one whole engine)")
    critics = cfg.placement.critic_ranks
    if critics and cfg.placement.mode != "split":
        raise ConfigError(f"config key 'placement.critic_ranks' ({critics}) needs placement.mode=split")
    if critics and not uses_critic(cfg.algorithm.advantage_estimator):
        raise ConfigError(f"config key 'placement.critic_ranks' ({critics}) needs a critic, and "
                          f"algorithm.advantage_estimator={cfg.algorithm.advantage_estimator!r} has none")
    if staleness and cfg.placement.mode != "split":
        raise ConfigError(f"config key 'trainer.max_staleness' ({staleness}) needs placement.mode=split: "
                          "colocated ranks sample and train in turn, so a batch is never stale")
    if staleness and cfg.algorithm.old_logprobs_from_sampler:
        raise ConfigError("config key 'algorithm.old_logprobs_from_sampler' cannot be true with "
                          "trainer.max_staleness > 0: the clip must be anchored on pi_old recomputed by the "
                          "current actor, not on the (stale) sampler")
    if staleness and cfg.algorithm.rollout_is_cap is None:
        raise ConfigError("config key 'algorithm.rollout_is_cap' must be set with trainer.max_staleness > 0: the "
                          "stale sampler enters the loss through the truncated weight min(pi_old / pi_sampler, "
                          "cap) (decoupled PPO); e.g. algorithm.rollout_is_cap=2")
    if staleness and cfg.rollout.sampler_logprobs is False:
        raise ConfigError("config key 'rollout.sampler_logprobs' is false but trainer.max_staleness > 0 needs "
                          "the sampler's logprobs (the behaviour policy): set it to null (auto) or true")


def finalize(cfg: Config) -> Config:
    """Derived fields, computed in this one place."""
    if not cfg.model.tokenizer_path:
        cfg.model.tokenizer_path = cfg.model.policy_path
    if not uses_critic(cfg.algorithm.advantage_estimator):
        cfg.value_pretrain.enabled = False  # no critic, nothing to pretrain
    if cfg.value_pretrain.cache_dir is None:
        cfg.value_pretrain.cache_dir = os.path.join(cfg.trainer.output_root, "critic_cache")
    return cfg


# The paths each command reads; checked before any engine starts (a typo must not cost a
# vLLM start-up). Optional ones are checked only when set.
_PATHS = {
    "train": (["model.policy_path", "model.tokenizer_path", "data.train_files"], ["data.val_files"]),
    "sft": (["sft.init_model", "data.train_files"], ["data.val_files"]),
    "rm": (["rm.policy_path", "data.train_files"], []),
    "eval": (["eval.model_path", "eval.data_files"], []),
}


_PATH_LISTS = ("eval.data_files",)  # keys that take several paths, separated by commas


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


# ---------------------------------------------------------------------------------------------
# Output

def to_dict(cfg: Config) -> dict:
    return dataclasses.asdict(cfg)


SAVED_CONFIG = "config.yaml"  # the resolved config of a run, in its run directory


def save_config(cfg: Config, run_dir: str | Path, name: str = SAVED_CONFIG) -> Path:
    """Write the resolved config (every field, defaults included) into ``run_dir``."""
    path = Path(run_dir) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".yaml.tmp")
    tmp.write_text(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
    os.replace(tmp, path)
    return path


def schema_markdown() -> str:
    """The config reference (docs/config.md is generated from this)."""
    lines = ["# Config reference", "",
             "Generated from `vcppo/schema.py` (`make docs`). Every command reads the same schema: "
             "`vcppo <command> [CONFIG] [section.key=value ...]`, where CONFIG is a shipped preset "
             "name or a YAML file. A default `${a.b}` follows key `a.b` unless set. The resume column says "
             "what changing a key does when a run resumes (docs/robustness.md): "
             + "; ".join(f"`{name}` {text}" for name, text in RESUME_CLASSES.items()) + ".", ""]
    classes = resume_classes()
    root = Config()
    for sec in dataclasses.fields(root):
        value = getattr(root, sec.name)
        if not dataclasses.is_dataclass(value):
            lines += [f"- `{sec.name}` (default `{value!r}`, resume {classes[sec.name]}): {sec.metadata['doc']}", ""]
            continue
        lines += [f"## `{sec.name}` — {sec.metadata['doc']}", "", "| key | default | resume | doc |",
                  "|---|---|---|---|"]
        lines += _schema_rows(value, sec.name, classes)
        lines.append("")
    return "\n".join(lines)


def _schema_rows(section: Any, prefix: str, classes: dict[str, str]) -> list[str]:
    """One table row per leaf field of ``section``; a nested section's fields under its dotted name."""
    rows = []
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if dataclasses.is_dataclass(value):
            rows += _schema_rows(value, f"{prefix}.{f.name}", classes)
            continue
        doc = f.metadata["doc"]
        if f.metadata.get("choices"):
            doc += f" One of {', '.join(map(str, f.metadata['choices']))}."
        rows.append(f"| `{prefix}.{f.name}` | `{value!r}` | {classes[f'{prefix}.{f.name}']} | {doc} |")
    return rows


if __name__ == "__main__":
    print(schema_markdown())
