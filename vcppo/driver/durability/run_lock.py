"""One live run per run directory, and one run per directory over time.

Two processes that resolve to the same run directory (two launches of one command, or a sweep
whose grid leaves the seed out of the run names while the seed varies in its overrides) would
both auto-resume from, and then overwrite, the same checkpoints and metrics file, silently. The
main rank therefore holds an exclusive ``flock`` on ``<run_dir>/.run.lock`` for the life of the
run. The kernel releases it when the process dies, however it dies, so a crashed run never leaves
a stale lock behind and its resume is never refused.

Over time: ``trainer.resume=auto`` continues whatever run the directory holds, so a command that
lands on another run's directory (a sweep for seed 1 whose run names leave the seed out, after the
seed-0 sweep finished there) would silently continue, or simply re-report, the other run. Before
resuming from the directory's own checkpoint, the keys that say which run it is are compared with
the saved ``config.yaml`` (paths after resolving them: ``dir/`` and ``./dir`` are one model); any
difference refuses the resume. Other keys are judged by their
resume class (:mod:`vcppo.config.provenance`): more steps or other logging go through, a change to
the math only when ``trainer.resume_allow_changes`` lists it.
"""
from __future__ import annotations

import fcntl
import logging
import os
import socket
from pathlib import Path
from typing import IO

from omegaconf import OmegaConf

from vcppo.config.load import SAVED_CONFIG
from vcppo.config.provenance import same_value
from vcppo.config.schema import Config
from vcppo.errors import ConfigError

logger = logging.getLogger(__name__)
LOCK_FILE = ".run.lock"
# What makes a run that run: a resume that changes one of these would continue another experiment.
IDENTITY_KEYS = ("preset", "trainer.seed", "model.policy_path", "model.critic_init", "data.train_files",
                 "algorithm.advantage_estimator")


class RunDirInUse(ConfigError):
    """Another live process holds the run directory, or the directory holds another run (the CLI
    prints the reason and exits 2)."""


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


def identity_conflict(run_dir: Path, cfg: Config) -> str | None:
    """Why resuming ``run_dir``'s run with ``cfg`` would continue a different run, or None."""
    saved_path = run_dir / SAVED_CONFIG
    if not saved_path.exists():  # a run from before configs were saved: nothing to compare
        return None
    try:
        saved = OmegaConf.load(saved_path)
    except Exception as e:  # noqa: BLE001 - a damaged record must not stop a resume: the checkpoint's own
        # run_config.json is still compared with this config (resume_checks)
        cause = (str(e).splitlines() or [type(e).__name__])[0][:200]
        logger.warning("%s cannot be read (%s): which run the directory holds is judged by its checkpoint's "
                       "run_config.json alone", saved_path, cause)
        return None
    now = OmegaConf.structured(cfg)
    diffs = [f"{key}: {OmegaConf.select(saved, key)!r} there, {OmegaConf.select(now, key)!r} now"
             for key in IDENTITY_KEYS if not same_value(key, OmegaConf.select(saved, key), OmegaConf.select(now, key))]
    if not diffs:
        return None
    return (f"run dir {run_dir} holds another run ({'; '.join(diffs)}), and trainer.resume=auto would "
            f"continue it. Give this run its own trainer.run_name or trainer.output_root, or pass "
            f"trainer.resume=never to start over in that directory (the other run is moved into a dated "
            f"folder inside it, not deleted).")
