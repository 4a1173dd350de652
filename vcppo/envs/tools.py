"""``tools``: tool calls in the Qwen / Hermes convention, as one environment.

The policy calls a tool by writing ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (one
or more per turn); each call is answered, in order, in ``<tool_response>...</tool_response>``, and
the episode goes on. A turn without a call is the final answer: it is scored by the row's verifier
(the built-in math scorer on ``answer``, as single-turn rows are), +1 / -1, and the episode ends.
An unknown tool, JSON that does not parse or arguments a tool refuses get a response saying so,
as agents expect, and count in ``env/tool_errors``; they never end the run.

Built-in tools: ``calculator`` (``{"expression": "12*(3+4)"}``: + - * / // % ** and parentheses on
numbers, evaluated from the syntax tree, never ``eval``) and ``python`` (``{"code": ...}``: run in a
child interpreter with a time limit and an address-space limit; its stdout is the answer).
``tools``: the names this env offers (all built-ins by default). Each call runs inside the env
worker, so a tool that hangs past ``rollout.env_timeout_s`` ends the episode as a counted failure.
"""
from __future__ import annotations

import ast
import json
import operator
import re
import subprocess
import sys

from vcppo.rewards.lifeline import limited

_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
        ast.USub: operator.neg, ast.UAdd: operator.pos}


class ToolError(Exception):
    """What a tool answers when its arguments are wrong (the message is the response)."""


def calculator(expression: str) -> str:
    """Arithmetic on numbers: the syntax tree is walked, so no name, call or attribute can run."""
    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 64:
                raise ToolError("exponent too large")
            return _OPS[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.operand))
        raise ToolError(f"unsupported expression element: {type(node).__name__}")
    if not isinstance(expression, str) or len(expression) > 200:
        raise ToolError("expression must be a string of at most 200 characters")
    try:
        value = ev(ast.parse(expression, mode="eval"))
    except SyntaxError:
        raise ToolError("expression does not parse") from None
    except ZeroDivisionError:
        raise ToolError("division by zero") from None
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def python(code: str, timeout_s: float = 2.0, memory_mb: int = 256) -> str:
    """Run ``code`` in a child interpreter (isolated mode, no site packages) limited to ``timeout_s``
    seconds and ``memory_mb`` MiB of address space; its stdout (and the last line of stderr on an
    error), cut to 1,000 characters."""
    if not isinstance(code, str):
        raise ToolError("code must be a string")
    # limits and death with the worker set in the child: no preexec_fn, so the worker is never forked
    command = limited([sys.executable, "-I", "-S", "-c", code], memory_mb * 2 ** 20, int(timeout_s) + 1)
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise ToolError(f"timed out after {timeout_s:g} s") from None
    out = done.stdout
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        out += f"error: {lines[-1] if lines else f'exit code {done.returncode}'}"
    return out.strip()[:1000]


TOOLS = {"calculator": calculator, "python": python}


def parse_tool_calls(text: str) -> list[tuple[str, dict] | str]:
    """Each ``<tool_call>`` of ``text``, in order: ``(name, arguments)``, or the error text that
    answers a call that does not parse."""
    calls: list[tuple[str, dict] | str] = []
    for body in _CALL.findall(text):
        try:
            call = json.loads(body)
        except json.JSONDecodeError as e:
            calls.append(f"error: the tool call is not valid JSON ({e.msg})")
            continue
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            calls.append('error: a tool call needs {"name": ..., "arguments": {...}}')
            continue
        args = call.get("arguments", {})
        if isinstance(args, str):  # some templates send the arguments JSON-encoded
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                args = None
        calls.append((call["name"], args) if isinstance(args, dict) else "error: arguments must be an object")
    return calls


class ToolEnv:
    def __init__(self, tools: list[str] | None = None, max_turns: int = 8):
        names = list(TOOLS) if tools is None else list(tools)
        unknown = [n for n in names if n not in TOOLS]
        if unknown:
            raise ValueError(f"tools env: unknown tool {unknown[0]!r}; built-in tools: {', '.join(TOOLS)}")
        self.tools, self.max_turns = {n: TOOLS[n] for n in names}, int(max_turns)
        self.answer, self.turn = None, 0

    def reset(self, row: dict, seed: int) -> tuple[str, dict]:
        self.answer, self.turn = row["answer"], 0
        return "", {}

    def call(self, name: str, args: dict) -> tuple[str, bool]:
        """(the response text, whether it was an error)."""
        if name not in self.tools:
            return f"error: unknown tool {name!r}; tools: {', '.join(self.tools)}", True
        try:
            return self.tools[name](**args), False
        except ToolError as e:
            return f"error: {e}", True
        except TypeError as e:  # wrong argument names
            return f"error: bad arguments for {name}: {e}", True

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        from vcppo.rewards.verifier import score
        self.turn += 1
        calls = parse_tool_calls(action)
        if not calls:
            reward = float(score(action, self.answer))
            return "", reward, True, False, {"solved": reward > 0}
        if self.turn >= self.max_turns:
            return "out of turns", -1.0, False, True, {"tool_calls": len(calls)}
        responses, errors = [], 0
        for call in calls:
            text, failed = (call, True) if isinstance(call, str) else self.call(*call)
            errors += failed
            responses.append(f"<tool_response>\n{text}\n</tool_response>")
        return "\n".join(responses), 0.0, False, False, {"tool_calls": len(calls), "tool_errors": errors}
