"""The Python parts of ``launch/gpu_check.sh``; each writes one JSON file of figures.

    python -m vcppo.bench.gpu_check bf16 OUT.json
    python -m vcppo.bench.gpu_check sleep-wake OUT.json [--model DIR]
    python -m vcppo.bench.gpu_check gae-bandwidth BENCH_GAE.json OUT.json
    python -m vcppo.bench.gpu_check train-summary RUN_DIR OUT.json

``bf16``: the device supports bf16, and a bf16 matmul / log-softmax against fp32 (the error the
sampler and the trainer see). ``sleep-wake``: vLLM through :class:`RolloutEngine` in bf16 frees
device memory on ``sleep()`` and, after ``wake_up()``, greedy outputs are unchanged.
``gae-bandwidth``: achieved bandwidth of each GAE implementation of a ``vcppo bench gae`` JSON
against the copy floor's (the same 5 fp32 (B, T) arrays moved). ``train-summary``: per-step
figures of a run's metrics.jsonl (rollout tokens/s, memory peak, mismatch / TIS, phase seconds).
``bf16``, ``gae-bandwidth`` and ``train-summary`` also run on CPU (tested there).
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


def sleep_wake(model: str | None) -> dict:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import torch

    if not torch.cuda.is_available():
        return {"skipped": "no CUDA device (sleep / wake are no-ops on CPU)"}
    from vcppo.engines import dist
    from vcppo.engines.rollout import RolloutEngine
    from vcppo.schema import RolloutConfig

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
    ap.add_argument("part", choices=("bf16", "sleep-wake", "gae-bandwidth", "train-summary"))
    ap.add_argument("paths", nargs="+", help="inputs (gae-bandwidth: bench JSON; train-summary: run dir), then OUT")
    ap.add_argument("--model", default=None)
    args = ap.parse_args(argv)
    *inputs, out = args.paths
    if args.part == "bf16":
        res = bf16_check()
    elif args.part == "sleep-wake":
        res = sleep_wake(args.model)
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
