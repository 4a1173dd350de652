"""The run's guards: steps that must not go on for ever, a diverging run, a full disk.

**Streaks.** Steps that must not go on for ever: non-finite optimizer steps and a reward function that
fails on every sample. The engine skips a non-finite step (its gradient contract, point 5); this
module counts such steps in a row and aborts the run after ``trainer.max_nonfinite_steps``, and
after ``trainer.max_failed_reward_steps`` steps in a row whose every reward failed. The streaks
live in :class:`~vcppo.driver.state.RunState`, so a resumed run counts on exactly where the
uninterrupted one would. Both decisions are taken from figures that are the same on every rank
(skips follow the global gradient norm; failure counts are all-reduced), so all ranks abort together.

**Divergence**: a warning when a PPO run's step metrics leave their sane range, and with
``trainer.abort_on_divergence`` a stop before that step's checkpoint.

Read from the metrics every step already has (the same on every rank: gathered or all-reduced), so
every rank takes the same decision. A relative rule compares with the metric's value at the run's
first PPO step (its baseline, kept in :class:`~vcppo.driver.state.RunState`, so a resumed run
judges as the uninterrupted one):

==========================  ===================================================================
metric                      out of range when
==========================  ===================================================================
``actor/entropy``           below 1/20 of its baseline (the policy collapsed onto few tokens)
``critic/value_loss``       above 100x its baseline and above 10 x (correct - wrong score)^2
``actor/grad_norm``         above 100x its baseline and above 100 (pre-clip global norm)
``critic/grad_norm``        the same
``actor/approx_kl``         above 1 nat per token (pi_old to pi within one step's update)
``actor/kl_ref``            above 10 nats per token (to the reference policy)
``*/nonfinite_skipped``     above 0 (an optimizer step skipped for a non-finite value)
any of the above            not finite
==========================  ===================================================================

A normal run moves each by a few times at most (entropy falls slowly as the policy sharpens); a
run at ``actor.lr=1 critic.lr=1`` leaves three of them at its second step (the value loss goes
0.5 -> 826, the critic's gradient norm 5.8 -> 48916, entropy 5.73 -> 0.24). The metrics of step N
measure the weights step N-1's update wrote, so the checkpoint of step N-1 may already hold them.

**A full disk**: a write that fails because the disk is full, said as such in one line.

torch's zip writer reports a full disk as ``unexpected pos N vs M`` or ``file write failed``, and a
plain write raises ``OSError: [Errno 28]``; neither names the directory or what it needed. The run's
writes that can meet a full disk (a checkpoint, the run directory's config) go through
:func:`write_error`, which names the directory, the bytes free there and, when known, the bytes needed.
"""
from __future__ import annotations

import errno
import math
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from vcppo.config.schema import Config, TrainerConfig
from vcppo.driver.state import RunState
from vcppo.engines.deepspeed_engine import NonFiniteError
from vcppo.errors import ConfigError
from vcppo.runtime import collectives


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


class DivergenceError(ConfigError):
    """``trainer.abort_on_divergence``: the run left its sane range (the CLI prints it, exits 2)."""


@dataclass(frozen=True)
class Rule:
    metric: str
    kind: str          # "fall": below baseline / factor; "rise": above baseline x factor and the floor;
    factor: float = 0  # "above": above the floor
    floor: float = 0.0


def rules(cfg: Config) -> tuple[Rule, ...]:
    """The thresholds (the module docstring's table); the value-loss floor follows the reward scale."""
    spread = (cfg.reward.correct_score - cfg.reward.wrong_score) ** 2
    return (Rule("actor/entropy", "fall", 20.0), Rule("critic/value_loss", "rise", 100.0, 10.0 * max(spread, 1.0)),
            Rule("actor/grad_norm", "rise", 100.0, 100.0), Rule("critic/grad_norm", "rise", 100.0, 100.0),
            Rule("actor/approx_kl", "above", floor=1.0), Rule("actor/kl_ref", "above", floor=10.0),
            Rule("actor/nonfinite_skipped", "above"), Rule("critic/nonfinite_skipped", "above"))


