"""Task ``chain``: add 2..K numbers with running sums; the policy chooses how long it reasons.

Why a second task: on ``add`` every correct answer has the same length, so PPO's length collapse
(arXiv 2503.01491 sec. 3) cannot happen. Here the number of operands varies across prompts
(2..``max_operands``, uniform), so the full trace runs from ~20 to ~230 tokens, and there are
three ways to reason, all of which SFT sees::

    prompt:  sum(4821,39,702,15)=?
    full:    <think>                 one line per operand: previous running sum + next operand
             4821+39=4860
             4860+702=5562
             5562+15=5577
             </think>
             \\boxed{5577}
    skip:    <think>                 pairs of steps merged: two operands per line
             4821+39+702=5562
             5562+15=5577
             </think>
             \\boxed{5577}
    direct:  <think>
             </think>
             \\boxed{5577}

Why this shape:

* length is the policy's choice: a shorter style is a valid response, not a malformed one, so a
  critic biased toward early tokens (sec. 3.1) has shorter responses to select;
* shorter costs accuracy on hard prompts: a merged line asks a 2M-parameter model for a
  three-term sum in one go, and a direct answer asks for the whole sum at once;
* a wrong step shows at once: every line's result is checkable from the prompt and the line
  above (``first_wrong_line``), and the error carries to the end (the next line starts from the
  wrong running sum), so an error-aware critic can see the outcome mid-trace;
* the SFT data mixes the styles (``STYLE_MIX``), so RL can move length either way.

The prompt is ``sum(a,b,...)=?`` so it never parses as an ``add`` prompt (``a+b=?``).
"""
from __future__ import annotations

import random
import re
from typing import Callable, Sequence

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
DEFAULT_MAX_OPERANDS = 12
DEFAULT_DIGITS = 4  # operands have 1..DIGITS digits
# Share of SFT traces per style: mostly full reasoning, enough shortened traces to move length.
STYLE_MIX = (("full", 0.6), ("skip", 0.25), ("direct", 0.15))

_PROMPT_RE = re.compile(r"sum\((\d+(?:,\d+)+)\)=\?")
_LINE_RE = re.compile(r"^(\d+(?:\+\d+)+)=(\d+)$")
_BOXED_RE = re.compile(r"\\boxed\{([^{}]*)\}")


def prompt_of(operands: Sequence[int]) -> str:
    return "sum(" + ",".join(map(str, operands)) + ")=?"


def parse_prompt(prompt: str) -> list[int] | None:
    m = _PROMPT_RE.fullmatch(prompt.strip())
    return [int(x) for x in m.group(1).split(",")] if m else None


def trace_lines(operands: Sequence[int], style: str = "full") -> list[str]:
    """``full``: one operand per line; ``skip``: two per line; ``direct``: no lines."""
    per_line = {"full": 1, "skip": 2, "direct": 0}[style]
    if per_line == 0:
        return []
    lines, total, i = [], operands[0], 1
    while i < len(operands):
        terms = list(operands[i:i + per_line])
        new = total + sum(terms)
        lines.append("+".join(map(str, [total, *terms])) + f"={new}")
        total, i = new, i + per_line
    return lines


def solution(operands: Sequence[int], style: str = "full") -> str:
    body = "".join(line + "\n" for line in trace_lines(operands, style))
    return f"{THINK_OPEN}\n{body}{THINK_CLOSE}\n\\boxed{{{sum(operands)}}}"


def sample_operands(rng: random.Random, max_operands: int, digits: int = DEFAULT_DIGITS) -> list[int]:
    k = rng.randint(2, max_operands)
    return [rng.randint(0, 10 ** rng.randint(1, digits) - 1) for _ in range(k)]


def sample_style(rng: random.Random) -> str:
    x, acc = rng.random(), 0.0
    for style, share in STYLE_MIX:
        acc += share
        if x < acc:
            return style
    return STYLE_MIX[-1][0]


def line_errors(operands: Sequence[int], lines: Sequence[str]):
    """(line index, its errors) per line, in order; stops after a malformed line.

    A line is right when its first term is the running sum so far (the first operand on line
    1), the other terms are the next operands in prompt order, and its result is their sum. One
    or two operands per line are allowed (full or skip style; they may mix).
    """
    total, used = operands[0], 1
    for i, line in enumerate(lines):
        m = _LINE_RE.match(line.strip())
        if m is None:
            yield i, [f"line {i + 1} malformed: {line!r}"]
            return
        terms, result = [int(t) for t in m.group(1).split("+")], int(m.group(2))
        errors = []
        if terms[0] != total:
            errors.append(f"line {i + 1}: starts from {terms[0]}, running sum is {total}")
        nxt = list(operands[used:used + len(terms) - 1])
        if len(terms) - 1 > 2:
            errors.append(f"line {i + 1}: {len(terms) - 1} operands in one step (at most 2)")
        if terms[1:] != nxt:
            errors.append(f"line {i + 1}: adds {terms[1:]}, next operands are {nxt}")
        if result != sum(terms):
            errors.append(f"line {i + 1}: {'+'.join(map(str, terms))} != {result}")
        total, used = result, used + len(terms) - 1
        yield i, errors


