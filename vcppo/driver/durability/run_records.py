"""The run directory's records checked at start, before anything reads them: a resume never fails
because ``metrics.jsonl`` or ``config_history.jsonl`` is damaged.

- a record file that is not a readable file (a directory in its place, no permission) is moved
  aside to ``<name>.damaged-<date>-<time>``, with a line;
- a history line that is not a JSON record is named and skipped (:func:`vcppo.records.read_records`);
- a history that is missing (or was moved aside) while the directory holds checkpoints is rebuilt
  from their ``run_config.json``: one segment per config the checkpoints hold, marked ``rebuilt``.

On resume ``metrics.jsonl`` is cut back to its size at the checkpoint, and ``samples.jsonl`` loses the
samples of the steps cut (:func:`rewind_metrics`); a run that finds no checkpoint of its own starts
from step 0 again, so every record there is of a step it replays (a kill, or a full disk, before the
first checkpoint was sealed) and the file is cut to nothing. Each record is in the file once.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from vcppo.config.provenance import HISTORY_FILE, diff_configs, read_history
from vcppo.driver.durability.checkpoint import checkpoint_root, clean_partial, list_complete
from vcppo.driver.state import RunState
from vcppo.driver.durability.run_dir import RUN_CONFIG, set_aside
from vcppo.records import read_records
from vcppo.tracking import SAMPLES_FILE

METRICS_FILE = "metrics.jsonl"


def metrics_size(run_dir: Path) -> int:
    """Bytes of metrics.jsonl now (the logger writes whole lines, line-buffered)."""
    path = Path(run_dir) / METRICS_FILE
    return path.stat().st_size if path.exists() else 0


def rewind_metrics(run_dir: Path, state: RunState | None) -> set[tuple]:
    """Main rank, before the logger opens: cut metrics.jsonl back to what it held when the checkpoint
    the run resumes from (``state``) was sealed, or to nothing when it starts without one (None), so
    the replayed steps are not recorded twice. Returns the ``(phase, step)`` of the records cut off:
    the stopped run already sent those to wandb, so the logger must not send them again."""
    path = Path(run_dir) / METRICS_FILE
    keep = 0 if state is None else state.metrics_bytes
    if keep is None or not path.exists() or path.stat().st_size <= keep:
        return set()
    with open(path, "rb+") as f:
        f.seek(keep)
        tail = f.read()
        f.truncate(keep)
    sent = set()
    for line in tail.decode("utf-8", "replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:  # a line cut by the kill was never sent anywhere
            continue
        sent.add((rec.get("phase"), rec.get("step")))
    _drop_samples(run_dir, sent)
    return sent


def _drop_samples(run_dir: Path, steps: set[tuple]) -> None:
    """``samples.jsonl`` without the samples of ``steps`` ((phase, step): the steps a resume replays)."""
    path = Path(run_dir) / SAMPLES_FILE
    if not steps or not path.is_file():
        return
    kept = [r for r in read_records(path) if (r.get("phase"), r.get("step")) not in steps]
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
    os.replace(tmp, path)


def _readable(path: Path) -> bool:
    if not path.is_file():
        return False
    try:
        with open(path, "rb"):
            return True
    except OSError:
        return False


def set_aside_unreadable(run_dir: Path, say) -> list[str]:
    """Move each record file that exists but cannot be read as a file aside; the names moved."""
    moved = []
    for name in (METRICS_FILE, HISTORY_FILE):
        path = run_dir / name
        if not (path.exists() or path.is_symlink()) or _readable(path):
            continue
        aside = path.with_name(f"{name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}")
        os.replace(path, aside)
        say(f"{path} is not a readable file: moved aside to {aside.name}; a new one is started")
        moved.append(name)
    return moved


def _checkpoint_configs(run_dir: Path) -> list[tuple[Path, int, dict]]:
    """(checkpoint, its global step, its config) of every complete checkpoint with a readable config."""
    out = []
    for point in list_complete(checkpoint_root(run_dir)):
        try:
            config = json.loads((point / RUN_CONFIG).read_text())["config"]
            state = json.loads((point / "state.json").read_text())
        except (OSError, ValueError, KeyError, TypeError):
            continue
        out.append((point, int(state.get("pretrain_step", 0)) + int(state.get("step", 0)), config))
    return out


def rebuild_history(run_dir: Path) -> int:
    """Write ``config_history.jsonl`` anew from the checkpoints' configs; the segments written."""
    found = _checkpoint_configs(run_dir)
    records, previous = [], None
    for point, step, config in found:
        changes = diff_configs(previous, config) if previous is not None else []
        if previous is None or changes:
            records.append({"segment": len(records) + 1, "rebuilt": True, "started": None,
                            "phase": "start" if previous is None else None,
                            "step": 0 if previous is None else None, "global_step": 0 if previous is None else None,
                            "began_by": str(point), "resumed_from": None, "command": None,
                            "changes": {c.key: {"old": c.old, "new": c.new, "class": c.klass} for c in changes},
                            "models": {}})
        previous = config
    (run_dir / HISTORY_FILE).write_text("".join(json.dumps(r, default=str) + "\n" for r in records))
    return len(records)


def check_run_records(run_dir: Path, say) -> None:
    """Main rank, with the directory locked, before the resume point is looked for."""
    set_aside_unreadable(run_dir, say)
    history = run_dir / HISTORY_FILE
    if history.exists():
        read_history(run_dir, say)  # names each bad line; record_segment skips them the same way
    elif _checkpoint_configs(run_dir):
        try:
            n = rebuild_history(run_dir)
        except OSError as e:  # a full disk, say: the run goes on, and records its own segment
            say(f"{history} is missing, and rebuilding it failed ({e.strerror or e}): the run goes on without it")
            return
        say(f"{history} is missing: rebuilt from the checkpoints' {RUN_CONFIG} ({n} segment(s), marked "
            f"'rebuilt'; their commands and start times are unknown)")


def prepare_run_dir(run_dir: Path, resume: str) -> list[str]:
    """Main rank, with the directory locked, before anything reads it: a start-over
    (``trainer.resume=never``) moves the previous run aside, damaged records are named and set aside
    or rebuilt (run_records), and what a crash left (a stale ``step_N.tmp``, possibly the write that
    filled the disk) is removed. Returns the lines to log."""
    notes: list[str] = []
    if resume == "never":
        set_aside(run_dir, notes.append)
    removed = clean_partial(checkpoint_root(run_dir))  # first: it gives back the space a failed write took
    if removed:
        notes.append(f"removed {len(removed)} unfinished checkpoint folder(s) a stopped run left behind: "
                     f"{', '.join(str(p) for p in removed)}")
    check_run_records(run_dir, notes.append)
    return notes
