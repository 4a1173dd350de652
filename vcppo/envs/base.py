"""The environment API: gymnasium's shape for text (GEM, TextArena and gymnasium use it).

    env = make_env("guess", **kwargs)
    observation, info = env.reset(row, seed)                      # row: the data row (a dict)
    observation, reward, terminated, truncated, info = env.step(action_text)

``action_text`` is the policy's turn, decoded (special tokens dropped). ``observation`` is the text
the environment answers with (the next user or tool turn; ``info["role"]``, default ``"user"``),
``reward`` a float given for this turn (it sits on the turn's last model token), ``terminated`` the
episode's natural end, ``truncated`` an end the environment imposed. The observation of a
``reset`` is appended to the prompt when it is not empty.

An environment must be deterministic in (row, seed, actions so far): a resumed run repeats its
episodes, and the worker pool may replay an episode's earlier actions on a fresh instance.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol

from vcppo.rewards.loading import load_reward_fn


class Env(Protocol):
    def reset(self, row: dict, seed: int) -> tuple[str, dict]: ...
    def step(self, action: str) -> tuple[str, float, bool, bool, dict]: ...


@dataclass
class Turn:
    """One validated ``step``: what the driver reads of it (the ``info`` keys it knows)."""
    observation: str
    reward: float
    terminated: bool
    truncated: bool
    role: str = "user"
    tool_calls: int = 0
    tool_errors: int = 0
    solved: bool = False
    extra: dict = field(default_factory=dict)


BUILTIN = {"guess": "vcppo.envs.guess:GuessEnv", "tools": "vcppo.envs.tools:ToolEnv"}


def env_class(name: str):
    """The class ``rollout.env`` names: a built-in name (:data:`BUILTIN`) or ``"module:Class"``."""
    return load_reward_fn(BUILTIN.get(name, name))


def make_env(name: str, **kwargs) -> Env:
    return env_class(name)(**kwargs)


def checked_reset(out: Any) -> tuple[str, dict]:
    """``reset``'s answer, or ValueError naming what is wrong with it."""
    if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], str) and isinstance(out[1], dict)):
        raise ValueError(f"env.reset must return (observation: str, info: dict), got {_short(out)}")
    return out


def checked_turn(out: Any) -> Turn:
    """``step``'s answer as a :class:`Turn`, or ValueError naming what is wrong with it (garbage
    ends the episode as a counted failure, never the run)."""
    if not (isinstance(out, tuple) and len(out) == 5):
        raise ValueError(f"env.step must return (observation, reward, terminated, truncated, info), got {_short(out)}")
    obs, reward, terminated, truncated, info = out
    if not isinstance(obs, str):
        raise ValueError(f"env.step's observation must be a str, got {type(obs).__name__}")
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(float(reward)):
        raise ValueError(f"env.step's reward must be a finite number, got {_short(reward)}")
    if not isinstance(terminated, bool) or not isinstance(truncated, bool):
        raise ValueError("env.step's terminated and truncated must be bools")
    if not isinstance(info, dict):
        raise ValueError(f"env.step's info must be a dict, got {type(info).__name__}")
    role = info.get("role", "user")
    if role not in ("user", "tool"):
        raise ValueError(f"env.step's info['role'] must be 'user' or 'tool', got {_short(role)}")
    return Turn(obs, float(reward), terminated, truncated, role=role, tool_calls=int(info.get("tool_calls", 0)),
                tool_errors=int(info.get("tool_errors", 0)), solved=bool(info.get("solved", False)))


def _short(x: Any) -> str:
    text = repr(x)
    return text if len(text) <= 80 else text[:77] + "..."
