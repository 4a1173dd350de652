"""One config schema for every vcppo command.

Layering, lowest to highest priority:
  1. the dataclass defaults below (each field carries a one-line doc in ``metadata["doc"]``),
  2. YAML preset files (a file may name its parent with ``extends: base.yaml``),
  3. ``key=value`` overrides from the command line (``actor.lr=1e-6``).

Strict by design: an unknown key is an error that names it and suggests the closest valid key
(nanoGPT's exec-config silently created new globals; OmegaConf's own error gives no suggestion),
and out-of-range values are errors naming the field. Derived fields are filled in one place,
:func:`finalize`.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml


class ConfigError(ValueError):
    """A config problem the user must fix; the message names the key / file."""


def _f(default: Any, doc: str, *, choices: tuple | None = None, low: float | None = None,
       high: float | None = None, low_open: bool = False) -> Any:
    """A schema field with its doc line and its valid range or choices."""
    meta = {"doc": doc, "choices": choices, "low": low, "high": high, "low_open": low_open}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class ModelConfig:
    policy_path: str = _f("", "Local HF directory of the initial policy (the SFT / cold-start model).")
    tokenizer_path: Optional[str] = _f(None, "Local tokenizer directory; defaults to policy_path.")
    critic_init: str = _f("policy", "Critic initialisation: 'policy' (backbone of the policy + fresh "
                          "value head), 'reward_model' (an RM incl. its head; the paper's PPO "
                          "baseline), or 'checkpoint' (a pretrained critic).",
                          choices=("policy", "reward_model", "checkpoint"))
    critic_path: Optional[str] = _f(None, "Directory of the RM or critic checkpoint when critic_init "
                                    "is 'reward_model' or 'checkpoint'.")
    dtype: str = _f("auto", "Training dtype: 'auto' = bf16 on CUDA, fp32 on CPU.",
                    choices=("auto", "float32", "bfloat16", "float16"))


@dataclass
class DataConfig:
    train_files: str = _f("", "Training prompts: a .parquet / .jsonl file or a datasets save_to_disk dir.")
    val_files: Optional[str] = _f(None, "Validation prompts (same formats); validation is off if unset.")
    prompt_field: str = _f("prompt", "Column holding the prompt text.")
    answer_field: str = _f("answer", "Column holding the ground-truth answer.")
    max_prompt_tokens: int = _f(256, "Prompts longer than this (in tokens) are dropped, and counted.", low=1)
    use_chat_template: str = _f("auto", "Wrap prompts with the tokenizer's chat template: auto / true / false.",
                                choices=("auto", "true", "false"))


@dataclass
class RolloutConfig:
    n_samples_per_prompt: int = _f(4, "Responses sampled per prompt (GRPO/VAPO group size).", low=1)
    temperature: float = _f(1.0, "Sampling temperature.", low=0.0)
    top_p: float = _f(1.0, "Nucleus sampling top-p.", low=0.0, high=1.0, low_open=True)
    max_response_tokens: int = _f(512, "Maximum generated tokens per response (the context budget).", low=1)
    stop: list = _f([], "Extra stop strings (the tokenizer's EOS always stops).")
    gpu_memory_utilization: Optional[float] = _f(None, "vLLM memory share; on CPU the share of host RAM "
                                                 "for its KV cache per rank. null = 0.4 on CUDA "
                                                 "(colocated with training), 0.05 on CPU.",
                                                 low=0.0, high=1.0, low_open=True)
    tensor_parallel_size: int = _f(1, "vLLM tensor parallel size (GPU only).", low=1)
    enforce_eager: bool = _f(True, "Disable CUDA graphs in vLLM (faster start-up, slower decode).")
    free_memory_during_training: bool = _f(True, "GPU: put vLLM to sleep while actor/critic train.")


@dataclass
class OptimConfig:
    """Shared by the actor and the critic."""
    lr: float = _f(1e-6, "Peak learning rate.", low=0.0)
    weight_decay: float = _f(0.0, "AdamW weight decay.", low=0.0)
    betas: list = _f([0.9, 0.95], "AdamW betas.")
    warmup_steps: int = _f(0, "Linear learning-rate warm-up, in optimizer steps.", low=0)
    lr_schedule: str = _f("constant", "Schedule after warm-up.", choices=("constant", "cosine", "linear"))
    min_lr_ratio: float = _f(0.0, "Floor of cosine / linear decay, as a fraction of lr.", low=0.0, high=1.0)
    grad_clip: float = _f(1.0, "Global gradient-norm clip (0 disables).", low=0.0)
    micro_batch_size: int = _f(8, "Sequences per forward/backward per rank (gradient accumulation "
                               "makes up the mini-batch).", low=1)
    ppo_mini_batches: int = _f(1, "Optimizer steps per PPO epoch (the step's batch is split into this many).", low=1)
    ppo_epochs: int = _f(1, "Passes over each step's batch.", low=1)
    gradient_checkpointing: bool = _f(False, "Recompute activations in backward (saves memory).")
    zero_stage: int = _f(3, "DeepSpeed ZeRO stage.", choices=(0, 1, 2, 3))
    offload_optimizer: bool = _f(False, "ZeRO-3: keep optimizer states in CPU memory.")
    offload_params: bool = _f(False, "ZeRO-3: keep parameters in CPU memory.")


@dataclass
class ActorConfig(OptimConfig):
    pass


@dataclass
class CriticConfig(OptimConfig):
    lr: float = _f(2e-6, "Peak learning rate (paper: critic 2e-6 vs actor 1e-6).", low=0.0)
    value_clip: Optional[float] = _f(0.5, "Clip range of the value loss around old values (null: off).", low=0.0)


@dataclass
class AlgorithmConfig:
    advantage_estimator: str = _f("gae", "'gae' (PPO family, needs a critic) or 'grpo' (group-normalised "
                                  "outcome rewards, no critic).", choices=("gae", "grpo"))
    gamma: float = _f(1.0, "Discount factor.", low=0.0, high=1.0)
    lambda_actor: float = _f(0.95, "GAE lambda of the actor's advantages (Decoupled-GAE, paper sec. 4.2).",
                             low=0.0, high=1.0)
    lambda_critic: float = _f(1.0, "GAE lambda of the critic's targets; 1.0 = Monte-Carlo returns, no "
                              "reward decay (Decoupled-GAE).", low=0.0, high=1.0)
    length_adaptive_lambda: bool = _f(False, "VAPO: lambda_actor = 1 - 1/(alpha * length) per sequence.")
    length_adaptive_alpha: float = _f(0.05, "alpha of the length-adaptive lambda (VAPO: 0.05).", low=0.0,
                                      low_open=True)
    whiten_advantages: bool = _f(True, "Normalise the actor's advantages over the batch (std 1).")
    zero_mean_advantages: bool = _f(True, "When whitening, also subtract the mean (False keeps the mean).")
    eps_low: float = _f(0.2, "PPO ratio clip below 1 (1 - eps_low).", low=0.0)
    eps_high: float = _f(0.2, "PPO ratio clip above 1 (1 + eps_high); >eps_low is clip-higher (VAPO/DAPO).",
                         low=0.0)
    dual_clip_c: Optional[float] = _f(None, "Dual-clip constant c > 1 for negative advantages (null: off).",
                                      low=1.0, low_open=True)
    loss_agg: str = _f("token-mean", "Loss aggregation over tokens / sequences.",
                       choices=("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"))
    kl_coef: float = _f(0.0, "KL penalty coefficient vs the reference policy (paper: 0); >0 loads a "
                        "reference engine.", low=0.0)
    kl_estimator: str = _f("k3", "KL estimator for the penalty.", choices=("k1", "k2", "k3"))
    entropy_coef: float = _f(0.0, "Entropy bonus coefficient.", low=0.0)
    positive_lm_coef: float = _f(0.0, "VAPO positive-example LM loss weight (VAPO: 0.1).", low=0.0)
    grpo_scale_by_std: bool = _f(True, "GRPO: divide group-centred rewards by the group std.")


@dataclass
class RewardConfig:
    function: Optional[str] = _f(None, "Custom reward function 'module:function' (fn(response_text, "
                                 "ground_truth, **info) -> float); null = the built-in verifier.")
    correct_score: float = _f(1.0, "Reward of a correct final answer (paper: +1).")
    wrong_score: float = _f(-1.0, "Reward of a wrong / missing / truncated answer (paper: -1).")


@dataclass
class ValuePretrainConfig:
    enabled: bool = _f(True, "Run value pretraining (policy frozen, critic regressed on Monte-Carlo "
                       "returns) before PPO (VC-PPO sec. 4.1).")
    steps: int = _f(100, "Maximum value-pretraining steps (paper: ~100 best, 150 over-fits).", low=0)
    lambda_critic: float = _f(1.0, "GAE lambda of the pretraining targets (1.0 = Monte-Carlo).", low=0.0,
                              high=1.0)
    early_stop: bool = _f(True, "Stop early once explained variance and value loss have settled.")
    min_steps: int = _f(10, "Never stop before this many steps.", low=0)
    window: int = _f(10, "Settling rule: compare means of the last two windows of this many steps.", low=1)
    ev_tolerance: float = _f(0.02, "Settled when explained variance changed by less than this ...", low=0.0)
    loss_tolerance: float = _f(0.05, "... and value loss changed by less than this fraction.", low=0.0)
    cache_dir: Optional[str] = _f(None, "Where reusable critic checkpoints live, keyed by a hash of policy, "
                                  "data and critic config (default: <output_root>/critic_cache).")
    reuse: bool = _f(True, "Reuse a matching pretrained critic instead of training it again.")


@dataclass
class TrainerConfig:
    total_steps: int = _f(100, "PPO steps (each = one rollout batch).", low=0)
    prompts_per_step: int = _f(16, "Prompts per step over all ranks (x n_samples_per_prompt responses).", low=1)
    seed: int = _f(0, "Seed of data order, sampling and initialisation.")
    output_root: str = _f("runs", "Directory under which run directories are created.")
    run_name: Optional[str] = _f(None, "Run directory name (default: <preset>-<timestamp>).")
    save_every: int = _f(0, "Checkpoint every N steps (0: only at the end).", low=0)
    keep_last: int = _f(2, "Keep the last K checkpoints.", low=1)
    resume: str = _f("auto", "'auto' continues from the run's last complete checkpoint, 'never' "
                     "starts over, or a checkpoint path.")
    val_every: int = _f(0, "Validate every N steps (0: only at the start and end).", low=0)
    val_max_prompts: int = _f(128, "Validation prompts used (from the start of the val split).", low=1)
    val_n_samples: int = _f(4, "Samples per validation prompt for pass@k.", low=1)
    val_k: list = _f([1, 4], "k values of the unbiased pass@k estimator (<= val_n_samples).")
    device: str = _f("auto", "'auto' (cuda if available), 'cuda' or 'cpu'.", choices=("auto", "cuda", "cpu"))
    deterministic: bool = _f(False, "Deterministic torch algorithms (CPU runs are deterministic anyway).")


@dataclass
class LoggingConfig:
    wandb: bool = _f(True, "Log to Weights & Biases.")
    wandb_mode: str = _f("offline", "offline (default, sync later with `wandb sync`), online, disabled.",
                         choices=("offline", "online", "disabled"))
    wandb_project: str = _f("vcppo", "W&B project.")
    progress_bar: bool = _f(True, "Show a progress bar on rank 0.")
    profile_buckets: int = _f(16, "Buckets of the advantage-vs-position profile.", low=1)


@dataclass
class Config:
    preset: str = _f("custom", "Name of the preset this run came from (informational).")
    model: ModelConfig = field(default_factory=ModelConfig, metadata={"doc": "Policy / critic / tokenizer paths."})
    data: DataConfig = field(default_factory=DataConfig, metadata={"doc": "Prompt datasets."})
    rollout: RolloutConfig = field(default_factory=RolloutConfig, metadata={"doc": "vLLM sampling."})
    actor: ActorConfig = field(default_factory=ActorConfig, metadata={"doc": "Policy optimisation."})
    critic: CriticConfig = field(default_factory=CriticConfig, metadata={"doc": "Value model optimisation."})
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig, metadata={"doc": "Advantages and losses."})
    reward: RewardConfig = field(default_factory=RewardConfig, metadata={"doc": "Verifier / reward function."})
    value_pretrain: ValuePretrainConfig = field(default_factory=ValuePretrainConfig,
                                                metadata={"doc": "Value pretraining phase."})
    trainer: TrainerConfig = field(default_factory=TrainerConfig, metadata={"doc": "Loop, checkpoints, eval."})
    logging: LoggingConfig = field(default_factory=LoggingConfig, metadata={"doc": "wandb / JSONL / console."})


# ---------------------------------------------------------------------------------------------
# Strict merging

def _is_section(tp: Any) -> bool:
    return dataclasses.is_dataclass(tp)


def _field_types(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


def all_keys(cls: type = Config, prefix: str = "") -> list[str]:
    """Every dotted key of the schema (sections excluded)."""
    keys = []
    for f in dataclasses.fields(cls):
        tp = f.default_factory if f.default_factory is not dataclasses.MISSING else None
        if tp is not None and dataclasses.is_dataclass(tp):
            keys += all_keys(tp, f"{prefix}{f.name}.")
        else:
            keys.append(prefix + f.name)
    return keys


def _unknown_key(key: str, where: str) -> ConfigError:
    close = difflib.get_close_matches(key, all_keys(), n=1, cutoff=0.5)
    if not close:  # also try the last component alone ("lamda_actor" -> "algorithm.lambda_actor")
        leaf = {k.rsplit(".", 1)[-1]: k for k in all_keys()}
        hit = difflib.get_close_matches(key.rsplit(".", 1)[-1], list(leaf), n=1, cutoff=0.6)
        close = [leaf[hit[0]]] if hit else []
    hint = f"; did you mean '{close[0]}'?" if close else ""
    return ConfigError(f"unknown config key '{key}' ({where}){hint}")


def _coerce(value: Any, current: Any, key: str) -> Any:
    """Type-check a user value against the schema default's type."""
    if current is None or value is None:
        return value
    if isinstance(current, bool):
        if isinstance(value, bool):
            return value
        raise ConfigError(f"config key '{key}' must be true/false, got {value!r}")
    if isinstance(current, int) and not isinstance(current, bool):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"config key '{key}' must be an integer, got {value!r}")
    if isinstance(current, float):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(f"config key '{key}' must be a number, got {value!r}")
    if isinstance(current, str):
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"config key '{key}' must be a string, got {value!r}")
    if isinstance(current, list):
        if isinstance(value, (list, tuple)):
            return list(value)
        raise ConfigError(f"config key '{key}' must be a list, got {value!r}")
    return value


