"""The tool environment: Qwen / Hermes tool calls parsed, the calculator and the sandboxed Python
tool answered in <tool_response>, bad calls answered with an error, the final answer scored.
The sandbox's escapes through the env's API: tests/envs/test_tools_escapes.py."""
import json

import pytest

import vcppo.sandbox.bwrap as bwrap
from vcppo.envs.base import checked_turn, make_env
from vcppo.envs.tools import DEFAULT_TOOLS, ToolError, calculator, parse_tool_calls


def test_calculator_walks_the_tree_only():
    assert calculator("12*(3+4)") == "84" and calculator("7/2") == "3.5" and calculator("-2**3") == "-8"
    for bad in ("__import__('os')", "a+1", "2**1000", "1/0", "(1"):
        with pytest.raises(ToolError):
            calculator(bad)


def test_calculator_hostile_inputs_are_tool_errors():
    """A power tower, a float overflow, a complex root: each a quick error."""
    import time
    start = time.process_time()
    for bad in ("(((9**64)**64)**64)**64", "(9**64)**64", "2**64**64",
                "1e300**2", "(-8)**0.5"):
        with pytest.raises(ToolError):
            calculator(bad)
    assert time.process_time() - start < 1.0


def _python_call(code: str, **extra) -> str:
    return "<tool_call>" + json.dumps({"name": "python", "arguments": {"code": code, **extra}}) + "</tool_call>"


def test_python_tool_limits_time_and_memory_from_env_args():
    env = make_env("tools", tools=["python"], python_timeout_s=2.5, python_memory_mb=128)
    env.reset({"answer": "0"}, seed=0)
    assert checked_turn(env.step(_python_call("print(6*7)"))).observation == "<tool_response>\n42\n</tool_response>"
    assert "timed out after 2.5 s" in checked_turn(env.step(_python_call("while True: pass"))).observation
    assert "MemoryError" in checked_turn(env.step(_python_call("x = bytearray(2 * 1024 ** 3)"))).observation


def test_hostile_calls_answer_tool_errors_not_exceptions():
    """100k-deep JSON, a 0xff byte on stdout, a power tower: each answered in the episode."""
    env = make_env("tools", tools=["calculator", "python"])
    env.reset({"answer": "0"}, seed=0)
    deep = "<tool_call>" + "[" * 100_000 + "]" * 100_000 + "</tool_call>"
    turn = checked_turn(env.step(deep))
    assert (turn.tool_errors, turn.terminated) == (1, False) and "nested too deeply" in turn.observation
    turn = checked_turn(env.step(_python_call("import sys; sys.stdout.buffer.write(bytes([0xff, 65]))")))
    assert turn.tool_errors == 0 and turn.observation == "<tool_response>\n\ufffdA\n</tool_response>"
    turn = checked_turn(env.step('<tool_call>{"name": "calculator", "arguments": {"expression": "(9**64)**64"}}'
                                 '</tool_call>'))
    assert turn.tool_errors == 1 and "result too large" in turn.observation


def test_python_is_offered_only_when_named():
    assert DEFAULT_TOOLS == ("calculator",)
    env = make_env("tools")
    env.reset({"answer": "0"}, seed=0)
    turn = checked_turn(env.step(_python_call("print(1)")))
    assert turn.observation == "<tool_response>\nerror: unknown tool 'python'; tools: calculator\n</tool_response>"


def test_no_sandbox_refuses_naming_the_cause_and_the_key(monkeypatch):
    monkeypatch.setattr(bwrap, "_bwrap", lambda: "/nonexistent/bwrap")
    bwrap.sandbox_problem.cache_clear()
    try:
        with pytest.raises(ValueError) as e:
            make_env("tools", tools=["python"])
        message = str(e.value)
        assert "\n" not in message and "/nonexistent/bwrap" in message
        assert "rollout.env_args.allow_unsandboxed_python=true" in message
        # on purpose: it runs (a generous limit: a loaded host took over the default 2 s to start python)
        env = make_env("tools", tools=["python"], allow_unsandboxed_python=True, python_timeout_s=60)
        env.reset({"answer": "0"}, seed=0)
        assert "42" in checked_turn(env.step(_python_call("print(6*7)"))).observation
        make_env("tools")  # the calculator alone needs no sandbox
    finally:
        bwrap.sandbox_problem.cache_clear()


def test_bad_env_args_name_the_argument():
    with pytest.raises(TypeError, match="unknown argument 'python_timeout'"):
        make_env("tools", tools=["python"], python_timeout=3)
    with pytest.raises(ValueError, match="'memory_mb' must be a positive number"):
        make_env("tools", tools=["python"], python_memory_mb=0)
    with pytest.raises(ValueError, match="allow_unsandboxed_python must be true or false, got 'false'"):
        make_env("tools", tools=["python"], allow_unsandboxed_python="false")  # a truthy string never unsandboxes


def test_parse_calls_and_errors():
    text = ('<tool_call>{"name": "calculator", "arguments": {"expression": "1+2"}}</tool_call>'
            '<tool_call>{"name": oops}</tool_call><tool_call>{"name": "python", "arguments": "{\\"code\\": \\"1\\"}"}'
            '</tool_call>')
    calls = parse_tool_calls(text)
    assert calls[0] == ("calculator", {"expression": "1+2"}) and calls[1].startswith("error: the tool call is not valid JSON")
    assert calls[2] == ("python", {"code": "1"})


def test_episode_of_calls_then_an_answer():
    env = make_env("tools", tools=["calculator"])
    env.reset({"answer": "84"}, seed=0)
    turn = checked_turn(env.step('<tool_call>{"name": "calculator", "arguments": {"expression": "12*7"}}</tool_call>'
                                 '<tool_call>{"name": "python", "arguments": {"code": "1"}}</tool_call>'))
    assert turn.observation == ("<tool_response>\n84\n</tool_response>\n<tool_response>\nerror: unknown tool "
                                "'python'; tools: calculator\n</tool_response>")
    assert (turn.tool_calls, turn.tool_errors, turn.terminated) == (2, 1, False)
    final = checked_turn(env.step("<think>12*7=84</think>\\boxed{84}"))
    assert (final.reward, final.terminated, final.solved) == (1.0, True, True)


def test_a_code_episode_tries_its_program_then_answers_it():
    """Code rows in episodes: the python tool runs a draft, the final answer is scored by running it
    against the row's cases (answer_reward)."""
    cases = json.dumps({"inputs": ["2 3\n", "7 1\n"], "outputs": ["6\n", "7\n"]})
    program = "a,b=map(int,input().split())\nprint(a*b)"
    for final, reward in ((program, 1.0), (program.replace("a*b", "a+b"), -1.0)):
        env = make_env("tools", tools=["python"], answer_reward="vcppo.rewards.code:score")
        env.reset({"answer": cases}, seed=0)
        draft = checked_turn(env.step(_python_call("a, b = 2, 3\nprint(a*b)")))
        assert draft.observation == "<tool_response>\n6\n</tool_response>"
        done = checked_turn(env.step(f"<think>\n</think>\n```python\n{final}\n```"))
        assert (done.reward, done.terminated, done.solved) == (reward, True, reward > 0)
