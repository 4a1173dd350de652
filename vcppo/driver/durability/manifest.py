"""Checkpoint manifests: the size and SHA-256 of every file, written when a checkpoint is sealed and
verified before a run resumes from it.

``manifest.json`` (in the checkpoint directory, written after every other file)::

    {"version": 1, "files": {"actor/ds/zero_pp_rank_0_mp_rank_00_optim_states.pt":
                             {"size": 123, "sha256": "..."}, ...}}

Hashing is shared among ranks: file i (in sorted order) is hashed by rank ``i % world_size``, on
save and on verification, so no rank reads every shard. Sizes are checked by every rank (a stat).
A file listed but missing, of another size (truncated) or with another checksum (bit rot) makes
the checkpoint damaged; files not listed are ignored (nothing reads them).
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

MANIFEST = "manifest.json"
_CHUNK = 8 << 20


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            digest.update(block)
    return digest.hexdigest()


def _files(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST)


def hash_share(directory: Path, rank: int = 0, world_size: int = 1) -> dict[str, dict]:
    """``{relative path: {"size", "sha256"}}`` of this rank's share of the files in ``directory``."""
    return {rel: {"size": (directory / rel).stat().st_size, "sha256": sha256_of(directory / rel)}
            for i, rel in enumerate(_files(directory)) if i % world_size == rank}


def write_manifest(directory: Path, parts: list[dict[str, dict]]) -> Path:
    """Merge the ranks' shares (plus any file no share covered, e.g. ``state.json`` written after
    the shares were hashed) into ``manifest.json``, written atomically and flushed to disk."""
    files: dict[str, dict] = {}
    for part in parts:
        files.update(part)
    for rel in _files(directory):
        if rel not in files:
            files[rel] = {"size": (directory / rel).stat().st_size, "sha256": sha256_of(directory / rel)}
    path, tmp = directory / MANIFEST, directory / (MANIFEST + ".tmp")
    with open(tmp, "w") as f:
        json.dump({"version": 1, "files": dict(sorted(files.items()))}, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def read_manifest(directory: Path) -> dict[str, dict] | None:
    """The manifest's file table, or None when there is none or it cannot be read."""
    try:
        return json.loads((directory / MANIFEST).read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def problems(directory: Path, rank: int = 0, world_size: int = 1) -> list[str]:
    """What is wrong with ``directory`` as seen by this rank: every listed file's existence and
    size, and the checksums of this rank's share. Empty: intact."""
    files = read_manifest(directory)
    if files is None:
        return [f"{directory / MANIFEST} is missing or unreadable"]
    found = []
    for i, (rel, entry) in enumerate(sorted(files.items())):
        path = directory / rel
        if not path.is_file():
            found.append(f"{rel} is missing")
        elif path.stat().st_size != entry["size"]:
            found.append(f"{rel} has {path.stat().st_size} bytes, the manifest says {entry['size']} (truncated?)")
        elif i % world_size == rank and sha256_of(path) != entry["sha256"]:
            found.append(f"{rel} does not match its checksum (damaged on disk)")
    return found
