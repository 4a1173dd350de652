"""`vcppo eval`: greedy pass@1 and sampled unbiased pass@k of a policy on a prompt split.

The same :func:`evaluate` serves validation inside training, the SFT driver and this command.
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from vcppo.algos.stats import pass_at_k
from vcppo.driver.experience import rank_slice, verifier_scorer
from vcppo.engines import dist as D


def evaluate(rollout, rows: list[dict], scorer, *, dist, max_tokens: int, n_samples: int, ks: list[int],
             temperature: float = 1.0, top_p: float = 1.0, stop=None, seed: int = 0,
             greedy: bool = True) -> dict:
    """Each rank evaluates its slice of ``rows`` ({"prompt_ids", "answer"}); results are merged.

    Returns ``val/pass@1_greedy`` (temperature 0), ``val/pass@k`` for each k (unbiased estimator
    over ``n_samples`` samples at ``temperature``), and mean response lengths.
    """
    _, mine = rank_slice(rows, dist.rank, dist.world_size)
    part = {"greedy_correct": [], "greedy_lengths": [], "n_correct": [], "sampled_lengths": []}
    if mine:
        ids = [r["prompt_ids"] for r in mine]
        truths = lambda samples: [mine[s.prompt_index]["answer"] for s in samples]  # noqa: E731
        if greedy:
            out = rollout.generate(ids, n=1, temperature=0.0, top_p=1.0, max_tokens=max_tokens,
                                   stop=stop, seed=seed)
            _, ok = scorer([s.text for s in out], truths(out), [s.finish_reason for s in out])
            part["greedy_correct"] = [float(x) for x in ok]
            part["greedy_lengths"] = [len(s.response_ids) for s in out]
        if n_samples > 0 and ks:
            out = rollout.generate(ids, n=n_samples, temperature=temperature, top_p=top_p,
                                   max_tokens=max_tokens, stop=stop, seed=seed + 1)
            _, ok = scorer([s.text for s in out], truths(out), [s.finish_reason for s in out])
            counts = [0] * len(mine)
            for s, c in zip(out, ok):
                counts[s.prompt_index] += int(c)
            part["n_correct"] = counts
            part["sampled_lengths"] = [len(s.response_ids) for s in out]
    merged = {k: [] for k in part}
    for p in (D.all_gather_object(part) if dist.world_size > 1 else [part]):
        for k, v in p.items():
            merged[k] += v
    res = {"val/num_prompts": float(len(rows))}
    if greedy:
        res["val/pass@1_greedy"] = float(np.mean(merged["greedy_correct"]))
        res["val/response_length_greedy"] = float(np.mean(merged["greedy_lengths"]))
    if merged["n_correct"]:
        res["val/response_length_sampled"] = float(np.mean(merged["sampled_lengths"]))
        for k in ks:
            res[f"val/pass@{k}"] = float(np.mean([pass_at_k(n_samples, c, k) for c in merged["n_correct"]]))
    return res


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="vcppo eval", description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="HF-format policy directory")
    p.add_argument("--data", required=True, help="prompts (.parquet / .jsonl / saved dataset dir)")
    p.add_argument("--max-prompts", type=int, default=256)
    p.add_argument("--n", type=int, default=8, help="samples per prompt for pass@k")
    p.add_argument("--k", default="1,4,8", help="comma-separated k values (<= n)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--max-tokens", type=int, default=384)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the metrics here too")
    args = p.parse_args(argv)
    ks = [int(k) for k in args.k.split(",") if k]
    if any(k > args.n for k in ks):
        print(f"vcppo eval: every --k must be <= --n ({args.n})", file=sys.stderr)
        return 2
    metrics = evaluate_policy(args.model, args.data, max_prompts=args.max_prompts, n_samples=args.n, ks=ks,
                              temperature=args.temperature, max_tokens=args.max_tokens, seed=args.seed)
    if D.get_info() is None or D.get_info().is_main:
        print(json.dumps(metrics, indent=1))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(metrics, f, indent=1)
    return 0


def evaluate_policy(model_dir: str, data: str, *, max_prompts: int, n_samples: int, ks: list[int],
                    temperature: float = 1.0, max_tokens: int = 384, seed: int = 0,
                    max_prompt_tokens: int = 256) -> dict:
    """Load a policy into vLLM and evaluate it on ``data``."""
    from transformers import AutoTokenizer

    from vcppo.config import RolloutConfig
    from vcppo.data.dataset import load_prompts
    from vcppo.engines.rollout import RolloutEngine
    from vcppo.rewards.verifier import RewardScorer

    dist = D.init_distributed()
    tok = AutoTokenizer.from_pretrained(model_dir)
    rows = load_prompts(data, tok, max_prompt_tokens=max_prompt_tokens, shuffle_seed=None, limit=max_prompts)
    rows = rows.rows()
    scorer = verifier_scorer(RewardScorer())
    rollout = RolloutEngine(model_dir, RolloutConfig(max_response_tokens=max_tokens), dist, seed=seed,
                            max_model_len=max_prompt_tokens + max_tokens)
    try:
        return evaluate(rollout, rows, scorer, dist=dist, max_tokens=max_tokens, n_samples=n_samples, ks=ks,
                        temperature=temperature, seed=seed)
    finally:
        rollout.close()
        D.shutdown()
