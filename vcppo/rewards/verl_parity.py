"""verl's default rule scorers for standard math data, reimplemented, so a verl-format row scores
here what it scores in verl (``reward.verl_parity=true``; off by default: our verifier,
:mod:`vcppo.rewards.verifier`, scores every row unless told otherwise).

Each is a reward function ``fn(response_text, ground_truth, **info) -> float`` like any other
(``finish_reason``, ``data_source`` and the rest of ``info`` are ignored, as verl ignores them).
None of them strips a ``<think>`` part, none reads ``reward.correct_score`` / ``wrong_score``, and
a truncated response is scored on what it holds.

- ``gsm8k`` (verl ``verl/utils/reward_score/gsm8k.py``, ``method="strict"``): the LAST
  ``#### <number>`` (``-?[0-9.,]+`` right after ``#### `` with one space) within the response's
  last 300 characters, commas dropped, equal as text to the ground truth: 1.0; else (no such
  line, or another number; ``#### 72.`` is not ``72``) 0.0.
- ``math`` (verl ``verl/utils/reward_score/math_reward.py``): the last ``\\boxed{...}`` of the
  whole response, compared with the ground truth after the Hendrycks string normalisation
  (:func:`vcppo.rewards.verl_normalise.hendrycks_equal`): 1.0, else 0.0. Quirks kept: when
  ``\\boxed `` (with a space) appears anywhere, the answer is the text after its last occurrence up
  to a ``$``; a final ``\\fbox{...}`` is found but cannot be unwrapped upstream, so scores 0.0.
- ``math_dapo`` (verl ``verl/utils/reward_score/math_dapo.py``, the Minerva check): within the
  last 300 characters, the last ``Answer: ...`` (case-insensitive, the rest of its line), normalised
  as the ground truth is (:func:`vcppo.rewards.verl_normalise.dapo_normalise`) and equal as text:
  +1.0, else -1.0. A ``\\boxed{}`` on its own is not read.

``VERL_DATA_SOURCES`` maps data_sources to them as verl's ``default_compute_score``
(``verl/utils/reward_score/__init__.py``) routes: ``openai/gsm8k``; ``lighteval/MATH``,
``DigitalLearningGmbH/MATH-lighteval``, ``HuggingFaceH4/MATH-500``; ``math_dapo``, ``math``,
``math_dapo_reasoning`` and every source starting with ``aime`` (the key ``aime*``:
:class:`vcppo.rewards.routing.SourceTable`). verl's code sources (``codecontests``, ``apps``,
``codeforces``, ``taco``), which it scores by the share of test cases passed, go to
:func:`vcppo.rewards.code.pass_rate`: the same measure, not bit for bit (our sandbox and our output
comparison, not ``prime_code``'s).
"""
from __future__ import annotations

import re
from typing import Any

from vcppo.rewards.verl_normalise import dapo_normalise, hendrycks_equal

TAIL_CHARS = 300  # gsm8k and math_dapo read only this much of the end of a response
_GSM8K_FINAL = re.compile(r"#### (-?[0-9.,]+)")
_ANSWER_LINE = re.compile(r"answer\s*:\s*([^\n]+)", re.IGNORECASE)
_NO_ANSWER = "[INVALID]"  # what math_dapo compares when there is no Answer: line, as upstream does

_HERE = "vcppo.rewards.verl_parity"
VERL_DATA_SOURCES: dict[str, str] = {
    "openai/gsm8k": f"{_HERE}:gsm8k",
    "lighteval/MATH": f"{_HERE}:math",
    "DigitalLearningGmbH/MATH-lighteval": f"{_HERE}:math",
    "HuggingFaceH4/MATH-500": f"{_HERE}:math",
    "math_dapo": f"{_HERE}:math_dapo",
    "math": f"{_HERE}:math_dapo",
    "math_dapo_reasoning": f"{_HERE}:math_dapo",
    "aime*": f"{_HERE}:math_dapo",
    **{source: "vcppo.rewards.code:pass_rate" for source in ("codecontests", "apps", "codeforces", "taco")},
}


def functions_by_source(user: dict[str, str], verl_parity: bool) -> dict[str, str]:
    """The scorer's ``{data_source: "module:function"}``: with ``verl_parity``, ``VERL_DATA_SOURCES``
    under the user's own entries (which win, ``aime*`` included); without, the user's alone."""
    return {**(VERL_DATA_SOURCES if verl_parity else {}), **dict(user)}


def gsm8k_final_number(text: str, last: bool = True) -> str | None:
    """The number after ``#### `` (the last one, or with ``last=False`` the first, as verl's GSM8K
    preprocessing takes it), commas dropped; None without one."""
    found = _GSM8K_FINAL.findall(text)
    if not found:
        return None
    return (found[-1] if last else found[0]).replace(",", "")


def gsm8k(response_text: str, ground_truth: Any, **_: Any) -> float:
    """verl's strict GSM8K score (module docstring): 1.0 or 0.0."""
    if not isinstance(response_text, str):
        return 0.0
    number = gsm8k_final_number(response_text[-TAIL_CHARS:])
    return 1.0 if number is not None and number == str(ground_truth) else 0.0


def last_box(text: str) -> str | None:
    """The last box of ``text`` as upstream's ``last_boxed_only_string`` finds it, box command
    included: ``\\boxed `` (space) anywhere wins; else the last ``\\boxed`` (or, without one, the last
    ``\\fbox``) through the brace that closes its first group; None if there is none or it never closes."""
    if "\\boxed " in text:
        return "\\boxed " + text.split("\\boxed ")[-1].split("$")[0]
    start = text.rfind("\\boxed")
    if start < 0:
        start = text.rfind("\\fbox")
        if start < 0:
            return None
    depth = 0
    for end in range(start, len(text)):
        if text[end] == "{":
            depth += 1
        elif text[end] == "}":
            depth -= 1
            if depth == 0:
                return text[start:end + 1]
    return None


def unbox(box: str) -> str | None:
    """The content of ``\\boxed{...}`` / ``\\boxed ...`` from :func:`last_box`; None for any other
    form (``\\fbox{...}``, ``\\boxed\\n{...}``), which upstream's ``remove_boxed`` rejects."""
    if "\\boxed " in box:
        return box[len("\\boxed "):] if box.startswith("\\boxed ") else None
    if box.startswith("\\boxed{") and box.endswith("}"):
        return box[len("\\boxed{"):-1]
    return None


def math(response_text: str, ground_truth: Any, **_: Any) -> float:
    """verl's MATH score (module docstring): 1.0 or 0.0."""
    if not isinstance(response_text, str) or ground_truth is None:
        return 0.0
    box = last_box(response_text)
    answer = unbox(box) if box is not None else None
    return 1.0 if answer is not None and hendrycks_equal(answer, str(ground_truth)) else 0.0


def math_dapo(response_text: str, ground_truth: Any, **_: Any) -> float:
    """verl's DAPO / AIME score (module docstring): +1.0 or -1.0."""
    if not isinstance(response_text, str) or ground_truth is None:
        return -1.0
    found = _ANSWER_LINE.findall(response_text[-TAIL_CHARS:])
    prediction = dapo_normalise(found[-1] if found else _NO_ANSWER)
    return 1.0 if prediction == dapo_normalise(str(ground_truth)) else -1.0
