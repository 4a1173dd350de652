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

from vcppo.config.placement import CRITIC, ROLLOUT
from vcppo.config.schema import Config
from vcppo.driver.context import RunContext, init_run_distributed
from vcppo.driver.durability.resume import resume_or_start
from vcppo.driver.loops import ppo_loop, reuse_pretrained_critic, value_pretrain
from vcppo.driver.placement.colocated import make_source
from vcppo.driver.placement.critic_worker import serve_critic
from vcppo.driver.placement.remote_critic import start_remote_critic
from vcppo.driver.placement.rollout_worker import serve_rollouts
from vcppo.driver.state import Phase
from vcppo.driver.step.step_plan import ppo_plan, pretrain_plan


SERVES = {ROLLOUT: serve_rollouts, CRITIC: serve_critic}  # what a split run's other ranks do


def run_dir_of(cfg: Config) -> Path:
    # Deterministic default name, so re-running the same command resumes it (trainer.resume=auto).
    name = cfg.trainer.run_name or f"{cfg.preset}-seed{cfg.trainer.seed}"
    return Path(cfg.trainer.output_root) / name


def train(cfg: Config) -> Path:
    """Both phases; returns the run directory. The rollout ranks of a split run serve batches
    instead, and its critic ranks (``placement.critic_ranks``) the critic's steps."""
    serve = SERVES.get(init_run_distributed(cfg).role)
    if serve is not None:  # a rank that only samples, or only holds the critic
        serve(cfg, run_dir_of(cfg))
        return run_dir_of(cfg)
    ctx = RunContext.create(cfg, run_dir_of(cfg), remote_critic=start_remote_critic)
    finished = False
    try:
        state = resume_or_start(ctx)
        pretrain, ppo = pretrain_plan(cfg, ctx.dist.device), ppo_plan(cfg, ctx.dist.device)
        if state.phase == Phase.VALUE_PRETRAIN and ctx.critic_from_cache is not None:
            reuse_pretrained_critic(ctx)
            state.phase = Phase.PPO
        elif ctx.cfg.critic.init_from and ctx.resume_point is None:  # value pretraining off: still recorded
            reuse_pretrained_critic(ctx)
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
