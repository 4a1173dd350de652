"""Divergence guard: a warning when a PPO run's step metrics leave their sane range, and with
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
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from vcppo.driver.state import RunState
from vcppo.config.schema import Config
from vcppo.errors import ConfigError


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
