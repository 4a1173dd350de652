"""The Python parts of ``launch/gpu_check.sh``; each writes one JSON file of figures.

    python -m vcppo.bench.gpu_check bf16 OUT.json
    python -m vcppo.bench.gpu_check sleep-wake OUT.json [--model DIR]
    python -m vcppo.bench.gpu_check gae-bandwidth BENCH_GAE.json OUT.json
    python -m vcppo.bench.gpu_check train-summary RUN_DIR OUT.json
    python -m vcppo.bench.gpu_check summary RUN_DIR PLAN.json [BENCH_STEP.json] OUT.json [--checkpointing]

``bf16``: the device supports bf16, and a bf16 matmul / log-softmax against fp32 (the error the
sampler and the trainer see). ``sleep-wake``: vLLM through :class:`RolloutEngine` in bf16 frees
device memory on ``sleep()`` and, after ``wake_up()``, greedy outputs are unchanged.
``gae-bandwidth``: achieved bandwidth of each GAE implementation of a ``vcppo bench gae`` JSON
against the copy floor's (the same 5 fp32 (B, T) arrays moved). ``train-summary``: per-step
figures of a run's metrics.jsonl (rollout tokens/s, memory peak, mismatch / TIS, phase seconds).
``summary``: the check's one JSON (:func:`step_summary`): each PPO phase's median time and MFU, the
run's peak memory next to `vcppo plan`'s need for the same config, and `vcppo bench step --trl`'s
vcppo / TRL ratios. ``bf16``, ``gae-bandwidth``, ``train-summary`` and ``summary`` also run on CPU
(tested there).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ARRAYS_MOVED = 5  # GAE reads rewards, values, mask and writes advantages, returns (fp32 each)


def bf16_check(device: str | None = None) -> dict:
    import torch

    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(512, 512, generator=g).to(dev) for _ in range(2))
    exact = a @ b
    low = (a.bfloat16() @ b.bfloat16()).float()
    logits = torch.randn(64, 4096, generator=g).to(dev) * 3
    lp32 = torch.log_softmax(logits, -1)
    lp16 = torch.log_softmax(logits.bfloat16().float(), -1)  # bf16 logits, fp32 softmax (as the trainer)
    return {"device": str(dev), "name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
            "bf16_supported": bool(torch.cuda.is_bf16_supported()) if dev.type == "cuda" else True,
            "matmul_rel_err": float((low - exact).norm() / exact.norm()),
            "logprob_abs_err_mean": float((lp16 - lp32).abs().mean()),
            "logprob_abs_err_max": float((lp16 - lp32).abs().max())}


def gae_bandwidth(bench: dict) -> dict:
    """GB/s of every timed implementation and of the floor, per shape, from `vcppo bench gae --json`."""
    rows = []
    for r in bench["results"]:
        nbytes = ARRAYS_MOVED * 4 * r["B"] * r["T"]
        gbps = lambda ms: nbytes / (ms / 1e3) / 1e9  # noqa: E731
        row = {"B": r["B"], "T": r["T"], "device": r["device"], "bytes": nbytes,
               "floor_gb_s": gbps(r["floor"]["median_ms"])}
        for key, fig in r.items():
            if key.startswith("fused_") and isinstance(fig, dict):
                impl = key[len("fused_"):]
                row[f"{impl}_gb_s"] = gbps(fig["median_ms"])
                row[f"{impl}_share_of_floor"] = r["floor"]["median_ms"] / fig["median_ms"]
        rows.append(row)
    return {"arrays_moved": ARRAYS_MOVED, "rows": rows}


def train_summary(run_dir: str) -> dict:
    from vcppo.tracking import read_metrics

    keep = ("perf/rollout_tokens_per_s", "perf/tokens_per_s", "perf/gpu_mem_peak_gb", "time/step_s",
            "mismatch/logprob_abs_mean", "mismatch/logprob_abs_max", "mismatch/kl_k3", "mismatch/tis_weight_mean",
            "mismatch/tis_weight_max", "mismatch/tis_truncated_frac", "reward/mean", "response/length_mean")
    out = {}
    for phase in ("value_pretrain", "ppo"):
        recs = sorted(read_metrics(run_dir, phase), key=lambda r: r["step"])
        out[phase] = [{"step": r["step"], **{k: r[k] for k in keep if k in r},
                       "phase_s": {k[5:-2]: round(v, 3) for k, v in r.items()
                                   if k.startswith("time/") and k.endswith("_s") and k != "time/step_s"}}
                      for r in recs]
    return out


# FLOPs per token of each phase, in units of the policy's parameter count N: a forward 2 N, an update
# 6 N (forward + backward), 8 N with gradient checkpointing (the forward once more).
FORWARD_PHASES = ("rollout", "old_logprobs", "ref_logprobs", "values")
UPDATE_PHASES = ("actor_update", "critic_update")


def phase_mfu(phase_s: dict, tokens: float, params: int, peak_flops: float, checkpointing: bool) -> dict:
    """{phase: model-FLOPs utilisation} for the phases of known cost, counted on ``tokens`` tokens
    (the check passes a step's response tokens: a lower bound, prompt tokens also cost)."""
    out = {}
    for phase, seconds in phase_s.items():
        per_token = 2 if phase in FORWARD_PHASES else (8 if checkpointing else 6) if phase in UPDATE_PHASES else None
        if per_token is not None and seconds > 0:
            out[phase] = per_token * params * tokens / seconds / peak_flops
    return out


def step_summary(run_dir: str, plan: dict, bench: dict | None, checkpointing: bool) -> dict:
    """Median phase seconds over the PPO steps after the first, their MFU against the plan's
    accelerator peak (bf16 or fp32, the plan's dtype), the peak device memory against the plan's
    largest need, and the bench's vcppo / TRL ratios per micro-batch setting."""
    import statistics

    steps = train_summary(run_dir)["ppo"]
    timed = steps[1:] or steps
    if not timed:
        raise SystemExit(f"gpu_check summary: no PPO step in {run_dir}/metrics.jsonl")
    names = list(dict.fromkeys(k for s in timed for k in s["phase_s"]))
    phase_s = {k: statistics.median(s["phase_s"].get(k, 0.0) for s in timed) for k in names}
    recs = {r["step"]: r for r in read_metrics_rows(run_dir)}
    tokens = statistics.median(recs[s["step"]].get("perf/response_tokens", 0.0) for s in timed)
    hw, params = plan["plan"]["cluster"]["hardware"], plan["params"]["policy"]
    peak = hw["flops_bf16"] if plan["plan"]["dtype_bytes"] == 2 else hw["flops_fp32"]
    mem = [s["perf/gpu_mem_peak_gb"] for s in steps if "perf/gpu_mem_peak_gb" in s]
    out = {"steps": len(steps), "steps_timed": len(timed), "step_s": statistics.median(s["time/step_s"] for s in timed),
           "phase_s": phase_s, "response_tokens": tokens, "policy_params": params, "accelerator": hw["name"],
           "peak_flops": peak, "mfu_over_response_tokens": phase_mfu(phase_s, tokens, params, peak, checkpointing),
           "peak_memory_gib": max(mem) if mem else None,
           "plan_need_gib": {c["phase"]: c["need_bytes"] / 2 ** 30 for c in plan["plan"]["checks"]},
           "plan_step_s": plan["plan"]["time"]["step_s"]}
    if bench is not None:
        out["bench_step"] = {name: {k: row[k] for k in row if k.startswith("ratio")} |
                             {side: {"step_s": row[side]["step_s"], "tokens_per_s": row[side]["tokens_per_s"]}
                              for side in ("vcppo", "trl") if side in row}
                             for name, row in bench["settings"].items()}
    return out


def read_metrics_rows(run_dir: str) -> list[dict]:
    from vcppo.tracking import read_metrics
    return read_metrics(run_dir, "ppo")


def sleep_wake(model: str | None) -> dict:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import torch

    if not torch.cuda.is_available():
        return {"skipped": "no CUDA device (sleep / wake are no-ops on CPU)"}
    from vcppo.runtime import dist
    from vcppo.engines.rollout import RolloutEngine
    from vcppo.config.schema import RolloutConfig

    if model is None:
        from vcppo.models.factory import make_model
        model = tempfile.mkdtemp(prefix="vcppo_sleep_")
        make_model("tiny", None, model)
    info = dist.init_distributed("cuda")
    rollout = RolloutEngine(model, RolloutConfig(gpu_memory_utilization=0.3), info, seed=0, max_model_len=256,
                            dtype="bfloat16")
    prompts = [[5 + i, 6, 7, 8] for i in range(8)]
    gen = lambda: [s.response_ids for s in rollout.generate(prompts, n=1, temperature=0.0, top_p=1.0,  # noqa: E731
                                                              max_tokens=32)]
    before = gen()
    free = lambda: torch.cuda.mem_get_info()[0] / 2 ** 30  # noqa: E731
    awake_free = free()
    rollout.sleep()
    asleep_free = free()
    rollout.wake_up()
    woken_free = free()
    after = gen()
    rollout.close()
    dist.shutdown()
    return {"free_gb_awake": awake_free, "free_gb_asleep": asleep_free, "free_gb_woken": woken_free,
            "freed_by_sleep_gb": asleep_free - awake_free, "same_greedy_outputs": before == after,
            "ok": asleep_free > awake_free and before == after}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m vcppo.bench.gpu_check", description=__doc__.split("\n")[0])
    ap.add_argument("part", choices=("bf16", "sleep-wake", "gae-bandwidth", "train-summary", "summary"))
    ap.add_argument("paths", nargs="+", help="inputs (gae-bandwidth: bench JSON; train-summary: run dir; "
                                             "summary: run dir, plan JSON, [bench step JSON]), then OUT")
    ap.add_argument("--model", default=None)
    ap.add_argument("--checkpointing", action="store_true", help="summary: the run checkpointed activations")
    args = ap.parse_args(argv)
    *inputs, out = args.paths
    if args.part == "bf16":
        res = bf16_check()
    elif args.part == "sleep-wake":
        res = sleep_wake(args.model)
    elif args.part == "summary":
        bench = json.loads(Path(inputs[2]).read_text()) if len(inputs) > 2 and Path(inputs[2]).exists() else None
        res = step_summary(inputs[0], json.loads(Path(inputs[1]).read_text()), bench, args.checkpointing)
    elif args.part == "gae-bandwidth":
        res = gae_bandwidth(json.loads(Path(inputs[0]).read_text()))
    else:
        res = train_summary(inputs[0])
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=1))
    return 0 if res.get("ok", True) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
