"""`vcppo sweep SWEEP [KEY=VALUE ...] [--dry-run] [--collect-only]`: config-driven experiment sweeps.

SWEEP is a path to a sweep YAML file or the bare name of a sweep shipped with the package
(``vcppo/configs/sweeps/NAME.yaml``: ``vcppo sweep ablation``, ``vcppo sweep slow_critic``).

A sweep file::

    name: lambda_sweep
    output_root: runs/lambda_sweep       # every run directory goes under here
    launcher: python -m vcppo.cli        # or: deepspeed --num_gpus 8 -m vcppo.cli
    preset: vcppo                        # default preset of every run
    overrides: [trainer.total_steps=40]  # applied to every run
    grid:                                # cartesian product over keys ('preset' is a key too)
      algorithm.lambda_actor: [0.9, 0.95, 0.99, 1.0]
      trainer.seed: [0, 1, 2]
    runs:                                # and/or an explicit list; each may set name / preset
      - {name: ppo-baseline, preset: ppo}
    preset_overrides:                    # applied to every run of that preset, after `overrides`
      ppo: [algorithm.lambda_critic=0.8]

``KEY=VALUE`` after the sweep changes it for this invocation: a top-level key replaces the file's
(``output_root=runs/short``), ``grid.KEY`` one grid axis (``grid.trainer.seed=[0,1]``), and any
other key is a config override appended to every run (``trainer.total_steps=20``). Values are
YAML. Give a shortened sweep its own ``output_root``: finished runs are skipped by directory.

Keys only a critic reads (``critic.*``, ``value_pretrain.*``, ...) in the sweep-wide ``overrides`` go to
the runs whose method has a critic only.

Runs execute one after another here (each its own process), or ``--dry-run`` prints the launch
commands for a cluster scheduler. Finished runs (``final_metrics.json`` present) are skipped, so a
sweep is re-runnable; an interrupted run resumes from its last checkpoint. At the end the final
metrics of every run are collected into ``<output_root>/sweep_results.{md,csv}``, with the minutes
its PPO steps took (``ppo_minutes``, the sum of their ``time/step_s``: validation and start-up left
out) beside the validation figures.
"""
from __future__ import annotations

import csv
import itertools
import shlex
from pathlib import Path

import yaml

from vcppo.config.load import CONFIG_DIR, CRITIC_KEYS, load_config, resolve_named_file
from vcppo.errors import ConfigError
from vcppo.methods import uses_critic

_TOP_KEYS = {"name", "output_root", "launcher", "preset", "overrides", "grid", "runs", "preset_overrides"}

# Sweeps ship inside the package, next to the presets, so an installed wheel has them too.
SWEEP_DIR = CONFIG_DIR / "sweeps"


def shipped_sweeps() -> list[str]:
    """Names of the sweeps shipped with the package (``vcppo/configs/sweeps/*.yaml`` stems)."""
    return sorted(p.stem for p in SWEEP_DIR.glob("*.yaml"))


def resolve_sweep(name_or_path: str | Path) -> Path:
    """A sweep file: an existing path, or a bare shipped sweep name (``ablation``)."""
    return resolve_named_file(name_or_path, SWEEP_DIR, "sweep")


def load_sweep(name_or_path: str | Path) -> tuple[Path, dict]:
    """Resolve (see :func:`resolve_sweep`) and parse a sweep file: ``(path, spec)``."""
    path = resolve_sweep(name_or_path)
    try:
        spec = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"sweep file {path} is not valid YAML: {e}") from None
    if spec is None:
        spec = {}
    if not isinstance(spec, dict):
        raise ConfigError(f"sweep file {path} must hold a mapping at the top level")
    return path, spec


def _short(key: str) -> str:
    return key.rsplit(".", 1)[-1].replace("lambda_", "lam").replace("_", "")


def _fmt_override(key: str, value) -> str:
    return f"{key}={yaml.safe_dump(value, default_flow_style=True).strip().removesuffix('...').strip()}"


def expand(sweep: dict) -> list[dict]:
    """Sweep spec -> [{"name", "preset", "overrides": [...]}], validated against the config schema."""
    unknown = set(sweep) - _TOP_KEYS
    if unknown:
        raise ConfigError(f"unknown sweep key(s) {sorted(unknown)}; valid: {sorted(_TOP_KEYS)}")
    common = list(sweep.get("overrides") or [])
    default_preset = sweep.get("preset", "vcppo")
    per_preset = sweep.get("preset_overrides") or {}
    if not isinstance(per_preset, dict):
        raise ConfigError("sweep key 'preset_overrides' must map a preset to a list of key=value overrides")
    runs = []
    grid = sweep.get("grid") or {}
    if grid:
        keys = list(grid)
        for combo in itertools.product(*(grid[k] if isinstance(grid[k], list) else [grid[k]] for k in keys)):
            point = dict(zip(keys, combo))
            preset = point.pop("preset", default_preset)
            name = "-".join([preset] + [f"{_short(k)}{v}" for k, v in point.items()])
            runs.append({"name": name, "preset": preset, "overrides": common + list(per_preset.get(preset) or [])
                         + [_fmt_override(k, v) for k, v in point.items()]})
    for item in sweep.get("runs") or []:
        item = dict(item)
        preset = item.pop("preset", default_preset)
        name = item.pop("name", None) or "-".join([preset] + [f"{_short(k)}{v}" for k, v in item.items()])
        runs.append({"name": name, "preset": preset, "overrides": common + list(per_preset.get(preset) or [])
                     + [_fmt_override(k, v) for k, v in item.items()]})
    if not runs:
        raise ConfigError("sweep defines no runs: give 'grid' and/or 'runs'")
    names = [r["name"] for r in runs]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        raise ConfigError(f"sweep run names collide: {sorted(dupes)} (set explicit names)")
    root = sweep.get("output_root", f"runs/{sweep.get('name', 'sweep')}")
    for r in runs:
        r["overrides"] += [f"trainer.output_root={root}", f"trainer.run_name={r['name']}"]
        r["overrides"] = _without_unread_critic_keys(r["preset"], r["overrides"], common)
        load_config(r["preset"], r["overrides"])  # a typo fails here, before any run starts
        r["run_dir"] = str(Path(root) / r["name"])
    return runs


