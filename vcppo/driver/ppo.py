"""`vcppo train CONFIG [key=value ...]`: value pretraining, then the PPO loop with Decoupled-GAE.

Runs on every rank (SPMD) under the deepspeed launcher, torchrun, or plain python. One step, as
data flows (docs/architecture.md):

    prompts -> vLLM rollout (n per prompt) -> verifier reward -> old logprobs (actor)
      -> values (critic) -> decoupled GAE: advantages with lambda_actor, targets with lambda_critic
      -> whiten the actor's advantages -> critic update -> actor update -> weight sync into vLLM

Value pretraining (VC-PPO sec. 4.1) is the same loop with the policy frozen, Monte-Carlo targets
(lambda = 1), and only the critic updated; see :mod:`vcppo.driver.value_pretrain`.
GRPO swaps the critic for group-normalised outcome rewards; every other preset differs only in
config (vcppo/configs/*.yaml), not in code paths.
"""
from __future__ import annotations

from pathlib import Path

from vcppo.algos.losses import kl_penalty
from vcppo.config import load_command_config
from vcppo.driver.advantages import compute_advantages
from vcppo.driver.checkpoint import RunState
from vcppo.driver.resume import resume_or_start, save_checkpoint
from vcppo.driver.context import RunContext
from vcppo.driver.dapo import sample_batch
from vcppo.driver.guards import reward_tally, step_reward_failures, update_streaks
from vcppo.driver.metrics import PhaseTimer, log_validation, step_metrics
from vcppo.driver.update import old_logprobs_from_update, train_actor, train_critic
from vcppo.driver.value_pretrain import value_pretrain
from vcppo.schema import Config

def main(argv: list[str]) -> int:
    # Checked before any engine starts: a typo must not cost a vLLM start-up.
    train(load_command_config(argv, "train", default_config=None))
    return 0


def run_dir_of(cfg: Config) -> Path:
    # Deterministic default name, so re-running the same command resumes it (trainer.resume=auto).
    name = cfg.trainer.run_name or f"{cfg.preset}-seed{cfg.trainer.seed}"
    return Path(cfg.trainer.output_root) / name


def train(cfg: Config) -> Path:
    """Both phases; returns the run directory."""
    ctx = RunContext.create(cfg, run_dir_of(cfg))
    finished = False
    try:
        state = resume_or_start(ctx)
        if state.phase == "value_pretrain":
            value_pretrain(ctx, state)
            state.phase, state.step = "ppo", 0
        ppo_loop(ctx, state)
        finished = True
    finally:
        ctx.close(clean=finished)
    return ctx.run_dir


def ppo_step(ctx: RunContext, step: int) -> dict:
    """Sample, score, evaluate the batch under the current models, estimate advantages, update the
    critic and the actor, sync the actor into vLLM; the step's metrics."""
    alg, timer = ctx.cfg.algorithm, PhaseTimer()
    tally = reward_tally(ctx.scorer)
    with timer("rollout"):
        batch, sample_metrics = sample_batch(ctx, "ppo", step)  # + DAPO dynamic sampling / overlong
    sample_metrics.update(step_reward_failures(ctx.scorer, tally))
    ctx.rollout.sleep()  # GPU: hand vLLM's memory to training; no-op on CPU
    if not old_logprobs_from_update(ctx.cfg.actor, kl_in_reward=ctx.reference is not None):
        with timer("old_logprobs"):
            batch.old_logprobs, batch.entropy = ctx.actor.forward_logprobs(batch, with_entropy=True)
    # else the actor update's own forward gives them (exact: update.old_logprobs_from_update).
    # The critic's old values cannot come from its update: GAE needs them before any update.
    rewards = batch.token_rewards
    if ctx.reference is not None:
        with timer("ref_logprobs"):
            ref_logprobs, _ = ctx.reference.forward_logprobs(batch)
        # KL folded into the per-token reward (PPO-RLHF convention); the paper uses kl_coef=0.
        batch.kl = kl_penalty(batch.old_logprobs, ref_logprobs, alg.kl_estimator) * batch.response_mask
        rewards = rewards - alg.kl_coef * batch.kl
    if ctx.critic is not None:
        with timer("values"):
            batch.old_values = ctx.critic.forward_values(batch)
    with timer("advantages"):
        compute_advantages(batch, rewards, alg)
    update_metrics = {}
    if ctx.critic is not None:
        with timer("critic_update"):
            update_metrics.update(train_critic(ctx, batch, step))
    with timer("actor_update"):
        update_metrics.update(train_actor(ctx, batch, step))
    ctx.rollout.wake_up()
    with timer("weight_sync"):
        ctx.sync_weights()
    metrics = step_metrics(ctx, batch, timer)
    metrics.update(update_metrics)
    metrics.update(sample_metrics)
    return metrics


def ppo_loop(ctx: RunContext, state: RunState) -> None:
    cfg = ctx.cfg
    total = cfg.trainer.total_steps
    if state.step == 0:
        log_validation(ctx, step=0)
    ctx.log.start_phase("ppo", total=total, initial=state.step)
    while state.step < total:
        step = state.step + 1
        metrics = ppo_step(ctx, step)
        state.step = step
        ctx.log.log(metrics, step=step, phase="ppo")
        update_streaks(state, metrics, cfg.trainer, f"PPO step {step}")  # may abort, before any save
        if cfg.trainer.val_every and step % cfg.trainer.val_every == 0 and step != total:
            log_validation(ctx, step=step)
        if (cfg.trainer.save_every and step % cfg.trainer.save_every == 0) or step == total:
            save_checkpoint(ctx, state)
    if state.step == total:
        log_validation(ctx, step=total, final=True)
        ctx.export_final()
