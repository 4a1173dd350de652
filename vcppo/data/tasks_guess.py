"""Task ``guess`` (multi-turn, ``rollout.env=guess``): find a hidden number in [1, N] from "higher" /
"lower" answers within K turns (:class:`vcppo.envs.guess.GuessEnv`).

A model turn writes the interval it still believes in, then its guess: ``<think>9-16</think>12``.
The SFT demonstrations are imperfect bisections: each guess is the interval's midpoint with
probability ``MIDPOINT_P``, else a uniform pick inside it, so some demonstrations run out of turns
and RL has room: with N = 16 and K = 4 the demonstrations find 71% of the numbers,
pure bisection 15 of 16. The interval in the
think part is always right in the demonstrations: the policy learns to track the feedback, and the
critic can read it from the observations.

A row: ``prompt`` ("guess 1-16 in 4"), ``answer`` (the hidden number), ``solution`` (the SFT target:
the demonstration conversation after the prompt, the environment's answers in the chat template's
user turns exactly as the episode runner appends them), ``extra_info.env_args`` (``n``, ``max_turns``:
the env's arguments for this row). ``difficulty`` is N, ``operands`` K.
"""
from __future__ import annotations

import random

MIDPOINT_P = 0.5
# The observation frame of the project's tokenizer (ChatML, vcppo.models.tokenizer): the model's
# turn ends with <|im_end|>, then "\n", a user turn and the next assistant turn's opening; the
# episode runner derives the same frame from the template (a test checks they agree).
IM_END, USER_TURN = "<|im_end|>", "\n<|im_start|>user\n{obs}<|im_end|>\n<|im_start|>assistant\n"


def prompt_of(n: int, turns: int) -> str:
    return f"guess 1-{n} in {turns}"


def turn_text(lo: int, hi: int, guess: int) -> str:
    """A model turn: the interval it believes in, then its guess."""
    return f"<think>{lo}-{hi}</think>{guess}"


def demonstration(target: int, n: int, turns: int, rng: random.Random) -> tuple[str, bool]:
    """An imperfect bisection's conversation after the prompt (without the final end-of-turn
    token, which SFT appends) and whether it found ``target``."""
    lo, hi, parts = 1, n, []
    for turn in range(turns):
        guess = (lo + hi) // 2 if rng.random() < MIDPOINT_P else rng.randint(lo, hi)
        parts.append(turn_text(lo, hi, guess))
        if guess == target:
            return "".join(parts), True
        if turn == turns - 1:
            break
        feedback = "higher" if guess < target else "lower"
        lo, hi = (guess + 1, hi) if guess < target else (lo, guess - 1)
        parts.append(IM_END + USER_TURN.format(obs=feedback))
    return "".join(parts), False


def generate_rows(split: str, n_rows: int, n: int, turns: int, seed: int) -> list[dict]:
    """``n_rows`` rows of ``split``: a hidden number each, deterministic in (n, turns, split, seed).
    Every row shares the prompt, so splits are drawn apart by their seed, not by a prompt hash."""
    rng = random.Random(f"guess|{n}|{turns}|{split}|{seed}")
    rows = []
    for _ in range(n_rows):
        target = rng.randint(1, n)
        solution, found = demonstration(target, n, turns, rng)
        rows.append({"prompt": prompt_of(n, turns), "answer": str(target), "solution": solution, "task": "guess",
                     "difficulty": n, "demo_found": found,
                     "extra_info": {"env_args": {"n": n, "max_turns": turns}}})
    return rows
