"""Loading the config of any vcppo command: schema defaults <- YAML presets <- ``key=value``.

Layering, lowest to highest priority:
  1. the dataclass defaults of :mod:`vcppo.config.schema` (one doc line per field),
  2. YAML preset files (a file may name its parent with ``extends:``: a shipped preset's name, a
     path relative to the file, or an absolute path; :mod:`vcppo.config.extends`),
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
import functools
import os
from pathlib import Path
from typing import Any, Sequence

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from vcppo.config.extends import read_yaml_chain
from vcppo.config.provenance import CRITIC_CACHE_KEYS, resume_classes
from vcppo.config.rules import check_critic_keys, validate
from vcppo.methods import uses_critic
from vcppo.config.schema import RESUME_CLASSES, Config
from vcppo.errors import ConfigError

# Presets ship inside the package (vcppo/configs/*.yaml), so an installed wheel has them too.
CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


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


def critic_keys(cls: type = Config, prefix: str = "", section: bool = False) -> list[str]:
    """Every dotted key only a critic reads: marked ``critic`` in the schema, or inside a section so marked."""
    keys = []
    for f in dataclasses.fields(cls):
        marked = section or bool(f.metadata.get("critic"))
        if f.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(f.default_factory):
            keys += critic_keys(f.default_factory, f"{prefix}{f.name}.", marked)
        elif marked:
            keys.append(prefix + f.name)
    return keys


CRITIC_KEYS = tuple(critic_keys())


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
_MAPPING_KEYS = ("reward.functions_by_source.", "rollout.env_args.")


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


def _merge(base: DictConfig, layers: list[tuple[DictConfig, str]]) -> DictConfig:
    """``base`` <- each ``(data, where)`` in turn, in one merge (it copies ``base`` once); an error names
    the ``where`` of the layer it comes from."""
    for data, where in layers:
        _check_keys(data, where)
        _check_sections(data, where)
        _auto_as_null(data)
    try:
        return OmegaConf.merge(base, *(data for data, _ in layers))
    except OmegaConfBaseException:
        pass
    for data, where in layers:  # which layer: merged one at a time
        try:
            base = OmegaConf.merge(base, data)
        except OmegaConfBaseException as e:
            raise _config_error(e, where) from None
    raise AssertionError("a merge failed as a whole but not layer by layer")


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
    merged = OmegaConf.create()
    for item in overrides:
        key, sep, value = str(item).strip().lstrip("+").partition("=")
        if not sep:
            raise ConfigError(f"override '{item}' is not of the form key=value")
        if not key.strip():
            raise ConfigError(f"override '{item}' has an empty key")
        try:  # one item at a time, so that a value that does not parse is named with its key
            merged.merge_with_dotlist([f"{key}={value}"])
        except OmegaConfBaseException as e:
            raise _config_error(e, "command line") from None
        except Exception as e:  # noqa: BLE001 - yaml's parse errors, and whatever else a key or value trips
            cause = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
            raise ConfigError(f"config key '{key}': value {value!r} does not parse as YAML ({cause}); quote a "
                              f"plain string: {key}='\"{value}\"' (command line)") from None
    return merged


@functools.lru_cache(maxsize=1)
def _schema() -> DictConfig:
    """The schema's defaults as OmegaConf's structured config, built once a process (most of a load's
    time otherwise): every merge copies its base, and nothing writes into it."""
    return OmegaConf.structured(Config)


def load_config(config: str | Path | None = None, overrides: Sequence[str] = ()) -> Config:
    """Defaults <- YAML chain <- overrides; validated and finalized."""
    layers = []  # (data, where), merged in this order onto the schema's defaults
    preset, user_keys = None, {}  # the keys the user set (their files, the command line): key -> where
    if config:
        path = resolve_config_path(str(config))
        for p, data in read_yaml_chain(path, CONFIG_DIR):
            layers.append((data, str(p)))
            if CONFIG_DIR not in p.parents:  # a shipped preset's settings are not the user's
                user_keys.update(dict.fromkeys(_leaf_keys(OmegaConf.to_container(data, resolve=False)), str(p)))
        preset = path.stem
    if overrides:
        data = parse_overrides(overrides)
        layers.append((data, "command line"))
        user_keys.update(dict.fromkeys(_leaf_keys(OmegaConf.to_container(data, resolve=False)), "command line"))
    merged = _merge(_schema(), layers) if layers else _schema()
    try:
        cfg: Config = OmegaConf.to_object(merged)  # resolves ${...} interpolations
    except OmegaConfBaseException as e:
        raise _config_error(e, "interpolation") from None
    if preset and cfg.preset == "custom":
        cfg.preset = preset
    check_critic_keys(cfg, {k: w for k, w in user_keys.items() if k in CRITIC_KEYS})  # named before the rules
    validate(cfg)
    return finalize(cfg)


def split_command_line(argv: Sequence[str], default_config: str | None) -> tuple[str | None, list[str]]:
    """``[CONFIG] [key=value ...]``: the first argument is the config unless it holds a '='."""
    argv = list(argv)
    if argv and "=" not in argv[0]:
        return argv[0], argv[1:]
    return default_config, argv


def finalize(cfg: Config) -> Config:
    """Derived fields, computed in this one place."""
    if not cfg.model.tokenizer_path:
        cfg.model.tokenizer_path = cfg.model.policy_path
    if not uses_critic(cfg.algorithm.advantage_estimator):
        cfg.value_pretrain.enabled = False  # no critic, nothing to pretrain
    if cfg.value_pretrain.cache_dir is None:
        cfg.value_pretrain.cache_dir = os.path.join(cfg.trainer.output_root, "critic_cache")
    return cfg


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
             "Generated from `vcppo/config/schema.py` (`make docs`). Every command reads the same schema: "
             "`vcppo <command> [CONFIG] [section.key=value ...]`, where CONFIG is a shipped preset "
             "name or a YAML file. A default `${a.b}` follows key `a.b` unless set. The resume column says "
             "what changing a key does when a run resumes (docs/robustness.md): "
             + "; ".join(f"`{name}` {text}" for name, text in RESUME_CLASSES.items()) + ". A class marked "
             "(critic cache) is also in the key of the pretrained-critic cache (`value_pretrain.cache_dir`): "
             "a run that changes it pretrains its critic again instead of reusing another run's.", ""]
    classes = {k: c + (" (critic cache)" if k in CRITIC_CACHE_KEYS else "") for k, c in resume_classes().items()}
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
