"""`vcppo train CONFIG [key=value ...]`: value pretraining, then the PPO loop with Decoupled-GAE.

Runs on every rank (SPMD) under the deepspeed launcher, torchrun, or plain python. One step, as
data flows (docs/architecture.md):

    prompts -> vLLM rollout (n per prompt) -> verifier reward -> old logprobs (actor)
      -> values (critic) -> decoupled GAE: advantages with lambda_actor, targets with lambda_critic
      -> whiten the actor's advantages -> critic update -> actor update -> weight sync into vLLM

Two passes drop out where the math allows (docs/performance.md, "Fewer passes"): with one optimizer
step per update, pi_old is the actor update's own forward and V_old the critic update's (then the
critic trains first, on lambda_critic = 1 targets that need no values, and the advantages follow).

Value pretraining (VC-PPO sec. 4.1) is the same loop with the policy frozen, Monte-Carlo targets
(lambda = 1), and only the critic updated; see :mod:`vcppo.driver.value_pretrain`.
GRPO swaps the critic for group-normalised outcome rewards; every other preset differs only in
config (vcppo/configs/*.yaml), not in code paths.
"""
from __future__ import annotations

from pathlib import Path

from vcppo.algos.losses import kl_penalty
from vcppo.config import load_command_config
from vcppo.driver.advantages import compute_advantages, returns_to_go
from vcppo.driver.checkpoint import RunState
from vcppo.driver.resume import resume_or_start, save_checkpoint
from vcppo.driver.context import RunContext
from vcppo.driver.dapo import sample_batch
from vcppo.driver.guards import reward_tally, step_reward_failures, update_streaks
from vcppo.driver.metrics import PhaseTimer, log_validation, step_metrics
from vcppo.driver.update import old_values_from_update, pi_old_source, train_actor, train_critic
from vcppo.experience import Experience
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
    source = pi_old_source(ctx)
    if source == "sampler":
        batch.old_logprobs = batch.sampler_logprobs  # trusted by config; TIS weights are then 1
    elif source == "pass":
        with timer("old_logprobs"):
            batch.old_logprobs, batch.entropy = ctx.actor.forward_logprobs(batch, with_entropy=True)
    # else the actor update's own forward gives them (exact: update.old_logprobs_from_update).
    rewards = batch.token_rewards
    if ctx.reference is not None:
        with timer("ref_logprobs"):
            ref_logprobs, _ = ctx.reference.forward_logprobs(batch)
        # KL folded into the per-token reward (PPO-RLHF convention); the paper uses kl_coef=0.
        batch.kl = kl_penalty(batch.old_logprobs, ref_logprobs, alg.kl_estimator) * batch.response_mask
        rewards = rewards - alg.kl_coef * batch.kl
    update_metrics = critic_and_advantages(ctx, batch, rewards, timer, step)
    with timer("actor_update"):
        update_metrics.update(train_actor(ctx, batch, step))
    ctx.rollout.wake_up()
    with timer("weight_sync"):
        ctx.sync_weights()
    metrics = step_metrics(ctx, batch, timer)
    metrics.update(update_metrics)
    metrics.update(sample_metrics)
    return metrics


def critic_and_advantages(ctx: RunContext, batch: Experience, rewards, timer: PhaseTimer, step: int) -> dict:
    """Values, advantages and the critic update, in the order the config allows: when the targets
    need no values (lambda_critic = 1) and the critic makes one optimizer step, its update's own
    forward gives V_old (exact, :func:`~vcppo.driver.update.old_values_from_update`), so the critic
    trains first and the advantages follow from the values it kept; otherwise a values pass,
    then the advantages, then the update. Returns the critic's metrics."""
    alg = ctx.cfg.algorithm
    if ctx.critic is None:  # GRPO
        with timer("advantages"):
            compute_advantages(batch, rewards, alg)
        return {}
    if old_values_from_update(ctx.cfg.critic, alg.lambda_critic):
        batch.returns = returns_to_go(rewards, batch.response_mask, alg.gamma)
        with timer("critic_update"):
            metrics = train_critic(ctx, batch, step)  # fills batch.old_values
        with timer("advantages"):
            compute_advantages(batch, rewards, alg, keep_returns=True)
        return metrics
    with timer("values"):
        batch.old_values = ctx.critic.forward_values(batch)
    with timer("advantages"):
        compute_advantages(batch, rewards, alg)
    with timer("critic_update"):
        return train_critic(ctx, batch, step)


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
