"""The answer normalisations of verl's math scorers, reimplemented: what :mod:`vcppo.rewards.verl_parity`
compares.

- ``hendrycks_equal`` (verl ``verl/utils/reward_score/math_reward.py``, formerly ``math.py``:
  ``is_equiv`` / ``strip_string``, from the Hendrycks MATH / lm-evaluation-harness code): both
  strings rewritten (line breaks, ``\\!``, ``\\left`` / ``\\right``, degrees, ``\\$``, a right-hand
  unit after ``\\text{ ``, ``\\%``, a leading ``.`` -> ``0.``, a short ``k = `` prefix, ``\\sqrt3``
  -> ``\\sqrt{3}``, spaces, ``\\frac12`` -> ``\\frac{1}{2}``, ``0.5`` -> ``\\frac{1}{2}``, ``3/4``
  -> ``\\frac{3}{4}``) and compared as text. Where the rewriting fails upstream (an index error on a
  trailing ``\\sqrt`` / ``\\frac``, two ``\\text{ `` units) the raw strings are compared instead.
- ``dapo_normalise`` (verl ``verl/utils/reward_score/math_dapo.py``: ``normalize_final_answer``,
  Minerva's normalisation): the part after the last ``=``, a fixed list of substitutions and unit
  words removed, the first ``$...$`` of each line kept, ``\\text{}`` / ``\\textbf{}`` /
  ``\\overline{}`` / ``\\boxed{}`` unwrapped, shorthand ``\\frac`` / ``\\sqrt`` braced, ``$``
  dropped, thousands commas dropped from a digit string.

Only the behaviour is reproduced (quirks included: ``"tan x"`` loses its ``an ``, ``"fraction"``
becomes ``frac{t}{i}on``), so that a response scores here what it scores in verl.
"""
from __future__ import annotations

import re


class _Unreadable(Exception):
    """Upstream's rewriting raises on this input; the comparison falls back to the raw strings."""


# strip_string's plain rewrites, in upstream order (line breaks, thin space, doubled backslashes,
# frac variants, \left / \right, degrees, escaped dollars)
_HENDRYCKS_FIRST = (("\n", ""), ("\\!", ""), ("\\\\", "\\"), ("tfrac", "frac"), ("dfrac", "frac"),
                    ("\\left", ""), ("\\right", ""), ("^{\\circ}", ""), ("^\\circ", ""), ("\\$", ""))
# after the unit is cut: percent signs, and a zero before a bare decimal point
_HENDRYCKS_THEN = (("\\\\%", ""), ("\\%", ""), (" .", " 0."), ("{.", "{0."))


def _drop_right_unit(text: str) -> str:
    """``5\\text{ cm}`` -> ``5``: the text before the one ``\\text{ `` (two of them: unreadable)."""
    if "\\text{ " not in text:
        return text
    parts = text.split("\\text{ ")
    if len(parts) != 2:
        raise _Unreadable(text)
    return parts[0]


def _brace_sqrt(text: str) -> str:
    """``\\sqrt3`` -> ``\\sqrt{3}`` (one character); a ``\\sqrt`` with nothing after it is unreadable."""
    first, *rest = text.split("\\sqrt")
    out = [first]
    for part in rest:
        if not part:
            raise _Unreadable(text)
        out.append("\\sqrt" + (part if part[0] == "{" else "{" + part[0] + "}" + part[1:]))
    return "".join(out)


def _brace_fracs(text: str) -> str:
    """``\\frac12`` -> ``\\frac{1}{2}``, ``\\frac1{72}`` -> ``\\frac{1}{72}``; a ``\\frac`` followed by
    a single character leaves the whole text as it was; one followed by nothing is unreadable."""
    first, *rest = text.split("\\frac")
    out = first
    for part in rest:
        out += "\\frac"
        if not part:
            raise _Unreadable(text)
        if part[0] == "{":
            out += part
            continue
        if len(part) < 2:
            return text
        a, b, tail = part[0], part[1], part[2:]
        out += ("{" + a + "}" + b + tail) if b == "{" else ("{" + a + "}{" + b + "}" + tail)
    return out


