"""Value pretraining (VC-PPO sec. 4.1): fix the critic before the policy learns from it.

A critic initialised from a reward model (trained only at <eos>) scores early tokens low; its TD
errors then carry a positive bias that GAE accumulates toward the start of the response, so early
tokens get inflated advantages and the policy learns to stop early (sec. 3.1). The fix: freeze the
SFT policy, sample from it, and regress the critic on Monte-Carlo returns (GAE with lambda = 1,
i.e. unbiased targets) until value loss and explained variance settle. The loss curve shows two
phases: a fast "range alignment", then slow "knowledge injection" (Fig. 4). The paper found ~100
steps best and 150 over-fitting.

The result is saved under ``value_pretrain.cache_dir`` keyed by what determines it (policy, data,
critic and sampling config — not the RL algorithm or seed), so every preset and seed of a sweep
that starts from the same SFT model reuses one pretrained critic.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np

from vcppo.algos.gae import decoupled_gae
from vcppo.config import Config
from vcppo.driver.common import RunContext, fingerprint_path, step_metrics, train_critic
from vcppo.driver.experience import PhaseTimer

_COMPLETE = "vcppo_pretrain.json"


def cache_key(cfg: Config) -> str:
    relevant = {
        "policy": fingerprint_path(cfg.model.policy_path),
        "data": fingerprint_path(cfg.data.train_files),
        "data_fields": [cfg.data.prompt_field, cfg.data.answer_field, cfg.data.max_prompt_tokens,
                        cfg.data.use_chat_template],
        "critic_init": [cfg.model.critic_init,
                        fingerprint_path(cfg.model.critic_path) if cfg.model.critic_path else None],
        "critic": {k: v for k, v in vars(cfg.critic).items()},
        "value_pretrain": {k: getattr(cfg.value_pretrain, k) for k in
                           ("steps", "lambda_critic", "early_stop", "min_steps", "window", "ev_tolerance",
                            "loss_tolerance")},
        "rollout": [cfg.rollout.n_samples_per_prompt, cfg.rollout.temperature, cfg.rollout.top_p,
                    cfg.rollout.max_response_tokens, cfg.rollout.stop],
        "prompts_per_step": cfg.trainer.prompts_per_step,
        "gamma": cfg.algorithm.gamma,
        "reward": [cfg.reward.function, cfg.reward.correct_score, cfg.reward.wrong_score],
    }
    blob = json.dumps(relevant, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def cache_path(cfg: Config) -> Path:
    return Path(cfg.value_pretrain.cache_dir) / cache_key(cfg)


def cached_critic(cfg: Config) -> Path | None:
    path = cache_path(cfg)
    return path if (path / _COMPLETE).exists() else None


def settled(ev_history: list[float], loss_history: list[float], vp) -> bool:
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


def value_pretrain(ctx: RunContext, state: dict) -> None:
    """Critic-only steps on rollouts of the frozen policy; saves a reusable critic."""
    from vcppo.driver.ppo import save_checkpoint

    cfg, vp, dist = ctx.cfg, ctx.cfg.value_pretrain, ctx.dist
    if ctx.critic_from_cache is not None:
        ctx.log.info(f"value pretraining: reusing the pretrained critic {ctx.critic_from_cache}")
        ctx.log.log({"reused_from": str(ctx.critic_from_cache)}, step=0, phase="value_pretrain_reused")
        return
    ev_hist = list(state.get("pretrain_ev", []))
    loss_hist = list(state.get("pretrain_loss", []))
    ctx.log.start_phase("value_pretrain", total=vp.steps, initial=state["pretrain_step"])
    stop_reason = "step budget"
    while state["pretrain_step"] < vp.steps:
        step = state["pretrain_step"] + 1
        timer = PhaseTimer()
        with timer("rollout"):
            batch = ctx.sample_step("pretrain", step)
        mask = batch["response_mask"]
        with timer("values"):
            batch["old_values"] = ctx.critic.forward_values(batch)
        with timer("advantages"):
            # Targets: Monte-Carlo returns (lambda = 1). The actor's advantages are computed too,
            # only as a diagnostic: their position profile shows the bias the critic would inject.
            batch["raw_advantages"], batch["returns"] = decoupled_gae(
                batch["token_rewards"], batch["old_values"], mask, gamma=cfg.algorithm.gamma,
                lam_actor=cfg.algorithm.lambda_actor, lam_critic=vp.lambda_critic)
        with timer("critic_update"):
            update = train_critic(ctx, batch, step)
        metrics = step_metrics(ctx, batch, timer)
        metrics.update(update)
        state["pretrain_step"] = step
        ev_hist.append(metrics["critic/explained_variance"])
        loss_hist.append(metrics.get("critic/value_loss", float("nan")))
        state["pretrain_ev"], state["pretrain_loss"] = ev_hist, loss_hist
        ctx.log.log(metrics, step=step, phase="value_pretrain")
        if cfg.trainer.save_every and step % cfg.trainer.save_every == 0 and step < vp.steps:
            save_checkpoint(ctx, state)
        if vp.early_stop and settled(ev_hist, loss_hist, vp):
            stop_reason = "explained variance and value loss settled"
            break
    ctx.log.info(f"value pretraining stopped after {state['pretrain_step']} steps ({stop_reason})")

    # Publish the pretrained critic atomically so concurrent sweep runs never read half a model.
    target = cache_path(cfg)
    stage = target.with_name(f"{target.name}.tmp-{ctx.run_dir.name}")  # same path on every rank
    ctx.critic.export(str(stage))
    ctx.barrier()
    if dist.is_main:
        (stage / _COMPLETE).write_text(json.dumps({"steps": state["pretrain_step"], "stop_reason": stop_reason,
                                                   "run_dir": str(ctx.run_dir)}, indent=1))
        if target.exists():
            shutil.rmtree(stage)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(stage, target)
        ctx.log.info(f"pretrained critic saved to {target}")
    ctx.barrier()
