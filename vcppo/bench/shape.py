"""`vcppo bench shape`: a real model's shape through value pretraining and PPO on 2 CPU ranks.

Tiny models never exercise a 151,936-token vocabulary, bucketed gathers of real-size tensors or
gigabyte checkpoints. This builds a randomly initialised model with Qwen2.5-0.5B's published shape
(`vcppo model make --size qwen2.5-0.5b-shape`), runs `vcppo train vcppo` on ``--ranks`` processes
under torchrun (fp32, LoRA actor and critic by default: full fine-tuning of two 0.5B models does not
fit 2 ranks of a 24 GB machine, as `vcppo plan` says), then the same command with one step more,
which resumes from the last checkpoint. It reports, per rank, the peak resident memory (sampled
every 0.2 s) against `vcppo plan`'s figure for the same config on the ``cpu24`` profile; the
weight sync into vLLM against a plain in-memory copy of the same bytes; and the checkpoint's size,
write time and restore time (from the run's log).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from vcppo.bench.split import model_bytes, plain_copy_seconds
from vcppo.tracking import read_metrics

SIZE = "qwen2.5-0.5b-shape"


def _parse(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="vcppo bench shape", description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", default="runs/bench_shape", help="model, data and runs go here")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=2, help="PPO steps of the first run")
    ap.add_argument("--pretrain-steps", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=2, help="prompts per step (all ranks)")
    ap.add_argument("--n", type=int, default=2, help="samples per prompt")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--lora-rank", type=int, default=16, help="actor and critic LoRA rank (0: full fine-tuning)")
    ap.add_argument("--json", default=None)
    ap.add_argument("overrides", nargs="*", metavar="key=value", help="more `vcppo train` overrides")
    return ap.parse_args(argv)


def overrides(args, out: Path, total_steps: int) -> list[str]:
    w = Path(args.workdir).resolve()
    lora = [f"actor.lora.rank={args.lora_rank}", f"critic.lora.rank={args.lora_rank}"] if args.lora_rank else []
    return [f"model.policy_path={w}/model", "model.dtype=float32", f"data.train_files={w}/data/train.parquet",
            "data.val_files=null", f"trainer.output_root={out}", f"trainer.total_steps={total_steps}",
            f"trainer.prompts_per_step={args.prompts}", f"rollout.n_samples_per_prompt={args.n}",
            f"rollout.max_response_tokens={args.max_tokens}", "rollout.temperature=1.0",
            f"value_pretrain.steps={args.pretrain_steps}", "value_pretrain.early_stop=false",
            "value_pretrain.reuse=false", "trainer.save_every=1", "trainer.keep_last=1",
            "actor.gradient_checkpointing=true", "critic.gradient_checkpointing=true",
            "actor.micro_batch_size=2", "critic.micro_batch_size=2",
            "logging.wandb=false", "logging.progress_bar=false", *lora, *args.overrides]


def prepare(workdir: Path) -> None:
    cli = [sys.executable, "-m", "vcppo.cli"]
    if not (workdir / "data" / "train.parquet").exists():
        subprocess.run([*cli, "data", "make", "--task", "add", "--out", str(workdir / "data"), "--n", "64",
                        "--n-eval", "4"], check=True, stdout=subprocess.DEVNULL)
    if not (workdir / "model" / "config.json").exists():
        subprocess.run([*cli, "model", "make", "--size", SIZE, "--out", str(workdir / "model")], check=True,
                       stdout=subprocess.DEVNULL)


def run_watched(cmd: list[str], log: Path) -> dict:
    """Run ``cmd`` (torchrun); the peak RSS of each rank process (GiB, by RANK) and the wall time."""
    import psutil
    start = time.perf_counter()
    with open(log, "w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=dict(os.environ, OMP_NUM_THREADS="1"))
        peaks: dict[int, float] = {}
        while proc.poll() is None:
            for child in psutil.Process(proc.pid).children(recursive=True):
                try:
                    rank = int(child.environ().get("RANK", "-1"))
                    if rank >= 0:
                        peaks[rank] = max(peaks.get(rank, 0.0), child.memory_info().rss / 2 ** 30)
                except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
                    pass
            time.sleep(0.2)
    if proc.returncode != 0:
        raise RuntimeError(f"the run failed ({proc.returncode}; peak RSS by rank so far, GiB: {peaks}); its log: {log}")
    return {"rss_peak_gib": {f"rank{r}": round(v, 2) for r, v in sorted(peaks.items())},
            "wall_s": round(time.perf_counter() - start, 1)}


def logged_seconds(log: Path, pattern: str) -> list[float]:
    return [float(x) for x in re.findall(pattern, log.read_text())]


def planned(args, out: Path) -> dict:
    """`vcppo plan`'s figures for the same config on ``--ranks`` ranks of the cpu24 profile."""
    from vcppo.cli import main as vcppo_main  # `vcppo plan ...`, as a user runs it
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "plan.json"
        rc = vcppo_main(["plan", "vcppo", *overrides(args, out, args.steps), "--gpu", "cpu24", "--gpus-per-node",
                         str(args.ranks), "--json", str(path)])
        if rc != 0:
            raise SystemExit(f"vcppo bench shape: `vcppo plan` exited {rc}")
        return json.loads(path.read_text())["plan"]


def main(argv=None) -> dict:
    args = _parse(argv)
    workdir = Path(args.workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    prepare(workdir)
    out = workdir / "runs"
    subprocess.run(["rm", "-rf", str(out)], check=True)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.ranks}",
                "-m", "vcppo.cli", "train", "vcppo"]
    first = run_watched([*torchrun, *overrides(args, out, args.steps)], workdir / "first.log")
    resumed = run_watched([*torchrun, *overrides(args, out, args.steps + 1)], workdir / "resumed.log")
    run_dir = out / "vcppo-seed0"
    ckpt = sorted((run_dir / "checkpoints").glob("step_*"))[-1]
    syncs = [r["time/weight_sync_s"] for r in read_metrics(run_dir, "ppo") if "time/weight_sync_s" in r]
    nbytes = model_bytes(workdir / "model")
    result = {
        "size": SIZE, "ranks": args.ranks, "lora_rank": args.lora_rank, "first": first, "resumed": resumed,
        "weight_sync_s": syncs, "weight_bytes": nbytes, "plain_copy_s": plain_copy_seconds(nbytes),
        "checkpoint_bytes": sum(p.stat().st_size for p in ckpt.rglob("*") if p.is_file()),
        "checkpoint_write_s": logged_seconds(workdir / "first.log", r"checkpoint \S+ \(([\d.]+) s\)"),
        "restore_s": logged_seconds(workdir / "resumed.log", r"restored the engines' states in ([\d.]+) s"),
        "plan": planned(args, out),
    }
    print(json.dumps(result, indent=1))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1))
    return result
