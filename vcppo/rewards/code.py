"""Code-execution reward: the response's program runs against the row's test cases, each case in
its own sandbox (:mod:`vcppo.sandbox.bwrap`).

The program is the last fenced block (```` ```python ... ``` ```` or ```` ``` ... ``` ````) of the text
after the last ``</think>``; without a fence, that whole text. The ground truth (a row's ``answer``:
verl's ``reward_model.ground_truth``) is a JSON object (or a Python literal of one) with either

- ``inputs`` and ``outputs``: lists of equal length; case i feeds ``inputs[i]`` on stdin and
  expects ``outputs[i]`` on stdout (compared line by line with trailing whitespace and trailing
  empty lines dropped), the format of verl's code datasets (``prime_code``, Sandbox Fusion), or
- ``assert_case`` (or MBPP's ``test_list``): snippets such as ``assert add(2, 3) == 5``; case i runs
  the program followed by snippet i and passes when it exits cleanly;

and optionally ``time_limit`` (seconds per case, at most ``MAX_CASE_TIMEOUT_S``; default
``CASE_TIMEOUT_S``). ``fn_name`` (call-based cases) is not read: such a row raises, so it counts as
a reward failure rather than scoring silently.

``score``: ``correct`` (1.0) when every case passes, else ``wrong`` (-1.0), as the math verifier.
``pass_rate``: the share of cases passed, in [0, 1] (partial credit). A truncated response
(``finish_reason == "length"``) scores ``wrong`` / 0.0. Run in the reward pool
(``reward.num_workers``), a program that holds its reward past ``reward.timeout_s`` (say a loop in
every one of many cases) is a counted timeout, its worker replaced and its sandboxes killed with it.
Rows of your own route here by ``data_source``: ``reward.functions_by_source.SOURCE=vcppo.rewards.code:score``.
"""
from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from typing import Any

from vcppo.sandbox.bwrap import Limits, run

THINK_CLOSE = "</think>"
CASE_TIMEOUT_S = 2.0
MAX_CASE_TIMEOUT_S = 10.0
MAX_CASES = 64
CASE_LIMITS = {"memory_mb": 512, "max_processes": 8, "max_file_mb": 8}
_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


@dataclass(frozen=True)
class Case:
    """One test: ``stdin`` fed and ``expected`` stdout (stdin/stdout format), or ``check`` code
    appended to the program (assert format)."""
    stdin: str = ""
    expected: str | None = None
    check: str | None = None


def extract_program(response_text: str) -> str | None:
    """The program of a response (module docstring); None when there is nothing to run."""
    if not isinstance(response_text, str):
        return None
    tail = response_text.rsplit(THINK_CLOSE, 1)[-1]
    blocks = _FENCE.findall(tail)
    program = blocks[-1] if blocks else tail
    return program if program.strip() else None


def _as_object(ground_truth: Any) -> dict:
    if isinstance(ground_truth, dict):
        return ground_truth
    text = str(ground_truth)
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            raise ValueError(f"code ground truth is neither JSON nor a Python literal: {text[:80]!r}") from None
    if not isinstance(value, dict):
        raise ValueError(f"code ground truth must be an object, got {type(value).__name__}")
    return value


def parse_cases(ground_truth: Any) -> tuple[list[Case], float]:
    """(the cases, the time limit per case) of a ground truth; ValueError naming what is wrong."""
    truth = _as_object(ground_truth)
    if "fn_name" in truth:
        raise ValueError("code ground truth with 'fn_name' (call-based cases) is not supported")
    if "inputs" in truth or "outputs" in truth:
        inputs, outputs = truth.get("inputs"), truth.get("outputs")
        if not (isinstance(inputs, list) and isinstance(outputs, list) and len(inputs) == len(outputs)):
            raise ValueError("code ground truth: 'inputs' and 'outputs' must be lists of equal length")
        cases = [Case(stdin=str(i), expected=str(o)) for i, o in zip(inputs, outputs)]
    else:
        snippets = truth.get("assert_case", truth.get("test_list"))
        if not isinstance(snippets, list):
            raise ValueError("code ground truth needs 'inputs' / 'outputs' or 'assert_case' (or 'test_list')")
        cases = [Case(check=str(s)) for s in snippets]
    if not 0 < len(cases) <= MAX_CASES:
        raise ValueError(f"code ground truth has {len(cases)} cases (1..{MAX_CASES})")
    limit = truth.get("time_limit", CASE_TIMEOUT_S)
    if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not limit > 0:
        raise ValueError(f"code ground truth: 'time_limit' must be a positive number, got {limit!r}")
    return cases, min(float(limit), MAX_CASE_TIMEOUT_S)


def _same_output(got: str, expected: str) -> bool:
    def lines(text: str) -> list[str]:
        out = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
        while out and not out[-1]:
            out.pop()
        return out
    return lines(got) == lines(expected)


def passes(program: str, case: Case, limits: Limits) -> bool:
    """Whether ``program`` passes one case in the sandbox."""
    if case.check is not None:
        return run(f"{program}\n\n{case.check}\n", limits=limits).ok
    done = run(program, stdin=case.stdin, limits=limits)
    return done.ok and _same_output(done.stdout, case.expected or "")


def score(response_text: str, ground_truth: Any, finish_reason: str | None = None, correct: float = 1.0,
          wrong: float = -1.0, **_: Any) -> float:
    """``correct`` when the program passes every case, else ``wrong`` (module docstring)."""
    cases, timeout_s = parse_cases(ground_truth)
    program = extract_program(response_text)
    if finish_reason == "length" or program is None:
        return wrong
    limits = Limits(timeout_s=timeout_s, **CASE_LIMITS)
    return correct if all(passes(program, case, limits) for case in cases) else wrong


def pass_rate(response_text: str, ground_truth: Any, finish_reason: str | None = None, **_: Any) -> float:
    """The share of cases the program passes, in [0, 1]: partial credit (0.0 when the response was cut
    at the length limit or holds no program)."""
    cases, timeout_s = parse_cases(ground_truth)
    program = extract_program(response_text)
    if finish_reason == "length" or program is None:
        return 0.0
    limits = Limits(timeout_s=timeout_s, **CASE_LIMITS)
    return sum(passes(program, case, limits) for case in cases) / len(cases)
