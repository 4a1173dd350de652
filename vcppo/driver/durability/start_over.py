"""``trainer.resume=never`` in a directory that already holds a run: start over, losing nothing.

The previous run's files (checkpoints, ``metrics.jsonl``, ``config.yaml``, its history, exports,
wandb files) are moved into one folder inside the run directory, ``previous_<date>-<time>``, so
that the new run's records are its own, and the next ``trainer.resume=auto`` finds the new run's
checkpoints only. Nothing is deleted. Folders set aside by earlier start-overs stay where they are.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

from vcppo.driver.durability.run_lock import LOCK_FILE

ASIDE_PREFIX = "previous_"


def previous_contents(run_dir: Path) -> list[Path]:
    """What a start-over moves aside: everything but the live lock and earlier set-aside folders."""
    if not run_dir.is_dir():
        return []
    return sorted(p for p in run_dir.iterdir() if p.name != LOCK_FILE and not p.name.startswith(ASIDE_PREFIX))


def set_aside(run_dir: Path, say) -> Path | None:
    """Main rank, with the run directory locked: move its previous contents into one dated folder
    inside it and say so in one line (``say``). Returns that folder, or None when there was nothing."""
    run_dir = Path(run_dir)
    moving = previous_contents(run_dir)
    if not moving:
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside, n = run_dir / f"{ASIDE_PREFIX}{stamp}", 1
    while aside.exists():  # two start-overs within one second
        n += 1
        aside = run_dir / f"{ASIDE_PREFIX}{stamp}-{n}"
    aside.mkdir()
    for path in moving:
        os.replace(path, aside / path.name)
    say(f"trainer.resume=never: starting over in {run_dir}; the previous run's {len(moving)} file(s) and "
        f"folder(s) ({', '.join(p.name for p in moving[:6])}{', ...' if len(moving) > 6 else ''}) are now in {aside}")
    return aside
