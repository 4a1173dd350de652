"""The tool environment: Qwen / Hermes tool calls parsed, the calculator and the limited Python
tool answered in <tool_response>, bad calls answered with an error, the final answer scored."""
import pytest

from vcppo.envs.base import checked_turn, make_env
from vcppo.envs.tools import ToolError, calculator, parse_tool_calls, python


def test_calculator_walks_the_tree_only():
    assert calculator("12*(3+4)") == "84" and calculator("7/2") == "3.5" and calculator("-2**3") == "-8"
    for bad in ("__import__('os')", "a+1", "2**1000", "1/0", "(1"):
        with pytest.raises(ToolError):
            calculator(bad)


def test_python_tool_limits_time_and_memory():
    assert python("print(6*7)") == "42"
    with pytest.raises(ToolError, match="timed out"):
        python("while True: pass", timeout_s=0.5)
    assert "MemoryError" in python("x = bytearray(2 * 1024 ** 3)", memory_mb=128)


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
