"""Run checkpoints: written atomically, the last K kept, and found again by ``resume=auto``.

Layout of one checkpoint ``<run_dir>/checkpoints/step_000040/``::

    actor/            DeepSpeed checkpoint (weights, optimizer, LR scheduler), every rank's shard
    critic/           the same for the critic (absent for GRPO)
    rng_rank{r}.pt    torch / numpy / python RNG states of rank r
    state.json        phase, step counters, data position, ...   (written last)

A checkpoint is complete when its directory has lost the ``.tmp`` suffix: every rank writes into
``step_N.tmp``, all ranks meet at a barrier, then the main rank renames it. A crash mid-write leaves
only a ``.tmp`` directory, which is ignored and cleaned up.

Checkpoints are tagged by the global step (pretraining steps + PPO steps), so the newest one sorts
last whichever phase wrote it.
"""
from __future__ import annotations

import json
import os
import random
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

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


def rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


def write_rank_files(stage: Path, rank: int) -> None:
    stage.mkdir(parents=True, exist_ok=True)
    torch.save(rng_state(), stage / f"rng_rank{rank}.pt")


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
    state = RunState(**json.loads((ckpt / "state.json").read_text()))
    rng_file = ckpt / f"rng_rank{rank}.pt"
    if rng_file.exists():
        set_rng_state(torch.load(rng_file, weights_only=False))
    return state