def _is_plain_int(text: str) -> bool:
    """Written as Python writes the integer (no sign but ``-``, no leading zero, ASCII digits)."""
    try:
        return str(int(text)) == text
    except ValueError:
        return False


def _slash_to_frac(text: str) -> str:
    """``3/4`` -> ``\\frac{3}{4}`` when both sides are plain integers; anything else unchanged."""
    parts = text.split("/")
    if len(parts) == 2 and all(_is_plain_int(p) for p in parts):
        return "\\frac{" + parts[0] + "}{" + parts[1] + "}"
    return text


def hendrycks_strip(text: str) -> str:
    """``text`` rewritten as upstream's ``strip_string`` does (module docstring); raises
    ``_Unreadable`` where upstream raises."""
    for old, new in _HENDRYCKS_FIRST:
        text = text.replace(old, new)
    text = _drop_right_unit(text)
    for old, new in _HENDRYCKS_THEN:
        text = text.replace(old, new)
    if not text:
        return text
    if text[0] == ".":
        text = "0" + text
    head, _, tail = text.partition("=")
    if text.count("=") == 1 and len(head) <= 2:  # "k = 5" -> " 5": a short variable name is dropped
        text = tail
    text = _brace_fracs(_brace_sqrt(text).replace(" ", ""))
    if text == "0.5":
        text = "\\frac{1}{2}"
    return _slash_to_frac(text)


def hendrycks_equal(answer: str, truth: str) -> bool:
    """Upstream's ``is_equiv``: equal after ``hendrycks_strip``, or as raw strings where that fails."""
    try:
        return hendrycks_strip(answer) == hendrycks_strip(truth)
    except _Unreadable:
        return answer == truth


# normalize_final_answer's substitutions and removed expressions, in upstream order
_DAPO_SUBSTITUTIONS = (("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), ("\\ ", ""), (" ", ""),
                       ("mbox", "text"), (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"))
_DAPO_REMOVED = (
    "square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots", "sue",
    "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals",
    "edges", "students", "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}",
    "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}", "\\mathrm{th}", "^\\circ", "^{\\circ}", "\\;",
    ",\\!", "{,}", '"', "\\dots",
)
# per line: a line holding two or more $ keeps only its first $...$
_FIRST_INLINE_MATH = re.compile(r"[^\n$]*\$([^\n$]*)\$[^\n]*")
# \text{x}, \textbf{x}, \overline{x}: up to the first closing brace on the line
_UNWRAP = [re.compile(r"\\" + name + r"\{([^\n}]*)\}") for name in ("text", "textbf", "overline")]
_BOXED_GREEDY = re.compile(r"\\boxed\{(.*)\}")  # up to the LAST closing brace on the line
_FRAC_SHORT = re.compile(r"frac([^{])(.)")
_SQRT_SHORT = re.compile(r"sqrt([^{])")


def dapo_normalise(answer: str) -> str:
    """``answer`` as upstream's ``normalize_final_answer`` leaves it (module docstring)."""
    answer = answer.split("=")[-1]
    for old, new in _DAPO_SUBSTITUTIONS:
        answer = answer.replace(old, new)
    for removed in _DAPO_REMOVED:
        answer = answer.replace(removed, "")
    answer = _FIRST_INLINE_MATH.sub(r"$\1$", answer)
    for pattern in _UNWRAP:
        answer = pattern.sub(r"\1", answer)
    answer = _BOXED_GREEDY.sub(r"\1", answer)
    answer = _FRAC_SHORT.sub(r"frac{\1}{\2}", answer)
    answer = _SQRT_SHORT.sub(r"sqrt{\1}", answer)
    answer = answer.replace("$", "")
    if answer.replace(",", "").isdigit():
        answer = answer.replace(",", "")
    return answer.strip()