def judge(rule: Rule, value: float, baseline: float | None) -> str | None:
    """Why ``value`` is out of range, or None."""
    if not math.isfinite(value):
        return f"{rule.metric} is {value}"
    if rule.kind == "above":
        return f"{rule.metric} {value:.4g} > {rule.floor:g}" if value > rule.floor else None
    if baseline is None or not math.isfinite(baseline):
        return None
    if rule.kind == "fall" and baseline > 0 and value < baseline / rule.factor:
        return (f"{rule.metric} {value:.4g} is 1/{baseline / max(value, 1e-300):.3g} of its first PPO step's "
                f"{baseline:.4g} (limit 1/{rule.factor:g})")
    if rule.kind == "rise" and value > max(baseline * rule.factor, rule.floor):
        times = f"{value / baseline:.3g}x" if baseline > 0 else "far above"
        return (f"{rule.metric} {value:.4g} is {times} its first PPO step's {baseline:.4g} (limit {rule.factor:g}x "
                f"and {rule.floor:g})")
    return None


def out_of_range(cfg: Config, state: RunState, metrics: dict) -> dict[str, str]:
    """``{metric: why}`` for this step's metrics out of range; baselines are taken the first time
    a metric is seen (the first PPO step)."""
    found = {}
    for rule in rules(cfg):
        value = metrics.get(rule.metric)
        if value is None:
            continue
        value = float(value)
        if rule.kind != "above" and rule.metric not in state.divergence_baseline and math.isfinite(value):
            state.divergence_baseline[rule.metric] = value
        why = judge(rule, value, state.divergence_baseline.get(rule.metric))
        if why:
            found[rule.metric] = why
    return found


def check_divergence(cfg: Config, state: RunState, metrics: dict, step: int, last_checkpoint: str | None,
                     say: Callable[[str], None] = print) -> None:
    """Count the step in: ``say`` which metrics left their range (by how much, since which step) when
    one leaves, and when they are all back; with ``trainer.abort_on_divergence`` raise before the
    step's checkpoint is written."""
    found = out_of_range(cfg, state, metrics)
    since = state.divergence_since
    new = [m for m in found if m not in since]
    for metric in found:
        since.setdefault(metric, step)
    back = [m for m in since if m not in found]
    for metric in back:
        del since[metric]
    if back and not since:
        say(f"PPO step {step}: every guarded metric is back in its range ({', '.join(back)})")
    if not new:
        return
    details = "; ".join(f"{why} (since step {since[m]})" for m, why in found.items())
    if cfg.trainer.abort_on_divergence:
        kept = f"the last checkpoint kept is {last_checkpoint}" if last_checkpoint else "no checkpoint was written"
        raise DivergenceError(
            f"PPO step {step}: the run is diverging: {details}. Stopped by trainer.abort_on_divergence before this "
            f"step's checkpoint; {kept} (these metrics measure the weights the previous step's update wrote, so an "
            "earlier checkpoint is the safer one to resume from, with trainer.resume=<its path>). Lower actor.lr / "
            "critic.lr or raise their grad_clip")
    say(f"PPO step {step}: the run is diverging: {details}. It goes on; trainer.abort_on_divergence=true stops a "
        "run here, keeping the last checkpoint from before it (thresholds: docs/robustness.md)")


_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_TORCH_WRITE_FAILED = ("unexpected pos", "file write failed")  # torch's zip writer, short of space
LOW_SPACE = 64 * 2**20  # below this, a failed torch write is taken for a full disk


class DiskFull(ConfigError):
    """A write that failed for lack of space (the CLI prints it in one line and exits 2)."""


def free_bytes(path: Path) -> int | None:
    """Bytes free on the filesystem holding ``path`` (or its nearest existing parent)."""
    path = Path(path)
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def tree_bytes(path: Path) -> int | None:
    """Bytes of every file under ``path``; None when there is none."""
    path = Path(path)
    if not path.is_dir():
        return None
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def out_of_space(error: BaseException, where: Path) -> bool:
    """Whether ``error`` (or what caused it) is a write that found no space left at ``where``."""
    seen = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in _SPACE_ERRNOS:
            return True
        if isinstance(seen, RuntimeError) and any(t in str(seen) for t in _TORCH_WRITE_FAILED):
            free = free_bytes(where)
            return free is not None and free < LOW_SPACE
        seen = seen.__cause__ or seen.__context__
    return False


def _size(n: int | None) -> str:
    if n is None:
        return "unknown"
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n} bytes"


def write_error(what: str, where: Path, error: BaseException, needed: int | None = None,
                after: str = "") -> DiskFull | None:
    """One line for ``what`` failing to be written into ``where`` for lack of space, or None when
    ``error`` is something else. ``needed``: the bytes it takes, when known; ``after``: what the
    user should know next."""
    if not out_of_space(error, where):
        return None
    need = f", about {_size(needed)} needed" if needed else ""
    return DiskFull(f"{what} could not be written to {where}: no space left on device ({_size(free_bytes(where))} "
                    f"free there{need}). Free some space, or set trainer.output_root to a larger disk{after}")
