"""A checkpoint in another form: resharded for another number of ranks, or exported as a model.

**Resharding**: resuming on another number of training ranks than wrote the checkpoint. DeepSpeed's ZeRO 1-3
checkpoints hold one optimizer (and, at stage 3, weight) partition per rank of the world size that wrote them, so
each engine's checkpoint is converted to DeepSpeed's *universal* format (``ds_to_universal``: one fp32 weight, Adam
``exp_avg`` and ``exp_avg_sq`` file per parameter, the LR scheduler and step counters) and loaded with
``checkpoint.load_universal``. DeepSpeed's format rather than one of our own: it carries the optimizer states
exactly as DeepSpeed holds them, with DeepSpeed's own reader. A stage-0 checkpoint holds whole tensors and loads on
any number of ranks as it is. The main rank converts into ``<run dir>/universal/<checkpoint>/<role>`` at every such
resume, from the verified checkpoint, with ``weights_only`` loading (nothing in a checkpoint runs code). Kept:
weights, optimizer states, LR schedules, step counters, the data position and the run state. Not kept: the per-rank
RNG streams and vLLM's per-replica seeds, so samples differ from an uninterrupted run's (docs/robustness.md).

**Export**: ``vcppo model export CHECKPOINT [--critic] --out DIR`` and ``vcppo eval CHECKPOINT ...`` (which exports
into a temporary directory first). The engine's states are read with ``weights_only`` loading, ZeRO partitions are
joined into full fp32 tensors (DeepSpeed's ``zero_to_fp32`` reader), LoRA adapters merged into the weights they
adapt (W + s B A, :func:`vcppo.engines.lora.merge_adapters`), and the actor is written as an HF causal-LM directory
with the config, generation config and tokenizer of the run's ``model.policy_path`` (what ``final/actor`` holds),
the critic as a value-model directory (what ``final/critic`` holds and ``critic.init_from`` reads). The checkpoint
is verified against its manifest first, and ``--out`` is refused (one line, before anything is written) where
writing would destroy the run's input models and data or a run's ``checkpoints/`` directory.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

import torch

from vcppo.config.load import SAVED_CONFIG
from vcppo.config.placement import Placement
from vcppo.config.provenance import CLASSES, PATH_KEYS
from vcppo.config.schema_base import LoRAConfig
from vcppo.driver.durability import manifest
from vcppo.driver.durability.checkpoint import CheckpointError, checkpoint_problems, checkpoint_root
from vcppo.driver.durability.run_dir import RUN_CONFIG
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


_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}  # else (auto, float32) the fp32 master weights


def is_checkpoint(path: str | Path) -> bool:
    """A run's step directory (``checkpoints/step_N``) with an actor in it."""
    path = Path(path)
    return (path / "state.json").is_file() and (path / "actor" / CHECKPOINT_TAG).is_dir()


def engine_state(directory: Path) -> dict[str, torch.Tensor]:
    """Full fp32 tensors of a DeepSpeed engine checkpoint (``save_checkpoint``'s layout), its
    parameter names; ZeRO partitions joined."""
    stage = checkpoint_zero_stage(str(directory))
    with weights_only_loading():
        if stage in (1, 2, 3):
            from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
            state = get_fp32_state_dict_from_zero_checkpoint(str(directory), tag=CHECKPOINT_TAG)
        elif stage == 0:
            files = sorted((directory / CHECKPOINT_TAG).glob("*model_states.pt"))
            state = torch.load(files[0], map_location="cpu", weights_only=True)["module"]
        else:
            raise CheckpointError(f"{directory}: no DeepSpeed checkpoint there ({CHECKPOINT_TAG}/*model_states.pt)")
    return {name: t.float() for name, t in state.items()}


# what a run reads from disk and a change of which changes what it computes: its models and data
INPUT_KEYS = tuple(k for k in PATH_KEYS if CLASSES[k] == "math")
CHECKPOINTS = checkpoint_root("").name


def _resolved(path: str | Path) -> Path:
    return Path(os.path.realpath(os.path.expanduser(str(path))))


def _is_run_checkpoints(directory: Path) -> bool:
    return directory.name == CHECKPOINTS and ((directory.parent / SAVED_CONFIG).is_file()
                                              or any(directory.glob("step_*")))


def refuse_checkpoints_out(point: Path, out: str | Path) -> None:
    """``--out`` inside the checkpoint being exported, or inside any run's ``checkpoints/``."""
    target = _resolved(out)
    for d in (target, *target.parents):
        if d == _resolved(point) or _is_run_checkpoints(d):
            what = "the checkpoint it exports" if d == _resolved(point) else (
                f"the run's checkpoint directory {d}, which the run prunes and cleans of what is not one of its "
                "checkpoints")
            raise CheckpointError(f"--out {out} is inside {what}: choose a directory outside it")


