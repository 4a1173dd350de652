"""Synthetic add task: determinism, disjoint splits, step-by-step correct traces, length."""
import random
import re

import pytest

from vcppo.data import tasks
from vcppo.rewards.verifier import score


def test_deterministic_same_seed_same_data():
    a = tasks.generate("add", "train", 50, seed=7)
    b = tasks.generate("add", "train", 50, seed=7)
    c = tasks.generate("add", "train", 50, seed=8)
    assert a == b
    assert a != c


def test_splits_disjoint_and_distinct():
    prompts = {s: [r["prompt"] for r in tasks.generate("add", s, 300, difficulty=3, seed=0)]
               for s in tasks.SPLITS}
    for s, ps in prompts.items():
        assert len(set(ps)) == len(ps), f"duplicates in {s}"
        assert all(tasks.split_of(p) == s for p in ps)
    assert not set(prompts["train"]) & set(prompts["val"])
    assert not set(prompts["train"]) & set(prompts["test"])
    assert not set(prompts["val"]) & set(prompts["test"])
    # a different seed draws different rows but can never cross splits
    other = [r["prompt"] for r in tasks.generate("add", "val", 300, difficulty=3, seed=1)]
    assert not set(other) & set(prompts["train"])


def test_too_small_prompt_space_raises():
    with pytest.raises(ValueError, match="distinct"):
        tasks.generate("add", "val", 100, difficulty=1)  # only ~100 prompts in all, 5% in val


# chain, chain_tools and code: their own test files; guess: tests/envs
@pytest.mark.parametrize("task", [t for t in tasks.TASKS if t not in ("chain", "chain_tools", "guess", "code", "arith", "arith_words")])
@pytest.mark.parametrize("difficulty,operands", [(None, None), (3, 2), (12, 2), (5, 3)])
def test_every_trace_is_correct_step_by_step(task, difficulty, operands):
    rows = tasks.generate(task, "train", 200, difficulty=difficulty, seed=11, operands=operands)
    for r in rows:
        assert tasks.check_add_trace(r["prompt"], r["solution"]) == [], r
        ops = [int(x) for x in r["prompt"][:-2].split("+")]
        assert r["answer"] == str(sum(ops))
        assert tasks.answer_from_trace(r["solution"]) == r["answer"]
        assert score(r["solution"], r["answer"]) == 1.0
        assert score(r["solution"], str(int(r["answer"]) + 1)) == -1.0


def test_check_trace_catches_a_wrong_step():
    r = tasks.generate("add", "train", 1, seed=0)[0]
    bad = re.sub(r"c(\d)\n", lambda m: f"c{1 - int(m.group(1))}\n", r["solution"], count=1)  # flip a carry
    assert tasks.check_add_trace(r["prompt"], bad)
    assert tasks.check_add_trace("1+2=?", r["solution"])


def test_default_difficulty_trace_length():
    stats = tasks.trace_length_stats(tasks.generate("add", "train", 500, seed=0))
    assert stats["min"] >= 100
    assert stats["max"] <= 300


def test_dropping_steps_gives_wrong_answer():
    """A shortened trace (steps dropped) implies a different answer in (nearly) every case."""
    rng = random.Random(0)
    rows = tasks.generate("add", "train", 300, seed=5)
    wrong = 0
    for r in rows:
        body = r["solution"].split("<think>\n")[1].split("\n</think>")[0].split("\n")
        k = rng.randint(1, len(body) - 1)
        keep = sorted(rng.sample(range(len(body)), len(body) - k))
        short = "<think>\n" + "\n".join(body[i] for i in keep) + "\n</think>\n"
        implied = tasks.answer_from_trace(short)
        short += f"\\boxed{{{implied}}}"
        assert tasks.count_tokens(short) < tasks.count_tokens(r["solution"])
        assert tasks.check_add_trace(r["prompt"], short)
        wrong += score(short, r["answer"]) == -1.0
    assert wrong / len(rows) > 0.98


