"""Answer extraction and +1/-1 scoring, including adversarial responses; custom rewards."""
import logging
import sys
import threading
import types

import pytest

from vcppo.rewards.verifier import (RewardScorer, extract_answer, load_reward_fn, parse_int, score,
                                    score_batch)

T = "<think>\n1+2+0=3 d3 c0\n</think>\n"


@pytest.mark.parametrize("text,expected", [
    (T + "\\boxed{3}", "3"),
    (T + "answer: 42", "42"),
    (T + "Answer:   42 .\nbye", "42"),
    (T + "\\boxed{1} then \\boxed{2}", "2"),                     # several boxed: the last
    (T + "\\boxed{\\frac{1}{\\sqrt{2}}}", "\\frac{1}{\\sqrt{2}}"),  # nested braces
    (T + "\\boxed{ \u221217 }", "-17"),                           # unicode minus + whitespace
    ("<think>\\boxed{5}</think>\\boxed{6}", "6"),                 # think part ignored
    ("<think>a</think>b</think>\\boxed{7}", "7"),                 # only after the LAST </think>
    ("<think>a</think>\\boxed{7}</think>no answer", None),
    ("<think>\\boxed{5}</think>", None),                          # answer only inside think
    ("<think>\\boxed{5}", None),                                  # no </think> (truncated)
    ("\\boxed{5}", None),
    ("", None),
    (None, None),
    (T, None),
    (T + "\\boxed{}", None),
    (T + "\\boxed{12", None),                                     # unbalanced
])
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize("text,truth,expected", [
    (T + "\\boxed{3}", "3", 1.0),
    (T + "\\boxed{4}", "3", -1.0),
    ("<think>\\boxed{3}</think>", "3", -1.0),                    # right answer only in think
    ("<think>\\boxed{3}</think>\\boxed{4}", "3", -1.0),
    (T + "\\boxed{\u22125}", "-5", 1.0),
    (T + "\\boxed{-5}", "\u22125", 1.0),
    (T + "\\boxed{+007}", "7", 1.0),                             # leading + and zeros
    (T + "\\boxed{1,234,567}", "1234567", 1.0),
    (T + "\\boxed{1,23}", "123", -1.0),                           # not a thousands grouping
    (T + "\\boxed{" + "9" * 300 + "}", "9" * 300, 1.0),          # huge integers, exact
    (T + "\\boxed{" + "9" * 299 + "8}", "9" * 300, -1.0),
    (T + "\\boxed{ 12 }", " 12\n", 1.0),
    (T + "answer: 12", 12, 1.0),                                 # int ground truth
    (T + "\\boxed{0.5}", "\\frac{1}{2}", 1.0),                   # math-verify
    (T + "\\boxed{\\frac{2}{4}}", "1/2", 1.0),
    (T + "\\boxed{x^2}", "3", -1.0),
    ("", "3", -1.0),
    (T, "3", -1.0),
])
def test_score(text, truth, expected):
    assert score(text, truth) == expected


def test_truncated_scores_wrong_and_custom_values():
    assert score(T + "\\boxed{3}", "3", finish_reason="length") == -1.0
    assert score(T + "\\boxed{3}", "3", finish_reason="stop") == 1.0
    assert score(T + "\\boxed{3}", "3", correct=1.0, wrong=0.0) == 1.0
    assert score(T + "\\boxed{2}", "3", correct=1.0, wrong=0.0) == 0.0


def test_parse_int():
    assert parse_int("\u221212") == -12 and parse_int("+0") == 0 and parse_int("-0") == 0
    assert parse_int("1.0") is None and parse_int("") is None and parse_int("1e3") is None


def test_math_verify_off_main_thread():
    out = {}
    t = threading.Thread(target=lambda: out.update(r=score(T + "\\boxed{0.5}", "\\frac{1}{2}"),
                                                   w=score(T + "\\boxed{0.6}", "\\frac{1}{2}")))
    t.start()
    t.join(30)
    assert out == {"r": 1.0, "w": -1.0}


@pytest.fixture()
def reward_module():
    mod = types.ModuleType("vcppo_test_rewards")

    def length_reward(text, truth, **info):
        return float(len(text))

    def flaky(text, truth, **info):
        if "boom" in text:
            raise RuntimeError("reward exploded")
        if "nan" in text:
            return float("nan")
        return 1.0 if info.get("finish_reason") != "length" else 0.5

    mod.length_reward, mod.flaky, mod.not_callable = length_reward, flaky, 3
    sys.modules[mod.__name__] = mod
    yield mod
    del sys.modules[mod.__name__]


def test_load_reward_fn(reward_module):
    assert load_reward_fn("vcppo_test_rewards:length_reward")("abc", "x") == 3.0
    assert load_reward_fn("vcppo_test_rewards.length_reward") is reward_module.length_reward
    assert load_reward_fn("vcppo.rewards.verifier:score") is score
    with pytest.raises(ImportError, match="no_such_module"):
        load_reward_fn("no_such_module:f")
    with pytest.raises(AttributeError, match="missing"):
        load_reward_fn("vcppo_test_rewards:missing")
    with pytest.raises(TypeError, match="not callable"):
        load_reward_fn("vcppo_test_rewards:not_callable")
    with pytest.raises(ValueError):
        load_reward_fn("nocolon")


def test_raising_reward_does_not_stop_batch(reward_module, caplog):
    scorer = RewardScorer("vcppo_test_rewards:flaky", max_warnings=1)
    texts = ["ok", "boom", "ok", "nan", "boom", "ok"]
    with caplog.at_level(logging.WARNING, logger="vcppo.rewards.verifier"):
        rewards, metrics = scorer(texts, ["1"] * 6, ["stop", "stop", "length", "stop", "stop", "stop"])
    assert rewards == [1.0, -1.0, 0.5, -1.0, -1.0, 1.0]
    assert metrics["reward/num_failures"] == 3 and scorer.num_failures == 3
    assert metrics["reward/truncated_frac"] == pytest.approx(1 / 6)
    assert caplog.text.count("reward function failed") == 1  # rate-limited
    assert "reward exploded" in caplog.text


