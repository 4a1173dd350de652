"""Steps that must not go on for ever: non-finite optimizer steps and a reward function that
fails on every sample. The engine skips a non-finite step (its gradient contract, point 5); this
module counts such steps in a row and aborts the run after ``trainer.max_nonfinite_steps``, and
after ``trainer.max_failed_reward_steps`` steps in a row whose every reward failed. The streaks
live in :class:`~vcppo.driver.state.RunState`, so a resumed run counts on exactly where the
uninterrupted one would. Both decisions are taken from figures that are the same on every rank
(skips follow the global gradient norm; failure counts are all-reduced), so all ranks abort together.
"""
from __future__ import annotations

from typing import Callable

import torch

from vcppo.driver.state import RunState
from vcppo.runtime import collectives
from vcppo.engines.deepspeed_engine import NonFiniteError
from vcppo.config.schema import TrainerConfig
from vcppo.errors import ConfigError

SKIP_KEYS = ("actor/nonfinite_skipped", "critic/nonfinite_skipped")


class RewardFailureError(ConfigError):
    """The reward function failed on every sample for too long: the run learns nothing. A
    ConfigError: the CLI prints the reason and exits 2."""


def reward_tally(scorer) -> tuple[int, int]:
    """(failures, samples scored) so far on this rank; a step's figures are the difference."""
    return scorer.num_failures, scorer.num_scored


def step_reward_failures(scorer, before: tuple[int, int]) -> dict:
    """The step's failed and scored samples, summed over ranks (collective: every rank calls)."""
    failed, scored = (now - then for now, then in zip(reward_tally(scorer), before))
    total = collectives.all_reduce_sum(torch.tensor([failed, scored], dtype=torch.float64, device=collectives.comm_device()))
    return {"reward/step_failures": float(total[0]), "reward/step_scored": float(total[1])}


def update_streaks(state: RunState, metrics: dict, trainer: TrainerConfig, where: str,
                   say: Callable[[str], None] = print, env: str | None = None) -> None:
    """Count the step into the streaks; ``say`` the first skipped step of a streak (the run goes on,
    and no checkpoint is written until a step applies again); raise once a streak reaches its limit
    (before any checkpoint of this step is written, so the last good one is kept). ``env``: the
    run's ``rollout.env``, whose failures count with the reward's and are named as its own."""
    skipped = sum(metrics.get(k, 0.0) for k in SKIP_KEYS)
    state.nonfinite_streak = state.nonfinite_streak + 1 if skipped else 0
    if state.nonfinite_streak == 1:
        say(f"{where}: optimizer step skipped for a non-finite loss, gradient norm or advantages; no checkpoint "
            f"is written until a step applies again (the run stops after trainer.max_nonfinite_steps="
            f"{trainer.max_nonfinite_steps} in a row)")
    scored = metrics.get("reward/step_scored", 0.0)
    all_failed = scored > 0 and metrics.get("reward/step_failures", 0.0) >= scored
    state.reward_fail_streak = state.reward_fail_streak + 1 if all_failed else 0
    if state.nonfinite_streak >= trainer.max_nonfinite_steps:
        raise NonFiniteError(
            f"{where}: {state.nonfinite_streak} steps in a row had optimizer steps skipped for a non-finite "
            f"loss, gradient norm or advantages (trainer.max_nonfinite_steps={trainer.max_nonfinite_steps}); "
            "aborting with the last good checkpoint kept. Lower the lr, check the rewards and the data")
    if state.reward_fail_streak >= trainer.max_failed_reward_steps:
        raise RewardFailureError(failure_message(state.reward_fail_streak, metrics, trainer, where, env))


def failure_message(streak: int, metrics: dict, trainer: TrainerConfig, where: str, env: str | None) -> str:
    """The abort's line: who failed every sample (the env, the reward function, or both), and where
    its errors are."""
    limit = f"{streak} steps in a row (trainer.max_failed_reward_steps={trainer.max_failed_reward_steps})"
    env_failed = metrics.get("env/failures", 0.0)
    if env and env_failed >= metrics.get("reward/step_scored", 0.0):
        return (f"{where}: the env {env!r} (rollout.env) failed every episode for {limit}; its errors are logged "
                f"above as \"env {env!r} failed at turn ...\"; aborting")
    both = bool(env and env_failed)
    who = f"the reward function or the env {env!r}" if both else "the reward function"
    logged = '"reward function failed" and "env ... failed"' if both else '"reward function failed"'
    return f"{where}: {who} failed on every sample for {limit}; its errors are logged above as {logged}; aborting"
