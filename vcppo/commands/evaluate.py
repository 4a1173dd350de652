"""`vcppo eval MODEL_DIR DATA [key=value ...]` (or `vcppo eval [CONFIG] eval.model_path=DIR
eval.data_files=FILE [key=value ...]`): greedy pass@1 and sampled unbiased pass@k of a policy on a
prompt split (sampling settings from ``rollout``).

MODEL_DIR is any Hugging Face causal-LM directory (config.json, weights, tokenizer files: a real
Qwen2.5 checkpoint, a `vcppo model make` dir, a run's ``final/actor``) or a run's checkpoint
(``checkpoints/step_N``, exported first: :mod:`vcppo.driver.durability.conversion`); DATA any prompt file of the
supported formats: parquet / jsonl / json with a text prompt and a flat answer, or verl-format
parquet (chat-message prompt, answer at ``reward_model.ground_truth``, found without
``data.answer_field`` when the file has no ``answer`` column). The model directory and the file are
checked before any engine starts; a missing one, a directory that is not a causal LM, or an
unsupported format is one line naming it (exit code 2).

Several files (``eval.data_files=a.parquet,b.jsonl``, or DATA given so) are evaluated in one batch and
reported each on its own too: per ``data_source`` where the rows carry one (verl's format), else per
file, as ``val/<source>/...`` keys beside the overall ones, and printed as a markdown table.

The pass@k evaluation itself is :func:`vcppo.driver.step.validation.evaluate`, the one that validation
inside training and the SFT command use too.
"""
from __future__ import annotations

import dataclasses
import json
import os
import tempfile

from vcppo.preflight import load_command_config, split_paths
from vcppo.errors import DataError
from vcppo.driver.context import load_prompt_set, make_scorer
from vcppo.driver.durability.conversion import export_checkpoint, is_checkpoint
from vcppo.driver.durability.run_dir import RUN_CONFIG
from vcppo.driver.step.sampler import make_sampler
from vcppo.driver.step.validation import SAMPLES_KEY, evaluate
from vcppo.runtime import dist as D
from vcppo.engines.rollout_choice import make_rollout_engine
from vcppo.models.hub import parse_id
from vcppo.rewards.routing import data_source_of
from vcppo.config.schema import Config
from vcppo.errors import ConfigError


USAGE = ("usage: vcppo eval MODEL_DIR DATA [key=value ...]  (or: [CONFIG] MODEL_DIR DATA ..., "
         "MODEL --benchmark NAMES ..., [CONFIG] eval.model_path=DIR eval.data_files=FILE ...)")
DATA_SUFFIXES = (".parquet", ".jsonl", ".json", ".jsonl.gz", ".json.gz")
_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
_TOKENIZER = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
VERL_ANSWER = "reward_model.ground_truth"


def _benchmark_flag(argv: list[str]) -> tuple[list[str], list[str]]:
    """``--benchmark NAMES`` (or ``--benchmark=NAMES``) taken out of ``argv``: (the rest, overrides:
    ``eval.benchmark=NAMES``, and every prompt unless ``eval.max_prompts`` is given)."""
    rest, names = [], None
    args = iter(argv)
    for a in args:
        if a == "--benchmark":
            names = next(args, None)
            if names is None:
                raise ConfigError(f"--benchmark needs a name (gsm8k, math500, aime24, aime25)\n{USAGE}")
        elif a.startswith("--benchmark="):
            names = a.split("=", 1)[1]
        else:
            rest.append(a)
    if names is None:
        return rest, []
    if not [n for n in names.split(",") if n.strip()]:
        raise ConfigError(f"--benchmark needs a name (gsm8k, math500, aime24, aime25; several comma-separated), "
                          f"got {names!r}\n{USAGE}")
    extra = [f"eval.benchmark={json.dumps(names)}"]  # a quoted YAML string, whatever the names hold
    if not any(a.lstrip("+").startswith("eval.max_prompts=") for a in rest):
        extra.append("eval.max_prompts=null")
    return rest, extra


