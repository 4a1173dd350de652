"""`vcppo demo [CONFIG] [key=value ...]`: the whole pipeline on one machine, from nothing to a report.

    data -> small model -> SFT cold start -> [reward model] -> value pretraining + VC-PPO -> eval -> report
    with demo.fetch (`vcppo demo demo_real`):
    pretrained model -> data (+ a held-out harder split) -> eval -> value pretraining + VC-PPO -> eval -> report

The reward-model stage runs only for a preset whose critic starts from it (``model.critic_init:
reward_model``, e.g. ``vcppo demo model.critic_init=reward_model``, the paper's PPO baseline).

The config (default: the shipped ``demo`` preset) is resolved once and written to
``<demo.workdir>/demo_config.yaml``; every stage runs as its own process (a clean vLLM / DeepSpeed
lifetime each; on a CPU host a fork of the demo's process, which imports the libraries once for all
stages) from that one file, so ``vcppo demo trainer.total_steps=10`` changes the run
exactly as ``vcppo train ... trainer.total_steps=10`` would. A stage is skipped when its output
already exists, so an interrupted demo continues where it stopped (training itself resumes from
its last checkpoint). Sizes default to what fits ~20 minutes on a 2-core CPU.
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from vcppo.config.load import save_config
from vcppo.preflight import load_command_config
from vcppo.driver.phases import run_dir_of
from vcppo.commands.sft import target_shortfall
from vcppo.sandbox.lifeline import run_command_tied, warm_up
from vcppo.tracking import machine_info


def _run(stage: str, args: list[str], log: list) -> None:
    print(f"\n=== [{stage}] vcppo {' '.join(args)}", flush=True)
    t0 = time.time()
    rc = run_command_tied(args)  # the stage dies with the demo, however the demo ends
    if rc != 0:
        raise subprocess.CalledProcessError(rc, ["vcppo", *args])
    log.append({"stage": stage, "seconds": round(time.time() - t0, 1), "command": "vcppo " + " ".join(args)})


def _data_args(task: str, difficulty: int | None, operands: int | None) -> list[str]:
    """`vcppo data make`'s task flags (a knob left at None keeps the task's default)."""
    args = ["--task", task]
    for flag, value in (("--difficulty", difficulty), ("--operands", operands)):
        args += [flag, str(value)] if value is not None else []
    return args


def heldout_spec(value: str) -> tuple[str, int, int]:
    """One ``demo.heldout`` entry ('TASK:DIFFICULTY:OPERANDS') as its three parts; a malformed value is one
    line."""
    parts = value.split(":")
    if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
        raise SystemExit(f"demo.heldout: expected 'TASK:DIFFICULTY:OPERANDS' (e.g. arith_words:3:3), got {value!r}")
    return parts[0], int(parts[1]), int(parts[2])


def _evaluate(stage: str, config: str, model: Path, data: Path, out: Path, log: list) -> dict:
    if not out.exists():
        _run(stage, ["eval", config, f"eval.model_path={model}", f"eval.data_files={data}",
                     f"eval.output_json={out}", f"eval.samples_jsonl={out.with_suffix('.samples.jsonl')}"], log)
    return json.loads(out.read_text())


def real_pipeline(cfg, config: str, log: list) -> dict:
    """A pretrained model (``demo.fetch``), trained as it is: fetch, data (+ held-out split), eval, RL,
    eval. Returns ``{"base" | "rl": {split: metrics}}``, the splits ``test`` and one ``heldout-TASK-D-O``
    per ``demo.heldout`` entry."""
    d = cfg.demo
    heldout = [heldout_spec(value) for value in d.heldout]  # a malformed value stops before any stage
    model, data_dir, run_dir = Path(cfg.model.policy_path), Path(cfg.data.train_files).parent, run_dir_of(cfg)
    if not (model / "config.json").exists():
        _run("model", ["model", "fetch", d.fetch, "--out", str(model)], log)
    if not Path(cfg.data.train_files).exists():
        _run("data", ["data", "make", *_data_args(d.task, d.difficulty, d.operands), "--n", str(d.train_rows),
                      "--n-eval", str(cfg.eval.max_prompts), "--format", "verl", "--out", str(data_dir)], log)
    files = {"test": Path(cfg.eval.data_files)}
    for spec in heldout:
        name = "heldout-" + "-".join(map(str, spec))
        files[name] = data_dir / f"{name}.parquet"
        if not files[name].exists():
            _run(f"data-{name}", ["data", "make", *_data_args(*spec), "--split", "test", "--n",
                                  str(cfg.eval.max_prompts), "--format", "verl", "--out", str(files[name])], log)
    out = {"base": {name: _evaluate(f"eval-base-{name}", config, model, f, run_dir / f"{name}_base.json", log)
                    for name, f in files.items()}}
    if not (run_dir / "final_metrics.json").exists():
        _run("train", ["train", config], log)
    final = run_dir / "final" / "actor"
    out["rl"] = {name: _evaluate(f"eval-rl-{name}", config, final, f, run_dir / f"{name}_rl.json", log)
                 for name, f in files.items()}
    return out


def cpu_dtype(cfg):
    """``cfg`` with ``model.dtype`` float32 where the preset asks for bf16 on a CPU that has no bf16
    arithmetic (an AVX2 host emulates it: slower than fp32), said in one line."""
    import dataclasses

    import torch

    from vcppo.engines.engine_setup import cpu_has_native_bf16

    if cfg.model.dtype != "bfloat16" or torch.cuda.is_available() or cpu_has_native_bf16():
        return cfg
    print("vcppo demo: this CPU has no native bf16 (AVX-512 BF16 / AMX): training in float32 instead", flush=True)
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, dtype="float32"))


def main(argv: list[str]) -> int:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    cfg = cpu_dtype(load_command_config(argv, "demo", default_config="demo"))
    d, w = cfg.demo, Path(cfg.demo.workdir)
    config = str(save_config(cfg, w, name="demo_config.yaml"))
    if not (run_dir_of(cfg) / "final_metrics.json").exists():
        warm_up()  # several stages ahead: import once here, not once per stage
    if d.fetch:
        return _real_main(cfg, config)
    data_dir, init = Path(cfg.data.train_files).parent, Path(cfg.sft.init_model)
    sft, rm, run_dir = Path(cfg.sft.output_dir), Path(cfg.rm.output_dir), run_dir_of(cfg)
    log: list = []
    t0 = time.time()
    if not Path(cfg.data.train_files).exists():
        _run("data", ["data", "make", "--task", d.task, "--out", str(data_dir)], log)
    if not (init / "config.json").exists():
        _run("model", ["model", "make", "--size", d.model_size, "--out", str(init)], log)
    if not (sft / "sft_summary.json").exists():
        _run("sft", ["sft", config], log)
    sft_summary = json.loads((sft / "sft_summary.json").read_text())
    sft_warning = target_shortfall(sft_summary, cfg.sft.target_accuracy)
    if sft_warning:
        print(f"\n=== WARNING: {sft_warning}", flush=True)
    # The reward model is a stage only where the preset's critic starts from it (`ppo`): VC-PPO's
    # critic starts from the SFT policy and value pretraining, so the demo does not pay ~3 min for
    # an RM it never reads. `launch/ablation.sh` builds it for the `ppo` runs.
    wants_rm = cfg.model.critic_init == "reward_model"
    if wants_rm and not (rm / "rm_summary.json").exists():
        _run("rm", ["rm", config], log)
    if not (run_dir / "final_metrics.json").exists():
        _run("train", ["train", config], log)
    test_metrics = {}
    for name, model in (("sft", sft), ("rl", run_dir / "final" / "actor")):
        out = run_dir / f"test_{name}.json"
        if not out.exists():
            _run(f"eval-{name}", ["eval", config, f"eval.model_path={model}", f"eval.output_json={out}"], log)
        test_metrics[name] = json.loads(out.read_text())
    _run("report", ["report", str(run_dir), "--title", f"vcppo demo ({cfg.preset}, {d.model_size})"], log)

    summary = {"minutes": round((time.time() - t0) / 60, 1), "host": machine_info(), "stages": log,
               "test": test_metrics,
               "sft": sft_summary}
    if wants_rm:
        summary["rm"] = json.loads((rm / "rm_summary.json").read_text())
    (run_dir / "demo_summary.json").write_text(json.dumps(summary, indent=1))
    s, r = test_metrics["sft"], test_metrics["rl"]
    print(f"\n=== demo done in {summary['minutes']} min. Test greedy pass@1: SFT {s['val/pass@1_greedy']:.3f} "
          f"-> RL {r['val/pass@1_greedy']:.3f}; report: {run_dir / 'report' / 'report.md'}")
    if sft_warning:
        print(f"=== WARNING (see above): {sft_warning}")
    return 0


def _real_main(cfg, config: str) -> int:
    t0, log, run_dir = time.time(), [], run_dir_of(cfg)
    figures = real_pipeline(cfg, config, log)
    _run("report", ["report", str(run_dir), "--title", f"vcppo demo ({cfg.preset}, {cfg.demo.fetch})"], log)
    summary = {"minutes": round((time.time() - t0) / 60, 1), "host": machine_info(), "stages": log,
               "test": figures}
    (run_dir / "demo_summary.json").write_text(json.dumps(summary, indent=1))
    print(f"\n=== demo done in {summary['minutes']} min ({cfg.demo.fetch}); report: {run_dir / 'report' / 'report.md'}")
    print("| split | metric | before | after RL |\n|---|---|---|---|")
    for name in figures["base"]:
        for key in ("val/pass@1_greedy", "val/pass@1", "val/response_length_sampled"):
            print(f"| {name} | {key[4:]} | {figures['base'][name][key]:.3f} | {figures['rl'][name][key]:.3f} |")
    return 0
