"""``guess``: find a hidden number in [1, N] from "higher" / "lower" answers within K turns.

The row's ``answer`` column holds the hidden number; ``n`` and ``max_turns`` come from the env's
arguments (``rollout.env_args``) or the row's ``env_args`` column. A turn's action is read as the
last integer in the policy's text (after ``</think>`` when there is one). The outcome reward is
+1 when the number is found and -1 when the turns run out; ``shaped`` adds ``step_penalty`` per
turn that did not find it (a per-turn reward, which sits on that turn's last model token).
"""
from __future__ import annotations

import re

_INT = re.compile(r"-?\d+")


def parse_guess(action: str) -> int | None:
    """The policy's guess: the last integer of its answer (the text after ``</think>``, if any)."""
    text = action.rsplit("</think>", 1)[-1]
    found = _INT.findall(text)
    return int(found[-1]) if found else None


class GuessEnv:
    def __init__(self, n: int = 16, max_turns: int = 6, shaped: bool = False, step_penalty: float = -0.1):
        self.n, self.max_turns, self.shaped, self.step_penalty = int(n), int(max_turns), shaped, float(step_penalty)
        self.target, self.turn = None, 0

    def reset(self, row: dict, seed: int) -> tuple[str, dict]:
        self.target, self.turn = int(row["answer"]), 0
        if not 1 <= self.target <= self.n:
            raise ValueError(f"guess: the hidden number {self.target} is outside [1, {self.n}]")
        return "", {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        self.turn += 1
        guess = parse_guess(action)
        if guess == self.target:
            return "correct", 1.0, True, False, {"solved": True}
        if self.turn >= self.max_turns:
            return "out of turns", -1.0, False, True, {}
        feedback = "no number" if guess is None else ("higher" if guess < self.target else "lower")
        return feedback, self.step_penalty if self.shaped else 0.0, False, False, {}