def _merge_into(obj: Any, data: dict, where: str, prefix: str = "") -> None:
    if not isinstance(data, dict):
        raise ConfigError(f"config section '{prefix.rstrip('.') or '<root>'}' must be a mapping ({where})")
    fields_ = _field_types(type(obj))
    for key, value in data.items():
        dotted = prefix + str(key)
        if key not in fields_:
            # An unknown section ("critc: {lr: ...}") is reported with its full key "critc.lr".
            while isinstance(value, dict) and len(value) == 1:
                (sub, value), = value.items()
                dotted += f".{sub}"
            raise _unknown_key(dotted, where)
        current = getattr(obj, key)
        if dataclasses.is_dataclass(current):
            _merge_into(current, value or {}, where, dotted + ".")
        else:
            setattr(obj, key, _coerce(value, current if current is not None else _default_of(fields_[key]),
                                      dotted))


def _default_of(f: dataclasses.Field) -> Any:
    # Optional[float] fields default to None: type-check against the annotation instead.
    ann = str(f.type)
    if "float" in ann:
        return 0.0
    if "int" in ann:
        return 0
    if "str" in ann:
        return ""
    return None


def _set_dotted(data: dict, key: str, value: Any) -> None:
    parts = key.split(".")
    node = data
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override '{key}': '{p}' is not a section")
    node[parts[-1]] = value


