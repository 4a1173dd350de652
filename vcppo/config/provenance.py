"""What a resumed run may change in its config, and the record of what it did change.

Every schema field names its class (``resume=`` in :mod:`vcppo.config.schema`, :data:`RESUME_CLASSES`):

- ``math``: changes what the run computes; a resume that changes it is refused, naming each such
  key with its old and new value, unless the key is listed in ``trainer.resume_allow_changes``;
- ``numerics``: the same computation with other rounding or layout; accepted and recorded;
- ``free``: logging, cadence, validation, limits, run length; accepted and recorded;
- ``fixed``: the checkpoint's tensors would not fit; refused whatever the allow list says.

The run directory keeps ``config.yaml`` (the current segment's resolved config) and
``config_history.jsonl``: one record per segment (a start, a resume, a start-over) with the step it
began at, the checkpoint it resumed from, the command line, and every key that changed since that
checkpoint's config (old, new, class). Pure config logic: the engines' own checks (ZeRO layout,
model shape) are :mod:`vcppo.driver.durability.run_dir`'.
"""
from __future__ import annotations

import dataclasses
import difflib
import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from vcppo.records import read_records
from vcppo.config.schema import RESUME_CLASSES, Config
from vcppo.errors import ConfigError

HISTORY_FILE = "config_history.jsonl"
ALLOW_KEY = "trainer.resume_allow_changes"


def schema_tags(cls: type = Config, prefix: str = "", section: dict | None = None) -> dict[str, dict]:
    """``{dotted key: its field's metadata}`` for every leaf field; a section's own ``resume`` and
    ``critic_cache`` (set in its metadata) win over its fields'."""
    out = {}
    for f in dataclasses.fields(cls):
        factory = f.default_factory if f.default_factory is not dataclasses.MISSING else None
        if factory is not None and dataclasses.is_dataclass(factory):
            inherited = {k: f.metadata[k] for k in ("resume", "critic_cache") if k in f.metadata}
            out.update(schema_tags(factory, f"{prefix}{f.name}.", {**inherited, **(section or {})}))
        else:
            out[prefix + f.name] = {**f.metadata, **(section or {})}
    return out


def resume_classes(cls: type = Config) -> dict[str, str]:
    """``{dotted key: class}`` of every leaf field; a section's own ``resume`` metadata (the sections
    `vcppo train` does not read) wins over its fields'."""
    return {key: tags.get("resume") for key, tags in schema_tags(cls).items()}


def critic_cache_keys(cls: type = Config) -> tuple[str, ...]:
    """The keys a pretrained critic depends on, from the same tags as the resume classes: every
    ``math`` and ``fixed`` key but those tagged ``critic_cache=False`` (value pretraining never reads
    them). So a key that changes what the run computes is in the critic cache's key by construction,
    and a resume refuses a change of any of them."""
    return tuple(key for key, tags in schema_tags(cls).items()
                 if tags.get("resume") in ("math", "fixed") and tags.get("critic_cache", True))


CLASSES = resume_classes()  # the schema does not change at run time
CRITIC_CACHE_KEYS = critic_cache_keys()


@dataclasses.dataclass(frozen=True)
class Change:
    key: str
    old: Any
    new: Any
    klass: str

    def describe(self) -> str:
        return f"{self.key} {self.old!r} -> {self.new!r}"


def _select(data: dict, key: str) -> tuple[bool, Any]:
    for part in key.split("."):
        if not isinstance(data, dict) or part not in data:
            return False, None
        data = data[part]
    return True, data


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool) \
            and not isinstance(b, bool):
        return float(a) == float(b)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


# Keys that name a file or directory (by their schema names): two spellings of one path (a trailing
# slash, relative or absolute) are the same value.
PATH_KEYS = tuple(k for k in CLASSES if k.endswith(("_path", "_files", "_dir", "_root")))


def same_path(a: Any, b: Any) -> bool:
    """``a`` and ``b`` name the same path, from the current directory (or are equal as they are)."""
    if a == b or not (isinstance(a, str) and isinstance(b, str) and a and b):
        return a == b
    return os.path.realpath(os.path.expanduser(a)) == os.path.realpath(os.path.expanduser(b))