def eval_argv(argv: list[str]) -> list[str]:
    """``[CONFIG] MODEL_DIR DATA [key=value ...]`` -> the config form ``CONFIG eval.model_path=...
    eval.data_files=... [key=value ...]`` (CONFIG defaults to ``base``); ``[CONFIG] [key=value
    ...]`` is passed through. With ``--benchmark``, DATA may be left out, and a lone argument that
    is a model directory or a hub id is MODEL. MODEL_DIR and DATA are checked here (one line naming them)."""
    argv, bench = _benchmark_flag(list(argv))
    positional = [a for a in argv if "=" not in a]
    overrides = [a for a in argv if "=" in a] + bench
    lone_model = len(positional) == 1 and not _is_config(positional[0])  # not a config: a model, maybe a typo
    if bench and len(positional) in (1, 2) and (_is_model(positional[-1]) or lone_model):
        config, model = (["base"] + positional)[-2:]
        _refuse_twice(overrides, ("eval.model_path",))
        if parse_id(model) is None:  # a hub id is checked once resolved to its snapshot
            check_model_dir(model, "MODEL")
        return [config, f"eval.model_path={model}", *overrides]
    if bench and not positional and not any(a.lstrip("+").startswith("eval.model_path=") for a in overrides):
        raise ConfigError("MODEL is missing: name the model to evaluate (a model directory, a run's checkpoint or a "
                          f"hub id) before --benchmark\n{USAGE}")
    if len(positional) <= 1:
        _refuse_missing_model(positional, overrides)
        return list(argv) + bench
    if len(positional) > 3:
        raise ConfigError(f"too many arguments: {positional}\n{USAGE}")
    config, model, data = (["base"] + positional)[-3:]
    _refuse_twice(overrides, ("eval.model_path", "eval.data_files"))
    if parse_id(model) is None:  # a hub id is checked once resolved to its snapshot
        check_model_dir(model, "MODEL_DIR")
    for path in split_paths(data):
        check_data_path(path, "DATA")
    return [config, f"eval.model_path={model}", f"eval.data_files={data}", *overrides]


def _refuse_missing_model(positional: list[str], overrides: list[str]) -> None:
    """Zero or one argument: a model without data, data without a model, or nothing at all (the
    config's default model path is then no model the user named: no hint to download it)."""
    if positional and os.path.isfile(os.path.join(positional[0], "config.json")):
        raise ConfigError(f"DATA is missing after MODEL_DIR {positional[0]}\n{USAGE}")
    if positional and positional[0].lower().endswith(DATA_SUFFIXES):
        raise ConfigError(f"MODEL_DIR is missing: {positional[0]} is a data file; name the model to evaluate "
                          f"before it\n{USAGE}")
    default = Config().model.policy_path  # eval.model_path's default, in the base config
    named = any(a.lstrip("+").startswith(("eval.model_path=", "model.policy_path=")) for a in overrides)
    if not positional and not named and not os.path.exists(default):
        raise ConfigError(f"MODEL_DIR and DATA are missing (nothing names a model, and the default {default} "
                          f"does not exist here)\n{USAGE}")


def _refuse_twice(overrides: list[str], keys: tuple[str, ...]) -> None:
    """A key given as an argument must not also come as ``key=...``."""
    for key in keys:
        if any(a.lstrip("+").startswith(key + "=") for a in overrides):
            raise ConfigError(f"{key} is given twice: as an argument and as '{key}=...'")


def _is_config(arg: str) -> bool:
    """``arg`` names a config: a YAML file, or a shipped preset's name."""
    from vcppo.config.load import CONFIG_DIR
    return arg.endswith((".yaml", ".yml")) or ("/" not in arg and (CONFIG_DIR / f"{arg}.yaml").is_file())


def _is_model(arg: str) -> bool:
    return parse_id(arg) is not None or os.path.isfile(os.path.join(arg, "config.json")) or is_checkpoint(arg)


def check_model_dir(path: str, what: str) -> None:
    """``path`` is a Hugging Face causal-LM directory: config.json naming a causal LM (or no
    architecture), weights, and tokenizer files (eval reads the tokenizer from it)."""
    from vcppo.models.value_model import MARKER

    if is_checkpoint(path):  # a run's checkpoint: exported before it is evaluated
        return
    if not os.path.exists(path):
        raise ConfigError(f"{what}: model directory not found: {path}")
    if not os.path.isdir(path):
        raise ConfigError(f"{what}: {path} is not a directory (expected a Hugging Face model directory: "
                          "config.json, weights, tokenizer files)")
    config_file = os.path.join(path, "config.json")
    if not os.path.isfile(config_file):
        raise ConfigError(f"{what}: {path} has no config.json: not a Hugging Face model directory")
    if os.path.exists(os.path.join(path, MARKER)):
        raise ConfigError(f"{what}: {path} is a vcppo value / reward model ({MARKER}), not a causal LM")
    try:
        with open(config_file) as f:
            archs = json.load(f).get("architectures") or []
    except (ValueError, OSError, AttributeError) as e:
        raise ConfigError(f"{what}: cannot read {config_file}: {e}") from None
    if archs and not any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in archs):
        raise ConfigError(f"{what}: {path} holds a {', '.join(archs)}, not a causal LM (*ForCausalLM)")
    names = os.listdir(path)
    if not any(n in _WEIGHTS or n.endswith(".safetensors") for n in names):
        raise ConfigError(f"{what}: {path} has no weights (model.safetensors, pytorch_model.bin or a sharded index)")
    if not any(n in _TOKENIZER for n in names):
        raise ConfigError(f"{what}: {path} has no tokenizer files ({', '.join(_TOKENIZER[:2])}); eval reads "
                          "the tokenizer from the model directory")


