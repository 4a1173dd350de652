"""Task ``chain`` (vcppo.data.tasks_chain): generation, trace checking, answers, first wrong line."""
import collections

import pytest

from vcppo.data import tasks, tasks_chain as chain
from vcppo.rewards.verifier import score

OPS = [4821, 39, 702, 15]


def test_solutions_by_style():
    assert chain.solution(OPS, "full") == ("<think>\n4821+39=4860\n4860+702=5562\n5562+15=5577\n"
                                           "</think>\n\\boxed{5577}")
    assert chain.solution(OPS, "skip") == "<think>\n4821+39+702=5562\n5562+15=5577\n</think>\n\\boxed{5577}"
    assert chain.solution(OPS, "direct") == "<think>\n</think>\n\\boxed{5577}"
    for style in ("full", "skip", "direct"):
        text = chain.solution(OPS, style)
        assert chain.check_trace(chain.prompt_of(OPS), text) == []
        assert chain.style_of(chain.prompt_of(OPS), text) == style
        assert score(text, "5577") == 1.0


def test_generate_varies_length_and_mixes_styles():
    rows = tasks.generate("chain", "train", 600, seed=1)
    assert rows == tasks.generate("chain", "train", 600, seed=1)  # deterministic
    assert all(tasks.split_of(r["prompt"]) == "train" for r in rows)
    assert len({r["prompt"] for r in rows}) == 600
    assert {r["difficulty"] for r in rows} == set(range(2, 13))
    styles = collections.Counter(r["style"] for r in rows)
    assert styles["full"] > 300 and styles["skip"] > 100 and styles["direct"] > 50
    for r in rows:
        assert chain.check_trace(r["prompt"], r["solution"]) == []
        assert r["answer"] == str(sum(chain.parse_prompt(r["prompt"])))
        assert chain.style_of(r["prompt"], r["solution"]) == r["style"]
    full = [tasks.count_tokens(r["solution"]) for r in rows if r["style"] == "full"]
    assert min(full) < 40 and max(full) > 150  # a few dozen to ~200 tokens
    # full reasoning is longer on harder prompts: length is set by the prompt, shortened by the style
    by_k = {k: [tasks.count_tokens(r["solution"]) for r in rows if r["style"] == "full" and r["difficulty"] == k]
            for k in (3, 11)}
    assert min(by_k[11]) > max(by_k[3])
    assert not {r["prompt"] for r in rows} & {r["prompt"] for r in tasks.generate("chain", "val", 100)}


def test_chain_prompt_is_not_an_add_prompt():
    assert chain.parse_prompt("4821+3967=?") is None
    assert tasks._parse_add_prompt(chain.prompt_of(OPS)) is None


@pytest.mark.parametrize("bad, where", [
    ("<think>\n4821+39=4861\n4861+702=5563\n5563+15=5578\n</think>\n\\boxed{5578}", "line 1"),
    ("<think>\n4821+39=4860\n4860+702=5562\n5562+16=5578\n</think>\n\\boxed{5578}", "line 3"),
    ("<think>\n4821+39=4860\n4860+15=4875\n</think>\n\\boxed{4875}", "line 2"),       # skipped 702
    ("<think>\n4821+39+702+15=5577\n</think>\n\\boxed{5577}", "line 1"),              # 3 in one step
    ("<think>\n4821+39=4860\n5562+15=5577\n</think>\n\\boxed{5577}", "line 2"),       # wrong start
])
def test_check_trace_finds_wrong_lines(bad, where):
    errors = chain.check_trace(chain.prompt_of(OPS), bad)
    assert errors and errors[0].startswith(where)


def test_check_trace_answer_and_missing_operands():
    p = chain.prompt_of(OPS)
    assert chain.check_trace(p, "<think>\n</think>\n\\boxed{5570}") == ["boxed answer 5570 != 5577"]
    errs = chain.check_trace(p, "<think>\n4821+39=4860\n</think>\n\\boxed{5577}")
    assert errs == ["trace adds 2 of 4 operands"]
    assert chain.check_trace(p, "4821+39=4860") == ["no <think>...</think> block"]
    assert score("<think>\n</think>\n\\boxed{5570}", "5577") == -1.0


def test_first_wrong_line_offsets():
    p = chain.prompt_of(OPS)
    good = chain.solution(OPS, "full")
    assert tasks.first_wrong_line(p, good) is None  # dispatches to the chain checker
    bad = "<think>\n4821+39=4860\n4860+702=5561\n5561+15=5576\n</think>\n\\boxed{5576}"
    end_of_line2 = bad.index("5561\n") + len("5561\n")
    assert tasks.first_wrong_line(p, bad) == end_of_line2
    # a partial response: the wrong line counts only once its newline is written
    assert chain.first_wrong_line(p, bad[:end_of_line2 - 1]) is None
    assert chain.first_wrong_line(p, bad[:end_of_line2]) == end_of_line2
    # stopping early (lines that do not consume every operand) is wrong at </think>
    short = "<think>\n4821+39=4860\n</think>\n\\boxed{4860}"
    assert chain.first_wrong_line(p, short) == short.index("</think>") + len("</think>")
    # a wrong direct answer is visible only in the box
    assert chain.first_wrong_line(p, "<think>\n</think>\n\\boxed{1}") is None
    assert chain.first_wrong_line(p, "no think") is None
