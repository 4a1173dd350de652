"""What a run directory may hold: one live run (its lock), one run over time (a resume's checks
against the saved config), and on ``trainer.resume=never`` the previous run set aside.

**The lock.** One live run per run directory, and one run per directory over time.

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

``trainer.resume=never`` in a directory that already holds a run: start over, losing nothing.

**Starting over.** The previous run's files (checkpoints, ``metrics.jsonl``, ``config.yaml``, its history, exports,
wandb files) are moved into one folder inside the run directory, ``previous_<date>-<time>``, so
that the new run's records are its own, and the next ``trainer.resume=auto`` finds the new run's
checkpoints only. Nothing is deleted. Folders set aside by earlier start-overs stay where they are.

**A resume's checks.** A resume point checked against this run's config before any engine starts (every rank, no
collective: each reads the same files and comes to the same verdict).

Every checkpoint records the config that wrote it and the shape of its models in
``run_config.json`` (:func:`write_run_config`; a checkpoint without one is compared with its run
directory's ``config.yaml``). On resume:

1. each changed key is judged by its class (:mod:`vcppo.config.provenance`): a ``fixed`` one (LoRA
   rank / targets, the critic's confidence head) and a ``math`` one not in
   ``trainer.resume_allow_changes`` refuse the resume in one line naming the key;
2. an engine's ZeRO stage, when set, must be one its checkpoint's layout loads into;
3. the models' shapes (``config.json``: layers, widths, vocabulary) must be those the checkpoint
   was written for.

What DeepSpeed or peft would otherwise say only after vLLM and both engines started, as a long
"Error(s) in loading state_dict" that never names the key.
"""
from __future__ import annotations

import dataclasses
import fcntl
import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import IO

from omegaconf import OmegaConf

from vcppo.config.load import SAVED_CONFIG, to_dict
from vcppo.config.provenance import Change, diff_configs, refuse_changes, same_value
from vcppo.config.schema import Config
from vcppo.engines.engine_setup import checkpoint_zero_stage
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
        # run_config.json is still compared with this config (the resume checks below)
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


RUN_CONFIG = "run_config.json"
# what fixes the shapes of a model's tensors (config.json keys)
SHAPE_KEYS = ("model_type", "hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads",
              "num_key_value_heads", "vocab_size", "tie_word_embeddings")
ENGINES = {"actor": "model.policy_path", "critic": "model.critic_path"}


def model_shape(directory: str | None) -> dict | None:
    """The shape-fixing entries of ``directory/config.json``; None when there is none to read."""
    path = Path(directory or "") / "config.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return {k: data[k] for k in SHAPE_KEYS if k in data} if isinstance(data, dict) else None


def model_dirs(cfg: Config) -> dict[str, str | None]:
    """The directory each engine's architecture is built from (the critic: the policy's backbone
    unless it starts from a reward model or a critic checkpoint)."""
    critic = cfg.model.policy_path if cfg.model.critic_init == "policy" else cfg.model.critic_path
    return {"actor": cfg.model.policy_path, "critic": critic}


def write_run_config(cfg: Config, stage: Path) -> None:
    """Main rank, while a checkpoint is staged: the config that wrote it and its models' shapes."""
    shapes = {role: model_shape(path) for role, path in model_dirs(cfg).items()}
    (stage / RUN_CONFIG).write_text(json.dumps({"config": to_dict(cfg), "model_shapes": shapes}, indent=1))


def recorded_run_config(point: Path) -> tuple[dict | None, dict]:
    """(config, model shapes) a checkpoint was written with; for a checkpoint without its own
    record, its run directory's ``config.yaml`` and no shapes; (None, {}) when neither exists."""
    try:
        record = json.loads((point / RUN_CONFIG).read_text())
        return record["config"], record.get("model_shapes") or {}
    except (OSError, ValueError, KeyError, TypeError):
        pass
    saved = point.parent.parent / SAVED_CONFIG  # <run dir>/checkpoints/step_N
    if saved.is_file():
        return OmegaConf.to_container(OmegaConf.load(saved)), {}
    return None, {}


def _engine_of(key: str) -> str | None:
    head = key.split(".")[0]
    return head if head in ("actor", "critic") else None


def judged_changes(cfg: Config, point: Path, old: dict) -> list[Change]:
    """The changes since ``old``; a ``fixed`` key of an engine the checkpoint does not hold (the actor
    during value pretraining) changes only the math from here on."""
    changes = diff_configs(old, to_dict(cfg))
    return [dataclasses.replace(c, klass="math") if c.klass == "fixed" and not (point / str(_engine_of(c.key))).is_dir()
            else c for c in changes]


def _layout(stage: int) -> int:
    return 2 if stage in (1, 2) else stage  # ZeRO-1 and -2 write the same files


def check_zero_layouts(cfg: Config, point: Path, same_ranks: bool) -> None:
    """A ZeRO stage set in the config must load its checkpoint (on another number of ranks
    :mod:`vcppo.driver.durability.conversion` converts it and checks the stages itself)."""
    if not same_ranks:
        return
    for role in ("actor", "critic"):
        stage = getattr(cfg, role).zero_stage
        written = checkpoint_zero_stage(str(point / role)) if (point / role).is_dir() else None
        if stage is None or written is None or _layout(stage) == written:
            continue
        wrote = "ZeRO-1/2" if written == 2 else f"ZeRO-{written}"
        raise ConfigError(f"config key '{role}.zero_stage': checkpoint {point} holds the {role} at {wrote}, which "
                          f"does not load at ZeRO-{stage} on the same ranks; leave {role}.zero_stage null (auto: "
                          "the checkpoint's stage) or set that stage")


def check_model_shapes(cfg: Config, point: Path, recorded: dict) -> None:
    """The models this config builds have the shapes the checkpoint was written for."""
    for role, directory in model_dirs(cfg).items():
        before, now = recorded.get(role), model_shape(directory)
        if not before or not now or not (point / role).is_dir():
            continue
        differ = [k for k in SHAPE_KEYS if k in before and k in now and before[k] != now[k]]
        if differ:
            key = ENGINES[role] if role == "actor" or cfg.model.critic_init != "policy" else "model.policy_path"
            what = ", ".join(f"{k} {before[k]} there, {now[k]} in {directory}" for k in differ)
            raise ConfigError(f"config key '{key}': checkpoint {point} holds a {role} of another shape ({what}); "
                              f"its weights cannot be loaded. Point {key} at the model the run started from, or "
                              "start over (trainer.resume=never, or another trainer.run_name)")


def check_resume(cfg: Config, point: Path | None, same_ranks: bool = True) -> list[Change]:
    """Every check above; the changes this resume makes (to log and record). Raises a ConfigError
    (one line, naming the key) for a resume that would not load or would silently change the math."""
    if point is None:
        return []
    old, shapes = recorded_run_config(point)
    changes = judged_changes(cfg, point, old) if old is not None else []
    refuse_changes(changes, list(cfg.trainer.resume_allow_changes), point)
    check_zero_layouts(cfg, point, same_ranks)
    check_model_shapes(cfg, point, shapes)
    return changes
