"""An environment's turns in the worker pool (:class:`~vcppo.rewards.pool.RewardPool`): the env is
user code, so it runs in worker processes that a hang, a crash or an exit cannot take the trainer
down with; each call has the pool's wall-clock limit (``rollout.env_timeout_s``).

A worker keeps the envs of the episodes it served; a call whose episode it does not hold (another
worker served the earlier turns, or it replaced a killed worker) rebuilds the env and replays the
episode's earlier actions, which the API's determinism makes exact (:mod:`vcppo.envs.base`).
:class:`EnvRunner` is the trainer's side: a batch of turns in, one :class:`~vcppo.envs.base.Turn`
or failure out per episode, the failures counted.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from vcppo.envs.base import Turn, checked_reset, checked_turn, make_env

CACHED_EPISODES = 4096


@dataclass(frozen=True)
class EpisodeKey:
    """What defines an episode's env: ``episode`` a unique id, the env's name and arguments, the
    data row, the seed, and the actions taken so far (before the one being stepped)."""
    episode: str
    env: str
    env_args: tuple
    row: tuple
    seed: int
    actions: tuple = ()


_envs: OrderedDict = OrderedDict()  # episode id -> (env, actions applied)


def _env_for(key: EpisodeKey):
    held = _envs.pop(key.episode, None)
    if held is not None and held[1] == len(key.actions):
        return held[0]
    try:
        env = make_env(key.env, **dict(key.env_args))
    except TypeError as e:  # the arguments are not the env's: say where they came from
        raise TypeError(f"env {key.env!r} does not take the arguments {dict(key.env_args)} (rollout.env_args, "
                        f"updated by the row's extra_info env_args / interaction_kwargs / tools_kwargs): {e}") from None
    observation, _ = checked_reset(env.reset(dict(key.row), key.seed))
    if observation:
        raise ValueError("env.reset returned an observation: the task is the data row's prompt here, so reset "
                         "must return '' (put the first observation in the prompt column)")
    for action in key.actions:
        checked_turn(env.step(action))
    return env


def env_turn(action: str, key: EpisodeKey) -> Turn:
    """The pool's function: the episode's env after ``key.actions``, stepped with ``action``."""
    env = _env_for(key)
    turn = checked_turn(env.step(action))
    if not (turn.terminated or turn.truncated):
        _envs[key.episode] = (env, len(key.actions) + 1)
        while len(_envs) > CACHED_EPISODES:
            _envs.popitem(last=False)
    return turn


class EnvRunner:
    """Env turns for the trainer: in a pool of ``num_workers`` processes (0: in this process, where
    ``breakpoint()`` works inside an env), each call limited to ``timeout_s`` seconds in the pool.
    ``num_failures`` / ``num_timeouts`` accumulate (an env that raised, hung, died or answered
    garbage)."""

    def __init__(self, num_workers: int, timeout_s: float):
        self.num_failures = self.num_timeouts = 0
        self._pool = None
        if num_workers > 0:
            from vcppo.rewards.pool import RewardPool
            # one turn at a time: a turn that hangs holds up no other, and hangs time out side by side
            self._pool = RewardPool(f"{__name__}:env_turn", num_workers, timeout_s, convert=None,
                                    preload=(__name__,), max_chunk=1, role="env")

    def step(self, turns: list[tuple[str, EpisodeKey]]) -> list[Turn | str]:
        """One :class:`Turn` per ``(action, key)``, or the failure's message (a str)."""
        if self._pool is not None:
            outcomes = self._pool.map([(action, key, {}) for action, key in turns])
        else:
            outcomes = []
            for action, key in turns:
                try:
                    outcomes.append(("ok", env_turn(action, key)))
                except Exception as e:  # noqa: BLE001 - user code: any error ends the episode, counted
                    outcomes.append(("error", repr(e)[:500]))
        out: list[Turn | str] = []
        for kind, value in outcomes:
            if kind == "ok" and isinstance(value, Turn):
                out.append(value)
                continue
            self.num_failures += 1
            self.num_timeouts += kind == "timeout"
            out.append(f"{kind}: {value}")
        return out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
