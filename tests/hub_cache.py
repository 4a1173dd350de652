"""A Hugging Face hub cache, laid out as ``huggingface_hub`` writes it, built from local files: for
tests that resolve model and data set ids offline (``HF_HOME=<dir> HF_HUB_OFFLINE=1``).

``<HF_HOME>/hub/{models,datasets}--org--name/`` holds ``blobs/<hash>`` (the contents),
``snapshots/<commit>/<path>`` (relative symlinks into blobs) and ``refs/<branch or tag>`` (a commit).
"""
from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path


def repo_dir(hf_home: Path, repo_id: str, repo_type: str = "model") -> Path:
    return Path(hf_home) / "hub" / f"{repo_type}s--{repo_id.replace('/', '--')}"


def add_snapshot(hf_home: Path, repo_id: str, files: dict[str, Path | bytes | str], *, repo_type: str = "model",
                 commit: str | None = None, refs: tuple[str, ...] = ("main",)) -> Path:
    """Add a snapshot of ``repo_id`` with ``files`` ({path in the repo: a local file, or its bytes /
    text}); ``refs`` point at it. Returns the snapshot directory."""
    root = repo_dir(hf_home, repo_id, repo_type)
    commit = commit or hashlib.sha1(f"{repo_id}{sorted(files)}".encode()).hexdigest()
    snapshot = root / "snapshots" / commit
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    for rel, content in files.items():
        data = Path(content).read_bytes() if isinstance(content, Path) else \
            content.encode() if isinstance(content, str) else content
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = snapshot / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.exists() or link.is_symlink():
            link.unlink()
        link.symlink_to(os.path.relpath(blob, link.parent))
    (root / "refs").mkdir(exist_ok=True)
    for ref in refs:
        (root / "refs" / ref).write_text(commit)
    return snapshot


def add_model(hf_home: Path, repo_id: str, model_dir: Path, **kw) -> Path:
    """A model directory (config, weights, tokenizer files) as the snapshot of ``repo_id``."""
    files = {str(p.relative_to(model_dir)): p for p in Path(model_dir).rglob("*") if p.is_file()}
    return add_snapshot(hf_home, repo_id, files, **kw)


def remove(hf_home: Path, repo_id: str, repo_type: str = "model") -> None:
    shutil.rmtree(repo_dir(hf_home, repo_id, repo_type), ignore_errors=True)


def offline_hub(root: Path, monkeypatch) -> Path:
    """An empty hub cache under ``root``/hf, offline, for in-process tests: the constants huggingface_hub
    read from HF_HOME at import are patched, vcppo's per-process answers cleared, and no launcher
    rank variables set. Returns the HF_HOME directory."""
    import huggingface_hub.constants as constants

    from vcppo.models import hub

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(Path(root) / "hf" / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hub, "_RESOLVED", {})
    for var in ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE", "SLURM_LOCALID", "SLURM_NTASKS"):
        monkeypatch.delenv(var, raising=False)
    return Path(root) / "hf"
