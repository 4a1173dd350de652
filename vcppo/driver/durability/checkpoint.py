"""Run checkpoints: written atomically, the last K kept, and found again by ``resume=auto``.

Layout of one checkpoint ``<run_dir>/checkpoints/step_000040/``::

    actor/            DeepSpeed checkpoint (weights, optimizer, LR scheduler), every rank's shard
    critic/           the same for the critic (absent for GRPO)
    rng_rank{r}.json  torch (CPU and CUDA) / numpy / python RNG states of rank r, as JSON
    state.json        phase, step counters, data position, ...
    manifest.json     size and SHA-256 of every other file (written last; verified on resume)

A checkpoint is complete when its directory has lost the ``.tmp`` suffix: every rank writes into
``step_N.tmp``, all ranks meet at a barrier and hash their share of the files, then the main rank
writes the manifest and renames the directory. A crash mid-write leaves only a ``.tmp`` directory,
which is ignored and cleaned up; old checkpoints are renamed to ``.deleting`` before they are
deleted, so a crash mid-delete leaves nothing that looks like a checkpoint. On resume the newest
checkpoint whose files match its manifest is used; a damaged one (truncated, missing or changed
file) is reported and skipped.

Checkpoints are tagged by the global step (pretraining steps + PPO steps), so the newest one sorts
last whichever phase wrote it.

Nothing is loaded by unpickling: a crafted file in a checkpoint directory must not run code on
resume. Our own files are JSON; DeepSpeed's states are loaded with ``torch.load(weights_only=True)``
(:mod:`vcppo.engines.safe_checkpoint`); an older checkpoint's ``rng_rank{r}.pt`` is read so too.
"""
from __future__ import annotations

import base64
import json
import logging
import os
import random
import re
import shutil
from pathlib import Path

import numpy as np
import torch

from vcppo.driver.durability import manifest
from vcppo.driver.state import RunState
from vcppo.errors import ConfigError

logger = logging.getLogger(__name__)
_STEP_DIR = re.compile(r"^step_(\d+)$")


