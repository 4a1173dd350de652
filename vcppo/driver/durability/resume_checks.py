"""A resume point checked against this run's config before any engine starts (every rank, no
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
import json
from pathlib import Path

from omegaconf import OmegaConf

from vcppo.config.load import SAVED_CONFIG, to_dict
from vcppo.config.provenance import Change, diff_configs, refuse_changes
from vcppo.engines.engine_setup import checkpoint_zero_stage
from vcppo.config.schema import Config
from vcppo.errors import ConfigError

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
    :mod:`vcppo.driver.durability.reshard` converts it and checks the stages itself)."""
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
