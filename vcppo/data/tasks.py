"""Synthetic long chain-of-thought tasks whose correct answer *needs* the whole trace.

Task ``add``: add K numbers of D digits each (K = ``operands``, default 2; D = ``difficulty``).
The target response works column by column from the least significant digit, one line per
column, and every line consumes the carry written on the line before it::

    prompt:   4821+3967=?
    solution: <think>
              1+7+0=8 d8 c0        <- column 1: digits, carry-in, column sum, digit, carry-out
              2+6+0=8 d8 c0        <- carry-in (0) is the c of the previous line
              8+9+0=17 d7 c1
              4+3+1=8 d8 c0        <- carry-in (1) comes from the line above
              </think>
              \\boxed{8788}       <- the d digits read bottom-up (plus a final carry if > 0)

Why this shape (the mechanism VC-PPO is about, arXiv 2503.01491 sec. 3): each line's output
digit depends on state (the carry) written by the previous line, and the answer is assembled
from every line's digit, so a response that skips or drops steps gets the answer wrong. A policy
pushed toward shorter responses by a biased critic therefore loses accuracy, which is what the
paper's PPO collapse looks like. Lines are very regular so a ~10M-parameter character-level model
can learn them with a short SFT on CPU.

Task ``add_running``: the same trace, each line also carrying the answer digits so far
(``8+9+0=17 d7 c1 r78``), so the boxed answer is a short copy of the last line. In ``add`` most
wrong answers of the demo's SFT policy come from reading the d digits back bottom-up *after* the
trace (docs/results.md); ``add_running`` moves those mistakes into the trace.

Task ``chain`` (``vcppo.data.tasks_chain``): 2..K operands with running sums, a length the
policy chooses (full / merged / direct reasoning); ``first_wrong_line`` dispatches to it.

Splits are disjoint by construction: a prompt's split is decided by a hash of its text
(``split_of``), and each split's generator only keeps prompts whose hash falls in that split.
Generation is deterministic in (task, difficulty, operands, split, seed).
"""
from __future__ import annotations

import hashlib
import random
import re
import statistics
from dataclasses import dataclass
from typing import Iterable, Sequence

import vcppo.data.tasks_arith as tasks_arith
import vcppo.data.tasks_chain as tasks_chain
import vcppo.data.tasks_chain_tools as tasks_chain_tools
import vcppo.data.tasks_code as tasks_code
import vcppo.data.tasks_guess as tasks_guess

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
SPLITS = ("train", "val", "test")
# Hash buckets (out of 100) per split: train 90%, val 5%, test 5% of the prompt space.
_SPLIT_BUCKETS = {"val": range(0, 5), "test": range(5, 10), "train": range(10, 100)}
# chain (vcppo.data.tasks_chain): difficulty = max digits per operand, operands = max operands.
# chain_tools (vcppo.data.tasks_chain_tools, multi-turn): as chain, with a calculator to call.
# guess (vcppo.data.tasks_guess, multi-turn): difficulty = N (the numbers 1..N), operands = K turns.
# code (vcppo.data.tasks_code, scored by running the program): difficulty = digits of a constant, operands = inputs.
# arith, arith_words (vcppo.data.tasks_arith, for a pretrained instruct model): difficulty = digits per
# number at most, operands = numbers in the sum.
DEFAULT_DIFFICULTY = {"add": 7, "add_running": 7, "chain": 4, "chain_tools": 1, "guess": 16, "code": 2,
                      "arith": 2, "arith_words": 2}
DEFAULT_OPERANDS = {"add": 2, "add_running": 2, "chain": 12, "chain_tools": tasks_chain_tools.DEFAULT_MAX_OPERANDS,
                    "guess": 4, "code": 2, "arith": 2, "arith_words": 2}

# a+b+carry_in=sum d<digit> c<carry_out>, and in add_running a trailing r<answer digits so far>
_LINE_RE = re.compile(r"^(\d(?:\+\d)+)\+(\d+)=(\d+) d(\d) c(\d+)(?: r(\d+))?$")
_BOXED_RE = re.compile(r"\\boxed\{([^{}]*)\}")


def split_of(prompt: str) -> str:
    """The split a prompt belongs to (stable hash of its text; independent of seed and n)."""
    bucket = int(hashlib.sha256(prompt.encode()).hexdigest()[:8], 16) % 100
    for split, buckets in _SPLIT_BUCKETS.items():
        if bucket in buckets:
            return split
    raise AssertionError("unreachable")


