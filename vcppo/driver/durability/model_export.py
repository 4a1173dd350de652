"""Any checkpoint of a run as a model: ``vcppo model export CHECKPOINT --out DIR``, and ``vcppo eval
CHECKPOINT ...`` (which exports into a temporary directory first).

A checkpoint's actor is DeepSpeed's: at ZeRO-3 its weights are partitions, one file per rank that
wrote it; with LoRA the base weights and the adapters are separate tensors. The export reads the
engine's states with ``weights_only`` loading (nothing in a checkpoint runs code), joins the ZeRO
partitions into full fp32 tensors (DeepSpeed's own ``zero_to_fp32`` reader), merges the adapters into
the weights they adapt (W + s B A, :func:`vcppo.engines.lora.merge_adapters`), and writes an HF
causal-LM directory with the config, generation config and tokenizer files of the run's
``model.policy_path`` (:func:`vcppo.models.export.save_causal_lm`): what ``final/actor`` holds at the
end of a run. The checkpoint is verified against its manifest first.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from vcppo.driver.durability.checkpoint import CheckpointError, checkpoint_problems
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


def export_checkpoint(point: str | Path, out: str | Path) -> Path:
    """Write checkpoint ``point``'s policy as an HF causal-LM directory ``out``; returns ``out``."""
    from transformers import AutoModelForCausalLM

    from vcppo.engines import lora as L
    from vcppo.models.export import save_causal_lm

    point = Path(point)
    if not is_checkpoint(point):
        raise CheckpointError(f"{point} is not a run's checkpoint (a checkpoints/step_N directory with state.json "
                              "and actor/)")
    problems = checkpoint_problems(point)
    if problems:
        raise CheckpointError(f"checkpoint {point} is damaged: {'; '.join(problems[:5])}")
    try:
        config = json.loads((point / RUN_CONFIG).read_text())["config"]
    except (OSError, ValueError, KeyError) as e:
        raise CheckpointError(f"{point / RUN_CONFIG} cannot be read ({e}): the export needs the config that wrote "
                              "the checkpoint (its model.policy_path and LoRA settings)") from None
    src = config["model"]["policy_path"]
    if not (Path(src) / "config.json").is_file():
        raise CheckpointError(f"{point} was written from model.policy_path {src}, which is not there any more: the "
                              "export takes the model's config and tokenizer from it")
    state = engine_state(point / "actor")
    lora = LoRAConfig(**config["actor"].get("lora", {}))
    if L.enabled(lora):  # the adapters merged into the weights they adapt, with the run's scaling
        scalings = L.adapter_scalings(L.add_adapters(AutoModelForCausalLM.from_pretrained(src), lora))
        state = dict(L.merge_adapters(state.items(), scalings))
    save_causal_lm(state, src, str(out), _DTYPES.get(config["model"].get("dtype"), torch.float32))
    return Path(out)
