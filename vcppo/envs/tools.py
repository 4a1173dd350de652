"""``tools``: tool calls in the Qwen / Hermes convention, as one environment.

The policy calls a tool by writing ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (one
or more per turn); each call is answered, in order, in ``<tool_response>...</tool_response>``, and
the episode goes on. A turn without a call is the final answer: it is scored by the row's verifier
(the built-in math scorer on ``answer``, as single-turn rows are), +1 / -1, and the episode ends.
An unknown tool, JSON that does not parse, arguments a tool refuses or input it cannot compute get a
response saying so, as agents expect, and count in ``env/tool_errors``; they never end the run.

Built-in tools: ``calculator`` (``{"expression": "12*(3+4)"}``: + - * / // % ** and parentheses on
numbers, evaluated from the syntax tree, never ``eval``, results of at most ``MAX_RESULT_BITS``) and
``python`` (``{"code": ...}``, nothing else: the program runs in the sandbox of
:mod:`vcppo.sandbox.bwrap`; its stdout is the answer). ``tools``: the names this env offers; without
a list only the calculator is offered (``DEFAULT_TOOLS``): model-written code runs only where the
user names ``python``. Its limits are this env's arguments (``python_timeout_s``,
``python_memory_mb``, ``python_max_processes``, ``python_max_file_mb``), never the call's. Where the
sandbox cannot start, an env offering ``python`` refuses to be built, naming the cause and
``allow_unsandboxed_python`` (true: run the code as a plain child process, on purpose). Each call runs
inside the env worker, so a tool that hangs past ``rollout.env_timeout_s`` ends the episode as a
counted failure (the sandbox dies with the worker).
"""
from __future__ import annotations

import ast
import inspect
import json
import math
import operator
import re

from vcppo.rewards.loading import load_reward_fn
from vcppo.sandbox.bwrap import Limits, run, sandbox_problem

_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
        ast.USub: operator.neg, ast.UAdd: operator.pos}
MAX_RESULT_BITS = 4096  # about 1,233 decimal digits: any larger integer is refused before it is computed
MAX_RESPONSE_CHARS = 1000
DEFAULT_TOOLS = ("calculator",)
UNSANDBOXED_KEY = "allow_unsandboxed_python"


class ToolError(Exception):
    """What a tool answers when its arguments are wrong (the message is the response)."""


def _power(left, right):
    if isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 0 \
            and right * math.log2(abs(left)) > MAX_RESULT_BITS:
        raise ToolError("result too large")
    return left ** right


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
            value = _power(left, right) if isinstance(node.op, ast.Pow) else _OPS[type(node.op)](left, right)
        elif isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            value = _OPS[type(node.op)](ev(node.operand))
        else:
            raise ToolError(f"unsupported expression element: {type(node).__name__}")
        if isinstance(value, int) and value.bit_length() > MAX_RESULT_BITS or isinstance(value, complex):
            raise ToolError("result too large" if isinstance(value, int) else "complex result")
        return value
    if not isinstance(expression, str) or len(expression) > 200:
        raise ToolError("expression must be a string of at most 200 characters")
    try:
        value = ev(ast.parse(expression, mode="eval"))
    except (SyntaxError, RecursionError, MemoryError):
        raise ToolError("expression does not parse") from None
    except ZeroDivisionError:
        raise ToolError("division by zero") from None
    except OverflowError:
        raise ToolError("result too large") from None
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


class PythonTool:
    """The ``python`` tool: ``code`` (its only argument) run in the sandbox under ``limits``; the
    answer is its stdout (and the last line of stderr on an error), cut to ``MAX_RESPONSE_CHARS``."""

    def __init__(self, limits: Limits, allow_unsandboxed: bool = False):
        self.limits, self.allow_unsandboxed = limits, bool(allow_unsandboxed)

    def __call__(self, code: str) -> str:
        if not isinstance(code, str):
            raise ToolError("code must be a string")
        done = run(code, limits=self.limits, allow_unsandboxed=self.allow_unsandboxed)
        if done.timed_out:
            raise ToolError(f"timed out after {self.limits.timeout_s:g} s")
        out = done.stdout
        if done.exit_code != 0:
            lines = done.stderr.strip().splitlines()
            out += f"error: {lines[-1] if lines else f'exit code {done.exit_code}'}"
        return out.strip()[:MAX_RESPONSE_CHARS]