def _without_unread_critic_keys(preset: str, overrides: list[str], common: list[str]) -> list[str]:
    """A run whose method builds no critic does not get the sweep-wide critic settings (``overrides``
    applied to every run): they are meant for the runs that have one. Set for that run alone, such a
    key is still an error."""
    shared = [o for o in common if o.partition("=")[0].lstrip("+") in CRITIC_KEYS]
    if not shared:
        return overrides
    method = load_config(preset, [o for o in overrides if o.partition("=")[0].lstrip("+") not in CRITIC_KEYS])
    if uses_critic(method.algorithm.advantage_estimator):
        return overrides
    return [o for o in overrides if o not in shared]


def with_overrides(sweep: dict, items: list[str]) -> dict:
    """The sweep with ``KEY=VALUE`` items applied (module docstring); the file's dict is not changed."""
    out = {**sweep, "grid": dict(sweep.get("grid") or {}), "overrides": list(sweep.get("overrides") or [])}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"sweep override {item!r} is not KEY=VALUE")
        value = yaml.safe_load(raw) if raw else None
        if key in _TOP_KEYS - {"overrides"}:
            out[key] = value
        elif key.startswith("grid."):
            out["grid"][key[len("grid."):]] = value
        else:
            out["overrides"].append(item)
    return out


def launch_command(run: dict, launcher: str) -> list[str]:
    return shlex.split(launcher) + ["train", run["preset"], *run["overrides"]]


def collect(runs: list[dict], out_root: Path) -> tuple[Path, Path, list[dict]]:
    from vcppo.report import run_summary

    rows = []
    for r in runs:
        d = Path(r["run_dir"])
        row = {"name": r["name"], "preset": r["preset"], "finished": (d / "final_metrics.json").exists()}
        if (d / "metrics.jsonl").exists():
            row.update({k: v for k, v in run_summary(d).items() if k != "run"})
            row.update(ppo_time(d))
        rows.append(row)
    keys = list(dict.fromkeys(k for row in rows for k in row))
    out_root.mkdir(parents=True, exist_ok=True)
    csv_path, md_path = out_root / "sweep_results.csv", out_root / "sweep_results.md"
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    fmt = lambda v: f"{v:.3f}" if isinstance(v, float) else ("" if v is None else str(v))  # noqa: E731
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(fmt(row.get(k)) for k in keys) + " |" for row in rows]
    md_path.write_text("\n".join(lines) + "\n" + "\n" + seed_summary(rows) + "\n")
    return md_path, csv_path, rows


def ppo_time(run_dir: Path) -> dict:
    """``ppo_minutes``: the PPO steps' own seconds summed (``time/step_s``), in minutes;
    ``entropy_end``: the actor's mean token entropy over the last fifth of the steps (a collapse
    diagnostic beside the length). Empty for a run without PPO steps."""
    from vcppo.tracking import read_metrics

    ppo = sorted(read_metrics(run_dir, "ppo"), key=lambda r: r["step"])
    if not ppo:
        return {}
    out = {"ppo_minutes": sum(float(r.get("time/step_s") or 0.0) for r in ppo) / 60.0}
    tail = [r["actor/entropy"] for r in ppo[-max(1, len(ppo) // 5):] if r.get("actor/entropy") is not None]
    if tail:
        out["entropy_end"] = sum(tail) / len(tail)
    return out


_SUMMARY_KEYS = ["start_pass@1_greedy", "final_pass@1_greedy", "final_pass@1", "final_pass@4", "length_start",
                 "length_end", "entropy_end", "explained_variance_end", "adv_position_corr_start", "ppo_minutes"]


def seed_summary(rows: list[dict]) -> str:
    """Finished runs that differ only in ``seed<N>`` grouped: mean +- std over seeds (markdown table).
    Unfinished runs are left out: their partial metrics are not comparable."""
    import re
    import statistics

    groups: dict[str, list[dict]] = {}
    for row in rows:
        if row.get("finished"):
            groups.setdefault(re.sub(r"-?seed\d+", "", row["name"]) or row["name"], []).append(row)
    keys = [k for k in _SUMMARY_KEYS if any(isinstance(r.get(k), (int, float)) for r in rows)]
    lines = ["| run | seeds | " + " | ".join(keys) + " |", "|" + "---|" * (len(keys) + 2)]
    for name, rs in groups.items():
        cells = []
        for k in keys:
            vals = [r[k] for r in rs if isinstance(r.get(k), (int, float)) and r[k] == r[k]]
            if not vals:
                cells.append("")
            elif len(vals) == 1:
                cells.append(f"{vals[0]:.3f}")
            else:
                cells.append(f"{statistics.mean(vals):.3f} ± {statistics.stdev(vals):.3f}")
        lines.append(f"| {name} | {len(rs)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
