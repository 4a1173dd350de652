"""Score a plain-words answer by the last number the response writes (the ``arith`` tasks' reward).

An instruct model asked to 'Put the final answer after "####"' writes ``The final answer after
"####" is 32.``: verl's strict gsm8k scorer wants ``#### 32`` and gives it 0, and verl's flexible one
reads ``32.`` (the sentence's period) and gives it 0 too. This scorer takes the last number in the
response (thousands commas dropped, a sentence's closing period not part of it) and compares it
with the ground truth as a number: 1.0 if equal, else 0.0 (verl's gsm8k scores). A response cut at
the length limit is scored on what it holds, as verl does.
"""
from __future__ import annotations

import re
from typing import Any

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
TAIL_CHARS = 300  # as verl's gsm8k scorers, only the end of a response is read


def last_number_in(text: str) -> str | None:
    """The last number of ``text``'s last ``TAIL_CHARS`` characters, commas dropped; None if none."""
    found = _NUMBER.findall(text[-TAIL_CHARS:])
    return found[-1].replace(",", "") if found else None


def last_number(response_text: str | None, ground_truth: Any, **_: Any) -> float:
    """1.0 when the last number of ``response_text`` equals ``ground_truth`` (as numbers), else 0.0."""
    got = last_number_in(response_text or "")
    if got is None:
        return 0.0
    try:
        return 1.0 if float(got) == float(str(ground_truth).replace(",", "")) else 0.0
    except ValueError:
        return 0.0
