"""`vcppo bench step`: one real PPO step (`vcppo.driver.step.rl_step.rl_step`), timed by phase; with
``--trl``, TRL's PPOTrainer side by side on the same model, tokenizer, prompts and batch.

    vcppo bench step [--size small] [--micro-batch 16,64] [--steps 6] [--prompts 16 --n 4]
                     [--max-tokens 128] [--kl-coef 0.05] [--threads 2] [--trl] [--rounds 1]
                     [--workdir DIR] [--json PATH]

The workload: the factory's ``--size`` model built from config with vcppo's char
tokenizer (= `vcppo model make`), prompts of the ``add`` task (= `vcppo data make`) read by our
prompt loader, ``--prompts`` x ``--n`` samples of at most ``--max-tokens`` response tokens
(stopping at EOS), KL on (a reference pass, k1 estimator), 1 epoch, 1 mini-batch, fp32,
``--threads`` threads, ``--micro-batch`` sequences per pass (each setting is measured).

vcppo's side runs in a fresh process with a RunContext built exactly as `vcppo train` builds it
(preset ``vcppo``, value pretraining off, no validation, no checkpoints) and calls ``rl_step``
``--steps`` times: whatever the engines and the driver do today is what is measured. TRL's side
(:mod:`vcppo.bench.trl_step`, needs ``pip install -e .[trl]``) runs in another process. With
``--rounds`` > 1 the two sides alternate (A B A B) so drift in a shared machine's load hits both.
Figures: the median over steps 2..N (step 1 warms up) of the step's wall time, its phases, and
response tokens per second; the vcppo / TRL ratio of step time and of time per response token.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# The driver's phase timers (time/<phase>_s, driver/step/rl_step.py), in step order.
VCPPO_PHASES = ("rollout", "old_logprobs", "ref_logprobs", "values", "advantages", "critic_update",
                "actor_update", "weight_sync")


def _parse(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="vcppo bench step", description=__doc__.split("\n")[0])
    ap.add_argument("--size", default="small", help="model size (vcppo.models.factory.SIZES)")
    ap.add_argument("--micro-batch", default="16", help="sequences per pass; a comma list measures each")
    ap.add_argument("--steps", type=int, default=6, help="steps per process; the median skips step 1")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--n", type=int, default=4, help="samples per prompt")
    ap.add_argument("--max-tokens", type=int, default=128, help="response tokens at most")
    ap.add_argument("--kl-coef", type=float, default=0.05, help="> 0: a reference pass (TRL's default 0.05)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--trl", action="store_true", help="also run TRL's PPOTrainer (the `trl` extra)")
    ap.add_argument("--rounds", type=int, default=1, help="vcppo / TRL processes alternated this many times")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", default=None, help="model + data here (kept; default: a temp dir)")
    ap.add_argument("--profile", type=int, default=0, metavar="ROWS",
                    help="torch.profiler over the last step: print the top ROWS operators by self CPU time")
    ap.add_argument("--json", default=None)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="an extra `vcppo train` override of the vcppo side (repeatable), e.g. "
                         "algorithm.old_logprobs_from_sampler=true")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # "vcppo|trl,WORKDIR,MB,OUT_JSON"
    return ap.parse_args(argv)


def prepare_workdir(workdir: Path, size: str, seed: int) -> dict:
    """The model and the prompts, as `vcppo model make` / `vcppo data make` write them."""
    from vcppo.models.factory import count_params, make_model

    model_dir, data_dir = workdir / f"model-{size}", workdir / "data"
    if not (data_dir / "train.parquet").exists():
        subprocess.run([sys.executable, "-m", "vcppo.cli", "data", "make", "--task", "add", "--out", str(data_dir),
                        "--n", "512", "--n-eval", "16", "--seed", str(seed)], check=True, stdout=subprocess.DEVNULL)
    params = count_params(make_model(size, None, model_dir, seed=seed))
    return {"model_dir": str(model_dir), "train_files": str(data_dir / "train.parquet"), "params": params}


def train_overrides(args, workdir: Path, micro_batch: int) -> list[str]:
    """`vcppo train vcppo KEY=VALUE ...` of the benchmark's workload."""
    mb = micro_batch
    return [f"model.policy_path={workdir}/model-{args.size}", "model.dtype=float32",
            f"data.train_files={workdir}/data/train.parquet", "data.val_files=null",
            f"rollout.n_samples_per_prompt={args.n}", f"rollout.max_response_tokens={args.max_tokens}",
            f"actor.micro_batch_size={mb}", f"critic.micro_batch_size={mb}", f"reference.micro_batch_size={mb}",
            "actor.ppo_epochs=1", "actor.ppo_mini_batches=1", "critic.ppo_epochs=1", "critic.ppo_mini_batches=1",
            f"algorithm.kl_coef={args.kl_coef}", "algorithm.kl_estimator=k1",
            f"trainer.prompts_per_step={args.prompts}", f"trainer.total_steps={args.steps}",
            "trainer.val_every=0", "trainer.save_every=0", "trainer.resume=never", f"trainer.seed={args.seed}",
            f"trainer.output_root={workdir}/runs", f"trainer.run_name=bench-step-mb{mb}",
            "value_pretrain.enabled=false", "logging.wandb=false", "logging.progress_bar=false", *args.set]


