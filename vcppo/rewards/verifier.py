"""Rule-based outcome reward: +1 if the final answer is right, -1 otherwise (VC-PPO sec. 5.1).

Only the text after the LAST ``</think>`` is read; the reasoning itself is never scored. A
response with no ``</think>`` (e.g. truncated mid-thought) or cut at the length limit
(``finish_reason == "length"``) scores ``wrong``.

Answer extraction (``extract_answer``), in the text after the last ``</think>``:
  1. the LAST ``\\boxed{...}`` (nested braces allowed);
  2. else the LAST ``answer: X`` / ``Answer: X`` (case-insensitive; X runs to the end of the line;
     a trailing ``.`` is dropped);
  3. else the whole text, when it is a bare final answer (``bare_answer``): what many reasoning
     models emit for short answers (``</think>42``, ``</think>\n\n-7``, ``</think> 3/4``).
Unicode minus (U+2212) becomes ``-``; surrounding whitespace (and ``$``) is stripped.

A bare final answer is ONE line that is a single number or expression, once surrounding
whitespace, ``$``, ``\\(...\\)`` / ``\\[...\\]`` and markdown ``**...**`` are stripped and one
trailing ``.`` is dropped. It counts when it is an integer (any length, thousands separators
allowed) or, up to ``MAX_BARE_EXPRESSION_CHARS``, a formula: digits, single-letter variables,
LaTeX commands (``\\frac{3}{4}``, ``\\sqrt{2}``, ``\\pi``), operators and brackets. It does not
count when it holds a word (``The answer is 42``, ``42 apples``, ``sin x``), two terms side by side
(``42 43``), a comma outside brackets (``1, 2``), a second line, or characters that are not
mathematics (``#``, ``?``). tests/rewards/test_verifier.py holds the list, case by case.

Comparison (``score``): if both sides are integers they are compared exactly, of any size (as
canonical digit strings, so Python's 4,300-digit int-conversion limit does not apply): a leading
``+``, leading zeros, and ``,``/``_``/space thousands separators in the standard 3-digit grouping
are accepted (``+007`` == ``7``, ``1,234`` == ``1234``, ``-0`` == ``0``).
Otherwise equivalence is decided by ``math-verify`` (``parse`` + ``verify``). math-verify's
timeouts are signal-based and only work on the main thread, so off the main thread they are
disabled and the answer length is capped instead (``MAX_MATH_VERIFY_CHARS``).

``score`` never raises: any input it cannot read (not a string, a ground truth whose ``str()``
fails, an error inside math-verify) scores ``wrong``.

Custom rewards: ``load_reward_fn("pkg.module:function")``; the function is called as
``fn(response_text, ground_truth, **info) -> float`` with info = ``finish_reason`` and the row's
reward-info fields (``data_source``, ``extra_info``, ...: :mod:`vcppo.rewards.routing`); with
``functions_by_source`` a row's ``data_source`` picks the function. ``RewardScorer`` applies a reward function to a batch, serially in this
process or in a process pool (:mod:`vcppo.rewards.pool`, hard timeout per sample); a sample whose
reward function raises, times out, or returns a non-finite value scores ``wrong``, is counted,
and is logged (rate-limited), and the batch goes on.
"""
from __future__ import annotations

import decimal
import logging
import math
import re
import threading
from dataclasses import dataclass, field
from typing import Any, Sequence

from vcppo.rewards.loading import RewardFn, load_reward_fn
from vcppo.rewards.routing import BUILTIN_REWARD, RewardRouter, SourceTable, split_ground_truth
from vcppo.rewards.verl_parity import functions_by_source

logger = logging.getLogger(__name__)

THINK_CLOSE = "</think>"
MAX_MATH_VERIFY_CHARS = 500
MAX_BARE_EXPRESSION_CHARS = 200
_INT_RE = re.compile(r"[+-]?(?:\d+|\d{1,3}(?:([,_ ])\d{3})(?:\1\d{3})*)")
_ANSWER_RE = re.compile(r"answer\s*[:：]\s*([^\n]*)", re.IGNORECASE)
_BOXED = "\\boxed"
# A bare answer: the characters of a formula (digits, letters, LaTeX, operators, brackets) ...
_FORMULA_CHARS = re.compile(r"[0-9A-Za-z\\{}()\[\]^_+\-*/.,=<>!|':% \tπ√∞×·÷]+")
# ... without a word (2+ letters that are not the name of a LaTeX command) ...
_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}")
# ... or two terms with only blanks between them ("42 43", "x y").
_SIDE_BY_SIDE = re.compile(r"[0-9A-Za-z}.)\]]\s+[0-9A-Za-z({\[]")
_LATEX_COMMAND = re.compile(r"\\[A-Za-z]+")
_WRAPPERS = (("\\(", "\\)"), ("\\[", "\\]"), ("**", "**"))



