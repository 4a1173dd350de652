"""`vcppo bench split`: colocated vs split placement on the same cores, modes alternated in one run.

    vcppo bench split [--workload tail|demo] [--modes colocated,split0,split1] [--ranks 2]
                      [--steps 5] [--rounds 1] [--workdir DIR] [--json PATH] [--png PATH]

Each mode is a real `vcppo train vcppo` run of ``--ranks`` processes under torchrun (one thread
each, so the modes share the same cores the same way):

* ``colocated``: every rank samples its share with vLLM, then trains (ZeRO-3 over all ranks);
* ``split0``: the last rank only samples, the others only train, synchronously
  (``placement.mode=split trainer.max_staleness=0``: the colocated run's samples, in another place);
* ``split1``: the same with ``trainer.max_staleness=1``: batch k+1 is sampled while batch k trains;
* ``split1c``: ``split1`` with the critic on ranks of its own (``placement.critic_ranks``): one
  critic process beside each training process, so ``--ranks 2`` runs 3 processes on the same cores.

The workload: the factory's ``small`` model (the demo's size, random weights) with vcppo's
char tokenizer on the ``add`` prompts, sampled at temperature 1. A random model stops where it
happens to draw EOS, so response lengths are geometric: ``tail`` allows up to 1,024 tokens
(lengths from a few tokens to the cap: the long tail of CoT), ``demo`` the demo's 128.
Value pretraining is off unless ``--pretrain-steps N``: then its steps are timed too (the policy
is frozen, so a split run samples one batch ahead there at no off-policy cost).

Figures per mode (rounds alternate the modes, A B C A B C): steps per hour and response tokens
per second over PPO steps 2..N (step 1 includes start-up), each against ``colocated``; value
pretraining's steps per hour over its steps 2..N; per rank, the seconds busy by phase
(``logging.timeline``) and idle; for split runs, the weight transfer (the actor's bytes, the
seconds the rollout rank spends receiving them) against a plain in-memory copy of the same bytes.
``--png``: the last round's timelines, one row per rank.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from vcppo.driver.step.timeline import busy_seconds, clip, read_timelines
from vcppo.runtime.launch_env import free_port

MODES = {"colocated": ["placement.mode=colocated"],
         "split0": ["placement.mode=split", "trainer.max_staleness=0"],
         "split1": ["placement.mode=split", "trainer.max_staleness=1"],
         "split1c": ["placement.mode=split", "trainer.max_staleness=1"]}  # + critic ranks (run_command)
WORKLOADS = {"tail": 1024, "demo": 128}  # max response tokens


def _parse(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="vcppo bench split", description=__doc__.split("\n")[0])
    ap.add_argument("--workload", default="tail", choices=sorted(WORKLOADS))
    ap.add_argument("--modes", default="colocated,split0,split1", help=f"a comma list of {', '.join(MODES)}")
    ap.add_argument("--ranks", type=int, default=2, help="processes per run (split: the last one samples; "
                    "split1c adds a critic process per training process)")
    ap.add_argument("--steps", type=int, default=5, help="PPO steps per run; the figures skip step 1")
    ap.add_argument("--prompts", type=int, default=8, help="prompts per step")
    ap.add_argument("--n", type=int, default=4, help="samples per prompt")
    ap.add_argument("--size", default="small", help="model size (vcppo.models.factory.SIZES)")
    ap.add_argument("--rounds", type=int, default=1, help="the modes alternated this many times")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pretrain-steps", type=int, default=0, help="value-pretraining steps before PPO (0: off)")
    ap.add_argument("--workdir", default="runs/bench_split", help="model, data and the runs")
    ap.add_argument("--json", default=None)
    ap.add_argument("--png", default=None, help="draw the last round's per-rank timelines here")
    args = ap.parse_args(argv)
    unknown = [m for m in args.modes.split(",") if m not in MODES]
    if unknown:
        ap.error(f"unknown mode(s) {unknown}: choose from {', '.join(MODES)}")
    return args


def prepare(workdir: Path, size: str, seed: int) -> None:
    """The model and the prompts, as `vcppo model make` / `vcppo data make` write them."""
    cli = [sys.executable, "-m", "vcppo.cli"]
    if not (workdir / "data" / "train.parquet").exists():
        subprocess.run([*cli, "data", "make", "--task", "add", "--out", str(workdir / "data"), "--n", "512",
                        "--n-eval", "16", "--seed", str(seed)], check=True, stdout=subprocess.DEVNULL)
    if not (workdir / f"model-{size}" / "config.json").exists():
        subprocess.run([*cli, "model", "make", "--size", size, "--out", str(workdir / f"model-{size}"),
                        "--seed", str(seed)], check=True, stdout=subprocess.DEVNULL)


def processes(ranks: int, mode: str) -> int:
    """Processes of one mode's run: ``ranks``, plus a critic rank per training rank in ``split1c``."""
    return 2 * ranks - 1 if mode == "split1c" else ranks


