"""scripts/oracle_critic_rl.py: where the oracle puts the error, its values, and the shift report."""
import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from vcppo.data.tasks import add_prompt, add_solution

spec = importlib.util.spec_from_file_location("oracle_critic_rl",
                                              Path(__file__).parents[2] / "scripts" / "oracle_critic_rl.py")
oracle = importlib.util.module_from_spec(spec)
spec.loader.exec_module(oracle)


class CharTokenizer:
    """One token per character (ids are code points), as a stand-in for the demo's tokenizer."""

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(i) for i in ids)


def ids(text):
    return [ord(c) for c in text]


@pytest.fixture
def row():
    operands = [4427489, 5682116]
    return {"prompt": add_prompt(operands), "solution": add_solution(operands)}


def test_error_span_marks_the_first_wrong_line(row):
    tok, solution = CharTokenizer(), row["solution"]
    assert oracle.error_span(tok, ids(row["prompt"]), ids(solution)) is None
    lines = solution.split("\n")  # "<think>", then one line per column
    assert lines[2] == "8+1+1=10 d0 c1"
    wrong = "\n".join(lines[:2] + ["8+1+1=11 d1 c1"] + lines[3:])
    line_start = len("\n".join(lines[:2])) + 1
    span = oracle.error_span(tok, ids(row["prompt"]), ids(wrong))
    assert span is not None
    assert span[0] == line_start  # the wrong line's first token
    assert wrong[span[1] - 1] == "\n"  # the state after the newline that completes it


def test_chat_wrapped_prompts_are_unwrapped(row):
    tok = CharTokenizer()
    wrapped = f"<|im_start|>user\n{row['prompt']}<|im_end|>\n<|im_start|>assistant\n"
    assert oracle.error_span(tok, ids(wrapped), ids(row["solution"])) is None


def test_oracle_values_drop_to_the_wrong_score_after_the_error():
    mask = torch.tensor([[1., 1., 1., 1., 0.], [1., 1., 1., 1., 1.]])
    batch = SimpleNamespace(policy_mask=mask, scores=torch.tensor([1.0, -1.0]))
    mean = oracle.baseline_values(batch, [None, (1, 3)], "mean", -1.0)
    assert torch.equal(mean, torch.zeros(2, 5) * mask)  # the batch's mean return is 0
    v = oracle.baseline_values(batch, [None, (1, 3)], "oracle", -1.0)
    assert v[1].tolist() == [0., 0., 0., -1., -1.] and v[0].tolist() == [0.] * 5


def test_logprob_shift_splits_wrong_responses_at_the_error():
    mask = torch.ones(2, 4)
    old = torch.zeros(2, 4)
    new = torch.tensor([[0.1, 0.1, 0.1, 0.1], [0.5, -1.0, -2.0, 0.25]])
    batch = SimpleNamespace(policy_mask=mask, scores=torch.tensor([1.0, -1.0]), old_logprobs=old)
    out = oracle.logprob_shift(batch, [None, (1, 3)], new)
    assert out == pytest.approx({"shift/correct": 0.4, "shift/before_error": 0.5, "shift/error_line": -3.0,
                                 "shift/after_error": 0.25})