def python_tool(python_timeout_s: float = 2.0, python_memory_mb: int = 256, python_max_processes: int = 16,
                python_max_file_mb: int = 16, allow_unsandboxed_python: bool = False) -> PythonTool:
    """The env's ``python`` tool from its arguments; ValueError (one line) where the sandbox cannot
    start and ``allow_unsandboxed_python`` is not set."""
    if not isinstance(allow_unsandboxed_python, bool):
        raise ValueError(f"tools env: {UNSANDBOXED_KEY} must be true or false, got {allow_unsandboxed_python!r}")
    try:
        limits = Limits(python_timeout_s, python_memory_mb, python_max_processes, python_max_file_mb)
    except ValueError as e:
        raise ValueError(f"tools env: {e} (rollout.env_args.python_<limit>)") from None
    if not allow_unsandboxed_python and (problem := sandbox_problem()):
        raise ValueError(f"tools env: the python tool cannot sandbox model code here: {problem}; set "
                         f"rollout.env_args.{UNSANDBOXED_KEY}=true to run it unsandboxed on purpose")
    return PythonTool(limits, allow_unsandboxed_python)


PYTHON_ARGS = tuple(inspect.signature(python_tool).parameters)


TOOLS = ("calculator", "python")


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
        except RecursionError:
            calls.append("error: the tool call is nested too deeply")
            continue
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            calls.append('error: a tool call needs {"name": ..., "arguments": {...}}')
            continue
        args = call.get("arguments", {})
        if isinstance(args, str):  # some templates send the arguments JSON-encoded
            try:
                args = json.loads(args)
            except (json.JSONDecodeError, RecursionError):
                args = None
        calls.append((call["name"], args) if isinstance(args, dict) else "error: arguments must be an object")
    return calls


class ToolEnv:
    """The env (module docstring). ``tools``: the names offered (None: ``DEFAULT_TOOLS``);
    ``answer_reward``: ``"module:function"`` that scores the final answer against the row's ``answer``
    (None: the built-in math verifier; ``vcppo.rewards.code:score`` for code rows, whose program the
    policy may first try with the python tool); the ``python_*`` arguments and
    ``allow_unsandboxed_python``: the python tool's (:func:`python_tool`)."""

    def __init__(self, tools: list[str] | None = None, max_turns: int = 8, answer_reward: str | None = None,
                 **python_args):
        names = list(DEFAULT_TOOLS if tools is None else tools)
        unknown = [n for n in names if n not in TOOLS]
        if unknown:
            raise ValueError(f"tools env: unknown tool {unknown[0]!r}; built-in tools: {', '.join(TOOLS)}")
        bad = [k for k in python_args if k not in PYTHON_ARGS]
        if bad:
            raise TypeError(f"tools env: unknown argument {bad[0]!r}; arguments: tools, max_turns, answer_reward, "
                             f"{', '.join(PYTHON_ARGS)}")
        self.tools = {n: python_tool(**python_args) if n == "python" else calculator for n in names}
        self.max_turns = int(max_turns)
        self.answer_reward = load_reward_fn(answer_reward) if answer_reward is not None else None
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
            reward = float((self.answer_reward or score)(action, self.answer))
            return "", reward, True, False, {"solved": reward > 0}
        if self.turn >= self.max_turns:
            return "out of turns", -1.0, False, True, {"tool_calls": len(calls)}
        responses, errors = [], 0
        for call in calls:
            text, failed = (call, True) if isinstance(call, str) else self.call(*call)
            errors += failed
            responses.append(f"<tool_response>\n{text}\n</tool_response>")
        return "\n".join(responses), 0.0, False, False, {"tool_calls": len(calls), "tool_errors": errors}
