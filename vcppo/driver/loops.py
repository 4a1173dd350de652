"""The run's two phase loops, one level: value pretraining (critic-only steps until the critic settles,
VC-PPO sec. 4.1; :mod:`vcppo.driver.step.value_pretrain` has the stopping rule), then PPO. Each step is
:func:`vcppo.driver.step.rl_step.rl_step` under the phase's plan; the loops log, validate, guard and
checkpoint around it."""
from __future__ import annotations

from pathlib import Path

from vcppo.driver.context import RunContext
from vcppo.driver.durability import critic_cache
from vcppo.driver.durability.checkpoint import checkpoint_root, list_complete
from vcppo.driver.durability.guards import check_divergence, update_streaks
from vcppo.driver.durability.resume import save_checkpoint
from vcppo.driver.state import Phase, RunState
from vcppo.driver.step.metrics import log_validations, validate
from vcppo.driver.step.rl_step import rl_step
from vcppo.driver.step.sources import ExperienceSource
from vcppo.driver.step.step_plan import StepPlan
from vcppo.driver.step.value_pretrain import settled


def reuse_pretrained_critic(ctx: RunContext) -> None:
    """The run started its critic from the cache, or from ``critic.init_from``: value pretraining is
    skipped (logged, with the source's files for a warm start)."""
    record = {"reused_from": str(ctx.critic_from_cache)}
    if ctx.cfg.critic.init_from:
        record["critic_init_from"] = critic_cache.fingerprint_path(str(ctx.critic_from_cache))
    ctx.log.info(f"value pretraining: reusing the pretrained critic {ctx.critic_from_cache}"
                 + (" (critic.init_from)" if ctx.cfg.critic.init_from else ""))
    ctx.log.log(record, step=0, phase="value_pretrain_reused")


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
        update_streaks(state, metrics, ctx.cfg.trainer, f"value-pretraining step {step}", ctx.log.info,
                       ctx.cfg.rollout.env)  # may abort
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


def last_checkpoint(run_dir: Path) -> str | None:
    done = list_complete(checkpoint_root(run_dir))
    return done[-1].name if done else None


def ppo_loop(ctx: RunContext, source: ExperienceSource, plan: StepPlan, state: RunState) -> None:
    cfg = ctx.cfg
    total = cfg.trainer.total_steps
    if state.step == 0:
        validate(ctx, source, step=0)
    ctx.log.start_phase(Phase.PPO, total=total, initial=state.step)
    while state.step < total:
        step = state.step + 1
        metrics = rl_step(ctx, source, plan, state, step)
        state.step = step
        ctx.log.log(metrics, step=step, phase=Phase.PPO)
        log_validations(ctx, source)  # split: those the rollout ranks finished during the step
        update_streaks(state, metrics, cfg.trainer, f"PPO step {step}", ctx.log.info, cfg.rollout.env)  # may abort
        check_divergence(cfg, state, metrics, step, last_checkpoint(ctx.run_dir), ctx.log.info)  # may abort too
        if cfg.trainer.val_every and step % cfg.trainer.val_every == 0 and step != total:
            validate(ctx, source, step=step)
        if (cfg.trainer.save_every and step % cfg.trainer.save_every == 0) or step == total:
            log_validations(ctx, source, wait=True)  # a resumed run cuts metrics.jsonl back to its checkpoint
            save_checkpoint(ctx, state, source)
    if state.step == total:
        validate(ctx, source, step=total, final=True)
        ctx.export_final()
