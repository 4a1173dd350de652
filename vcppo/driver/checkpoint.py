"""Run checkpoints: written atomically, the last K kept, and found again by ``resume=auto``.

Layout of one checkpoint ``<run_dir>/checkpoints/step_000040/``::

    actor/            DeepSpeed checkpoint (weights, optimizer, LR scheduler), every rank's shard
    critic/           the same for the critic (absent for GRPO)
    rng_rank{r}.json  torch (CPU and CUDA) / numpy / python RNG states of rank r, as JSON
    state.json        phase, step counters, data position, ...   (written last)

A checkpoint is complete when its directory has lost the ``.tmp`` suffix: every rank writes into
``step_N.tmp``, all ranks meet at a barrier, then the main rank renames it. A crash mid-write leaves
only a ``.tmp`` directory, which is ignored and cleaned up.

Checkpoints are tagged by the global step (pretraining steps + PPO steps), so the newest one sorts
last whichever phase wrote it.

Nothing is loaded by unpickling: a crafted file in a checkpoint directory must not run code on
resume. Our own files are JSON; DeepSpeed's states are loaded with ``torch.load(weights_only=True)``
(:mod:`vcppo.engines.safe_checkpoint`). Checkpoints written before this change hold
``rng_rank{r}.pt``; it is read with ``weights_only=True`` and numpy's array types allowed.
"""
from __future__ import annotations

import base64
import json
import logging
import os
import random
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

logger = logging.getLogger(__name__)
_STEP_DIR = re.compile(r"^step_(\d+)$")


@dataclass
class RunState:
    """Where a run stands; saved as ``state.json`` in every checkpoint."""
    phase: str                        # "value_pretrain" or "ppo": the phase to continue
    step: int = 0                     # PPO steps done
    pretrain_step: int = 0            # value-pretraining steps done
    pretrain_ev: list = field(default_factory=list)    # explained variance per pretraining step
    pretrain_loss: list = field(default_factory=list)  # value loss per pretraining step
    data: dict = field(default_factory=dict)           # the prompt stream's position

    @property
    def global_step(self) -> int:
        return self.pretrain_step + self.step


def checkpoint_root(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / "checkpoints"


def staging_dir(run_dir: str | os.PathLike, tag: int) -> Path:
    return checkpoint_root(run_dir) / f"step_{tag:06d}.tmp"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used as it is; the message names the file."""


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
        raise CheckpointError(f"{path}: refusing to load (it holds more than RNG arrays; a crafted file "
                              f"would run code if unpickled): {str(e).splitlines()[0][:300]}") from None


def commit(stage: Path, state: dict, keep_last: int) -> Path:
    """Main rank only, after every rank has written into ``stage``: seal and rename."""
    (stage / "state.json").write_text(json.dumps(state, indent=1))
    final = stage.with_suffix("")
    if final.exists():  # the same step saved again after a resume
        shutil.rmtree(final)
    os.replace(stage, final)
    complete = list_complete(stage.parent)
    for old in complete[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_complete(root: str | os.PathLike) -> list[Path]:
    """Complete checkpoints, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = _STEP_DIR.match(p.name)
        if m and p.is_dir() and (p / "state.json").exists():
            found.append((int(m.group(1)), p))
    return [p for _, p in sorted(found)]


def clean_partial(root: str | os.PathLike) -> None:
    root = Path(root)
    if root.is_dir():
        for p in root.glob("*.tmp"):
            shutil.rmtree(p, ignore_errors=True)


def find_resume_point(run_dir: str | os.PathLike, resume: str) -> Path | None:
    """``resume``: 'auto' -> the newest complete checkpoint of this run (or None), 'never' -> None,
    otherwise a checkpoint directory that must exist."""
    if resume == "never":
        return None
    if resume == "auto":
        complete = list_complete(checkpoint_root(run_dir))
        return complete[-1] if complete else None
    path = Path(resume)
    if not (path / "state.json").exists():
        raise FileNotFoundError(f"trainer.resume: {path} is not a complete checkpoint (no state.json)")
    return path


def load_state(ckpt: Path, rank: int) -> RunState:
    """The run state, with this rank's RNG states restored (a missing RNG file is reported: the
    run continues, but no longer bit-exact)."""
    state = RunState(**json.loads((ckpt / "state.json").read_text()))
    rng_file, legacy = _rng_file(ckpt, rank), ckpt / f"rng_rank{rank}.pt"
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