def check_data_path(path: str, what: str) -> None:
    """``path`` exists and is of a supported format (the loader checks its contents)."""
    if not os.path.exists(path):
        raise ConfigError(f"{what}: data file not found: {path}")
    if os.path.isdir(path):
        if not any(os.path.exists(os.path.join(path, n)) for n in ("dataset_info.json", "dataset_dict.json")):
            raise ConfigError(f"{what}: {path} is a directory but not a datasets save_to_disk directory "
                              f"(supported: {', '.join(DATA_SUFFIXES)} files, or such a directory)")
        return
    if not path.lower().endswith(DATA_SUFFIXES):
        raise ConfigError(f"{what}: unsupported data format {path!r}: expected {', '.join(DATA_SUFFIXES)} "
                          "or a datasets save_to_disk directory")


def _columns(path: str) -> dict[str, list[str]] | None:
    """Top-level columns of a prompt file -> the keys of struct (dict) columns; None if unknown."""
    lower = path.lower()
    if lower.endswith(".parquet"):
        import pyarrow as pa
        import pyarrow.parquet as pq

        schema = pq.read_schema(path)
        return {f.name: [c.name for c in f.type] if pa.types.is_struct(f.type) else [] for f in schema}
    if lower.endswith(".jsonl") and os.path.isfile(path):
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.strip():
                    try:
                        row = json.loads(line)
                    except ValueError:
                        return None  # the loader names the bad line
                    return {k: list(v) if isinstance(v, dict) else [] for k, v in row.items()} \
                        if isinstance(row, dict) else None
    return None


def resolve_answer_field(path: str, answer_field: str) -> str:
    """The default ``answer`` field, for a verl-format file without an ``answer`` column, is
    ``reward_model.ground_truth``; any other setting is kept as it is."""
    if answer_field != "answer":
        return answer_field
    columns = _columns(path)
    top, sub = VERL_ANSWER.split(".")
    if columns is not None and "answer" not in columns and sub in columns.get(top, []):
        print(f"vcppo eval: {path} is verl-format: reading the answer from {VERL_ANSWER}")
        return VERL_ANSWER
    return answer_field


def main(argv: list[str]) -> int:
    cfg = load_command_config(eval_argv(argv), "eval")
    check_model_dir(cfg.eval.model_path, "config key 'eval.model_path'")
    for path in split_paths(cfg.eval.data_files):
        check_data_path(path, "config key 'eval.data_files'")
    for out in (cfg.eval.output_json, cfg.eval.samples_jsonl):  # before any engine starts: an evaluation is
        if out:                                                   # never lost for want of a folder
            os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="vcppo-benchmark-") as workdir:
        if cfg.eval.benchmark:
            cfg = with_benchmarks(cfg, workdir)
        if is_checkpoint(cfg.eval.model_path):  # exported (ZeRO shards joined, LoRA merged), then evaluated
            cfg = with_run_episodes(cfg, cfg.eval.model_path, argv)
            model = export_checkpoint(cfg.eval.model_path, os.path.join(workdir, "model"))
            print(f"vcppo eval: {cfg.eval.model_path} is a run's checkpoint: exported its policy to evaluate it",
                  flush=True)
            cfg = dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, model_path=str(model)))
        metrics = evaluate_policy(cfg)
    if metrics is not None:
        samples = metrics.pop(SAMPLES_KEY, [])
        if cfg.eval.samples_jsonl:
            with open(cfg.eval.samples_jsonl, "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in samples)
        print(json.dumps(metrics, indent=1))
        print(markdown_table(metrics, cfg.eval.k))
        if cfg.eval.output_json:
            with open(cfg.eval.output_json, "w") as f:
                json.dump(metrics, f, indent=1)
    return 0


EPISODE_KEYS = ("env", "env_args", "max_turns", "turn_max_tokens", "env_timeout_s")


def with_run_episodes(cfg: Config, point: str, argv: list[str]) -> Config:
    """``cfg`` evaluating checkpoint ``point`` on the episodes its run trained on: ``rollout.env``
    and its settings (:data:`EPISODE_KEYS`) from the checkpoint's run config, unless the command
    line sets ``rollout.env`` itself (``rollout.env=null``: single-turn)."""
    if any(a.lstrip("+").startswith("rollout.env=") for a in argv):
        return cfg
    try:
        with open(os.path.join(point, RUN_CONFIG)) as f:
            run = json.load(f)["config"]["rollout"]
    except (OSError, ValueError, KeyError, TypeError):
        return cfg  # a checkpoint without its run config: the command's settings
    if not run.get("env"):
        return cfg
    print(f"vcppo eval: {point}'s run trained on episodes of env {run['env']!r}: evaluating the same episodes "
          "(rollout.env=null: single-turn)", flush=True)
    episodes = {k: run[k] for k in EPISODE_KEYS if k in run}
    return dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, **episodes))