def checkpoint_root(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / "checkpoints"


def staging_dir(run_dir: str | os.PathLike, tag: int) -> Path:
    return checkpoint_root(run_dir) / f"step_{tag:06d}.tmp"


class CheckpointError(ConfigError):
    """A checkpoint that cannot be used as it is; the message names the file. A ConfigError: the
    user must act (move it away, or set trainer.resume), and the CLI prints it and exits 2."""


def _bytes_to_text(t: torch.Tensor) -> str:
    return base64.b64encode(t.cpu().numpy().tobytes()).decode("ascii")


def _text_to_bytes(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)


def rng_state() -> dict:
    """Every RNG the run draws from, as JSON-able values (no pickle)."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    version, words, gauss_next = random.getstate()
    cuda = [_bytes_to_text(s) for s in torch.cuda.get_rng_state_all()] if torch.cuda.is_available() else []
    return {"torch": _bytes_to_text(torch.get_rng_state()), "cuda": cuda,
            "numpy": {"name": name, "keys": keys.tolist(), "pos": int(pos), "has_gauss": int(has_gauss),
                      "cached_gaussian": float(cached)},
            "python": {"version": version, "words": list(words), "gauss_next": gauss_next}}


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(_text_to_bytes(state["torch"]) if isinstance(state["torch"], str) else state["torch"])
    if state.get("cuda") and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all([_text_to_bytes(s) for s in state["cuda"]])
    n = state["numpy"]
    if isinstance(n, dict):
        n = (n["name"], np.asarray(n["keys"], dtype=np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"])
    np.random.set_state(n)
    py = state["python"]
    if isinstance(py, dict):
        py = (py["version"], tuple(py["words"]), py["gauss_next"])
    random.setstate(py)


def _rng_file(directory: Path, rank: int) -> Path:
    return directory / f"rng_rank{rank}.json"


def write_rank_files(stage: Path, rank: int) -> None:
    stage.mkdir(parents=True, exist_ok=True)
    _rng_file(stage, rank).write_text(json.dumps(rng_state()))


def _legacy_rng_state(path: Path) -> dict:
    """An ``rng_rank{r}.pt`` of an older checkpoint: tensors and numpy arrays only, never code."""
    core = getattr(np, "_core", None) or np.core  # numpy 2 renamed numpy.core (what older pickles name)
    allowed = [core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]
    try:
        with torch.serialization.safe_globals(allowed):
            return torch.load(path, weights_only=True)
    except Exception as e:  # pickle.UnpicklingError for anything beyond those types
        raise unpickle_refusal(path, e, "RNG arrays") from None


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def unpickle_refusal(path: str | Path, error: BaseException,
                     allowed: str = "tensors and plain values") -> CheckpointError:
    """One line for a checkpoint file torch will not unpickle with ``weights_only``: the file, what it
    holds (torch's reason, without its colour codes), and what to do. torch's own advice (load it with
    ``weights_only=False``) is not ours to give."""
    lines = [_ANSI.sub("", ln).strip() for ln in str(error).splitlines()]
    cause = next((ln.split("error:", 1)[-1].strip() for ln in lines if "WeightsUnpickler error" in ln),
                 lines[0] if lines else type(error).__name__).split(". Please use")[0]
    return CheckpointError(
        f"{path}: refusing to load this checkpoint file: it holds more than {allowed} ({cause[:300]}), "
        "and unpickling it could run code from the file. If you did not put it there, the checkpoint was tampered "
        "with: move its step_N directory out of checkpoints/ (the run resumes from the previous one) or start over "
        "with trainer.resume=never (the run dir's files are moved aside, not deleted)")


def _delete(path: Path) -> None:
    """Rename first, then delete: a kill mid-delete leaves a ``.deleting`` directory (cleaned up
    later), never a half-deleted ``step_N`` that looks like a checkpoint."""
    doomed = path.with_name(path.name + ".deleting")
    os.replace(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def commit(stage: Path, state: dict, keep_last: int, manifest_parts: list[dict] | None = None) -> Path:
    """Main rank only, after every rank has written into ``stage``: write ``state.json`` and the
    manifest (``manifest_parts``: the ranks' hashed shares, see :mod:`vcppo.driver.durability.manifest`;
    None hashes everything here), seal by renaming, and prune to the last ``keep_last``."""
    (stage / "state.json").write_text(json.dumps(state, indent=1))
    manifest.write_manifest(stage, manifest_parts if manifest_parts is not None else [manifest.hash_share(stage)])
    final = stage.with_suffix("")
    if final.exists():  # the same step saved again after a resume
        _delete(final)
    os.replace(stage, final)
    for old in list_complete(stage.parent)[:-keep_last]:
        _delete(old)
    return final


def _is_complete(p: Path) -> bool:
    """Sealed with a manifest, or a checkpoint written before manifests existed (state.json and
    pickled RNG files; every newer checkpoint has JSON RNG files and a manifest)."""
    if (p / manifest.MANIFEST).is_file():
        return True
    return (p / "state.json").is_file() and any(p.glob("rng_rank*.pt")) and not any(p.glob("rng_rank*.json"))


def list_complete(root: str | os.PathLike) -> list[Path]:
    """Complete checkpoints, oldest first (complete: sealed; intact: see :func:`find_resume_point`)."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = _STEP_DIR.match(p.name)
        if m and p.is_dir() and _is_complete(p):
            found.append((int(m.group(1)), p))
    return [p for _, p in sorted(found)]


def clean_partial(root: str | os.PathLike) -> list[Path]:
    """Remove what a crash left: unsealed ``.tmp`` dirs, ``.deleting`` dirs, and ``step_N`` dirs
    that are not complete checkpoints. Returns what was removed."""
    root = Path(root)
    if not root.is_dir():
        return []
    removed = []
    for p in sorted(root.iterdir()):
        stray_step = _STEP_DIR.match(p.name) and p.is_dir() and not _is_complete(p)
        if p.is_dir() and (p.name.endswith((".tmp", ".deleting")) or stray_step):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


_VERDICTS: dict[tuple, list[str]] = {}  # a checkpoint is hashed once per process, not per caller


def checkpoint_problems(path: Path, rank: int = 0, world_size: int = 1, gather=None) -> list[str]:
    """What is wrong with checkpoint ``path`` over all ranks (``gather``: an all-gather of Python
    objects, e.g. ``vcppo.runtime.collectives.all_gather_object``; every rank must call). Legacy
    checkpoints without a manifest are not verified."""
    if not (path / manifest.MANIFEST).is_file() and _is_complete(path):
        logger.warning("%s predates checkpoint manifests: resuming from it unverified", path)
        return []
    stamp = tuple((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in sorted(path.rglob("*")) if f.is_file())
    key = (str(path.resolve()), stamp, rank, world_size)  # any change to a file is a new verdict
    if key not in _VERDICTS:
        mine = manifest.problems(path, rank, world_size)
        everyone = gather(mine) if gather is not None else [mine]
        _VERDICTS[key] = sorted({p for part in everyone for p in part})
    return _VERDICTS[key]


def find_resume_point(run_dir: str | os.PathLike, resume: str, rank: int = 0, world_size: int = 1,
                      gather=None) -> Path | None:
    """``resume``: 'auto' -> the newest complete AND intact checkpoint of this run (a damaged one is
    reported and skipped in favour of the previous one; None if there is none), 'never' -> None,
    otherwise a checkpoint directory that must exist and be intact. Collective when ``gather``
    is given (see :func:`checkpoint_problems`)."""
    if resume == "never":
        return None
    if resume != "auto":
        path = Path(resume)
        if not (path / "state.json").exists():
            raise FileNotFoundError(f"trainer.resume: {path} is not a complete checkpoint (no state.json)")
        found = checkpoint_problems(path, rank, world_size, gather)
        if found:
            raise CheckpointError(f"trainer.resume: checkpoint {path} is damaged: {'; '.join(found[:5])}")
        return path
    complete = list_complete(checkpoint_root(run_dir))
    for path in reversed(complete):
        found = checkpoint_problems(path, rank, world_size, gather)
        if not found:
            return path
        logger.warning("checkpoint %s is damaged, skipping it for the previous one: %s", path, "; ".join(found[:5]))
    if complete:
        raise CheckpointError(f"every checkpoint of {run_dir} is damaged ({', '.join(p.name for p in complete)}); "
                              "move them away, or start over with trainer.resume=never")
    return None


def peek_state(ckpt: Path) -> RunState:
    """The run state of a checkpoint, without restoring anything (to decide how to build engines)."""
    return RunState(**json.loads((ckpt / "state.json").read_text()))


def load_state(ckpt: Path, rank: int, restore_rng: bool = True) -> RunState:
    """The run state, with this rank's RNG states restored (a missing RNG file is reported: the
    run continues, but no longer bit-exact). ``restore_rng`` False: on another number of ranks, the
    per-rank streams do not carry over (the seeded ones stay)."""
    state = RunState(**json.loads((ckpt / "state.json").read_text()))
    rng_file, legacy = _rng_file(ckpt, rank), ckpt / f"rng_rank{rank}.pt"
    if not restore_rng:
        return state
    if rng_file.exists():
        try:
            set_rng_state(json.loads(rng_file.read_text()))
        except (ValueError, KeyError, TypeError) as e:
            raise CheckpointError(f"{rng_file}: not a valid RNG state ({e!r})") from None
    elif legacy.exists():
        set_rng_state(_legacy_rng_state(legacy))
    else:
        logger.warning("%s has no RNG state of rank %d (%s): continuing from the seeded RNGs; the "
                       "resumed run will not repeat an uninterrupted one exactly", ckpt, rank, rng_file.name)
    return state