def run_command(args, mode: str, out: Path) -> list[str]:
    """The torchrun command line of one mode's run."""
    w = Path(args.workdir)
    overrides = [f"model.policy_path={w}/model-{args.size}",
                 "model.dtype=float32", f"data.train_files={w}/data/train.parquet", "data.val_files=null",
                 f"trainer.output_root={out}", f"trainer.total_steps={args.steps}", f"trainer.seed={args.seed}",
                 f"trainer.prompts_per_step={args.prompts}", f"rollout.n_samples_per_prompt={args.n}",
                 f"rollout.max_response_tokens={WORKLOADS[args.workload]}", "rollout.temperature=1.0",
                 *_pretrain_overrides(args.pretrain_steps), "trainer.save_every=0", "trainer.val_every=0",
                 "algorithm.rollout_is_cap=2.0", "logging.timeline=true", "logging.wandb=false",
                 "logging.progress_bar=false", *MODES[mode]]
    if mode == "split1c":
        overrides.append(f"placement.critic_ranks={args.ranks - 1}")
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={processes(args.ranks, mode)}",
            f"--master_port={free_port()}", "-m", "vcppo.cli", "train", "vcppo", *overrides]


def _pretrain_overrides(steps: int) -> list[str]:
    if not steps:
        return ["value_pretrain.enabled=false"]
    return [f"value_pretrain.steps={steps}", "value_pretrain.early_stop=false", "value_pretrain.reuse=false"]


def _steps_per_hour(records: list[dict]) -> float | None:
    """Over steps 2..N of one phase's records (step 1 includes start-up)."""
    return 3600 * (len(records) - 1) / (records[-1]["time"] - records[0]["time"]) if len(records) > 2 else None


def weight_transfers(rows: list[dict]) -> dict | None:
    """The rollout rank's weight receptions: how many, and their mean seconds (None: none)."""
    spans = [r["end"] - r["start"] for r in rows if r["name"] == "receive_weights"]
    return {"count": len(spans), "mean_s": sum(spans) / len(spans)} if spans else None


def plain_copy_seconds(nbytes: int, repeats: int = 5) -> float:
    """The best of ``repeats`` in-memory copies of ``nbytes`` (the floor a transfer is held against)."""
    import time

    import torch
    src = torch.empty(nbytes, dtype=torch.uint8).fill_(1)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        src.clone()
        best = min(best, time.perf_counter() - start)
    return best


def model_bytes(model_dir: Path) -> int:
    """The bytes of a model's weights as saved (what one transfer carries when trained in that dtype)."""
    from safetensors.torch import load_file
    return sum(t.numel() * t.element_size() for path in model_dir.glob("*.safetensors")
               for t in load_file(str(path)).values())


def figures(run_dir: Path, samples_per_step: int) -> dict:
    """Steps per hour and response tokens/s over PPO steps 2..N; busy seconds by rank and phase."""
    records = sorted((json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()),
                     key=lambda r: r["step"])
    ppo = [r for r in records if r["phase"] == "ppo" and "perf/response_tokens" in r]
    pretrain = [r for r in records if r["phase"] == "value_pretrain"]
    span = ppo[-1]["time"] - ppo[0]["time"]
    tokens = sum(r["perf/response_tokens"] for r in ppo[1:])
    rows = read_timelines(run_dir)
    window = clip(rows, ppo[0]["time"], ppo[-1]["time"])
    pretrain_rate = _steps_per_hour(pretrain)
    busy = {f"rank{rank}/{name}": round(s, 3) for (rank, name), s in sorted(busy_seconds(window).items())}
    return {"steps_per_hour": 3600 * (len(ppo) - 1) / span, "response_tokens_per_s": tokens / span,
            "seconds": span, "steps": len(ppo) - 1,
            "mean_response_tokens": tokens / (samples_per_step * (len(ppo) - 1)),
            "busy_s": busy, "window": [ppo[0]["time"], ppo[-1]["time"]],
            "pretrain_steps_per_hour": pretrain_rate, "weight_transfer": weight_transfers(rows)}


