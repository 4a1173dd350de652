"""Saving a run's checkpoint and continuing from one (collective: every rank calls).

The file format and its atomicity are :mod:`vcppo.driver.checkpoint`'s; this module decides what
goes in (engines, RNG, data position, :class:`~vcppo.driver.checkpoint.RunState`) and restores it.
"""
from __future__ import annotations

import dataclasses
import logging
import pickle
import time
from pathlib import Path

from vcppo.driver import checkpoint as ckpt
from vcppo.driver import manifest, reshard
from vcppo.driver.context import RunContext
from vcppo.driver.remote_critic import RemoteCritic
from vcppo.driver.resume_checks import write_run_config
from vcppo.driver.sources import ExperienceSource
from vcppo.engines import dist as D
from vcppo.engines.deepspeed_engine import DeepSpeedModelEngine
from vcppo.engines.safe_checkpoint import use_weights_only_loading

logger = logging.getLogger(__name__)


def save_checkpoint(ctx: RunContext, state: ckpt.RunState, source: ExperienceSource) -> None:
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
    ckpt.write_rank_files(stage, ctx.dist.rank)
    if state.phase == "ppo":  # during value pretraining the actor is frozen: nothing to save
        ctx.actor.save_checkpoint(str(stage / "actor"))
    if ctx.critic is not None:
        ctx.critic.save_checkpoint(str(stage / "critic"))
    ctx.barrier()
    # every rank hashes its share of the files for the manifest (the gather is also a barrier)
    parts = D.all_gather_object(manifest.hash_share(stage, ctx.dist.rank, ctx.dist.world_size))
    if ctx.dist.is_main:
        state.data = source.checkpoint(stage, state)
        state.metrics_bytes = ckpt.metrics_size(ctx.run_dir)  # a resume cuts the file back to here
        write_run_config(ctx.cfg, stage)  # what a resume compares its config with
        final = ckpt.commit(stage, dataclasses.asdict(state), ctx.cfg.trainer.keep_last, manifest_parts=parts)
        ctx.log.info(f"checkpoint {final} ({time.perf_counter() - started:.1f} s)")
    ctx.barrier()


def refused_file(path: str | Path, error: BaseException) -> ckpt.CheckpointError:
    """One line for a checkpoint file torch will not unpickle with ``weights_only``: the file, what it
    holds, what to do; torch's own advice (load it with ``weights_only=False``) is not ours to give."""
    logger.debug("weights-only load of %s failed", path, exc_info=(type(error), error, error.__traceback__))
    lines = [ln.strip() for ln in str(error).splitlines()]
    cause = next((ln.split("error:", 1)[-1].strip() for ln in lines if "WeightsUnpickler error" in ln),
                 lines[0] if lines else type(error).__name__).split(". Please use")[0]
    return ckpt.CheckpointError(
        f"{path}: refusing to load this checkpoint file: it holds more than tensors and plain values ({cause[:300]}), "
        "and unpickling it could run code from the file. If you did not put it there, the checkpoint was tampered "
        "with: move its step_N directory out of checkpoints/ (the run resumes from the previous one) or start over "
        "with trainer.resume=never")


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
    that holds anything else is a :class:`~vcppo.driver.checkpoint.CheckpointError` naming it."""
    use_weights_only_loading(engine.engine)  # nothing in a checkpoint directory may run code
    _name_refused_files(engine)
    try:
        if universal:
            with reshard.weights_only_loading():  # DeepSpeed's universal reader calls torch.load itself
                engine.load_checkpoint(str(directory), universal=True)
        else:
            engine.load_checkpoint(str(directory))
    except pickle.UnpicklingError as e:  # read by DeepSpeed itself: name the directory
        raise refused_file(directory, e) from None


def resume_or_start(ctx: RunContext) -> ckpt.RunState:
    """The state to continue from: the resume point's (engines restored; the data position and
    the sampler's weights are the experience source's, :meth:`ExperienceSource.start`), or a fresh
    start (stale partial checkpoints removed)."""
    cfg = ctx.cfg
    first_phase = "value_pretrain" if (ctx.critic is not None and cfg.value_pretrain.enabled) else "ppo"
    point = ctx.resume_point  # found and verified once, before the engines started
    if ctx.dist.is_main:  # what a crash left behind (unsealed, half-deleted) is never resumed from
        ckpt.clean_partial(ckpt.checkpoint_root(ctx.run_dir))
    if point is None:
        return ckpt.RunState(phase=first_phase)
    ctx.log.info(f"resuming from {point}")
    universal = ctx.universal_checkpoints
    wrote = reshard.written_world_size(point)
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
        if isinstance(engine, RemoteCritic):  # restored on the critic's own ranks
            engine.load_checkpoint(str(directory), universal=role in universal)
        else:
            restore_engine(engine, directory, universal=role in universal)
    ctx.log.info(f"restored the engines' states in {time.perf_counter() - started:.1f} s")
    return state