def refuse_input_out(config: dict, out: str | Path) -> None:
    """``--out`` that is (or lies inside) one of the run's input models or data (its ``INPUT_KEYS``)."""
    target = _resolved(out)
    for key in INPUT_KEYS:
        section, name = key.split(".")
        value = (config.get(section) or {}).get(name)
        if not isinstance(value, str) or not value:
            continue
        source = _resolved(value)
        if target == source or source in target.parents:
            where = "is" if target == source else "is inside"
            raise CheckpointError(f"--out {out} {where} the run's {key} ({value}): exporting there would overwrite "
                                  "what the run was trained from, and its resume would read the new files; choose "
                                  "another directory")


def _checked_config(point: Path, out: str | Path) -> dict:
    """The config that wrote checkpoint ``point``, after the refusals every export makes (``out``
    inside a checkpoint or over a run's input, a damaged checkpoint)."""
    if not is_checkpoint(point):
        raise CheckpointError(f"{point} is not a run's checkpoint (a checkpoints/step_N directory with state.json "
                              "and actor/)")
    refuse_checkpoints_out(point, out)
    problems = checkpoint_problems(point)
    if problems:
        raise CheckpointError(f"checkpoint {point} is damaged: {'; '.join(problems[:5])}")
    try:
        config = json.loads((point / RUN_CONFIG).read_text())["config"]
    except (OSError, ValueError, KeyError) as e:
        raise CheckpointError(f"{point / RUN_CONFIG} cannot be read ({e}): the export needs the config that wrote "
                              "the checkpoint (its model.policy_path and LoRA settings)") from None
    refuse_input_out(config, out)
    return config


def _source(point: Path, config: dict, key: str) -> str:
    """The model directory ``key`` names in the checkpoint's config (config and tokenizer files come from it)."""
    section, name = key.split(".")
    src = config[section][name]
    if not src or not (Path(src) / "config.json").is_file():
        raise CheckpointError(f"{point} was written from {key} {src}, which is not there any more: the export takes "
                              "the model's config and tokenizer from it")
    return src


def export_checkpoint(point: str | Path, out: str | Path) -> Path:
    """Write checkpoint ``point``'s policy as an HF causal-LM directory ``out``; returns ``out``."""
    from transformers import AutoModelForCausalLM

    from vcppo.engines import lora as L
    from vcppo.models.export import save_causal_lm

    point = Path(point)
    config = _checked_config(point, out)
    src = _source(point, config, "model.policy_path")
    state = engine_state(point / "actor")
    lora = LoRAConfig(**config["actor"].get("lora", {}))
    if L.enabled(lora):  # the adapters merged into the weights they adapt, with the run's scaling
        scalings = L.adapter_scalings(L.add_adapters(AutoModelForCausalLM.from_pretrained(src), lora))
        state = dict(L.merge_adapters(state.items(), scalings))
    save_causal_lm(state, src, str(out), _DTYPES.get(config["model"].get("dtype"), torch.float32))
    return Path(out)


def export_critic(point: str | Path, out: str | Path) -> Path:
    """Write checkpoint ``point``'s critic as a vcppo value-model directory ``out`` (what a run's
    ``final/critic`` holds, and what ``critic.init_from`` reads); returns ``out``. The backbone's config
    comes from the model the critic was built from (the policy's, or ``model.critic_path``'s for a
    critic from a reward model or checkpoint), the tokenizer from the policy's."""
    from transformers import AutoConfig, AutoModel

    from vcppo.engines import lora as L
    from vcppo.models.value_model import save_value_model

    point = Path(point)
    config = _checked_config(point, out)
    if not (point / "critic" / CHECKPOINT_TAG).is_dir():
        raise CheckpointError(f"{point} holds no critic (its run trained none): there is no value model to export")
    if L.enabled(LoRAConfig(**config.get("critic", {}).get("lora", {}))):
        raise CheckpointError(f"{point}'s critic trained LoRA adapters, which this export does not merge: use the "
                              "run's final/critic (its directory as critic.init_from)")
    policy = _source(point, config, "model.policy_path")
    init = config["model"].get("critic_init", "policy")
    src = policy if init == "policy" or config.get("critic", {}).get("init_from") else \
        _source(point, config, "model.critic_path")
    backbone = AutoModel.from_config(AutoConfig.from_pretrained(src))  # only a vessel for config + save_pretrained
    save_value_model(backbone, str(out), engine_state(point / "critic"),
                     tokenizer_src=config["model"].get("tokenizer_path") or policy)
    return Path(out)