def check_trace(prompt: str, response: str) -> list[str]:
    """Every error of a response (empty: the trace is right and the boxed answer is the sum).
    A trace with lines must consume every operand; no lines at all (direct) is allowed."""
    operands = parse_prompt(prompt)
    if operands is None:
        return [f"prompt not in the chain format: {prompt!r}"]
    lines = _think_lines(response)
    if lines is None:
        return ["no <think>...</think> block"]
    errors: list[str] = []
    for _, errs in line_errors(operands, lines):
        errors.extend(errs)
    if lines and not errors and _consumed(operands, lines) != len(operands):
        errors.append(f"trace adds {_consumed(operands, lines)} of {len(operands)} operands")
    boxed = _BOXED_RE.findall(response.rsplit(THINK_CLOSE, 1)[-1])
    truth = str(sum(operands))
    if not boxed:
        errors.append("no \\boxed{} answer after </think>")
    elif boxed[-1] != truth:
        errors.append(f"boxed answer {boxed[-1]} != {truth}")
    return errors


def style_of(prompt: str, response: str) -> str:
    """``direct`` (no lines), ``full`` (one operand per line), ``skip`` (any merged line), or
    ``other`` (malformed / no think block): how the response chose to reason."""
    lines = _think_lines(response)
    if lines is None:
        return "other"
    if not lines:
        return "direct"
    ms = [_LINE_RE.match(line.strip()) for line in lines]
    if any(m is None for m in ms):
        return "other"
    return "skip" if any(m.group(1).count("+") > 1 for m in ms) else "full"


def first_wrong_line(prompt: str, response: str) -> int | None:
    """Character offset just past the first wrong line of a (possibly partial) response: from
    there the response is certain to be graded wrong (every later line builds on the wrong sum).
    A ``</think>`` after lines that did not consume every operand is wrong at its last character.
    None when every complete line is right (a wrong direct answer shows only in the box)."""
    operands = parse_prompt(prompt)
    if operands is None:
        raise ValueError(f"prompt not in the chain format: {prompt!r}")
    trace = complete_trace_lines(response)
    if trace is None:
        return None
    lines, offsets, think_end = trace
    for i, errors in line_errors(operands, lines):
        if errors:
            return offsets[i]
    if think_end is not None and lines and _consumed(operands, lines) != len(operands):
        return think_end
    return None


def complete_trace_lines(response: str) -> tuple[list[str], list[int], int | None] | None:
    """The complete non-empty lines inside ``<think>`` of a (possibly partial) response, the
    character offset just past each, and the offset just past ``</think>`` (None while it is not
    written yet; then only lines ended by a newline are complete). None without ``<think>``."""
    start = response.find(THINK_OPEN)
    if start < 0:
        return None
    pos = start + len(THINK_OPEN)
    body = response[pos:]
    close = body.find(THINK_CLOSE)
    complete = body[:close] if close >= 0 else body[:body.rfind("\n") + 1]
    offsets, lines, at = [], [], pos
    for raw in complete.split("\n"):
        at += len(raw) + 1
        if raw.strip():
            lines.append(raw)
            offsets.append(at)
    return lines, offsets, (pos + close + len(THINK_CLOSE) if close >= 0 else None)


def _consumed(operands: Sequence[int], lines: Sequence[str]) -> int:
    return 1 + sum(line.split("=")[0].count("+") for line in lines)


def _think_lines(response: str) -> list[str] | None:
    if THINK_OPEN not in response or THINK_CLOSE not in response:
        return None
    body = response.split(THINK_OPEN, 1)[1].split(THINK_CLOSE, 1)[0]
    return [line for line in body.split("\n") if line.strip()]


def generate_rows(split: str, n: int, max_operands: int, digits: int, seed: int, split_of, *, task: str = "chain",
                  styles: Callable[[random.Random], str] = sample_style,
                  write: Callable[[Sequence[int], str], str] = solution) -> list[dict]:
    """``n`` distinct rows of ``split`` (``split_of`` decides a prompt's split); operands have
    1..``digits`` digits; a row's ``difficulty`` is its number of operands, ``style`` the SFT
    trace's style (drawn by ``styles``, written by ``write``: ``chain_tools`` adds its own)."""
    rng = random.Random(f"{task}|{max_operands}|{digits}|{split}|{seed}")
    rows, seen, attempts = [], set(), 0
    while len(rows) < n:
        attempts += 1
        if attempts > 200 * n + 10_000:
            raise ValueError(f"could only find {len(rows)} distinct {split} prompts for task={task}")
        ops = sample_operands(rng, max_operands, digits)
        prompt = prompt_of(ops)
        if prompt in seen or split_of(prompt) != split:
            continue
        seen.add(prompt)
        style = styles(rng)
        if style == "skip" and len(ops) == 2:  # nothing to merge: the same trace as full
            style = "full"
        rows.append({"prompt": prompt, "answer": str(sum(ops)), "solution": write(ops, style),
                     "task": task, "difficulty": len(ops), "style": style})
    return rows
