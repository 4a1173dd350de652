"""The run of `vcppo train` (:mod:`vcppo.commands.train`): value pretraining, then the PPO loop with Decoupled-GAE.

Runs on every rank (SPMD) under the deepspeed launcher, torchrun, or plain python. Each step is
:func:`vcppo.driver.step.rl_step.rl_step` (sample, score, pi_old and V_old, advantages, critic update,
actor update, weight sync), run as the run's :class:`~vcppo.driver.step.step_plan.StepPlan` says; value
pretraining (VC-PPO sec. 4.1) is the same step with the policy frozen; both phase loops are in
:mod:`vcppo.driver.loops`. GRPO swaps the critic for group-normalised outcome rewards;
every other preset differs only in config (vcppo/configs/*.yaml), not in code paths.
"""
from __future__ import annotations

from pathlib import Path

from vcppo.config.placement import Placement
from vcppo.config.schema import Config
from vcppo.driver.context import RunContext, init_run_distributed
from vcppo.driver.durability.resume import resume_or_start
from vcppo.driver.loops import ppo_loop, reuse_pretrained_critic, value_pretrain
from vcppo.driver.state import Phase
from vcppo.driver.step.step_plan import ppo_plan, pretrain_plan


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