# ----------------------------------------------------------------------------- add task


def add_prompt(operands: Sequence[int]) -> str:
    """Prompt text, e.g. ``4821+3967=?`` (short on purpose: characters are tokens)."""
    return "+".join(str(x) for x in operands) + "=?"


def add_trace_lines(operands: Sequence[int], running: bool = False) -> list[str]:
    """One line per column, least significant first: ``a+b+carry_in=sum d<digit> c<carry_out>``.

    ``running`` (task ``add_running``) appends `` r<digits>``: the answer digits so far, this
    line's digit prepended to the previous line's r. The boxed answer is then a copy of the last
    r (plus the final carry) instead of the d digits read back bottom-up across the lines, so
    mistakes happen inside the trace, where a critic can see them, rather than in the answer.
    """
    width = max(len(str(x)) for x in operands)
    digits = [str(x).zfill(width)[::-1] for x in operands]  # least significant first
    lines, carry, so_far = [], 0, ""
    for col in range(width):
        column = [int(d[col]) for d in digits]
        s = sum(column) + carry
        so_far = f"{s % 10}{so_far}"
        lines.append("+".join(map(str, column)) + f"+{carry}={s} d{s % 10} c{s // 10}"
                     + (f" r{so_far}" if running else ""))
        carry = s // 10
    return lines


def add_solution(operands: Sequence[int], running: bool = False) -> str:
    """The full target response: ``<think>\\n<lines>\\n</think>\\n\\boxed{<sum>}``."""
    lines = add_trace_lines(operands, running)
    return f"{THINK_OPEN}\n" + "\n".join(lines) + f"\n{THINK_CLOSE}\n\\boxed{{{sum(operands)}}}"


def answer_from_trace(solution: str) -> str | None:
    """The answer the trace lines imply: their d digits read bottom-up, then the last carry.

    This is how the trace is meant to be read, so dropping a line changes the implied answer.
    Returns None when there is no think block or no well-formed line.
    """
    lines = _think_lines(solution)
    if lines is None:
        return None
    parsed = [_LINE_RE.match(line) for line in lines]
    if not parsed or any(m is None for m in parsed):
        return None
    digits = "".join(m.group(4) for m in reversed(parsed))
    last_carry = int(parsed[-1].group(5))
    value = int((str(last_carry) if last_carry else "") + digits)
    return str(value)


def _parse_add_prompt(prompt: str) -> list[int] | None:
    m = re.fullmatch(r"(\d+(?:\+\d+)+)=\?", prompt)
    return [int(x) for x in m.group(1).split("+")] if m else None


def _line_errors(operands: Sequence[int], lines: Sequence[str]) -> Iterable[tuple[int, list[str]]]:
    """(line index, that line's errors) for each trace line in order; stops after a malformed line.

    A line is right when its digits are the column's digits, its carry-in is the previous line's
    carry-out (0 on the first line), and its sum, digit and carry-out follow from them; when the
    trace carries running answers (add_running), every line's r must be its d prepended to the
    previous line's r.
    """
    width = max(len(str(x)) for x in operands)
    rev = [str(x).zfill(width)[::-1] for x in operands]
    carry, so_far = 0, ""
    matches = [_LINE_RE.match(line) for line in lines]
    running = any(m is not None and m.group(6) is not None for m in matches)
    for col, (line, lm) in enumerate(zip(lines, matches)):
        if lm is None:
            yield col, [f"line {col + 1} malformed: {line!r}"]
            return
        errors = []
        column = [int(d) for d in lm.group(1).split("+")]
        c_in, s, d, c_out = (int(lm.group(i)) for i in (2, 3, 4, 5))
        if col >= width:
            errors.append(f"line {col + 1}: only {width} columns")
        elif column != [int(r[col]) for r in rev]:
            errors.append(f"line {col + 1}: digits {column} are not column {col + 1} of {list(operands)}")
        if c_in != carry:
            errors.append(f"line {col + 1}: carry-in {c_in} != previous carry-out {carry}")
        if s != sum(column) + c_in:
            errors.append(f"line {col + 1}: {sum(column)}+{c_in} != {s}")
        if d != s % 10 or c_out != s // 10:
            errors.append(f"line {col + 1}: digit/carry d{d} c{c_out} wrong for sum {s}")
        if running and lm.group(6) is None:
            errors.append(f"line {col + 1}: no running answer r...")
        elif running and lm.group(6) != f"{d}{so_far}":
            errors.append(f"line {col + 1}: running answer r{lm.group(6)} != d{d} + previous r{so_far}")
        carry, so_far = c_out, lm.group(6) or ""
        yield col, errors


