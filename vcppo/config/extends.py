"""``extends:``: the parent a YAML config file names, and the chain of files it makes.

A file may name one parent with ``extends: NAME``. NAME is looked up in this order:

  1. a shipped preset's name, with or without ``.yaml`` (``vcppo``, ``vcppo.yaml``): a file in
     vcppo/configs, so a user's own file extends a preset wherever it lives;
  2. a path relative to the directory of the file that names it (``../common.yaml``);
  3. an absolute path.

A name with a directory part (``./base.yaml``, ``configs/x.yaml``) is never a preset name, so
``./NAME.yaml`` picks the user's file beside it even when a preset has that name; a bare name that is
both is read as the preset, with a one-line warning naming the file that was not read. The parent may
itself extend another file (chains mix presets and user files); a file that extends itself,
directly or through others, is an error, and so is a NAME that none of the three finds: the
error lists the paths tried.
"""
from __future__ import annotations

import logging
import re
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from vcppo.errors import ConfigError

logger = logging.getLogger(__name__)
_KEY = re.compile(r"^[A-Za-z_][\w.+-]*$")  # what a config key (or extends) looks like


def extends_candidates(name: str, child: Path, preset_dir: Path) -> list[Path]:
    """Where ``extends: name`` in file ``child`` may point, in lookup order."""
    path = Path(name)
    tried = []
    if "/" not in name:  # a bare name (Path drops a leading './'): a shipped preset first
        tried.append(preset_dir / (name if path.suffix in (".yaml", ".yml") else f"{name}.yaml"))
    tried.append(path if path.is_absolute() else child.parent / path)
    return tried


def resolve_extends(name: str, child: Path, preset_dir: Path) -> Path:
    """The file ``extends: name`` in ``child`` names (see the module docstring)."""
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"config file {child}: 'extends' must be a file name or a preset name, got {name!r}")
    tried = extends_candidates(name.strip(), child, preset_dir)
    found = [candidate for candidate in tried if candidate.is_file()]
    # a shipped preset and the user's file of the same name: say which one is read
    if len(found) > 1 and found[0].resolve() != found[1].resolve():
        logger.warning("config file %s: 'extends: %s' reads the shipped preset %s, not %s beside it "
                       "(write 'extends: ./%s' for that one)", child, name, found[0].stem, found[1], name.strip())
    if found:
        return found[0]
    shipped = sorted(p.stem for p in preset_dir.glob("*.yaml"))
    raise ConfigError(f"config file {child}: 'extends: {name}' not found (tried {', '.join(map(str, tried))}); "
                      f"name a shipped preset ({', '.join(shipped)}), a path relative to {child.parent}, "
                      "or an absolute path")


def load_yaml_mapping(path: Path) -> DictConfig:
    """One config file's mapping (a missing file is 'not found', a parse error 'not valid YAML')."""
    if not path.is_file():
        raise ConfigError(f"config file {path} not found")
    try:
        data = OmegaConf.load(path)
    except Exception as e:  # noqa: BLE001 - yaml's and OmegaConf's parse errors alike
        raise ConfigError(f"config file {path} is not valid YAML ({_where(e)})") from None
    if not isinstance(data, DictConfig) or not all(_KEY.match(str(k)) for k in data.keys()):
        # no part of the file is echoed: a file named by mistake (/etc/passwd) must not end up in a CI log
        raise ConfigError(f"config file {path} is not a vcppo config: its top level must be a YAML mapping of "
                          "config keys (section: {key: value})")
    return data


def _where(error: Exception) -> str:
    """A parse error's problem and line, without the file's text that yaml quotes."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or type(error).__name__
    return f"{problem}, line {mark.line + 1}" if mark is not None else problem


def read_yaml_chain(path: Path, preset_dir: Path, seen: tuple = ()) -> list[tuple[Path, DictConfig]]:
    """The file and its ``extends:`` ancestors, root first."""
    path = path.resolve()
    if path in seen:
        raise ConfigError(f"config 'extends' cycle: {' -> '.join(map(str, seen + (path,)))}")
    data = load_yaml_mapping(path)
    parent = data.pop("extends", None)
    if parent is None:
        return [(path, data)]
    return read_yaml_chain(resolve_extends(parent, path, preset_dir), preset_dir, seen + (path,)) + [(path, data)]