def parse_overrides(overrides: list[str]) -> dict:
    """``["actor.lr=1e-6", "rollout.stop=[a,b]"]`` -> nested dict; values parsed as YAML scalars."""
    out: dict = {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override '{item}' is not of the form key=value")
        key, raw = item.split("=", 1)
        key = key.strip().lstrip("+")
        if not key:
            raise ConfigError(f"override '{item}' has an empty key")
        value = yaml.safe_load(raw) if raw.strip() != "" else ""
        # YAML reads "1e-6" as a string (no dot); numbers in scientific notation are common here.
        if isinstance(value, str):
            try:
                value = float(value) if any(c in value for c in "eE.") else value
            except ValueError:
                pass
        _set_dotted(out, key, value)
    return out


CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


def resolve_config_path(name_or_path: str) -> Path:
    """A YAML path, or a bare preset name looked up in the repo's ``configs/``."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml"):
        if not p.exists():
            raise ConfigError(f"config file not found: {p}")
        return p
    candidate = CONFIG_DIR / f"{name_or_path}.yaml"
    if candidate.exists():
        return candidate
    presets = sorted(x.stem for x in CONFIG_DIR.glob("*.yaml")) if CONFIG_DIR.exists() else []
    close = difflib.get_close_matches(name_or_path, presets, n=1)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    raise ConfigError(f"no config file or preset named '{name_or_path}' (presets: {', '.join(presets)}){hint}")


def _read_yaml_chain(path: Path, seen: tuple = ()) -> list[tuple[Path, dict]]:
    """The file and its ``extends:`` ancestors, root first."""
    path = path.resolve()
    if path in seen:
        raise ConfigError(f"config 'extends' cycle: {' -> '.join(map(str, seen + (path,)))}")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {path} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    parent = data.pop("extends", None)
    chain = []
    if parent:
        chain = _read_yaml_chain((path.parent / parent), seen + (path,))
    return chain + [(path, data)]


def load_config(config: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Defaults <- YAML chain <- overrides; validated and finalized."""
    cfg = Config()
    if config:
        path = resolve_config_path(str(config))
        for p, data in _read_yaml_chain(path):
            _merge_into(cfg, data, where=str(p))
        if cfg.preset == "custom":
            cfg.preset = path.stem
    if overrides:
        _merge_into(cfg, parse_overrides(overrides), where="command line")
    validate(cfg)
    return finalize(cfg)


def from_dict(data: dict) -> Config:
    cfg = Config()
    _merge_into(cfg, data, where="dict")
    validate(cfg)
    return finalize(cfg)


def validate(cfg: Config) -> None:
    """Range and choice checks from the schema metadata, plus cross-field rules."""

    def walk(obj: Any, prefix: str) -> None:
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            key = prefix + f.name
            if dataclasses.is_dataclass(value):
                walk(value, key + ".")
                continue
            m = f.metadata
            if value is None:
                continue
            if m.get("choices") is not None and value not in m["choices"]:
                raise ConfigError(f"config key '{key}' must be one of {list(m['choices'])}, got {value!r}")
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                if isinstance(value, float) and math.isnan(value):
                    raise ConfigError(f"config key '{key}' is NaN")
                low, high = m.get("low"), m.get("high")
                if low is not None and (value < low or (m.get("low_open") and value == low)):
                    op = ">" if m.get("low_open") else ">="
                    raise ConfigError(f"config key '{key}' must be {op} {low}, got {value}")
                if high is not None and value > high:
                    raise ConfigError(f"config key '{key}' must be <= {high}, got {value}")

    walk(cfg, "")
    if len(cfg.actor.betas) != 2 or len(cfg.critic.betas) != 2:
        raise ConfigError("config keys 'actor.betas' / 'critic.betas' must have two entries")
    for k in cfg.trainer.val_k:
        if not isinstance(k, int) or k < 1 or k > cfg.trainer.val_n_samples:
            raise ConfigError(f"config key 'trainer.val_k' entries must be integers in "
                              f"[1, trainer.val_n_samples={cfg.trainer.val_n_samples}], got {k!r}")
    if cfg.model.critic_init in ("reward_model", "checkpoint") and not cfg.model.critic_path \
            and cfg.algorithm.advantage_estimator == "gae":
        raise ConfigError(f"config key 'model.critic_path' is required when model.critic_init="
                          f"'{cfg.model.critic_init}'")
    if cfg.algorithm.advantage_estimator == "grpo" and cfg.rollout.n_samples_per_prompt < 2:
        raise ConfigError("config key 'rollout.n_samples_per_prompt' must be >= 2 for GRPO "
                          "(advantages are normalised within a group)")


def finalize(cfg: Config) -> Config:
    """Derived fields, computed in this one place."""
    if not cfg.model.tokenizer_path:
        cfg.model.tokenizer_path = cfg.model.policy_path
    if cfg.algorithm.advantage_estimator == "grpo":
        cfg.value_pretrain.enabled = False  # no critic, nothing to pretrain
    if cfg.value_pretrain.cache_dir is None:
        cfg.value_pretrain.cache_dir = os.path.join(cfg.trainer.output_root, "critic_cache")
    return cfg


def check_paths(cfg: Config) -> None:
    """Fail at start-up, before any engine starts, on files the run needs but that don't exist."""
    need = [("model.policy_path", cfg.model.policy_path), ("model.tokenizer_path", cfg.model.tokenizer_path),
            ("data.train_files", cfg.data.train_files)]
    if cfg.data.val_files:
        need.append(("data.val_files", cfg.data.val_files))
    if cfg.algorithm.advantage_estimator == "gae" and cfg.model.critic_init != "policy":
        need.append(("model.critic_path", cfg.model.critic_path))
    for key, value in need:
        if not value:
            raise ConfigError(f"config key '{key}' is required")
        if not os.path.exists(value):
            raise ConfigError(f"config key '{key}': path does not exist: {value}")


def to_dict(cfg: Config) -> dict:
    return dataclasses.asdict(cfg)


def save_config(cfg: Config, run_dir: str | Path) -> Path:
    """Write the resolved config (every field, defaults included) into the run directory."""
    path = Path(run_dir) / "config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".yaml.tmp")
    tmp.write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    os.replace(tmp, path)
    return path


def schema_markdown() -> str:
    """The config reference (docs/config.md is generated from this)."""
    lines = ["# Config reference", "",
             "Generated from `vcppo/config.py` (`python -m vcppo.config > docs/config.md`). "
             "Every key can be set in a YAML preset or as `section.key=value` on the command line.", ""]
    root = Config()
    for sec in dataclasses.fields(root):
        value = getattr(root, sec.name)
        if not dataclasses.is_dataclass(value):
            lines += [f"- `{sec.name}` (default `{value!r}`): {sec.metadata['doc']}", ""]
            continue
        lines += [f"## `{sec.name}` — {sec.metadata['doc']}", "", "| key | default | doc |", "|---|---|---|"]
        for f in dataclasses.fields(value):
            m = f.metadata
            doc = m["doc"]
            if m.get("choices"):
                doc += f" One of {', '.join(map(str, m['choices']))}."
            lines.append(f"| `{sec.name}.{f.name}` | `{getattr(value, f.name)!r}` | {doc} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(schema_markdown())