def with_benchmarks(cfg: Config, workdir: str) -> Config:
    """``cfg`` evaluating ``eval.benchmark``'s files (prepared under ``workdir``) with verl's scorers."""
    from vcppo.data.hub_sources import benchmark_files

    names = split_paths(cfg.eval.benchmark)
    files = benchmark_files(names, split_paths(cfg.eval.data_files), workdir)
    print(f"vcppo eval: {', '.join(names)}: {cfg.eval.n_samples} samples per prompt for pass@k "
          f"(k = {cfg.eval.k}) and one greedy", flush=True)
    return dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, data_files=",".join(files)),
                               reward=dataclasses.replace(cfg.reward, verl_parity=True))


def load_rows(cfg: Config, tok) -> tuple[list[dict], list[str] | None]:
    """Every file's prompt rows (``eval.max_prompts`` of each), and a label per row for the
    per-source figures: its ``data_source`` where the file has one, else the file's name. None
    (no per-source figures) for one file of one source."""
    rows, labels = [], []
    for path in split_paths(cfg.eval.data_files):
        answer_field = resolve_answer_field(path, cfg.data.answer_field)
        file_cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, answer_field=answer_field))
        try:  # before the process group and vLLM: a data problem costs no engine start-up
            mine = load_prompt_set(file_cfg, path, tok, max_prompt_tokens=cfg.data.max_prompt_tokens,
                                   shuffle_seed=None, limit=cfg.eval.max_prompts).rows()
        except (ValueError, TypeError) as err:  # e.g. chat-message prompts and a tokenizer without a template
            if isinstance(err, DataError):  # read through this model's tokenizer: name it
                raise DataError(f"{err} (read with the tokenizer of {cfg.eval.model_path})") from None
            if isinstance(err, ConfigError):
                raise
            raise ConfigError(f"{path} with the tokenizer of {cfg.eval.model_path}: {err}") from None
        name = os.path.basename(path.rstrip("/")).split(".")[0]
        labels += [data_source_of(r["answer"]) or name for r in mine]
        rows += mine
    return rows, (labels if len(set(labels)) > 1 else None)


def evaluate_policy(cfg: Config) -> dict | None:
    """Load ``eval.model_path`` into vLLM and evaluate it on ``eval.data_files`` (every file in one
    batch); the metrics on the main rank, None on the others."""
    from transformers import AutoTokenizer

    e = cfg.eval
    try:
        tok = AutoTokenizer.from_pretrained(e.model_path)
    except Exception as err:  # noqa: BLE001 - any loading failure: name the directory
        raise ConfigError(f"cannot load the tokenizer of {e.model_path}: {type(err).__name__}: {err}") from None
    rows, groups = load_rows(cfg, tok)
    dist = D.init_distributed(cfg.trainer.device, **D.timeouts(cfg.trainer))
    rollout = make_rollout_engine(e.model_path, cfg.rollout, dist, seed=cfg.trainer.seed,
                                  max_model_len=cfg.data.max_prompt_tokens + cfg.rollout.max_response_tokens,
                                  max_sequences=len(rows) * max(e.n_samples, 1))
    clean = False
    try:
        scorer = make_scorer(cfg)
        metrics = evaluate(make_sampler(cfg, rollout, scorer), rows, dist=dist, sampling=cfg.rollout,
                           n_samples=e.n_samples, ks=e.k, seed=cfg.trainer.seed, groups=groups,
                           text_samples=len(rows) if e.samples_jsonl else 0)
        clean = True
    finally:
        rollout.close(final=True)
        D.shutdown(wait_for_peers=clean)  # a clean end meets the peers first
    return metrics if dist.is_main else None


def markdown_table(metrics: dict, ks: list[int]) -> str:
    """The metrics as a table: a row per data_source (or file) when there are several, then all."""
    groups = sorted(k[len("val/"):-len("/num_prompts")] for k in metrics
                    if k.startswith("val/") and k.endswith("/num_prompts") and k != "val/num_prompts")
    cols = ["num_prompts", "pass@1_greedy", *[f"pass@{k}" for k in ks], "response_length_sampled"]
    lines = ["| data_source | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for label, prefix in [*((g, f"val/{g}/") for g in groups), ("all", "val/")]:
        cells = [f"{metrics[prefix + c]:.4g}" if prefix + c in metrics else "-" for c in cols]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
