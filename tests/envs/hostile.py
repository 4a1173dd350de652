"""Environments that misbehave, for the worker-pool tests (imported by the workers by path)."""
import os
import time


class _Base:
    def __init__(self, **_):
        self.turn = 0

    def reset(self, row, seed):
        return "", {}


class Raises(_Base):
    def step(self, action):
        raise RuntimeError("the env broke")


class Hangs(_Base):
    def step(self, action):
        time.sleep(60)


class Exits(_Base):
    def step(self, action):
        os._exit(3)


class Garbage(_Base):
    def step(self, action):
        return "obs", float("nan"), False, False, {}


class Fine(_Base):
    """Answers "ok <turn>" and ends at the third turn with reward 1."""

    def step(self, action):
        self.turn += 1
        return f"ok {self.turn}", 1.0 if self.turn == 3 else 0.0, self.turn == 3, False, {}


class Surrogate(_Base):
    """Answers with text that is not valid Unicode: a lone surrogate (a JSON "\\ud800" decoded) and
    an undecodable byte read with surrogateescape; ends at the second turn."""

    def step(self, action):
        self.turn += 1
        bad = "half \ud800 pair" if self.turn == 1 else b"byte \xff".decode("utf-8", "surrogateescape")
        return bad, 1.0 if self.turn == 2 else 0.0, self.turn == 2, False, {}


class Spins(_Base):
    """A turn that never ends, on the CPU (a pure-Python loop)."""

    def step(self, action):
        while True:
            pass


class ToolSleeps(_Base):
    """A turn whose python tool call sleeps for two minutes (a tool child of the env worker)."""

    def step(self, action):
        from vcppo.envs.tools import python_tool
        return python_tool(python_timeout_s=120)("import time; time.sleep(120)"), 0.0, True, False, {}


class Unseeded(_Base):
    """Answers with a number from an unseeded generator: not deterministic in (row, seed, actions)."""

    def step(self, action):
        import random
        self.turn += 1
        return f"{random.random()}", 0.0, self.turn == 2, False, {}
