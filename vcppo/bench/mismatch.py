"""`vcppo bench mismatch`: how far the sampler's (vLLM's) logprobs are from the trainer's, by dtype.

    vcppo bench mismatch [--model DIR | --size small] [--dtypes float32,bfloat16] [--prompts 32]
                         [--n 4] [--max-tokens 96] [--cap 2.0] [--device auto] [--json PATH]

Per dtype, in a fresh process (one vLLM engine per process): vLLM samples ``--prompts`` x ``--n``
responses at temperature 1 with that dtype and returns each sampled token's logprob; the DeepSpeed
actor (ZeRO-3, one rank, the same dtype, as ``model.dtype`` sets both in a run) scores the same
tokens. Reported over the sampled tokens: mean, p99 and max of |log pi_trainer - log pi_vLLM|, the
k3 estimate of KL(vLLM || trainer), and the truncated importance weights at ``--cap`` (mean, max,
share truncated) that ``algorithm.rollout_is_cap`` would apply (:mod:`vcppo.algos.mismatch`).
The prompts are random token ids, or the first rows of ``--data``; without ``--model`` the model is
a random Qwen2 of ``--size`` (``--model`` points at a trained one, e.g. the demo's SFT policy).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _parse(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="vcppo bench mismatch", description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="HF model dir (default: a random model of --size)")
    ap.add_argument("--size", default="small", help="factory size when --model is not given")
    ap.add_argument("--data", default=None, help="prompts from this file (e.g. the task's val.parquet) "
                    "instead of random token ids")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=24)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--cap", type=float, default=2.0, help="TIS cap for the weight figures")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--json", default=None, help="write the figures to this file")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # internal: one dtype, JSON out
    return ap.parse_args(argv)


def _prompts(args, vocab: int) -> list[list[int]]:
    """``--prompts`` prompts: the first rows of ``--data`` (tokenised as in training), or random ids."""
    import torch
    if args.data:
        from transformers import AutoTokenizer

        from vcppo.data.dataset import load_prompts
        rows = load_prompts(args.data, AutoTokenizer.from_pretrained(args.model), max_prompt_tokens=None,
                            shuffle_seed=None, limit=args.prompts).rows()
        return [list(r["prompt_ids"]) for r in rows]
    g = torch.Generator().manual_seed(0)
    return [[int(x) for x in torch.randint(5, min(vocab, 80), (args.prompt_len,), generator=g)]
            for _ in range(args.prompts)]


def measure(args) -> dict:
    """One dtype (``args.worker``) in this process: sample with vLLM, score with the actor."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from transformers import AutoConfig

    from vcppo.algos.mismatch import mismatch_stats, tis_weights
    from vcppo.runtime import dist
    from vcppo.engines.rollout import RolloutEngine
    from vcppo.config.schema import ActorConfig, RolloutConfig

    dtype = args.worker
    info = dist.init_distributed(args.device)
    vocab = AutoConfig.from_pretrained(args.model).vocab_size
    prompts = _prompts(args, vocab)
    t0 = time.perf_counter()
    rollout = RolloutEngine(args.model, RolloutConfig(gpu_memory_utilization=None), info, seed=0,
                            max_model_len=max(map(len, prompts)) + args.max_tokens + 8, dtype=dtype)
    samples = rollout.generate(prompts, n=args.n, temperature=1.0, top_p=1.0, max_tokens=args.max_tokens, seed=1)
    t_sample = time.perf_counter() - t0
    from vcppo.engines.actor import ActorEngine  # after vLLM: its start-up scan must precede numba/llvmlite
    from vcppo.engines.rollout import sampled_logprobs_layout
    from vcppo.experience import make_layout
    actor = ActorEngine(args.model, ActorConfig(micro_batch_size=16), info, total_optimizer_steps=1, dtype=dtype,
                        train=False)
    batch = make_layout([s.prompt_ids for s in samples], [s.response_ids for s in samples], pad_id=0,
                            device=info.device)
    sampler = sampled_logprobs_layout(samples, batch.responses.shape[1], info.device)
    t1 = time.perf_counter()
    trainer, _ = actor.forward_logprobs(batch)
    t_score = time.perf_counter() - t1
    mask = batch.policy_mask
    m = {k: float(v) for k, v in mismatch_stats(trainer, sampler, mask).items()}
    m.update({f"tis_{k}": float(v) for k, v in tis_weights(trainer, sampler, mask, args.cap)[1].items()})
    diff = (trainer.float() - sampler).abs()[mask > 0]
    m.update(dtype=dtype, device=str(info.device), tokens=int(mask.sum()), tis_cap=args.cap,
             logprob_abs_p99=float(diff.quantile(0.99)) if diff.numel() else 0.0,
             sampler_logprob_mean=float(sampler[mask > 0].mean()), sample_s=t_sample, score_s=t_score)
    rollout.close()
    dist.shutdown()
    return m


def _run_worker(args, dtype: str) -> dict:
    cmd = [sys.executable, "-m", "vcppo.bench.mismatch", "--worker", dtype, "--model", args.model,
           "--prompts", str(args.prompts), "--prompt-len", str(args.prompt_len), "--n", str(args.n),
           "--max-tokens", str(args.max_tokens), "--cap", str(args.cap), "--device", args.device]
    cmd += ["--data", args.data] if args.data else []
    res = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0"))
    lines = [line for line in res.stdout.splitlines() if line.startswith("{")]
    if res.returncode != 0 or not lines:
        return {"dtype": dtype, "error": (res.stderr or res.stdout)[-1500:]}
    return json.loads(lines[-1])


def main(argv=None) -> int:
    args = _parse(argv)
    if args.worker:
        print(json.dumps(measure(args)), flush=True)
        return 0
    if args.model is None:
        from vcppo.models.factory import make_model
        args.model = tempfile.mkdtemp(prefix="vcppo_mismatch_")
        make_model(args.size, None, args.model)
    rows = [_run_worker(args, d) for d in args.dtypes.split(",")]
    print(f"sampler (vLLM) vs trainer (DeepSpeed) logprobs of {args.prompts} x {args.n} samples, "
          f"<= {args.max_tokens} tokens; TIS cap {args.cap}")
    print(f"{'dtype':>9} {'tokens':>7} {'|d| mean':>10} {'|d| p99':>10} {'|d| max':>10} {'KL k3':>10} "
          f"{'w mean':>8} {'w max':>8} {'trunc':>7}")
    for r in rows:
        if "error" in r:
            print(f"{r['dtype']:>9} failed: {r['error'].strip().splitlines()[-1] if r['error'].strip() else '?'}")
            continue
        print(f"{r['dtype']:>9} {r['tokens']:>7} {r['logprob_abs_mean']:>10.2e} {r['logprob_abs_p99']:>10.2e} "
              f"{r['logprob_abs_max']:>10.2e} {r['kl_k3']:>10.2e} {r['tis_weight_mean']:>8.4f} "
              f"{r['tis_weight_max']:>8.4f} {r['tis_truncated_frac']:>7.4f}")
    if args.json:
        from vcppo.tracking import machine_info
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"machine": machine_info(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                                               "args": vars(args), "results": rows}, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
