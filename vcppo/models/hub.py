"""Hugging Face Hub ids wherever a model or data set path goes: ``Qwen/Qwen2.5-0.5B-Instruct`` (optionally
``@revision``) resolves through ``huggingface_hub`` to a snapshot directory of the local cache.

A value that is an existing path is used as it is. Otherwise a value shaped ``org/name[@revision]``
is an id: :func:`resolve` calls ``snapshot_download`` (which honours ``HF_HOME``, ``HF_HUB_CACHE``,
``HF_HUB_OFFLINE`` and ``HF_TOKEN``) and returns the snapshot directory, whose name is the resolved
commit. Every engine then reads that one directory, so vLLM and the trainer load the same files.

On several ranks the id is resolved once per node: local rank 0 downloads under a file lock and
writes the answer next to it; the other local ranks wait for that answer (:func:`resolve_once`).
Errors are one line naming the config key and the fix: an id neither local nor cached while
offline, a repository that does not exist or is gated, a revision that does not exist.
"""
from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from vcppo.errors import ConfigError

_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*(@[\w./-]+)?$")
_SNAPSHOT = re.compile(r"(models|datasets)--(?P<org>[^/]+?)--(?P<name>[^/]+)/snapshots/(?P<commit>[0-9a-f]{40})/?$")
WAIT_S = 1800.0  # how long a non-zero local rank waits for local rank 0's download


@dataclass(frozen=True)
class HubId:
    """``repo_id`` (``org/name``) and an optional ``revision`` (a branch, tag or commit)."""

    repo_id: str
    revision: str | None = None

    def __str__(self) -> str:
        return self.repo_id + (f"@{self.revision}" if self.revision else "")


def parse_id(value: str) -> HubId | None:
    """The hub id ``value`` names, or None when it is an existing path or not shaped ``org/name[@rev]``."""
    if not value or os.path.exists(value) or not _ID.match(value):
        return None
    repo_id, _, revision = value.partition("@")
    return HubId(repo_id, revision or None)


def snapshot_source(path: str) -> str | None:
    """``org/name@commit`` for a snapshot directory of the hub cache, else None (a plain directory)."""
    m = _SNAPSHOT.search(str(path))
    return f"{m['org']}/{m['name']}@{m['commit']}" if m else None


def _fetch_hint(hub_id: HubId, repo_type: str) -> str:
    kind = " --repo-type dataset" if repo_type == "dataset" else ""
    rev = f" --revision {hub_id.revision}" if hub_id.revision else ""
    return f"`hf download {hub_id.repo_id}{kind}{rev}` on a machine with access (same HF_HOME), or unset HF_HUB_OFFLINE"


def _download(hub_id: HubId, what: str, repo_type: str, allow_patterns: list[str] | None) -> str:
    """``snapshot_download`` with its errors turned into one line starting with ``what`` (the config
    key, or the command, that named it)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError,
                                        RevisionNotFoundError)

    kind = "data set" if repo_type == "dataset" else "model"
    try:
        return snapshot_download(hub_id.repo_id, repo_type=repo_type, revision=hub_id.revision,
                                 allow_patterns=allow_patterns)
    except GatedRepoError:
        raise ConfigError(f"{what}: {kind} {hub_id.repo_id} is gated: accept its terms on "
                          f"huggingface.co and set HF_TOKEN (or `hf auth login`)") from None
    except RevisionNotFoundError:
        raise ConfigError(f"{what}: {kind} {hub_id.repo_id} has no revision {hub_id.revision!r} "
                          "(a branch, tag or commit of the repository)") from None
    except RepositoryNotFoundError:
        raise ConfigError(f"{what}: no {kind} {hub_id.repo_id} on the Hugging Face Hub (check the "
                          "name; a private repository needs HF_TOKEN), and no such local path") from None
    except LocalEntryNotFoundError:
        raise ConfigError(f"{what}: {hub_id} is not a local path and not in the Hugging Face cache "
                          f"({_cache_dir()}) while offline or unreachable: fetch it with "
                          f"{_fetch_hint(hub_id, repo_type)}") from None


def _cache_dir() -> str:
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


def _local_rank() -> tuple[int, int]:
    """(local rank, local world size) from the launcher's environment (deepspeed, torchrun, or SLURM's
    srun before any group exists); (0, 1) for one process. The size only tells one process from
    several, so a job's total stands in where a launcher gives no per-node count."""
    env = os.environ
    rank = env.get("LOCAL_RANK") or env.get("SLURM_LOCALID") or 0
    size = (env.get("LOCAL_WORLD_SIZE") or env.get("LOCAL_SIZE") or env.get("WORLD_SIZE") or env.get("SLURM_NTASKS")
            or 1)  # LOCAL_SIZE: the deepspeed launcher's name for the node's rank count
    return int(rank), int(size)