def test_default_scorer_batch():
    rewards, metrics = score_batch([T + "\\boxed{3}", T + "\\boxed{4}", T + "\\boxed{3}"], ["3", "3", 3],
                                   ["stop", "stop", "length"])
    assert rewards == [1.0, -1.0, -1.0]
    assert metrics["reward/accuracy"] == pytest.approx(1 / 3) and metrics["reward/num_failures"] == 0
    rewards, _ = RewardScorer(wrong=0.0)([T + "\\boxed{4}"], ["3"])
    assert rewards == [0.0]
    with pytest.raises(ValueError):
        score_batch(["a"], ["1", "2"])


# --- bare final answers after </think> --------------------------------------------------------

BARE_COUNTS = [  # (text after </think>, extracted answer)
    ("42", "42"), ("\n\n-7", "-7"), (" 3/4", "3/4"), ("\u22127\n", "-7"), ("+007", "+007"),
    ("1,234", "1,234"), ("0.25", "0.25"), ("42.", "42"), ("$\\frac{3}{4}$", "\\frac{3}{4}"),
    ("\\(\\sqrt{2}\\)", "\\sqrt{2}"), ("\\[2^{10}\\]", "2^{10}"), ("**42**", "42"), ("x+1", "x+1"),
    ("x = 3", "x = 3"), ("\\pi", "\\pi"), ("π", "π"), ("(1, 2)", "(1, 2)"), ("2 \\pi", "2 \\pi"),
    ("\\frac{1}{2} \\cdot 3", "\\frac{1}{2} \\cdot 3"), ("B", "B"), ("1e-3", "1e-3"),
]
BARE_DOES_NOT_COUNT = [
    "", "   \n ", "The answer is 42", "42 apples", "so 42", "sin x", "42 43", "1, 2", "42\n43",
    "Final: 42", "# 42", "42?", "\\text{apples}", "-", "**", "x" * 201 + "+1", "(1+2", "1+2)", "\\boxed{12",
]


@pytest.mark.parametrize("tail,expected", BARE_COUNTS)
def test_bare_final_answer_counts(tail, expected):
    assert extract_answer(T + tail) == expected


@pytest.mark.parametrize("tail", BARE_DOES_NOT_COUNT)
def test_bare_final_answer_does_not_count(tail):
    assert extract_answer(T + tail) is None


@pytest.mark.parametrize("text,truth,expected", [
    ("<think>x</think>42", "42", 1.0), ("<think>x</think>\n\n-7", "-7", 1.0),
    ("<think>x</think> 3/4", "0.75", 1.0), ("<think>x</think>\\frac{6}{8}", "3/4", 1.0),
    ("<think>x</think>41", "42", -1.0), ("<think>x</think>The answer is 42", "42", -1.0),
    ("<think>42</think>", "42", -1.0),              # the answer only inside <think>
    ("<think>x</think>\n\n", "42", -1.0),           # empty answer
    ("<think>x\n42", "42", -1.0),                   # no </think>: truncated mid-thought
])
def test_bare_final_answer_scores(text, truth, expected):
    assert score(text, truth) == expected


def test_truncated_bare_answer_scores_wrong():
    assert score("<think>x</think>42", "42", finish_reason="length") == -1.0
    assert score("<think>x</think>42", "42", finish_reason="stop") == 1.0


def test_boxed_and_answer_line_win_over_the_bare_text():
    assert extract_answer(T + "\\boxed{5}") == "5"
    assert extract_answer(T + "answer: 6") == "6"


# --- score() never raises -----------------------------------------------------------------------

def test_hundred_thousand_digit_answers_compare_exactly():
    digits = "9" * 100_000
    with pytest.raises(ValueError):
        int(digits)  # Python's int-conversion limit, what score() used to hit
    assert score(T + "\\boxed{" + digits + "}", digits) == 1.0
    assert score(T + digits, digits) == 1.0                      # bare, too
    assert score(T + "\\boxed{" + digits + "}", digits[:-1] + "8") == -1.0
    assert score(T + "\\boxed{" + digits + "}", "9") == -1.0
    assert parse_int("-" + digits) == -(10 ** 100_000 - 1)


class _Unprintable:
    def __str__(self):
        raise RuntimeError("no str for you")


@pytest.mark.parametrize("text,truth", [
    (b"<think></think>\\boxed{3}", "3"), (3, "3"), (["a"], "3"), (T + "\\boxed{3}", _Unprintable()),
    (T + "\\boxed{" + "{" * 50_000 + "}", "3"), (T + "\\boxed{\\frac{", "3"), (T + "\x00\ud800", "3"),
    (T + "\\boxed{" + "1" * 499 + "/" + "}", "1/2"),
])
def test_score_never_raises(text, truth):
    assert score(text, truth) == -1.0


def test_score_never_raises_on_random_text():
    import random
    rng = random.Random(0)
    alphabet = "0123456789+-*/^{}()[]\\$.,:= \nabxπ\u2212" + "</think>" + "\\boxed{" + "answer:"
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))
        truth = rng.choice(["3", "-1", "\\frac{1}{2}", "x+1", ""])
        assert score(text, truth) in (1.0, -1.0)


def test_many_unclosed_boxes_are_read_in_linear_time():
    import time
    start = time.perf_counter()
    assert score(T + "\\boxed{1" * 200_000, "1") == -1.0
    assert time.perf_counter() - start < 5.0  # quadratic rescanning took minutes
