"""`vcppo bench reward`: scoring a batch serially (in the trainer) vs in the reward pool.

The batch mixes what a policy emits: boxed integers, bare final answers, ``answer:`` lines,
fractions that need math-verify, truncated and answer-less responses, and ``--hostile`` power
towers (``\\boxed{9^{9^{9^{9}}}}``) that math-verify gives up on only after ~5 s of one C call.

    vcppo bench reward [--samples 512] [--hostile 4] [--workers 1,2] [--timeout 5] [--json PATH]

For each pool size it reports the pool's start-up (in training it overlaps the engines' start)
and the batch's wall time (both paths warmed up: math-verify imported, a worker ready), and checks that the rewards equal the serial ones on every
non-hostile sample.
"""
from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

from vcppo.rewards.verifier import RewardScorer

HOSTILE = "\\boxed{9^{9^{9^{9}}}}"


def make_batch(samples: int, hostile: int, seed: int = 0) -> tuple[list[str], list[str], list[str], set[int]]:
    """(texts, truths, finish reasons, indices of the hostile samples)."""
    rng = random.Random(seed)
    texts, truths, finish = [], [], []
    for _ in range(samples):
        a, b = rng.randint(1, 999), rng.randint(1, 9)
        guess = a if rng.random() < 0.6 else a + 1
        kind = rng.randrange(6)
        think = f"<think>{'step ' * rng.randint(20, 200)}</think>"
        tail = [f"\\boxed{{{guess}}}", f"\n\n{guess}", f"answer: {guess}",
                f"\\boxed{{\\frac{{{guess * b}}}{{{b}}}}}", "no idea", f"\\boxed{{{guess}}}"][kind]
        texts.append(think + tail)
        truths.append(str(a))
        finish.append("length" if kind == 5 else "stop")
    bad = set(rng.sample(range(samples), hostile))
    for i in bad:
        texts[i] = "<think>x</think>" + HOSTILE
    return texts, truths, finish, bad


def _time_scorer(scorer: RewardScorer, batch) -> tuple[float, list[float], dict]:
    texts, truths, finish, _ = batch
    start = time.perf_counter()
    rewards, metrics = scorer(texts, truths, finish)
    return time.perf_counter() - start, rewards, metrics


def _parse(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="vcppo bench reward", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=512)
    ap.add_argument("--hostile", type=int, default=4, help="power-tower answers among the samples")
    ap.add_argument("--workers", default="1,2", help="pool sizes to time, comma-separated")
    ap.add_argument("--timeout", type=float, default=5.0, help="reward.timeout_s of the pool")
    ap.add_argument("--json", default=None, help="write the figures to this file")
    return ap.parse_args(argv)


def main(argv=None) -> dict:
    args = _parse(argv)
    batch = make_batch(args.samples, args.hostile)
    others = [i for i in range(args.samples) if i not in batch[3]]
    serial = RewardScorer()
    serial(["<think></think>\\boxed{\\frac{2}{4}}"], ["1/2"])  # warm-up: math-verify's imports, as the workers'
    serial_s, serial_rewards, _ = _time_scorer(serial, batch)
    out = {"samples": args.samples, "hostile": args.hostile, "timeout_s": args.timeout,
           "serial_s": round(serial_s, 3), "pool": []}
    print(f"{args.samples} samples ({args.hostile} hostile): serial {serial_s:.2f} s")
    for n in (int(w) for w in args.workers.split(",")):
        start = time.perf_counter()
        scorer = RewardScorer(num_workers=n, timeout_s=args.timeout)
        scorer([batch[0][others[0]]], [batch[1][others[0]]])  # returns once a worker is ready
        startup_s = time.perf_counter() - start
        try:
            pool_s, rewards, metrics = _time_scorer(scorer, batch)
        finally:
            scorer.close()
        same = all(rewards[i] == serial_rewards[i] for i in others)
        row = {"workers": n, "startup_s": round(startup_s, 3), "batch_s": round(pool_s, 3),
               "speedup": round(serial_s / pool_s, 2), "timeouts": metrics["reward/num_timeouts"],
               "same_rewards_on_the_rest": same}
        out["pool"].append(row)
        print(f"pool of {n}: start-up {startup_s:.2f} s, batch {pool_s:.2f} s ({serial_s / pool_s:.1f}x), "
              f"{int(row['timeouts'])} timeouts, rewards equal to serial on the rest: {same}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=1))
    return out