def _normalise(text: str) -> str:
    text = text.replace("\u2212", "-").replace("\u2013", "-")  # unicode minus / en dash
    return text.strip().strip("$").strip()


def _last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` with balanced (nested) braces, or None.

    Linear time: when the box at ``start`` never closes, an earlier box that is still open at
    ``start`` cannot close either (its depth stays above the later one's), so earlier candidates
    are only scanned up to the previous failed start.
    """
    limit = len(text)
    start = text.rfind(_BOXED + "{")
    while start != -1:
        i, depth = start + len(_BOXED) + 1, 1
        j = i
        while j < limit and depth:
            if text[j] == "{":
                depth += 1
            elif text[j] == "}":
                depth -= 1
            j += 1
        if depth == 0:
            return text[i:j - 1]
        limit = start
        start = text.rfind(_BOXED + "{", 0, start)  # unbalanced: try an earlier one
    return None


def _one_bracketed_term(text: str) -> bool:
    """Brackets balance, and no comma separates items at the top level (``1, 2`` is a list)."""
    depth = 0
    for ch in text:
        depth += ch in "([{"
        depth -= ch in ")]}"
        if depth < 0 or (ch == "," and depth == 0):
            return False
    return depth == 0


def bare_answer(tail: str) -> str | None:
    """``tail`` (the text after the last ``</think>``) as a bare final answer, or None (see the
    module docstring for what counts)."""
    text = _normalise(tail)
    for opening, closing in _WRAPPERS:
        if text.startswith(opening) and text.endswith(closing) and len(text) >= len(opening) + len(closing):
            text = _normalise(text[len(opening):len(text) - len(closing)])
    text = text[:-1].rstrip() if text.endswith(".") else text
    if not text or "\n" in text or "\r" in text:
        return None
    if canonical_int(text) is not None:
        return text
    if len(text) > MAX_BARE_EXPRESSION_CHARS or not _FORMULA_CHARS.fullmatch(text):
        return None
    without_commands = _LATEX_COMMAND.sub("\\\\", text)  # "\\cdot 3": a blank after a command separates nothing
    if _WORD.search(text) or _SIDE_BY_SIDE.search(without_commands) or not _one_bracketed_term(text):
        return None
    return text if re.search(r"[0-9A-Za-zπ∞]", text) else None


def extract_answer(response_text: str | None) -> str | None:
    """The final answer in ``response_text`` (see module docstring), or None if there is none."""
    if not isinstance(response_text, str) or THINK_CLOSE not in response_text:
        return None
    tail = response_text.rsplit(THINK_CLOSE, 1)[1]
    boxed = _last_boxed(tail)
    if boxed is not None:
        ans = _normalise(boxed)
        return ans or None
    matches = _ANSWER_RE.findall(tail)
    if matches:
        ans = _normalise(matches[-1])
        ans = ans[:-1].rstrip() if ans.endswith(".") else ans
        return ans or None
    return bare_answer(tail)


def canonical_int(text: str) -> str | None:
    """An integer written as in the module docstring, as a canonical digit string (``"-12"``,
    ``"0"``), or None. Strings, not ints: a 100,000-digit answer must not hit Python's
    int-conversion limit (``int()`` raises ValueError past 4,300 digits)."""
    t = _normalise(text)
    if not _INT_RE.fullmatch(t):
        return None
    digits = re.sub(r"[^0-9]", "", t).lstrip("0") or "0"
    return "-" + digits if t.startswith("-") and digits != "0" else digits


def parse_int(text: str) -> int | None:
    """An integer written as in the module docstring, or None; of any number of digits."""
    digits = canonical_int(text)
    if digits is None:
        return None
    if len(digits) <= 4000:
        return int(digits)
    with decimal.localcontext() as exact:  # Decimal -> int has no digit limit
        exact.prec = decimal.MAX_PREC
        return int(decimal.Decimal(digits))


def _math_verify_equal(pred: str, truth: str) -> bool:
    if len(pred) > MAX_MATH_VERIFY_CHARS or len(truth) > MAX_MATH_VERIFY_CHARS:
        return False
    from math_verify import parse, verify

    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    try:
        gold = parse(f"${truth}$", parsing_timeout=timeout)
        guess = parse(f"${pred}$", parsing_timeout=timeout)
        if not gold or not guess:
            return False
        return bool(verify(gold, guess, timeout_seconds=timeout))
    except Exception as e:  # math-verify / sympy errors on odd input: not equal
        logger.debug("math-verify failed on %r vs %r: %r", pred, truth, e)
        return False


def is_equivalent(pred: str, truth: str) -> bool:
    """Exact integer comparison when both are integers, else math-verify equivalence."""
    a, b = canonical_int(pred), canonical_int(str(truth))
    if a is not None and b is not None:
        return a == b
    if _normalise(pred) == _normalise(str(truth)):
        return True
    return _math_verify_equal(_normalise(pred), _normalise(str(truth)))


def score(response_text: str | None, ground_truth: Any, correct: float = 1.0, wrong: float = -1.0,
          finish_reason: str | None = None, **_: Any) -> float:
    """``correct`` if the answer after the last ``</think>`` equals ``ground_truth``, else ``wrong``.

    Truncated responses (``finish_reason == "length"``) and responses without ``</think>`` or
    without an answer score ``wrong``. Never raises: an input it cannot read scores ``wrong``.
    """
    if finish_reason == "length" or ground_truth is None:
        return wrong
    try:
        pred = extract_answer(response_text)
        return correct if pred is not None and is_equivalent(pred, str(ground_truth)) else wrong
    except Exception as e:  # a reward of -1 is the answer to unreadable input, not a crash
        logger.debug("score() could not read %.200r vs %.200r: %r", response_text, ground_truth, e)
        return wrong


@dataclass
class RewardScorer:
    """Score batches with a reward function; failures score ``wrong`` and are counted.

    ``reward_fn``: a callable ``fn(response_text, ground_truth, **info) -> float``, a dotted
    path for ``load_reward_fn``, or None for the built-in ``score`` (which is given
    ``correct``/``wrong``). ``num_workers=0`` scores serially in this process (``breakpoint()``
    works inside a reward function); ``num_workers >= 1`` scores in a :class:`~vcppo.rewards.pool.
    RewardPool` of that many processes, started here (their imports overlap the engines' start-up),
    where a sample that takes longer than ``timeout_s`` scores ``wrong`` and counts as a timeout.
    ``num_failures`` (timeouts included) and ``num_timeouts`` accumulate over the scorer's life;
    each call's metrics give that batch's counts. Call :meth:`close` to stop the workers.

    ``functions_by_source`` (``{data_source: "module:function"}``): rows of those sources are scored
    by their function, the others by ``reward_fn`` (a :class:`~vcppo.rewards.routing.RewardRouter`); a
    key ending in ``*`` covers the sources that start with the rest, and ``source in
    scorer.functions_by_source`` follows that rule too (a :class:`~vcppo.rewards.routing.SourceTable`).
    A ground truth that is a :class:`~vcppo.rewards.routing.GroundTruth` adds its row's reward info
    to the keyword arguments. ``verl_parity=True`` adds verl's math data_sources to that table
    (:mod:`vcppo.rewards.verl_parity`; the entries given win).
    """

    reward_fn: RewardFn | str | None = None
    correct: float = 1.0
    wrong: float = -1.0
    max_warnings: int = 5  # then one warning per 100 failures
    num_workers: int = 0
    timeout_s: float = 10.0
    functions_by_source: dict[str, str] | None = None
    verl_parity: bool = False
    num_failures: int = field(default=0, init=False)
    num_timeouts: int = field(default=0, init=False)
    num_scored: int = field(default=0, init=False)

    def __post_init__(self):
        if self.verl_parity:
            self.functions_by_source = functions_by_source(self.functions_by_source or {}, True)
        if self.functions_by_source:
            self.functions_by_source = SourceTable(self.functions_by_source)
            self.reward_fn = RewardRouter(dict(self.functions_by_source), default=self.reward_fn,
                                          correct=self.correct, wrong=self.wrong)
            self.reward_fn.load_all()  # import errors surface here, at start-up
        # a path travels as text and workers import it themselves; the built-in verifier likewise
        sent_to_workers = BUILTIN_REWARD if self.reward_fn is None else self.reward_fn
        if isinstance(self.reward_fn, str):
            self.reward_fn = load_reward_fn(self.reward_fn)  # import errors surface here, at start-up
        self._builtin = self.reward_fn is None
        if self._builtin:
            self.reward_fn = score
        self._pool = None
        if self.num_workers > 0:
            from vcppo.rewards.pool import RewardPool

            self._pool = RewardPool(sent_to_workers, self.num_workers, self.timeout_s)

    def _outcomes(self, items: list[tuple[str, Any, dict]]) -> list[tuple[str, Any]]:
        if self._pool is not None:
            return self._pool.map(items)
        outcomes = []
        for text, truth, kwargs in items:
            try:
                outcomes.append(("ok", float(self.reward_fn(text, truth, **kwargs))))
            except Exception as e:
                outcomes.append(("error", repr(e)))
        return outcomes

    def _reward(self, kind: str, value: Any) -> tuple[float, bool]:
        """(reward, failed) of one outcome; a failure is logged, rate-limited."""
        if kind == "ok" and math.isfinite(value):
            return value, False
        self.num_failures += 1
        self.num_timeouts += kind == "timeout"
        n = self.num_failures
        if n <= self.max_warnings or n % 100 == 0:
            what = f"returned {value}" if kind == "ok" else f"{kind}: {value}"
            logger.warning("reward function failed (%d so far; sample scored %s): %s", n, self.wrong, what)
        return self.wrong, True

    def __call__(self, texts: Sequence[str], truths: Sequence[Any],
                 finish_reasons: Sequence[str | None] | None = None,
                 infos: Sequence[dict] | None = None) -> tuple[list[float], dict[str, float]]:
        """Rewards for a batch and metrics: reward/mean, reward/accuracy, reward/num_failures,
        reward/num_timeouts, reward/truncated_frac. ``accuracy`` is the fraction scoring ``correct``."""
        if len(texts) != len(truths):
            raise ValueError(f"{len(texts)} texts but {len(truths)} ground truths")
        finish_reasons = list(finish_reasons) if finish_reasons is not None else [None] * len(texts)
        infos = list(infos) if infos is not None else [{}] * len(texts)
        items = []
        for text, row_truth, fr, info in zip(texts, truths, finish_reasons, infos):
            truth, row_info = split_ground_truth(row_truth)
            kwargs = {**row_info, **info, "finish_reason": fr}
            if self._builtin:
                kwargs.update(correct=self.correct, wrong=self.wrong)
            items.append((text, truth, kwargs))
        timeouts_before = self.num_timeouts
        judged = [self._reward(kind, value) for kind, value in self._outcomes(items)]
        rewards = [r for r, _ in judged]
        self.num_scored += len(texts)
        n = max(len(rewards), 1)
        metrics = {
            "reward/mean": sum(rewards) / n,
            "reward/accuracy": sum(r == self.correct for r in rewards) / n,
            "reward/num_failures": float(sum(failed for _, failed in judged)),
            "reward/num_timeouts": float(self.num_timeouts - timeouts_before),
            "reward/truncated_frac": sum(fr == "length" for fr in finish_reasons) / n,
        }
        return rewards, metrics

    def judge(self, texts: Sequence[str], truths: Sequence[Any],
              finish_reasons: Sequence[str | None]) -> tuple[list[float], list[bool]]:
        """Rewards and correctness flags: a sample is correct when it earned the ``correct`` score."""
        rewards, _ = self(texts, truths, finish_reasons)
        return rewards, [r == self.correct for r in rewards]

    def close(self) -> None:
        """Stop the worker processes (if any); a closed scorer scores serially from then on."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None


def score_batch(texts: Sequence[str], truths: Sequence[Any],
                finish_reasons: Sequence[str | None] | None = None,
                reward_fn: RewardFn | str | None = None) -> tuple[list[float], dict[str, float]]:
    """One-shot ``RewardScorer(reward_fn)(texts, truths, finish_reasons)``."""
    return RewardScorer(reward_fn)(texts, truths, finish_reasons)
