"""Tasks arith / arith_words: the sums a pretrained instruct model is trained on (vcppo.data.tasks_arith)."""
import random
import re

import pytest

from vcppo.data import tasks
from vcppo.data.tasks_arith import sample_terms, solution, value
from vcppo.rewards.last_number import last_number


@pytest.mark.parametrize("task", ["arith", "arith_words"])
def test_rows_answer_their_own_question_and_the_scorer_accepts_the_solution(task):
    rows = tasks.generate(task, "train", 200, 2, 0, 3)
    for r in rows:
        numbers = [int(x) for x in re.findall(r"\d+", r["prompt"])]
        assert len(numbers) == 3, r["prompt"]
        assert r["solution"].endswith(f"#### {r['answer']}")
        assert last_number(r["solution"], r["answer"]) == 1.0
        assert r["data_source"] == f"vcppo/{task}" and r["operands"] == 3 and r["difficulty"] == 2
        assert 'Put the final answer after "####".' in r["prompt"]
    assert len({r["prompt"] for r in rows}) == 200


def test_the_running_total_never_goes_negative_and_digits_stay_in_range():
    rng = random.Random(1)
    for _ in range(2000):
        terms = sample_terms(rng, 3, 4)
        total = 0
        for op, x in terms:
            assert 0 <= x <= 999
            total += x if op == "+" else -x
            assert total >= 0
        assert value(terms) == total
    assert {len(str(x)) for _, x in (t for _ in range(200) for t in sample_terms(rng, 3, 2))} == {1, 2, 3}


def test_solution_lines_are_gsm8k_style_steps():
    assert solution([("+", 23), ("+", 45), ("-", 12)]) == "23 + 45 = 68\n68 - 12 = 56\n#### 56"


def test_splits_are_disjoint_and_generation_is_deterministic():
    train = {r["prompt"] for r in tasks.generate("arith", "train", 500, 2, 0, 2)}
    test = {r["prompt"] for r in tasks.generate("arith", "test", 100, 2, 0, 2)}
    assert not train & test
    assert tasks.generate("arith", "test", 50, 2, 0, 2) == tasks.generate("arith", "test", 50, 2, 0, 2)
    assert tasks.generate("arith", "test", 50, 2, 1, 2) != tasks.generate("arith", "test", 50, 2, 0, 2)


@pytest.mark.parametrize("digits,operands,msg", [(5, 2, "difficulty"), (0, 2, "difficulty"), (2, 1, "operands")])
def test_bad_knobs_are_one_line_errors(digits, operands, msg):
    with pytest.raises(ValueError, match=msg):
        tasks.generate("arith", "train", 5, digits, 0, operands)