def draw(runs: dict[str, Path], windows: dict[str, list], path: Path) -> None:
    """One panel per mode, one row per rank: busy intervals coloured by phase, gaps idle."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(runs), 1, figsize=(11, 1.6 + 1.1 * len(runs) * 2), squeeze=False)
    colours: dict[str, str] = {}
    palette = plt.get_cmap("tab20").colors  # up to 20 phase names (a critic rank adds its own)
    for ax, (mode, run_dir) in zip(axes[:, 0], runs.items()):
        t0, t1 = windows[mode]
        rows = clip(read_timelines(run_dir), t0, t1)
        ranks = sorted({r["rank"] for r in rows})
        for r in rows:
            name = "wait for batch" if r["role"] == "train" and r["name"] == "rollout" else r["name"]
            colour = colours.setdefault(name, palette[len(colours) % len(palette)])
            ax.broken_barh([(r["start"] - t0, r["end"] - r["start"])], (ranks.index(r["rank"]) - 0.4, 0.8),
                           color=colour, label=name)
        ax.set_yticks(range(len(ranks)), [f"rank {k} ({next(r['role'] for r in rows if r['rank'] == k)})"
                                          for k in ranks])
        ax.set_title(f"{mode}: steps 2..N, white = idle", fontsize=9)
        ax.set_xlim(0, max(b - a for a, b in windows.values()))  # one scale: panel lengths compare
    handles = {}  # one legend entry per phase name, over every panel
    for ax in axes[:, 0]:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=min(6, len(handles)), fontsize=8)
    axes[-1, 0].set_xlabel("seconds")
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path, dpi=110)


def main(argv=None) -> dict:
    args = _parse(argv)
    workdir = Path(args.workdir).resolve()
    args.workdir = str(workdir)
    prepare(workdir, args.size, args.seed)
    # DS_ACCELERATOR as the caller set it: unset, each rank's init_distributed picks cpu off CUDA
    env = dict(os.environ, OMP_NUM_THREADS="1", VLLM_ENABLE_V1_MULTIPROCESSING="0", WANDB_MODE="offline",
               TOKENIZERS_PARALLELISM="false")
    modes = args.modes.split(",")
    results: dict[str, list[dict]] = {m: [] for m in modes}
    last: dict[str, Path] = {}
    for round_ in range(args.rounds):
        for mode in modes:
            out = workdir / "runs" / f"{args.workload}-{mode}-r{round_}"
            subprocess.run(["rm", "-rf", str(out)], check=True)
            res = subprocess.run(run_command(args, mode, out), env=env, capture_output=True, text=True)
            if res.returncode != 0:
                sys.stderr.write(res.stderr[-4000:])
                raise SystemExit(f"vcppo bench split: the {mode} run failed (exit {res.returncode}); log above")
            last[mode] = out / f"vcppo-seed{args.seed}"
            results[mode].append(figures(last[mode], args.prompts * args.n))
            f = results[mode][-1]
            print(f"[round {round_}] {mode:10s} {f['steps_per_hour']:8.1f} steps/h  "
                  f"{f['response_tokens_per_s']:8.1f} response tok/s  ({f['steps']} steps, {f['seconds']:.1f} s, "
                  f"{f['mean_response_tokens']:.0f} tokens/sample)", flush=True)
    summary = _summarise(results)
    for mode, s in summary.items():
        pretrain = f"  value pretraining {s['pretrain_steps_per_hour']:.1f} steps/h" \
            if s.get("pretrain_steps_per_hour") else ""
        print(f"{mode:10s} {s['steps_per_hour']:8.1f} steps/h ({s['vs_colocated']:.2f}x colocated)  "
              f"{s['response_tokens_per_s']:8.1f} response tok/s{pretrain}")
    transfer = _transfer_figures(results, workdir / f"model-{args.size}")
    if transfer:
        print(f"weights: {transfer['bytes'] / 2**20:.1f} MiB per transfer; the rollout rank receives them in "
              f"{1e3 * transfer['receive_s']:.1f} ms ({transfer['receive_gb_per_s']:.2f} GB/s), a plain copy takes "
              f"{1e3 * transfer['plain_copy_s']:.1f} ms ({transfer['plain_copy_gb_per_s']:.2f} GB/s)")
    out = {"workload": args.workload, "max_response_tokens": WORKLOADS[args.workload], "ranks": args.ranks,
           "steps": args.steps, "prompts": args.prompts, "n": args.n, "size": args.size, "summary": summary,
           "weight_transfer": transfer, "runs": results}
    if args.png:
        draw(last, {m: results[m][-1]["window"] for m in modes}, Path(args.png))
        print(f"timeline: {args.png}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return out


def _transfer_figures(results: dict[str, list[dict]], model_dir: Path) -> dict | None:
    """The split runs' mean reception time against a plain copy of the same bytes."""
    seen = [r["weight_transfer"] for runs in results.values() for r in runs if r.get("weight_transfer")]
    if not seen:
        return None
    nbytes = model_bytes(model_dir)
    receive = sum(t["mean_s"] * t["count"] for t in seen) / sum(t["count"] for t in seen)
    copy = plain_copy_seconds(nbytes)
    return {"bytes": nbytes, "receive_s": receive, "plain_copy_s": copy, "receive_gb_per_s": nbytes / receive / 1e9,
            "plain_copy_gb_per_s": nbytes / copy / 1e9}


def _summarise(results: dict[str, list[dict]]) -> dict:
    """Per mode, the mean over rounds; the ratio of steps per hour against colocated's."""
    out = {}
    for mode, runs in results.items():
        out[mode] = {k: sum(r[k] for r in runs) / len(runs) for k in ("steps_per_hour", "response_tokens_per_s")}
        rates = [r["pretrain_steps_per_hour"] for r in runs if r.get("pretrain_steps_per_hour")]
        out[mode]["pretrain_steps_per_hour"] = sum(rates) / len(rates) if rates else None
    base = out.get("colocated", {}).get("steps_per_hour")
    for s in out.values():
        s["vs_colocated"] = s["steps_per_hour"] / base if base else float("nan")
    return out
