"""Task ``code``: rows are deterministic, splits disjoint, each row's test cases are the program's
true outputs, and the code-execution reward scores the demonstration right and a near miss wrong."""
import json

import pytest

from vcppo.data import tasks
from vcppo.data.tasks_code import evaluate
from vcppo.envs.tools import calculator
from vcppo.rewards.code import score


def test_deterministic_and_disjoint():
    a = tasks.generate("code", "train", 50, seed=3)
    assert a == tasks.generate("code", "train", 50, seed=3) != tasks.generate("code", "train", 50, seed=4)
    val = {r["prompt"] for r in tasks.generate("code", "val", 40, seed=3)}
    assert not val & {r["prompt"] for r in tasks.generate("code", "train", 400, seed=3)}


@pytest.mark.parametrize("operands", [2, 3])
def test_cases_are_the_expression_values(operands):
    """The outputs agree with the calculator tool on the expression, inputs put in (precedence included)."""
    for row in tasks.generate("code", "train", 100, seed=0, operands=operands):
        expr = row["prompt"].removeprefix("code: ")
        cases = json.loads(row["answer"])
        for line, out in zip(cases["inputs"], cases["outputs"]):
            filled = expr
            for name, value in zip("abc", line.split()):
                filled = filled.replace(name, f"({value})")
            assert out == calculator(filled) + "\n"


def test_evaluate_follows_precedence():
    assert evaluate(["a", "*", 3, "+", "b", "-", 7], {"a": 2, "b": 5}) == 2 * 3 + 5 - 7
    assert evaluate(["a", "-", 3, "*", "b", "*", 7], {"a": 2, "b": 5}) == 2 - 3 * 5 * 7


def test_the_reward_runs_the_demonstration():
    for row in tasks.generate("code", "train", 3, seed=1):
        assert score(row["solution"], row["answer"]) == 1.0
        near_miss = row["solution"].replace("print(", "print(1+", 1)
        assert score(near_miss, row["answer"]) == -1.0
