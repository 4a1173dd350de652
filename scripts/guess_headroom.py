"""How much explained variance can a critic reach on `guess`? (docs/results.md, "Does a critic read the
feedback of an episode?")

The outcome of a `guess` episode (+1 found, -1 not) is decided by the policy's guesses and the hidden
number. A critic sees the prompt, its own turns and the env's answers, never the number: the best it can
do at any model token is V*(interval still possible, turns left) = P(found | that state) under the
policy. This script computes V* exactly for the demonstrations' policy (the interval's midpoint with
probability ``--midpoint``, else a number drawn uniformly inside it; vcppo.data.tasks_guess), plays
``--episodes`` episodes with it, values each turn's ``--tokens-per-turn`` model tokens at the state before
the turn's guess, and prints the explained variance of the returns that this oracle critic reaches,
pooled over model tokens as the trainer logs it (critic/explained_variance).

    python scripts/guess_headroom.py [--n 16] [--turns 4] [--midpoint 0.5] [--episodes 20000]
"""
from __future__ import annotations

import argparse
import functools
import json
import random


def oracle(n: int, midpoint: float):
    @functools.lru_cache(maxsize=None)
    def v(lo: int, hi: int, left: int) -> float:
        """P(found) with the number uniform in [lo, hi] and ``left`` turns to go."""
        if left == 0 or lo > hi:
            return 0.0
        size, total = hi - lo + 1, 0.0
        picks = [((lo + hi) // 2, midpoint)] + [(g, (1 - midpoint) / size) for g in range(lo, hi + 1)]
        for g, p in picks:
            below, above = (g - lo) / size, (hi - g) / size
            total += p * (1 / size + below * v(lo, g - 1, left - 1) + above * v(g + 1, hi, left - 1))
        return total
    return v


def headroom(n: int = 16, turns: int = 4, midpoint: float = 0.5, episodes: int = 20000, tokens_per_turn: int = 12,
             seed: int = 0) -> dict:
    v, rng = oracle(n, midpoint), random.Random(seed)
    values, returns, wins = [], [], 0
    for _ in range(episodes):
        target, lo, hi, states, found = rng.randint(1, n), 1, n, [], False
        for turn in range(turns):
            states.append(v(lo, hi, turns - turn))
            guess = (lo + hi) // 2 if rng.random() < midpoint else rng.randint(lo, hi)
            if guess == target:
                found = True
                break
            lo, hi = (guess + 1, hi) if guess < target else (lo, guess - 1)
        wins += found
        ret = 1.0 if found else -1.0
        for p in states:  # the expected return 2p - 1 at every model token of the turn
            values += [2 * p - 1] * tokens_per_turn
            returns += [ret] * tokens_per_turn
    mean = sum(returns) / len(returns)
    var = sum((r - mean) ** 2 for r in returns) / len(returns)
    mse = sum((r - x) ** 2 for r, x in zip(returns, values)) / len(returns)
    return {"found_rate": wins / episodes, "oracle_ev": 1 - mse / var, "value_at_start": 2 * v(1, n, turns) - 1,
            "n": n, "turns": turns, "midpoint": midpoint, "episodes": episodes}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--midpoint", type=float, default=0.5)
    ap.add_argument("--episodes", type=int, default=20000)
    ap.add_argument("--tokens-per-turn", type=int, default=12)
    args = ap.parse_args(argv)
    out = headroom(args.n, args.turns, args.midpoint, args.episodes, args.tokens_per_turn)
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