def _answer_file(hub_id: HubId, repo_type: str) -> Path:
    safe = re.sub(r"[^\w.-]", "_", f"{repo_type}--{hub_id}")
    return Path(_cache_dir()) / ".vcppo" / f"{safe}.json"


def _process_start() -> float:
    import psutil

    return psutil.Process().create_time()


def resolve_once(hub_id: HubId, what: str, repo_type: str = "model",
                 allow_patterns: list[str] | None = None) -> str:
    """The snapshot directory of ``hub_id``, downloaded by local rank 0 only (under a file lock); the
    other local ranks read rank 0's answer, written after this launch started, so every rank of a
    node reads the same snapshot even when the cache's ``refs/main`` moves during the download."""
    from filelock import FileLock

    answer = _answer_file(hub_id, repo_type)
    local_rank, local_size = _local_rank()
    if local_size <= 1 or local_rank == 0:
        if local_size <= 1:
            return _download(hub_id, what, repo_type, allow_patterns)
        answer.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(answer) + ".lock"):
            path = _download(hub_id, what, repo_type, allow_patterns)
            answer.write_text(json.dumps({"path": path, "time": time.time()}))
        return path
    started, deadline = _process_start() - 60.0, time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        try:
            record = json.loads(answer.read_text())
            if record["time"] >= started and os.path.isdir(record["path"]):
                return record["path"]
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.5)
    raise ConfigError(f"{what}: local rank {local_rank} waited {WAIT_S:.0f} s for local rank 0 to "
                      f"resolve {hub_id} (its error, if any, is in its log)")


_RESOLVED: dict[tuple[HubId, str], str] = {}  # one answer per id in a process (tokenizer_path = policy_path)


def resolve(value: str, key: str, repo_type: str = "model", allow_patterns: list[str] | None = None) -> str:
    """``value`` as a local path: itself when it is not a hub id, else its snapshot directory."""
    hub_id = parse_id(value)
    if hub_id is None:
        return value
    if (hub_id, repo_type) not in _RESOLVED:
        path = resolve_once(hub_id, f"config key '{key}'", repo_type, allow_patterns)
        print(f"vcppo: {key}={hub_id} -> {path} (revision {hub_id.revision or 'main'} = {Path(path).name})",
              flush=True)
        _RESOLVED[(hub_id, repo_type)] = path
    return _RESOLVED[(hub_id, repo_type)]


# The model keys each command reads (a critic path only where a critic is built from it).
MODEL_KEYS = {
    "train": ("model.policy_path", "model.tokenizer_path", "model.critic_path", "reward.model_path"),
    "plan": ("model.policy_path", "model.critic_path", "reward.model_path"),
    "sft": ("sft.init_model",),
    "rm": ("rm.policy_path",),
    "eval": ("eval.model_path",),
}


def _model_fields(cfg, command: str):
    """(key, section object, field name) of ``command``'s model keys in ``cfg``."""
    for key in MODEL_KEYS.get(command, ()):
        section, name = key.split(".")
        yield key, getattr(cfg, section), name


def resolve_model_keys(cfg, command: str, allow_patterns: list[str] | None = None) -> None:
    """Replace each hub id among ``command``'s model keys of ``cfg`` (a :class:`~vcppo.config.schema.Config`)
    by its snapshot directory, in place; ``allow_patterns`` limits a download (``vcppo plan`` reads
    only the JSON files)."""
    from vcppo.methods import uses_critic

    for key, section, name in _model_fields(cfg, command):
        if key == "model.critic_path" and (cfg.model.critic_init == "policy"
                                           or not uses_critic(cfg.algorithm.advantage_estimator)):
            continue
        value = getattr(section, name)
        if value and parse_id(value) is not None:
            setattr(section, name, resolve(value, key, allow_patterns=allow_patterns))


def model_sources(cfg, command: str = "train") -> dict[str, str]:
    """``{key: org/name@commit}`` of ``command``'s model keys that are snapshots of the hub cache
    (what a run records beside its config)."""
    sources = {key: snapshot_source(getattr(section, name) or "") for key, section, name in _model_fields(cfg, command)}
    return {key: source for key, source in sources.items() if source}
