"""The arith tasks' scorer: the last number of the response (vcppo.rewards.last_number)."""
import pytest

from vcppo.rewards.last_number import last_number, last_number_in
from vcppo.rewards.verl_parity import gsm8k


@pytest.mark.parametrize("text,truth,expected", [
    ('The final answer after "####" is 32.', "32", 1.0),    # SmolLM2's own phrasing
    ("23 + 9 = 32\n#### 32", "32", 1.0),
    ("It is 1,234.", "1234", 1.0),
    ("3.50 dollars", "3.5", 1.0),
    ("first 32, then 33", "32", 0.0),                        # the LAST number counts
    ("no number here", "7", 0.0),
    ("", "7", 0.0),
    ("The answer is -5.", "-5", 1.0),
    ("45-12=33", "33", 1.0),
])
def test_last_number_scores(text, truth, expected):
    assert last_number(text, truth) == expected


def test_only_the_tail_is_read_and_none_is_safe():
    assert last_number_in("7 " + "x" * 400) is None
    assert last_number(None, "7") == 0.0
    assert last_number("7", "not a number") == 0.0


def test_verl_strict_gsm8k_scores_the_models_phrasing_zero_and_this_scorer_one():
    text = 'The final answer after "####" is 32.'
    assert gsm8k(text, "32") == 0.0 and last_number(text, "32") == 1.0
