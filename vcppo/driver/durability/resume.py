"""Saving a run's checkpoint and continuing from one (collective: every rank calls).

The file format and its atomicity are :mod:`vcppo.driver.durability.checkpoint`'s; this module decides what
goes in (engines, RNG, data position, :class:`~vcppo.driver.state.RunState`) and restores it.

**One engine** (:func:`restore_engine`, also the critic ranks'): restored from its checkpoint directory, reading
tensors and plain values only (a file that holds anything else is refused, named, before it could run code).
"""
from __future__ import annotations

import dataclasses
import logging
import pickle
import time
from pathlib import Path

from vcppo.driver.durability import checkpoint as ckpt
from vcppo.driver.durability import conversion, guards, manifest
from vcppo.driver.durability.run_dir import write_run_config
from vcppo.driver.durability.run_records import metrics_size
from vcppo.driver.parts import CheckpointedSource, RunParts
from vcppo.driver.state import Phase, RunState
from vcppo.engines.deepspeed_engine import DeepSpeedModelEngine
from vcppo.engines.safe_checkpoint import use_weights_only_loading
from vcppo.runtime import collectives


def save_checkpoint(ctx: RunParts, state: RunState, source: CheckpointedSource) -> None:
    """Every rank writes its shards, then the main rank seals the directory (with the data
    position ``source`` reports, and in a split run the batches in flight). Not while optimizer
    steps are being skipped: weights that made a loss non-finite must not become the "last good"
    checkpoint a resume or an abort falls back on (the streak is the same on every rank)."""
    if state.nonfinite_streak:
        ctx.log.info(f"no checkpoint at step {state.global_step}: the last {state.nonfinite_streak} step(s) were "
                     "skipped as non-finite; the previous checkpoint stays the last good one")
        return
    started = time.perf_counter()
    stage = ckpt.staging_dir(ctx.run_dir, state.global_step)
    try:
        _write_engines(ctx, state, stage)
    except Exception as error:  # noqa: BLE001 - a full disk, as torch or the OS reports it
        raise _space_error(ctx, state, stage, error) or error
    ctx.barrier()
    # every rank hashes its share of the files for the manifest (the gather is also a barrier)
    parts = collectives.all_gather_object(manifest.hash_share(stage, ctx.dist.rank, ctx.dist.world_size))
    if ctx.dist.is_main:
        try:
            state.data = source.checkpoint(stage, state)
            state.metrics_bytes = metrics_size(ctx.run_dir)  # a resume cuts the file back to here
            write_run_config(ctx.cfg, stage)  # what a resume compares its config with
            final = ckpt.commit(stage, dataclasses.asdict(state), ctx.cfg.trainer.keep_last, manifest_parts=parts)
        except Exception as error:  # noqa: BLE001 - as above
            raise _space_error(ctx, state, stage, error) or error
        ctx.log.info(f"checkpoint {final} ({time.perf_counter() - started:.1f} s)")
    ctx.barrier()


def _write_engines(ctx: RunParts, state: RunState, stage) -> None:
    """This rank's share of the checkpoint: its RNG states and the engines' shards."""
    ckpt.write_rank_files(stage, ctx.dist.rank)
    if state.phase == Phase.PPO:  # during value pretraining the actor is frozen: nothing to save
        ctx.actor.save_checkpoint(str(stage / "actor"))
    if ctx.critic is not None:
        ctx.critic.save_checkpoint(str(stage / "critic"))


def _space_error(ctx: RunParts, state: RunState, stage, error: BaseException):
    """The checkpoint's write failing for space as one line (None: another error). The bytes needed
    are the last complete checkpoint's size, when there is one."""
    done = ckpt.list_complete(stage.parent)
    needed = guards.tree_bytes(done[-1]) if done else None
    kept = f"; the earlier checkpoints are intact ({done[-1].name} the newest), and rerunning the command " \
           "resumes from it" if done else "; no earlier checkpoint was written"
    return guards.write_error(f"the checkpoint of step {state.global_step}", stage.parent, error, needed,
                                  after=kept + f" (the unfinished {stage.name} is removed when the run restarts)")


def resume_or_start(ctx: RunParts) -> RunState:
    """The state to continue from: the resume point's (engines restored; the data position and
    the sampler's weights are the experience source's, :meth:`ExperienceSource.start`), or a fresh
    start."""
    cfg = ctx.cfg
    first_phase = Phase.VALUE_PRETRAIN if (ctx.critic is not None and cfg.value_pretrain.enabled) else Phase.PPO
    point = ctx.resume_point  # found and verified once, before the engines started (what a crash left
    # behind, unsealed or half-deleted, was removed then: driver/context.py prepare_run_dir)
    if point is None:
        return RunState(phase=first_phase)
    ctx.log.info(f"resuming from {point}")
    universal = ctx.universal_checkpoints
    wrote = conversion.written_world_size(point)
    resharded = wrote not in (None, ctx.dist.world_size)
    if resharded:
        ctx.log.info(f"the checkpoint was written by {wrote} training rank(s), this run "
                     f"has {ctx.dist.world_size}: weights, optimizer states, schedules and the data position carry "
                     f"over ({', '.join(universal) or 'no engine'} through DeepSpeed's universal checkpoint); "
                     "per-rank RNG streams do not, so sampling starts from the run's seed")
    started = time.perf_counter()
    state = ckpt.load_state(point, ctx.dist.rank, restore_rng=not resharded)
    for role in ("actor", "critic"):
        engine = getattr(ctx, role)
        if engine is None or not (point / role).exists():
            continue
        directory = universal.get(role, point / role)
        if role == "critic":  # the critic side restores it where it lives
            engine.restore(directory, universal=role in universal)
        else:
            restore_engine(engine, directory, universal=role in universal)
    ctx.log.info(f"restored the engines' states in {time.perf_counter() - started:.1f} s")
    return state


logger = logging.getLogger(__name__)


def refused_file(path: str | Path, error: BaseException) -> ckpt.CheckpointError:
    """One line for a checkpoint file torch will not unpickle with ``weights_only``: the file, what it
    holds, what to do; torch's own advice (load it with ``weights_only=False``) is not ours to give."""
    logger.debug("weights-only load of %s failed", path, exc_info=(type(error), error, error.__traceback__))
    return ckpt.unpickle_refusal(path, error)


def _name_refused_files(engine: DeepSpeedModelEngine) -> None:
    """Make the engine's checkpoint loader name the file it refuses (DeepSpeed reads many)."""
    loader = engine.engine.checkpoint_engine
    load = type(loader).load

    def load_naming_the_file(path, map_location=None):
        try:
            return load(loader, path, map_location=map_location)
        except pickle.UnpicklingError as e:
            raise refused_file(path, e) from None

    loader.load = load_naming_the_file


def restore_engine(engine: DeepSpeedModelEngine, directory: Path, universal: bool = False) -> None:
    """``engine``'s states from its checkpoint ``directory`` (``universal``: DeepSpeed's universal
    format, written for another number of ranks), reading tensors and plain values only; a file
    that holds anything else is a :class:`~vcppo.driver.durability.checkpoint.CheckpointError` naming it."""
    use_weights_only_loading(engine.engine)  # nothing in a checkpoint directory may run code
    _name_refused_files(engine)
    try:
        if universal:
            with conversion.weights_only_loading():  # DeepSpeed's universal reader calls torch.load itself
                engine.load_checkpoint(str(directory), universal=True)
        else:
            engine.load_checkpoint(str(directory))
    except pickle.UnpicklingError as e:  # read by DeepSpeed itself: name the directory
        raise refused_file(directory, e) from None
