"""Task ``chain_tools`` (multi-turn, ``rollout.env=tools``): ``chain``'s sums with a calculator the
policy may call (tool-integrated reasoning, :class:`vcppo.envs.tools.ToolEnv`).

The prompt is ``chain``'s (``sum(4821,39,702,15,8,260)=?``). The SFT demonstrations mix four ways
to answer; three are ``chain``'s one-turn styles (``full``, ``skip``, ``direct``: the model adds in
its own head), the fourth calls the calculator for sub-sums of at most ``TOOL_CHUNK`` operands,
carrying each answer into the next call, then copies the last one into the box::

    <think>
    </think>
    <tool_call>{"name": "calculator", "arguments": {"expression": "4821+39+702+15+8"}}</tool_call>
        -> user turn: <tool_response>\\n5585\\n</tool_response>
    <think>
    </think>
    <tool_call>{"name": "calculator", "arguments": {"expression": "5585+260"}}</tool_call>
        -> user turn: <tool_response>\\n5845\\n</tool_response>
    <think>
    </think>
    \\boxed{5845}

Why this shape: a 1.6M model's own additions go wrong on long prompts, and copying digits into a
call and out of a response is what it does reliably, so the tool is the better policy, but SFT
sees it in only ``TOOL_SHARE`` of the demonstrations: RL has to find it. The second call starts from
the first one's answer, so the policy (and the critic) must read the observation.

A row: ``prompt``, ``answer`` (the sum), ``solution`` (the demonstration after the prompt, the tool's
answers in the chat template's user turns exactly as the episode runner appends them), ``style``,
``difficulty`` (the number of operands), ``extra_info.env_args`` (``tools: [calculator]``,
``max_turns``).
"""
from __future__ import annotations

import json
import random
from typing import Sequence

import vcppo.data.tasks_chain as tasks_chain
from vcppo.data.tasks_guess import IM_END, USER_TURN

TOOL_CHUNK = 5  # operands per calculator call: up to 5 operands take one call, 6-9 two
TOOL_SHARE = 0.25  # the share of demonstrations that call the calculator
DEFAULT_MAX_OPERANDS = 8


def tool_call(expression: str) -> str:
    """A calculator call in the Qwen / Hermes convention."""
    call = {"name": "calculator", "arguments": {"expression": expression}}
    return f"<tool_call>{json.dumps(call)}</tool_call>"


def tool_turns(operands: Sequence[int]) -> int:
    """The episode's turns in the tool style: one per call, and the answer."""
    return 1 + -(-(len(operands) - 1) // (TOOL_CHUNK - 1))


def tool_solution(operands: Sequence[int]) -> str:
    """The tool style's conversation after the prompt (without the final end-of-turn token, which
    SFT appends): calls on chunks of at most ``TOOL_CHUNK`` operands, the first of each later chunk
    being the previous call's answer, then the boxed sum."""
    empty_think = f"{tasks_chain.THINK_OPEN}\n{tasks_chain.THINK_CLOSE}\n"
    parts, total, i = [], operands[0], 1
    while i < len(operands):
        terms = [total, *operands[i:i + TOOL_CHUNK - 1]]
        total, i = sum(terms), i + TOOL_CHUNK - 1
        parts.append(empty_think + tool_call("+".join(map(str, terms))))
        parts.append(IM_END + USER_TURN.format(obs=f"<tool_response>\n{total}\n</tool_response>"))
    parts.append(empty_think + f"\\boxed{{{total}}}")
    return "".join(parts)


def sample_style(rng: random.Random) -> str:
    return "tool" if rng.random() < TOOL_SHARE else tasks_chain.sample_style(rng)


def write(operands: Sequence[int], style: str) -> str:
    return tool_solution(operands) if style == "tool" else tasks_chain.solution(operands, style)


def generate_rows(split: str, n: int, max_operands: int, digits: int, seed: int, split_of) -> list[dict]:
    """``chain``'s rows (:func:`vcppo.data.tasks_chain.generate_rows`) with this task's styles and the env's
    arguments; a row's ``max_turns`` fits the tool style's calls."""
    turns = tool_turns(range(max_operands)) + 1  # one spare turn: a call may go wrong once
    rows = tasks_chain.generate_rows(split, n, max_operands, digits, seed, split_of, task="chain_tools",
                                     styles=sample_style, write=write)
    for row in rows:
        row["extra_info"] = {"env_args": {"tools": ["calculator"], "max_turns": turns}}
    return rows
