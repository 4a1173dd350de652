"""`vcppo train CONFIG [key=value ...]`: value pretraining, then the PPO loop with Decoupled-GAE.

Runs on every rank (SPMD) under the deepspeed launcher, torchrun, or plain python. One step, as
data flows (../docs/architecture.md):

    prompts -> vLLM rollout (n per prompt) -> verifier reward -> old logprobs (actor)
      -> values (critic) -> decoupled GAE: advantages with lambda_actor, targets with lambda_critic
      -> whiten the actor's advantages -> critic update -> actor update -> weight sync into vLLM

Value pretraining (VC-PPO sec. 4.1) is the same loop with the policy frozen, Monte-Carlo targets
(lambda = 1), and only the critic updated; see :mod:`vcppo.driver.value_pretrain`.
GRPO swaps the critic for group-normalised outcome rewards; every other preset differs only in
config (configs/*.yaml), not in code paths.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vcppo.algos.gae import decoupled_gae, length_adaptive_lambda
from vcppo.algos.losses import kl_penalty
from vcppo.algos.stats import grpo_advantages
from vcppo.config import Config, ConfigError, check_paths, load_config
from vcppo.driver import checkpoint as ckpt
from vcppo.driver.common import RunContext, global_whiten, step_metrics, train_actor, train_critic
from vcppo.driver.experience import PhaseTimer


def parse_args(argv: list[str]) -> tuple[str, list[str]]:
    parser = argparse.ArgumentParser(prog="vcppo train", description=__doc__.split("\n")[0])
    parser.add_argument("config", help="preset name (vcppo, ppo, vcppo_no_dgae, grpo, vapo) or YAML path")
    parser.add_argument("overrides", nargs="*", help="key=value overrides, e.g. actor.lr=1e-6")
    args = parser.parse_args(argv)
    return args.config, args.overrides


def main(argv: list[str]) -> int:
    config, overrides = parse_args(argv)
    try:
        cfg = load_config(config, overrides)
        check_paths(cfg)  # before any engine starts: a typo must not cost a vLLM start-up
    except (ConfigError, FileNotFoundError) as e:
        print(f"vcppo train: {e}", file=sys.stderr)
        return 2
    train(cfg)
    return 0


def run_dir_of(cfg: Config) -> Path:
    # Deterministic default name, so re-running the same command resumes it (trainer.resume=auto).
    name = cfg.trainer.run_name or f"{cfg.preset}-seed{cfg.trainer.seed}"
    return Path(cfg.trainer.output_root) / name


def train(cfg: Config) -> Path:
    """Both phases; returns the run directory."""
    ctx = RunContext.create(cfg, run_dir_of(cfg))
    try:
        state = _resume_or_start(ctx)
        if state["phase"] == "value_pretrain":
            from vcppo.driver.value_pretrain import value_pretrain
            value_pretrain(ctx, state)
            state.update(phase="ppo", step=0)
        ppo_loop(ctx, state)
    finally:
        ctx.close()
    return ctx.run_dir


def _resume_or_start(ctx: RunContext) -> dict:
    cfg = ctx.cfg
    first_phase = "value_pretrain" if (ctx.critic is not None and cfg.value_pretrain.enabled) else "ppo"
    state = {"phase": first_phase, "step": 0, "pretrain_step": 0}
    point = ckpt.find_resume_point(ctx.run_dir, cfg.trainer.resume)
    if point is None:
        if ctx.dist.is_main:
            ckpt.clean_partial(ckpt.checkpoint_root(ctx.run_dir))
        return state
    ctx.log.info(f"resuming from {point}")
    state = ckpt.load_state(point, ctx.dist.rank)
    if (point / "actor").exists():
        ctx.actor.load_checkpoint(str(point / "actor"))
    if ctx.critic is not None:
        ctx.critic.load_checkpoint(str(point / "critic"))
    ctx.prompts.load_state_dict(state["data"])
    if state["phase"] == "ppo" and state["step"] > 0:
        ctx.sync_weights()  # vLLM started from the initial policy; give it the resumed actor
    return state


def save_checkpoint(ctx: RunContext, state: dict) -> None:
    """Collective: every rank writes its shards, then the main rank seals the directory.

    Checkpoints are tagged by the global step (pretraining steps + PPO steps), so the newest one
    sorts last whichever phase wrote it.
    """
    stage = ckpt.staging_dir(ctx.run_dir, state["pretrain_step"] + state["step"])
    ckpt.write_rank_files(stage, ctx.dist.rank)
    if state["phase"] == "ppo":  # during value pretraining the actor is frozen: nothing to save
        ctx.actor.save_checkpoint(str(stage / "actor"))
    if ctx.critic is not None:
        ctx.critic.save_checkpoint(str(stage / "critic"))
    ctx.barrier()
    if ctx.dist.is_main:
        final = ckpt.commit(stage, {**state, "data": ctx.prompts.state_dict()}, ctx.cfg.trainer.keep_last)
        ctx.log.info(f"checkpoint {final}")
    ctx.barrier()


def ppo_loop(ctx: RunContext, state: dict) -> None:
    cfg, alg = ctx.cfg, ctx.cfg.algorithm
    total = cfg.trainer.total_steps
    if state["step"] == 0:
        ctx.log_validation(step=0)
    ctx.log.start_phase("ppo", total=total, initial=state["step"])
    while state["step"] < total:
        step = state["step"] + 1
        timer = PhaseTimer()
        with timer("rollout"):
            batch = ctx.sample_step("ppo", step)
        ctx.rollout.sleep()  # GPU: hand vLLM's memory to training; no-op on CPU

        mask = batch["response_mask"]
        with timer("old_logprobs"):
            batch["old_logprobs"], batch["entropy"] = ctx.actor.forward_logprobs(
                batch, temperature=cfg.rollout.temperature, with_entropy=True)
        rewards = batch["token_rewards"]
        if ctx.reference is not None:
            with timer("ref_logprobs"):
                ref_lp, _ = ctx.reference.forward_logprobs(batch, temperature=cfg.rollout.temperature)
            # KL folded into the per-token reward (PPO-RLHF convention); the paper uses kl_coef=0.
            batch["kl"] = kl_penalty(batch["old_logprobs"], ref_lp, alg.kl_estimator) * mask
            rewards = rewards - alg.kl_coef * batch["kl"]

        if ctx.critic is not None:
            with timer("values"):
                batch["old_values"] = ctx.critic.forward_values(batch)
        with timer("advantages"):
            if alg.advantage_estimator == "gae":
                lam_actor = alg.lambda_actor
                if alg.length_adaptive_lambda:
                    # VAPO: longer responses get lambda closer to 1 (less bias on long sequences).
                    lam_actor = length_adaptive_lambda(mask.sum(1), alg.length_adaptive_alpha)
                    batch["lambda_actor"] = lam_actor
                advantages, batch["returns"] = decoupled_gae(
                    rewards, batch["old_values"], mask, gamma=alg.gamma,
                    lam_actor=lam_actor, lam_critic=alg.lambda_critic)
            else:
                seq_adv = grpo_advantages(batch["scores"], group_ids=batch["group"],
                                          scale_by_std=alg.grpo_scale_by_std)
                advantages = seq_adv[:, None] * mask
            batch["raw_advantages"] = advantages
            # Whitening is the caller's job and touches only the actor's advantages (DESIGN.md).
            batch["advantages"] = (global_whiten(advantages, mask, ctx, zero_mean=alg.zero_mean_advantages)
                                   if alg.whiten_advantages else advantages)

        update_metrics = {}
        if ctx.critic is not None:
            with timer("critic_update"):
                update_metrics.update(train_critic(ctx, batch, step))
        with timer("actor_update"):
            update_metrics.update(train_actor(ctx, batch, step))
        ctx.rollout.wake_up()
        with timer("weight_sync"):
            ctx.sync_weights()

        state["step"] = step
        metrics = step_metrics(ctx, batch, timer)
        metrics.update(update_metrics)
        ctx.log.log(metrics, step=step, phase="ppo")

        if cfg.trainer.val_every and step % cfg.trainer.val_every == 0 and step != total:
            ctx.log_validation(step=step)
        if (cfg.trainer.save_every and step % cfg.trainer.save_every == 0) or step == total:
            save_checkpoint(ctx, state)
    if state["step"] == total:
        ctx.log_validation(step=total, final=True)
        ctx.export_final()
