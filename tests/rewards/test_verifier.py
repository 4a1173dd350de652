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