def same_value(key: str, a: Any, b: Any) -> bool:
    """Whether key ``key`` holds one value in both configs (paths compared after resolving them)."""
    return same_path(a, b) if key in PATH_KEYS else _same(a, b)


def diff_configs(old: dict, new: dict) -> list[Change]:
    """The schema keys whose value differs between two resolved configs (plain dicts). A key the
    old config does not hold (written by a version without it) is not a change."""
    changes = []
    for key, klass in CLASSES.items():
        had, before = _select(old, key)
        has, after = _select(new, key)
        if had and has and not same_value(key, before, after):
            changes.append(Change(key, before, after, klass))
    return changes


def check_allow_list(allowed: list[str]) -> None:
    """``trainer.resume_allow_changes`` names schema keys, none of them ``fixed``."""
    for key in allowed:
        if key not in CLASSES:
            close = difflib.get_close_matches(str(key), list(CLASSES), n=1, cutoff=0.6)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise ConfigError(f"config key '{ALLOW_KEY}': unknown key '{key}'{hint}")
        if CLASSES[key] == "fixed":
            raise ConfigError(f"config key '{ALLOW_KEY}': '{key}' cannot change on resume (the checkpoint's "
                              "tensors would not fit), so it cannot be allowed")


def refuse_changes(changes: list[Change], allowed: list[str], point: Path) -> None:
    """Raise (one line) for the changes a resume from ``point`` may not make: ``fixed`` ones always,
    ``math`` ones not in ``allowed``."""
    fixed = [c for c in changes if c.klass == "fixed"]
    if fixed:
        c = fixed[0]
        raise ConfigError(
            f"config key '{c.key}': {c.old!r} in checkpoint {point}, {c.new!r} now; the checkpoint's tensors have "
            f"the old shape and cannot be loaded into the new one. Set {c.key}={_literal(c.old)} to resume, or "
            "start over (trainer.resume=never, or another trainer.run_name)")
    math = [c for c in changes if c.klass == "math" and c.key not in allowed]
    if math:
        keys = ",".join(c.key for c in math)
        raise ConfigError(
            f"resuming from checkpoint {point} would change what the run computes: "
            f"{'; '.join(c.describe() for c in math)}. Put the old value(s) back, or accept the change with "
            f"{ALLOW_KEY}=[{keys}] (recorded in {HISTORY_FILE}), or start over (trainer.resume=never, or another "
            "trainer.run_name)")


def _literal(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(map(str, value)) + "]"
    return "null" if value is None else str(value)


def summary(changes: list[Change]) -> str:
    """One log line of the changes a resume accepted."""
    notes = {"math": "allowed by " + ALLOW_KEY, "numerics": "same math, other rounding: no longer bit-exact",
             "free": "does not touch the math"}
    return "; ".join(f"{c.describe()} ({notes[c.klass]})" for c in changes)


def record_segment(run_dir: Path, *, phase: str, step: int, global_step: int, resumed_from: Path | None,
                   changes: list[Change], argv: list[str] | None = None,
                   models: dict[str, str] | None = None) -> Path:
    """Append this segment to ``<run_dir>/config_history.jsonl`` (main rank); ``models``: the hub
    snapshots the model keys resolved to (``{key: org/name@commit}``)."""
    path = Path(run_dir) / HISTORY_FILE
    segments = max((r.get("segment", 0) for r in read_history(run_dir) if isinstance(r.get("segment"), int)),
                   default=0)
    record = {"segment": segments + 1, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "phase": phase, "step": step, "global_step": global_step,
              "resumed_from": str(resumed_from) if resumed_from is not None else None,
              "command": shlex.join(sys.argv if argv is None else argv),
              "changes": {c.key: {"old": c.old, "new": c.new, "class": c.klass} for c in changes},
              "models": models or {}}
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(record, default=str) + "\n")
    return path


def read_history(run_dir: Path, say=None) -> list[dict]:
    """The segments of ``config_history.jsonl`` (:func:`read_records`)."""
    return read_records(Path(run_dir) / HISTORY_FILE, say)


def describe_classes() -> str:
    """The classes as a markdown list (docs)."""
    return "\n".join(f"- `{name}`: {text}" for name, text in RESUME_CLASSES.items())
