"""Value pretraining (VC-PPO sec. 4.1): fix the critic before the policy learns from it.

A critic initialised from a reward model (trained only at <eos>) scores early tokens low; its TD
errors then carry a positive bias that GAE accumulates toward the start of the response, so early
tokens get inflated advantages and the policy learns to stop early (sec. 3.1). The fix: freeze the
SFT policy, sample from it, and regress the critic on Monte-Carlo returns (GAE with lambda = 1,
i.e. unbiased targets) until value loss and explained variance settle. The loss curve shows two
phases: a fast "range alignment", then slow "knowledge injection" (Fig. 4). The paper found ~100
steps best and 150 over-fitting.

The result is published to the critic cache (:mod:`vcppo.driver.durability.critic_cache`), so every preset
and seed of a sweep that starts from the same SFT model reuses one pretrained critic.
"""
from __future__ import annotations

import numpy as np

from vcppo.driver.durability import critic_cache
from vcppo.driver.state import RunState
from vcppo.driver.context import RunContext
from vcppo.driver.durability.guards import update_streaks
from vcppo.driver.state import Phase
from vcppo.driver.step.step_plan import StepPlan
from vcppo.driver.durability.resume import save_checkpoint
from vcppo.driver.step.sources import ExperienceSource
from vcppo.driver.step.rl_step import rl_step
from vcppo.config.schema import ValuePretrainConfig


def settled(ev_history: list[float], loss_history: list[float], vp: ValuePretrainConfig) -> bool:
    """Stopping rule: after ``min_steps``, compare the means of the last two windows of
    ``window`` steps; settled when explained variance moved by less than ``ev_tolerance``
    (absolute) and value loss by less than ``loss_tolerance`` (relative)."""
    w = vp.window
    if len(ev_history) < max(vp.min_steps, 2 * w):
        return False
    ev_prev, ev_last = np.mean(ev_history[-2 * w:-w]), np.mean(ev_history[-w:])
    l_prev, l_last = np.mean(loss_history[-2 * w:-w]), np.mean(loss_history[-w:])
    return bool(abs(ev_last - ev_prev) < vp.ev_tolerance
                and abs(l_last - l_prev) <= vp.loss_tolerance * max(abs(l_prev), 1e-8))


def reuse_pretrained_critic(ctx: RunContext) -> None:
    """The run started its critic from the cache: value pretraining is skipped (logged)."""
    ctx.log.info(f"value pretraining: reusing the pretrained critic {ctx.critic_from_cache}")
    ctx.log.log({"reused_from": str(ctx.critic_from_cache)}, step=0, phase="value_pretrain_reused")


def value_pretrain(ctx: RunContext, source: ExperienceSource, plan: StepPlan, state: RunState) -> None:
    """Critic-only steps (:func:`~vcppo.driver.step.rl_step.rl_step` under ``plan``, the actor frozen) on
    rollouts of the policy; publishes a reusable critic."""
    vp = ctx.cfg.value_pretrain
    ctx.log.info(plan.describe())
    ctx.log.start_phase(Phase.VALUE_PRETRAIN, total=vp.steps, initial=state.pretrain_step)
    stop_reason = "step budget"
    while state.pretrain_step < vp.steps:
        step = state.pretrain_step + 1
        metrics = rl_step(ctx, source, plan, state, step)
        state.pretrain_step = step
        state.pretrain_ev.append(metrics["critic/explained_variance"])
        state.pretrain_loss.append(metrics.get("critic/value_loss", float("nan")))
        ctx.log.log(metrics, step=step, phase=Phase.VALUE_PRETRAIN)
        update_streaks(state, metrics, ctx.cfg.trainer, f"value-pretraining step {step}", ctx.log.info)  # may abort
        if ctx.cfg.trainer.save_every and step % ctx.cfg.trainer.save_every == 0 and step < vp.steps:
            save_checkpoint(ctx, state, source)
        if vp.early_stop and settled(state.pretrain_ev, state.pretrain_loss, vp):
            stop_reason = "explained variance and value loss settled"
            break
    ctx.log.info(f"value pretraining stopped after {state.pretrain_step} steps ({stop_reason})")
    publish_critic(ctx, {"steps": state.pretrain_step, "stop_reason": stop_reason, "run_dir": str(ctx.run_dir)})


def publish_critic(ctx: RunContext, info: dict) -> None:
    """Export the critic and publish it in the cache (collective)."""
    target = critic_cache.cache_path(ctx.cfg)
    stage = critic_cache.staging_path(ctx.cfg, ctx.run_dir.name)
    ctx.critic.check_finite_weights(f"the pretrained critic {target}")  # never cache a NaN critic
    ctx.critic.export(str(stage))
    ctx.barrier()
    if ctx.dist.is_main:
        critic_cache.publish(stage, target, info)
        ctx.log.info(f"pretrained critic saved to {target}")
    ctx.barrier()
