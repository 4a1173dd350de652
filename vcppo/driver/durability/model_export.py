"""Any checkpoint of a run as a model: ``vcppo model export CHECKPOINT --out DIR``, and ``vcppo eval
CHECKPOINT ...`` (which exports into a temporary directory first).

A checkpoint's actor is DeepSpeed's: at ZeRO-3 its weights are partitions, one file per rank that
wrote it; with LoRA the base weights and the adapters are separate tensors. The export reads the
engine's states with ``weights_only`` loading (nothing in a checkpoint runs code), joins the ZeRO
partitions into full fp32 tensors (DeepSpeed's own ``zero_to_fp32`` reader), merges the adapters into
the weights they adapt (W + s B A, :func:`vcppo.engines.lora.merge_adapters`), and writes an HF
causal-LM directory with the config, generation config and tokenizer files of the run's
``model.policy_path`` (:func:`vcppo.models.export.save_causal_lm`): what ``final/actor`` holds at the
end of a run. The checkpoint is verified against its manifest first, and ``--out`` is refused (one
line, before anything is written) where writing would destroy something: the run's input models and
data (``model.policy_path`` and the other path keys a run reads), or a run's ``checkpoints/``
directory, which the run prunes and cleans of what it does not recognise as a checkpoint.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from vcppo.config.load import SAVED_CONFIG
from vcppo.config.provenance import CLASSES, PATH_KEYS
from vcppo.driver.durability.checkpoint import CheckpointError, checkpoint_problems, checkpoint_root
from vcppo.driver.durability.reshard import weights_only_loading
from vcppo.driver.durability.resume_checks import RUN_CONFIG
from vcppo.engines.engine_setup import CHECKPOINT_TAG, checkpoint_zero_stage
from vcppo.config.schema_base import LoRAConfig

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
