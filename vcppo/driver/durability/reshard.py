"""Resuming on another number of training ranks than wrote the checkpoint.

DeepSpeed's checkpoints of ZeRO stages 1-3 hold one optimizer (and, at stage 3, weight) partition per
rank, laid out for the world size that wrote them. To continue on another world size, each engine's
checkpoint is converted to DeepSpeed's *universal* format (``deepspeed.checkpoint.ds_to_universal``:
one fp32 weight, Adam ``exp_avg`` and ``exp_avg_sq`` file per parameter, plus the LR scheduler and
step counters) and loaded from there with ``checkpoint.load_universal`` (each rank takes its new
partition). We chose DeepSpeed's format rather than a consolidated one of our own: it carries the
optimizer states exactly as DeepSpeed holds them, with DeepSpeed's own reader. A stage-0 checkpoint
(one rank, the auto stage there) holds whole tensors and loads on any number of ranks as it is.

The conversion runs on the main rank into ``<run dir>/universal/<checkpoint>/<role>``, rebuilt at
every such resume from the verified checkpoint (only files its manifest lists may be in an engine's
directory). Every file is read with ``weights_only`` loading, so nothing in a checkpoint runs code.

What a resumed run on another world size keeps: weights, optimizer states, LR schedules, step
counters, the data position (every rank draws the global batch and takes its share) and the run
state (KL coefficient, reward-model moments). What it cannot keep: the per-rank RNG streams and the
vLLM sampler's per-replica seeds, so its samples differ from those of an uninterrupted run on either
world size; each rank starts from the run's seed instead (docs/robustness.md).
"""
from __future__ import annotations

import argparse
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

from vcppo.config.placement import Placement
from vcppo.driver.durability import manifest
from vcppo.driver.durability.checkpoint import CheckpointError
from vcppo.engines.engine_setup import CHECKPOINT_TAG, checkpoint_zero_stage, resolve_zero_stage
from vcppo.engines.safe_checkpoint import allow_deepspeed_state_types

ROLES = ("actor", "critic")


def written_world_size(point: Path) -> int | None:
    """How many training ranks wrote checkpoint ``point`` (one RNG file each); None: unknown."""
    return len({p.stem for p in point.glob("rng_rank*.*")}) or None


def universal_root(run_dir: Path, point: Path) -> Path:
    return Path(run_dir) / "universal" / point.name


@contextmanager
def weights_only_loading():
    """Every ``torch.load`` inside reads tensors and plain values only (DeepSpeed's converter and
    universal loader pass ``weights_only=False``; the environment variable overrides them)."""
    old = os.environ.get("TORCH_FORCE_WEIGHTS_ONLY_LOAD")
    os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "1"
    allow_deepspeed_state_types()
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TORCH_FORCE_WEIGHTS_ONLY_LOAD", None)
        else:
            os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = old


def _check_only_listed_files(point: Path, role: str) -> None:
    """The converter globs the engine's directory: a file the manifest does not list (planted after
    the checkpoint was sealed) must not be read."""
    listed = manifest.read_manifest(point) or {}
    for path in sorted((point / role).rglob("*")):
        rel = str(path.relative_to(point))
        if path.is_file() and rel not in listed and path.name not in ("zero_to_fp32.py", "zero_to_torch.py"):
            raise CheckpointError(f"{path}: not in the checkpoint's manifest; a checkpoint resumed on another number "
                                  "of ranks is converted from the files its manifest lists only (remove the file)")


def convert_engine(point: Path, role: str, out_dir: Path) -> Path:
    """Checkpoint ``point/<role>`` in DeepSpeed's universal format at ``out_dir`` (rebuilt)."""
    from deepspeed.checkpoint import ds_to_universal

    _check_only_listed_files(point, role)
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    args = argparse.Namespace(input_folder=str(point / role / CHECKPOINT_TAG),
                              output_folder=str(tmp / CHECKPOINT_TAG),
                              num_extract_workers=1, num_merge_workers=1, keep_temp_folder=False, strict=True,
                              inject_missing_state=False)
    with weights_only_loading():
        ds_to_universal.main(args)
    (tmp / "latest").write_text(CHECKPOINT_TAG)
    os.replace(tmp, out_dir)
    return out_dir


def plan_reshard(point: Path, run_dir: Path) -> dict[str, Path]:
    """{role: the directory to load it from} for the engines whose checkpoint must be converted
    (ZeRO 1-3), their universal directories; stage-0 engines are absent (they load as they are)."""
    root = universal_root(run_dir, point)
    return {role: root / role for role in ROLES
            if (point / role).is_dir() and (checkpoint_zero_stage(str(point / role)) or 0) >= 1}


def reshard(point: Path, run_dir: Path, is_main: bool, gather) -> dict[str, Path]:
    """Collective (``gather``: an all-gather of Python objects): the main rank converts what
    :func:`plan_reshard` names; every rank gets the map, or the main rank's error."""
    targets = plan_reshard(point, run_dir)
    problem = None
    if is_main:
        try:
            for role, out in targets.items():
                convert_engine(point, role, out)
        except CheckpointError as e:
            problem = str(e)
        except Exception as e:  # noqa: BLE001 - DeepSpeed's converter: name the checkpoint, keep the cause
            problem = f"checkpoint {point}: converting it to DeepSpeed's universal format failed: {e!r}"
    if (problem := gather(problem)[0]) is not None:
        raise CheckpointError(problem)
    return targets


def check_stages(point: Path, stages: dict[str, int], wrote: int, world_size: int) -> None:
    """The ZeRO stage each engine will run at must be one its checkpoint can be loaded into on another
    world size: a ZeRO 1-3 checkpoint into ZeRO 1-3 (universal), a stage-0 one into stage 0."""
    for role, stage in stages.items():
        written = checkpoint_zero_stage(str(point / role)) if (point / role).is_dir() else None
        if written is None or (written >= 1) == (stage >= 1):
            continue
        raise CheckpointError(f"checkpoint {point} holds the {role} at ZeRO-{written} on {wrote} rank(s); on "
                              f"{world_size} it can resume at ZeRO-{'1/2/3' if written else '0'} only, not "
                              f"{role}.zero_stage={stage} (leave it null: the checkpoint's stage)")


def prepare(point: Path, run_dir: Path, cfg, rank_is_main: bool, world_size: int, gather,
            placement: Placement) -> dict[str, Path]:
    """Collective, before the engines start: {} when ``point`` was written on ``world_size`` training
    ranks; else its ZeRO 1-3 engine checkpoints converted (:func:`reshard`), after checking that
    the stages the engines will run at can load them. A placement that does not reshard (split)
    resumes on its own shape only."""
    wrote = written_world_size(point)
    if not wrote or wrote == world_size:
        return {}
    if not placement.reshards:
        raise CheckpointError(f"checkpoint {point} was written by {wrote} training rank(s) and this {placement.name} "
                              f"run has {world_size}: with placement.mode={placement.name} a run resumes only on the "
                              "training ranks that checkpointed it")
    stages = {role: resolve_zero_stage(getattr(cfg, role).zero_stage, world_size, str(point / role))
              for role in ROLES if (point / role).is_dir()}
    check_stages(point, stages, wrote, world_size)
    return reshard(point, run_dir, rank_is_main, gather)
