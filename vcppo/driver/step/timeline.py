"""A step's phase timer, and per-rank timelines: when each rank was busy, and with what (``logging.timeline``).

One JSON line per interval, ``{"rank", "role", "name", "start", "end"}`` (wall-clock seconds), in
``<run dir>/timeline/rank<global rank>.jsonl``; time not covered by an interval is idle.
``vcppo bench split`` draws them.
"""
from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from vcppo.engines.dist import global_rank


class Timeline:
    """Writes this rank's intervals; a disabled timeline (``path`` None) records nothing."""

    def __init__(self, run_dir: Path | None, role: str):
        self.rank = global_rank()
        self.role = role
        self._file = None
        if run_dir is not None:
            directory = Path(run_dir) / "timeline"
            directory.mkdir(parents=True, exist_ok=True)
            self._file = open(directory / f"rank{self.rank}.jsonl", "a")

    def record(self, name: str, start: float, end: float) -> None:
        if self._file is not None:
            self._file.write(json.dumps({"rank": self.rank, "role": self.role, "name": name,
                                         "start": start, "end": end}) + "\n")
            self._file.flush()

    @contextlib.contextmanager
    def span(self, name: str):
        start = time.time()
        try:
            yield
        finally:
            self.record(name, start, time.time())

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_timelines(run_dir: Path) -> list[dict]:
    """Every rank's intervals of a run, sorted by start."""
    rows = []
    for path in sorted((Path(run_dir) / "timeline").glob("rank*.jsonl")):
        rows += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return sorted(rows, key=lambda r: r["start"])


def clip(rows: list[dict], start: float, end: float) -> list[dict]:
    """The parts of ``rows`` inside the window [start, end]."""
    return [{**r, "start": max(r["start"], start), "end": min(r["end"], end)}
            for r in rows if r["end"] > start and r["start"] < end]


def busy_seconds(rows: list[dict]) -> dict[tuple[int, str], float]:
    """Seconds per (rank, interval name)."""
    out: dict[tuple[int, str], float] = {}
    for r in rows:
        key = (r["rank"], r["name"])
        out[key] = out.get(key, 0.0) + r["end"] - r["start"]
    return out


@dataclass
class PhaseTimer:
    """Wall time per named phase of a step; ``with timer("rollout"): ...``. Each interval also
    goes to ``timeline`` (``logging.timeline``) when given."""
    seconds: dict = field(default_factory=dict)
    timeline: Timeline | None = None

    @contextlib.contextmanager
    def __call__(self, name: str):
        start, wall = time.perf_counter(), time.time()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start
            if self.timeline is not None:
                self.timeline.record(name, wall, time.time())

    def metrics(self) -> dict:
        out = {f"time/{k}_s": v for k, v in self.seconds.items()}
        out["time/step_s"] = sum(self.seconds.values())
        return out
