"""The pretrained-critic cache: value pretraining's result, reused by every run it would be the
same for.

A pretrained critic is determined by the policy, the data, the critic's init and optimiser, the
pretraining, sampling and episode settings, and the reward -- not by the RL algorithm or the seed:
the schema's tags say which keys (:func:`vcppo.config.provenance.critic_cache_keys`). So every
preset and seed of a sweep that starts from the same SFT model reuses one critic, stored under
``value_pretrain.cache_dir/<key>`` and published atomically (concurrent runs never read half a
model).
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
from pathlib import Path

from vcppo.config.provenance import CRITIC_CACHE_KEYS, PATH_KEYS
from vcppo.config.rules import combine_mode
from vcppo.config.schema import Config

COMPLETE_MARKER = "vcppo_pretrain.json"


def fingerprint_path(path: str) -> dict:
    """Cheap identity of a file or directory (names, sizes, mtimes) for cache keys: hashing a 60 GB
    checkpoint to decide whether to reuse a critic would cost more than it saves."""
    p = Path(path)
    files = [p] if p.is_file() else sorted(x for x in p.rglob("*") if x.is_file())
    return {"path": str(p.resolve()),
            "files": [(str(f.relative_to(p)) if p.is_dir() else f.name, f.stat().st_size,
                       int(f.stat().st_mtime)) for f in files]}


def critic_source(cfg: Config) -> tuple[str, str]:
    """(init, directory) the critic is built from: the policy's backbone for ``critic_init: policy``
    (``model.critic_path`` names the RM / checkpoint of the other two kinds and is ignored here, even
    when a preset sets it: the demo's does, for ``critic_init=reward_model``)."""
    init = cfg.model.critic_init
    return init, (cfg.model.policy_path if init == "policy" else cfg.model.critic_path)


def key_value(cfg: Config, key: str):
    """What ``key`` contributes to the cache key: its value as the run reads it (a path by its
    files' fingerprint; ``model.critic_path`` nothing for a policy-initialised critic, which is the
    policy; ``reward.combine`` with null resolved)."""
    if key == "model.critic_path" and critic_source(cfg)[0] == "policy":
        return None
    if key == "reward.combine":
        return combine_mode(cfg)
    value = functools.reduce(getattr, key.split("."), cfg)
    if key in PATH_KEYS and value:
        return fingerprint_path(value)
    return value


def cache_key(cfg: Config) -> str:
    """A hash of every key the pretrained critic depends on (:data:`CRITIC_CACHE_KEYS`: the
    schema's ``math`` and ``fixed`` keys but those tagged ``critic_cache=False``), the same tags that
    refuse a resume that changes one. A key added to the schema changes every cache key once (the
    critic is pretrained again): reusing a critic the new key would have changed is the worse error."""
    relevant = {key: key_value(cfg, key) for key in CRITIC_CACHE_KEYS}
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
