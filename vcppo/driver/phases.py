"""The run of `vcppo train` (:mod:`vcppo.commands.train`): value pretraining, then the PPO loop with
Decoupled-GAE; the two phase loops, and value pretraining's stopping rule.

**Value pretraining** (VC-PPO sec. 4.1): fix the critic before the policy learns from it.

A critic initialised from a reward model (trained only at <eos>) scores early tokens low; its TD
errors then carry a positive bias that GAE accumulates toward the start of the response, so early
tokens get inflated advantages and the policy learns to stop early (sec. 3.1). The fix: freeze the
SFT policy, sample from it, and regress the critic on Monte-Carlo returns (GAE with lambda = 1,
i.e. unbiased targets) until value loss and explained variance settle. The loss curve shows two
phases: a fast "range alignment", then slow "knowledge injection" (Fig. 4). The paper found ~100
steps best and 150 over-fitting.

The loop is :func:`value_pretrain`, its stopping rule :func:`settled`; it publishes the result to the
critic cache (:mod:`vcppo.driver.run_engines`), so every preset and seed of a sweep that starts from the
same SFT model reuses one pretrained critic.

**The two phase loops**, one level: value pretraining (critic-only steps until the critic settles),
then PPO. Each step is
:func:`vcppo.driver.step.rl_step.rl_step` under the phase's plan; the loops log, validate, guard and
checkpoint around it.

**The run** (:func:`train`) runs on every rank (SPMD) under the deepspeed launcher, torchrun, or plain python.
Each step is :func:`vcppo.driver.step.rl_step.rl_step` (sample, score, pi_old and V_old, advantages, critic
update, actor update, weight sync), run as the run's :class:`~vcppo.driver.step.step_plan.StepPlan` says;
value pretraining (VC-PPO sec. 4.1) is the same step with the policy frozen. GRPO swaps the critic for
group-normalised outcome rewards; every other preset differs only in config (vcppo/configs/*.yaml), not in
code paths.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from vcppo.config.placement import Placement
from vcppo.config.schema import Config, ValuePretrainConfig
from vcppo.driver.context import RunContext, init_run_distributed
from vcppo.driver.durability.checkpoint import checkpoint_root, list_complete
from vcppo.driver.durability.guards import check_divergence, update_streaks
from vcppo.driver.durability.resume import resume_or_start, save_checkpoint
from vcppo.driver.parts import ExperienceSource
from vcppo.driver.run_engines import cache_path, fingerprint_path, publish, staging_path
from vcppo.driver.state import Phase, RunState
from vcppo.driver.step.metrics import log_validations, validate
from vcppo.driver.step.rl_step import rl_step
from vcppo.driver.step.step_plan import StepPlan, ppo_plan, pretrain_plan


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
    """The run started its critic from the cache, or from ``critic.init_from``: value pretraining is
    skipped (logged, with the source's files for a warm start)."""
    record = {"reused_from": str(ctx.critic_from_cache)}
    if ctx.cfg.critic.init_from:
        record["critic_init_from"] = fingerprint_path(str(ctx.critic_from_cache))
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
    target = cache_path(ctx.cfg)
    stage = staging_path(ctx.cfg, ctx.run_dir.name)
    ctx.critic.check_finite_weights(f"the pretrained critic {target}")  # never cache a NaN critic
    ctx.critic.export(str(stage), masters=True)  # a run reusing it trains on from the fp32 masters
    ctx.barrier()
    if ctx.dist.is_main:
        publish(stage, target, info)
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


def run_dir_of(cfg: Config) -> Path:
    # Deterministic default name, so re-running the same command resumes it (trainer.resume=auto).
    name = cfg.trainer.run_name or f"{cfg.preset}-seed{cfg.trainer.seed}"
    return Path(cfg.trainer.output_root) / name


def train(cfg: Config) -> Path:
    """Both phases; returns the run directory. The run's placement is built here, once, and passed on: a
    rank whose role it serves otherwise (a split run's rollout ranks, its critic ranks) does that instead."""
    placement = Placement.of(cfg)
    serve = placement.serves().get(init_run_distributed(cfg, placement).role)
    if serve is not None:  # a rank that only samples, or only holds the critic
        serve(cfg, run_dir_of(cfg), placement)
        return run_dir_of(cfg)
    ctx = RunContext.create(cfg, run_dir_of(cfg), placement)
    finished = False
    try:
        state = resume_or_start(ctx)
        pretrain, ppo = pretrain_plan(cfg, ctx.dist.device, placement), ppo_plan(cfg, ctx.dist.device, placement)
        if state.phase == Phase.VALUE_PRETRAIN and ctx.critic_from_cache is not None:
            reuse_pretrained_critic(ctx)
            state.phase = Phase.PPO
        elif ctx.cfg.critic.init_from and ctx.resume_point is None:  # value pretraining off: still recorded
            reuse_pretrained_critic(ctx)
        source = placement.source(ctx, ppo)  # both plans ask vLLM for the same logprobs
        source.start(state, resumed=ctx.resume_point is not None)
        if state.phase == Phase.VALUE_PRETRAIN:
            value_pretrain(ctx, source, pretrain, state)
            state.phase, state.step = Phase.PPO, 0
            source.begin_phase(Phase.PPO)
        ctx.log.info(ppo.describe())
        ppo_loop(ctx, source, ppo, state)
        source.close()
        finished = True
    finally:
        ctx.close(clean=finished)
    return ctx.run_dir