def check_add_trace(prompt: str, solution: str) -> list[str]:
    """Verify a solution step by step against its prompt; returns a list of errors (empty: ok).

    Checks every column: the digits are the right digits of the operands, the carry-in equals the
    previous line's carry-out (0 on the first line), the sum, digit and carry-out are right, the
    number of lines equals the number of columns, and the boxed answer equals the trace's answer
    and the true sum.
    """
    operands = _parse_add_prompt(prompt)
    if operands is None:
        return [f"prompt not in the add format: {prompt!r}"]
    width = max(len(str(x)) for x in operands)
    lines = _think_lines(solution)
    if lines is None:
        return ["no <think>...</think> block"]
    errors: list[str] = []
    if len(lines) != width:
        errors.append(f"{len(lines)} lines for {width} columns")
    for _, line_errors in _line_errors(operands, lines):
        errors.extend(line_errors)
    boxed = _BOXED_RE.findall(solution.rsplit(THINK_CLOSE, 1)[-1])
    truth = str(sum(operands))
    if not boxed:
        errors.append("no \\boxed{} answer after </think>")
    elif boxed[-1] != truth:
        errors.append(f"boxed answer {boxed[-1]} != {truth}")
    implied = answer_from_trace(solution)
    if implied != truth:
        errors.append(f"trace implies {implied}, true sum is {truth}")
    return errors


def first_wrong_line(prompt: str, response: str) -> int | None:
    """Character offset just past the first wrong trace line of a (possibly partial) response.

    From that point on the response is certain to be graded wrong, so this marks where a critic
    that checks the arithmetic could know the outcome (scripts/critic_headroom.py). A line counts
    once its newline is written; a ``</think>`` with too few lines is wrong at its last character.
    None when every written line is right (the error, if any, is in the boxed answer).
    """
    if tasks_chain.parse_prompt(prompt) is not None:
        return tasks_chain.first_wrong_line(prompt, response)
    operands = _parse_add_prompt(prompt)
    if operands is None:
        raise ValueError(f"prompt not in the add format: {prompt!r}")
    trace = tasks_chain.complete_trace_lines(response)
    if trace is None:
        return None
    lines, offsets, think_end = trace
    for col, errors in _line_errors(operands, lines):
        if errors:
            return offsets[col]
    width = max(len(str(x)) for x in operands)
    if think_end is not None and len(lines) != width:
        return think_end
    return None


def first_wrong_line_tokens(prompt: str, pieces: Sequence[str]) -> tuple[int, int] | None:
    """:func:`first_wrong_line` for a response given as its decoded tokens ``pieces``: (index of the
    first token of the wrong line, index of the first token whose state contains the whole line,
    i.e. one past the token that completes it), or None when every written line is right."""
    offset = first_wrong_line(prompt, "".join(pieces))
    if offset is None:
        return None
    chars = 0
    for i, piece in enumerate(pieces):
        chars += len(piece)
        if chars >= offset:
            line = i
            while line > 0 and "\n" not in pieces[line - 1]:
                line -= 1
            return line, i + 1
    return None


def _think_lines(solution: str) -> list[str] | None:
    if THINK_OPEN not in solution or THINK_CLOSE not in solution:
        return None
    body = solution.split(THINK_OPEN, 1)[1].split(THINK_CLOSE, 1)[0]
    return [line for line in body.split("\n") if line.strip()]


# ----------------------------------------------------------------------------- generation


@dataclass(frozen=True)
class TaskSpec:
    name: str
    difficulty: int  # add: digits per operand
    operands: int = 2

    def sample_prompt_operands(self, rng: random.Random) -> list[int]:
        lo, hi = 10 ** (self.difficulty - 1), 10 ** self.difficulty - 1
        if self.difficulty == 1:
            lo = 0
        return [rng.randint(lo, hi) for _ in range(self.operands)]