def run_vcppo(args, workdir: Path, micro_batch: int) -> dict:
    """``--steps`` calls of the driver's rl_step on a RunContext built as `vcppo train` builds it."""
    import torch

    from vcppo.preflight import load_command_config
    from vcppo.driver.state import RunState
    from vcppo.driver.context import RunContext
    from vcppo.driver.step.step_plan import ppo_plan
    from vcppo.driver.phases import run_dir_of
    from vcppo.config.placement import Placement
    from vcppo.driver.step.rl_step import rl_step

    torch.set_num_threads(args.threads)
    cfg = load_command_config(["vcppo", *train_overrides(args, workdir, micro_batch)], "train", default_config=None)
    t0 = time.perf_counter()
    placement = Placement.of(cfg)
    ctx = RunContext.create(cfg, run_dir_of(cfg), placement)
    plan = ppo_plan(cfg, ctx.dist.device, placement)
    maker = placement.source(ctx, plan)
    steps, startup_s, profile_table = [], time.perf_counter() - t0, None
    state = RunState(phase="ppo")
    try:
        for step in range(1, args.steps + 1):
            profiling = bool(args.profile) and step == args.steps
            t = time.perf_counter()
            with _profiler(profiling) as prof:
                m = rl_step(ctx, maker, plan, state, step)
            wall = time.perf_counter() - t
            if profiling:
                profile_table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.profile)
            phases = {k[len("time/"):-2]: v for k, v in m.items() if k.startswith("time/") and k != "time/step_s"}
            steps.append({"step_s": wall, "phases": phases, "response_tokens": m["perf/response_tokens"]})
    finally:
        ctx.close()
    return {"side": "vcppo", "startup_s": startup_s, "torch_threads": torch.get_num_threads(), "steps": steps,
            "profile": profile_table}


def _profiler(on: bool):
    """torch.profiler (CPU activity) around one step, or nothing."""
    import contextlib

    import torch.profiler as tp
    return tp.profile(activities=[tp.ProfilerActivity.CPU]) if on else contextlib.nullcontext()


def summarize(run: dict) -> dict:
    """Medians over steps 2..N (all steps when there is only one)."""
    timed = run["steps"][1:] or run["steps"]
    step_s = statistics.median(s["step_s"] for s in timed)
    tokens = statistics.median(s["response_tokens"] for s in timed)
    names = list(dict.fromkeys(k for s in timed for k in s["phases"]))
    phases = {k: statistics.median(s["phases"].get(k, 0.0) for s in timed) for k in names}
    per_token = statistics.median(s["step_s"] / max(s["response_tokens"], 1) for s in timed)
    return {"step_s": step_s, "phases": phases, "response_tokens": tokens,
            "tokens_per_s": 1.0 / per_token, "s_per_token": per_token, "steps_timed": len(timed)}


