"""The test session's /dev/shm check (tests/conftest.py): DeepSpeed's CPU shm all-reduce segments
(``deepspeed_allreduce_buffer_<uid>_...``, ~66 MiB each) that appeared during the session and that no
living process maps any more are leftovers: the session fails naming them, and they are removed. A
segment some process still maps (another session's run in progress) is not one."""
from __future__ import annotations

import os
import time
from pathlib import Path

ROOT = Path("/dev/shm")


def segments(root: Path = ROOT) -> dict[Path, float]:
    """This user's DeepSpeed shm segments now, with their modification times."""
    out = {}
    for path in root.glob(f"deepspeed_allreduce_buffer_{os.getuid()}_*"):
        try:
            out[path] = path.stat().st_mtime
        except OSError:  # removed meanwhile
            pass
    return out


def mapped_paths() -> set[str]:
    """Every file some process on this machine maps (as /proc/*/maps names it)."""
    found = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            text = maps.read_text()
        except OSError:  # the process ended, or is not ours to read
            continue
        for line in text.splitlines():
            parts = line.split(maxsplit=5)
            if len(parts) == 6:
                found.add(parts[5])
    return found


def leftovers(before: dict[Path, float], since: float, root: Path = ROOT) -> list[Path]:
    """Segments that are new since ``before`` (taken at time ``since``) and mapped by no process."""
    new = [p for p, mtime in segments(root).items() if p not in before and mtime >= since - 1.0]
    if not new:
        return []
    live = mapped_paths()
    return sorted(p for p in new if str(p) not in live)


def start() -> tuple[dict[Path, float], float]:
    return segments(), time.time()


def finish(snapshot: tuple[dict[Path, float], float], root: Path = ROOT) -> list[Path]:
    """The leftovers since ``snapshot`` (:func:`start`), removed; the caller fails the session on them."""
    left = leftovers(*snapshot, root=root)
    for path in left:
        path.unlink(missing_ok=True)
    return left