TASKS = ("add", "add_running", "chain", "chain_tools", "guess", "code", "arith", "arith_words")


def make_spec(task: str = "add", difficulty: int | None = None, operands: int | None = None) -> TaskSpec:
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; available: {', '.join(TASKS)}")
    difficulty = DEFAULT_DIFFICULTY[task] if difficulty is None else int(difficulty)
    operands = DEFAULT_OPERANDS[task] if operands is None else int(operands)
    if difficulty < 1:
        raise ValueError(f"difficulty must be >= 1 (digits per operand), got {difficulty}")
    if operands < 2:
        raise ValueError(f"operands must be >= 2, got {operands}")
    return TaskSpec(task, difficulty, operands)


def generate(
    task: str = "add",
    split: str = "train",
    n: int = 1000,
    difficulty: int | None = None,
    seed: int = 0,
    operands: int | None = None,
) -> list[dict]:
    """``n`` distinct rows of one split: dicts with prompt, answer, solution, task, difficulty.

    Deterministic in (task, difficulty, operands, split, seed); rows of different splits never
    share a prompt (see ``split_of``). Raises ValueError if the split's prompt space is too
    small for ``n`` distinct prompts.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    spec = make_spec(task, difficulty, operands)
    if spec.name == "chain":  # its own module: variable length, mixed reasoning styles
        return tasks_chain.generate_rows(split, n, spec.operands, spec.difficulty, seed, split_of)
    if spec.name == "chain_tools":  # multi-turn: a calculator answers the policy's calls (rollout.env=tools)
        return tasks_chain_tools.generate_rows(split, n, spec.operands, spec.difficulty, seed, split_of)
    if spec.name == "code":  # scored by running the program (vcppo.rewards.code)
        return tasks_code.generate_rows(split, n, spec.operands, spec.difficulty, seed, split_of)
    if spec.name in tasks_arith.PROMPTS:  # plain words, for a pretrained instruct model
        return tasks_arith.generate_rows(spec.name, split, n, spec.difficulty, spec.operands, seed, split_of)
    if spec.name == "guess":  # multi-turn: an environment answers each turn (rollout.env=guess)
        return tasks_guess.generate_rows(split, n, spec.difficulty, spec.operands, seed)
    rng = random.Random(f"{spec.name}|{spec.difficulty}|{spec.operands}|{split}|{seed}")
    rows: list[dict] = []
    seen: set[str] = set()
    attempts, max_attempts = 0, 200 * n + 10_000
    while len(rows) < n:
        attempts += 1
        if attempts > max_attempts:
            raise ValueError(
                f"could only find {len(rows)} distinct {split} prompts for task={spec.name} "
                f"difficulty={spec.difficulty} operands={spec.operands}; lower n or raise difficulty")
        ops = spec.sample_prompt_operands(rng)
        prompt = add_prompt(ops)
        if prompt in seen or split_of(prompt) != split:
            continue
        seen.add(prompt)
        rows.append({
            "prompt": prompt,
            "answer": str(sum(ops)),
            "solution": add_solution(ops, running=spec.name == "add_running"),
            "task": spec.name,
            "difficulty": spec.difficulty,
        })
    return rows


# ----------------------------------------------------------------------------- lengths


def count_tokens(text: str, tokenizer=None) -> int:
    """Token count of a response: with ``tokenizer`` its encoding; else the character-level
    count of vcppo's own tokenizer (one token per character, ``<think>``/``</think>`` one each)."""
    if tokenizer is not None:
        return len(tokenizer.encode(text, add_special_tokens=False))
    n_open, n_close = text.count(THINK_OPEN), text.count(THINK_CLOSE)
    return len(text) - n_open * (len(THINK_OPEN) - 1) - n_close * (len(THINK_CLOSE) - 1)


def trace_length_stats(rows_or_texts: Iterable, tokenizer=None, field: str = "solution") -> dict:
    """min / median / mean / max token length of the solutions (rows as dicts, or strings)."""
    lengths = [count_tokens(r[field] if isinstance(r, dict) else r, tokenizer) for r in rows_or_texts]
    if not lengths:
        raise ValueError("no rows to measure")
    return {
        "n": len(lengths),
        "min": min(lengths),
        "median": statistics.median(lengths),
        "mean": round(statistics.fmean(lengths), 2),
        "max": max(lengths),
    }