def _spawn(side: str, argv: list[str], workdir: Path, micro_batch: int, threads: int) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), VLLM_ENABLE_V1_MULTIPROCESSING="0",
               TRL_EXPERIMENTAL_SILENCE="1")
    module = "vcppo.bench.step" if side == "vcppo" else "vcppo.bench.trl_step"
    cmd = [sys.executable, "-m", module, *argv, "--worker", f"{side},{workdir},{micro_batch},{out}"]
    subprocess.run(cmd, check=True, env=env)
    with open(out) as f:
        return json.load(f)


def _merge(runs: list[dict]) -> dict:
    """One side's processes as one: every timed step of every round."""
    steps = [s for r in runs for s in (r["steps"][1:] or r["steps"])]
    merged = summarize({"steps": [steps[0]] + steps}) if len(steps) > 1 else summarize({"steps": steps})
    merged["rounds"] = [summarize(r) for r in runs]
    merged["startup_s"] = [r.get("startup_s") for r in runs]
    for key in ("computes", "profile"):
        if runs[0].get(key):
            merged[key] = runs[-1][key]
    return merged


def main(argv=None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parse(argv)
    if args.worker:
        side, workdir, mb, out = args.worker.split(",")
        result = run_vcppo(args, Path(workdir), int(mb))
        Path(out).write_text(json.dumps(result))
        return result
    if args.trl:
        try:
            import trl  # noqa: F401
        except ImportError:
            raise SystemExit("vcppo bench step --trl: TRL is not installed (pip install -e '.[trl]')")
    holder = None if args.workdir else tempfile.TemporaryDirectory(prefix="vcppo_bench_step_")
    workdir = Path(args.workdir or holder.name).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    from vcppo.tracking import machine_info
    results = {"config": {k: v for k, v in vars(args).items() if k not in ("worker", "json", "workdir")},
               "host": machine_info(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "settings": {}}
    results["model"] = prepare_workdir(workdir, args.size, args.seed)
    sides = ("vcppo", "trl") if args.trl else ("vcppo",)
    for mb in (int(x) for x in args.micro_batch.split(",")):
        runs: dict[str, list] = {s: [] for s in sides}
        for _ in range(args.rounds):  # A B A B
            for side in sides:
                runs[side].append(_spawn(side, argv, workdir, mb, args.threads))
        row = {side: _merge(r) for side, r in runs.items()}
        if args.trl:
            v, t = row["vcppo"], row["trl"]
            row["ratio_step"] = v["step_s"] / t["step_s"]
            row["ratio_per_token"] = v["s_per_token"] / t["s_per_token"]
        results["settings"][f"mb{mb}"] = row
        print_setting(mb, row, results["model"]["params"])
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    if holder is not None:
        holder.cleanup()
    return results


def print_setting(mb: int, row: dict, params: int) -> None:
    print(f"\nmicro-batch {mb} | {params / 1e6:.2f}M params | median of {row['vcppo']['steps_timed']} steps")
    for side, r in ((s, row[s]) for s in ("vcppo", "trl") if s in row):
        split = ", ".join(f"{k} {v:.2f}" for k, v in r["phases"].items())
        print(f"  {side:<6} step {r['step_s']:6.2f} s | {r['response_tokens']:.0f} response tokens, "
              f"{r['tokens_per_s']:.0f} tok/s | {split}")
        if "computes" in r:
            print(f"         ({r['computes']})")
        if r.get("profile"):
            print(f"  torch.profiler, {side}'s last step, by self CPU time:\n{r['profile']}")
    if "ratio_step" in row:
        print(f"  vcppo / TRL: step time {row['ratio_step']:.2f}, time per response token "
              f"{row['ratio_per_token']:.2f} (< 1: vcppo faster; speedup {1 / row['ratio_step']:.2f}x / "
              f"{1 / row['ratio_per_token']:.2f}x)")


if __name__ == "__main__":
    main()
