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

from vcppo.runtime.dist import global_rank


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


class PeakRss:
    """This process's resident-memory high-water mark, reset on demand: Linux keeps it as ``VmHWM`` in
    ``/proc/self/status`` and resets it when ``5`` is written to ``/proc/self/clear_refs``. Where either
    is missing (not Linux, a locked-down /proc), ``available`` is False and nothing is measured."""

    def __init__(self):
        self.available = self.reset() and self.read() is not None

    @staticmethod
    def reset() -> bool:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            return True
        except OSError:
            return False

    @staticmethod
    def read() -> int | None:
        """Bytes, or None when /proc does not say."""
        return proc_status_bytes("VmHWM")


def proc_status_bytes(field: str) -> int | None:
    """A memory field of ``/proc/self/status`` (``VmRSS``, ``VmHWM``, ...) in bytes, or None when /proc
    does not say."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


@dataclass
class PhaseTimer:
    """Wall time per named phase of a step; ``with timer("rollout"): ...``. Each interval also
    goes to ``timeline`` (``logging.timeline``) when given. With ``rss`` (a :class:`PeakRss`), each
    phase's peak resident memory of this process too (a nested phase's peak counts in its parent's)."""
    seconds: dict = field(default_factory=dict)
    timeline: Timeline | None = None
    rss: PeakRss | None = None
    peak_bytes: dict = field(default_factory=dict)
    _open: list = field(default_factory=list)

    @contextlib.contextmanager
    def __call__(self, name: str):
        start, wall = time.perf_counter(), time.time()
        self._enter_rss()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start
            self._leave_rss(name)
            if self.timeline is not None:
                self.timeline.record(name, wall, time.time())

    def _enter_rss(self) -> None:
        if self.rss is None or not self.rss.available:
            return
        if self._open:  # the parent's peak so far, kept before the reset
            self._open[-1] = max(self._open[-1], self.rss.read() or 0)
        self.rss.reset()
        self._open.append(0)

    def _leave_rss(self, name: str) -> None:
        if self.rss is None or not self.rss.available:
            return
        peak = max(self._open.pop(), self.rss.read() or 0)
        self.peak_bytes[name] = max(self.peak_bytes.get(name, 0), peak)
        if self._open:
            self._open[-1] = max(self._open[-1], peak)
        self.rss.reset()

    def metrics(self) -> dict:
        out = {f"time/{k}_s": v for k, v in self.seconds.items()}
        out["time/step_s"] = sum(self.seconds.values())
        out.update({f"perf/rss_peak_gb/{k}": v / 2 ** 30 for k, v in self.peak_bytes.items()})
        return out
