"""One live run per run directory.

Two processes that resolve to the same run directory (two launches of one command, or a sweep
whose grid leaves the seed out of the run names while the seed varies in its overrides) would
both auto-resume from, and then overwrite, the same checkpoints and metrics file, silently. The
main rank therefore holds an exclusive ``flock`` on ``<run_dir>/.run.lock`` for the life of the
run. The kernel releases it when the process dies, however it dies, so a crashed run never leaves
a stale lock behind and its resume is never refused.
"""
from __future__ import annotations

import fcntl
import os
import socket
from pathlib import Path
from typing import IO

from vcppo.schema import ConfigError

LOCK_FILE = ".run.lock"


class RunDirInUse(ConfigError):
    """Another live process holds the run directory (the CLI prints the reason and exits 2)."""


def try_lock_run_dir(run_dir: Path) -> tuple[IO | None, str | None]:
    """(open lock file to keep until the run ends, None), or (None, why the directory is taken)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    handle = open(run_dir / LOCK_FILE, "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        return None, (f"run dir {run_dir} is in use by a live run ({holder}): two runs in one directory "
                      f"overwrite each other's checkpoints and metrics. Give this run its own "
                      f"trainer.run_name or trainer.output_root, or wait for the other one to end.")
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
    handle.flush()
    return handle, None


def release(handle: IO | None) -> None:
    if handle is not None:
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()