def test_count_tokens_matches_tokenizer():
    from vcppo.models.tokenizer import build_tokenizer
    tok = build_tokenizer()
    rows = tasks.generate("add", "test", 20, seed=0)
    assert tasks.trace_length_stats(rows) == tasks.trace_length_stats(rows, tokenizer=tok)


def test_unknown_task_and_split():
    with pytest.raises(ValueError, match="add"):
        tasks.generate("sort", "train", 1)
    with pytest.raises(ValueError, match="split"):
        tasks.generate("add", "dev", 1)


def test_first_wrong_line_marks_where_the_outcome_is_decided():
    r = tasks.generate("add", "train", 1, seed=3)[0]
    sol, prompt = r["solution"], r["prompt"]
    assert tasks.first_wrong_line(prompt, sol) is None
    # a wrong boxed answer with a right trace: no line is wrong (the error comes after the trace)
    assert tasks.first_wrong_line(prompt, sol.replace(r["answer"], str(int(r["answer"]) + 1))) is None
    lines = sol.split("\n")            # ["<think>", line 1, ..., line W, "</think>", "\\boxed{..}"]
    bad3 = re.sub(r"d(\d)", lambda m: f"d{(int(m.group(1)) + 1) % 10}", lines[3], count=1)
    wrong = "\n".join(lines[:3] + [bad3] + lines[4:])
    end_of_line3 = len("\n".join(lines[:4])) + 1     # just past line 3's newline
    assert tasks.first_wrong_line(prompt, wrong) == end_of_line3
    # a partial response: the wrong line counts only once its newline is written
    assert tasks.first_wrong_line(prompt, wrong[:end_of_line3 - 1]) is None
    assert tasks.first_wrong_line(prompt, wrong[:end_of_line3]) == end_of_line3
    # dropping a middle line makes the next one wrong (its digits are the wrong column's) ...
    dropped = "\n".join(lines[:3] + lines[4:])
    assert tasks.first_wrong_line(prompt, dropped) == end_of_line3 + len(lines[4]) - len(lines[3])
    # ... and a trace closed with its last line missing is wrong at the end of </think>
    short = "\n".join(lines[:-3] + lines[-2:])
    assert tasks.first_wrong_line(prompt, short) == short.index("</think>") + len("</think>")
    assert tasks.check_add_trace(prompt, short) and tasks.check_add_trace(prompt, wrong)
    with pytest.raises(ValueError, match="add format"):
        tasks.first_wrong_line("hello", sol)


def test_add_running_checks_the_running_answer():
    r = tasks.generate("add_running", "train", 1, seed=4)[0]
    lines = r["solution"].split("\n")
    assert all(" r" in line for line in lines[1:-2])
    assert lines[-1] == "\\boxed{" + r["answer"] + "}" and r["answer"].endswith(lines[-3].rsplit(" r", 1)[1])
    wrong_r = "\n".join(lines[:2] + [lines[2][:-1] + str((int(lines[2][-1]) + 1) % 10)] + lines[3:])
    assert any("running answer" in e for e in tasks.check_add_trace(r["prompt"], wrong_r))
    assert tasks.first_wrong_line(r["prompt"], wrong_r) == len("\n".join(lines[:3])) + 1
    missing_r = "\n".join(lines[:2] + [lines[2].rsplit(" r", 1)[0]] + lines[3:])
    assert any("no running answer" in e for e in tasks.check_add_trace(r["prompt"], missing_r))
    assert " r" not in tasks.generate("add", "train", 1, seed=4)[0]["solution"]  # plain add: no r


def test_first_wrong_line_tokens_maps_the_offset_onto_tokens():
    operands = [4427489, 5682116]
    good = tasks.add_solution(operands)
    assert tasks.first_wrong_line_tokens(tasks.add_prompt(operands), list(good)) is None
    bad = good.replace("8+1+1=10 d0 c1", "8+1+1=11 d1 c1")
    pieces = re.findall(r"\n|[^\n]{1,4}", bad)  # 4-character tokens, a newline on its own
    line_start, visible_from = tasks.first_wrong_line_tokens(tasks.add_prompt(operands), pieces)
    assert "".join(pieces[line_start:visible_from]) == "8+1+1=11 d1 c1\n"  # the wrong line, and no more
