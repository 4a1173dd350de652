"""The chain_tools task: its demonstrations replay in the tools env, the calls chain their answers."""
import collections
import json
import re

import pytest

from vcppo.data import tasks, tasks_chain, tasks_chain_tools, tasks_guess
from vcppo.driver.step.multi_turn import ObservationEncoder
from vcppo.envs.base import checked_turn, make_env
from vcppo.envs.tools import parse_tool_calls
from vcppo.models.tokenizer import build_tokenizer

FRAME = re.escape(tasks_guess.IM_END + tasks_guess.USER_TURN).replace(r"\{obs\}", "(.*?)")


def replay(row: dict) -> list:
    """Each model turn of the row's demonstration, stepped in its env: the turns, checking that every
    observation the demonstration shows is the one the env answers."""
    env = make_env("tools", **row["extra_info"]["env_args"])
    env.reset(row, 0)
    parts = re.split(FRAME, row["solution"], flags=re.DOTALL)
    actions, shown = parts[0::2], parts[1::2]
    out = []
    for i, action in enumerate(actions):
        out.append(checked_turn(env.step(action)))
        if i < len(shown):
            assert out[-1].observation == shown[i], (row["prompt"], i)
    return out


def test_every_style_solves_its_row_in_the_env():
    rows = tasks.generate("chain_tools", "train", n=400, seed=0)
    styles = collections.Counter(r["style"] for r in rows)
    assert set(styles) == {"full", "skip", "direct", "tool"}
    assert 0.18 < styles["tool"] / len(rows) < 0.32  # TOOL_SHARE = 0.25: RL has the tool to find
    for r in rows:
        turns = replay(r)
        assert turns[-1].terminated and turns[-1].reward == 1.0 and turns[-1].solved, r["prompt"]
        ops = tasks_chain.parse_prompt(r["prompt"])
        assert r["answer"] == str(sum(ops)) and r["difficulty"] == len(ops)
        assert all(0 <= x <= 9 for x in ops) and 2 <= len(ops) <= 8  # one digit, 2..8 operands
        if r["style"] == "tool":
            assert len(turns) == tasks_chain_tools.tool_turns(ops) <= r["extra_info"]["env_args"]["max_turns"] - 1
            assert sum(t.tool_calls for t in turns) == len(turns) - 1 and not any(t.tool_errors for t in turns)
        else:
            assert len(turns) == 1 and tasks_chain.check_trace(r["prompt"], r["solution"]) == []


def test_calls_take_sub_sums_and_carry_the_answer():
    ops = [2, 3, 5, 6, 8, 9, 1]
    text = tasks_chain_tools.tool_solution(ops)
    calls = [c for turn in re.split(FRAME, text, flags=re.DOTALL)[0::2] for c in parse_tool_calls(turn)]
    expressions = [args["expression"] for name, args in calls]
    assert expressions == ["2+3+5+6+8", "24+9+1"]  # five operands, then the answer and the rest
    assert text.endswith("\\boxed{34}")
    assert [tasks_chain_tools.tool_turns(range(k)) for k in (2, 5, 6, 9, 10)] == [2, 2, 3, 3, 4]
    assert json.loads(tasks_chain_tools.tool_call("1+2")[len("<tool_call>"):-len("</tool_call>")]) == {
        "name": "calculator", "arguments": {"expression": "1+2"}}


def test_rows_are_deterministic_distinct_and_split_apart():
    a = tasks.generate("chain_tools", "train", n=200, seed=3)
    assert a == tasks.generate("chain_tools", "train", n=200, seed=3)
    assert len({r["prompt"] for r in a}) == 200
    val = tasks.generate("chain_tools", "val", n=50, seed=3)
    assert not {r["prompt"] for r in a} & {r["prompt"] for r in val}


@pytest.mark.parametrize("tool_row", range(3))
def test_sft_demonstrations_tokenize_like_the_episodes(tool_row):
    """A tool demonstration's SFT ids are its model turns' ids, each closed by the end-of-turn token,
    and the env's answers as the episode runner encodes them."""
    tok = build_tokenizer()
    rows = [r for r in tasks.generate("chain_tools", "train", n=200, seed=0) if r["style"] == "tool"]
    row = rows[tool_row]
    parts = re.split(FRAME, row["solution"], flags=re.DOTALL)
    encode, ids = ObservationEncoder(tok), []
    for i, action in enumerate(parts[0::2]):
        ids += tok.encode(action, add_special_tokens=False)
        if i < len(parts[1::2]):
            ids += [tok.eos_token_id] + encode(parts[1::2][i])
    assert tok.encode(row["solution"], add_special_tokens=False) == ids
