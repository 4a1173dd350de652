"""The run of `vcppo train` (:mod:`vcppo.commands.train`): value pretraining, then the PPO loop with Decoupled-GAE.

Runs on every rank (SPMD) under the deepspeed launcher, torchrun, or plain python. Each step is
:func:`vcppo.driver.step.rl_step.rl_step` (sample, score, pi_old and V_old, advantages, critic update,
actor update, weight sync), run as the run's :class:`~vcppo.driver.step.step_plan.StepPlan` says; value
pretraining (VC-PPO sec. 4.1) is the same step with the policy frozen
(:mod:`vcppo.driver.step.value_pretrain`). GRPO swaps the critic for group-normalised outcome rewards;
every other preset differs only in config (vcppo/configs/*.yaml), not in code paths.
"""
from __future__ import annotations

from pathlib import Path

from vcppo.driver.durability.checkpoint import checkpoint_root, list_complete

from vcppo.driver.state import RunState
from vcppo.driver.context import RunContext, init_run_distributed
from vcppo.driver.placement.critic_worker import serve_critic
from vcppo.driver.durability.divergence import check_divergence
from vcppo.driver.durability.guards import update_streaks
from vcppo.driver.step.metrics import log_validations, validate
from vcppo.driver.state import Phase
from vcppo.driver.step.step_plan import StepPlan, ppo_plan, pretrain_plan
from vcppo.driver.durability.resume import resume_or_start, save_checkpoint
from vcppo.driver.placement.rollout_worker import serve_rollouts
from vcppo.driver.placement.colocated import make_source
from vcppo.driver.step.sources import ExperienceSource
from vcppo.driver.step.rl_step import rl_step
from vcppo.driver.step.value_pretrain import reuse_pretrained_critic, value_pretrain
from vcppo.config.schema import Config


def run_dir_of(cfg: Config) -> Path:
    # Deterministic default name, so re-running the same command resumes it (trainer.resume=auto).
    name = cfg.trainer.run_name or f"{cfg.preset}-seed{cfg.trainer.seed}"
    return Path(cfg.trainer.output_root) / name


def train(cfg: Config) -> Path:
    """Both phases; returns the run directory. The rollout ranks of a split run serve batches
    instead, and its critic ranks (``placement.critic_ranks``) the critic's steps."""
    role = init_run_distributed(cfg).role
    if role in ("rollout", "critic"):
        (serve_rollouts if role == "rollout" else serve_critic)(cfg, run_dir_of(cfg))
        return run_dir_of(cfg)
    ctx = RunContext.create(cfg, run_dir_of(cfg))
    finished = False
    try:
        state = resume_or_start(ctx)
        pretrain, ppo = pretrain_plan(cfg, ctx.dist.device), ppo_plan(cfg, ctx.dist.device)
        if state.phase == Phase.VALUE_PRETRAIN and ctx.critic_from_cache is not None:
            reuse_pretrained_critic(ctx)
            state.phase = Phase.PPO
        source = make_source(ctx, ppo)  # both plans ask vLLM for the same logprobs
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
        update_streaks(state, metrics, cfg.trainer, f"PPO step {step}", ctx.log.info)  # may abort, before any save
        check_divergence(cfg, state, metrics, step, last_checkpoint(ctx.run_dir), ctx.log.info)  # may abort too
        if cfg.trainer.val_every and step % cfg.trainer.val_every == 0 and step != total:
            validate(ctx, source, step=step)
        if (cfg.trainer.save_every and step % cfg.trainer.save_every == 0) or step == total:
            log_validations(ctx, source, wait=True)  # a resumed run cuts metrics.jsonl back to its checkpoint
            save_checkpoint(ctx, state, source)
    if state.step == total:
        validate(ctx, source, step=total, final=True)
        ctx.export_final()
