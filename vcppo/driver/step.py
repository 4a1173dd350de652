"""One RL step, as the algorithm reads (docs/architecture.md), for PPO and value pretraining alike.

    1. sample and score              prompts -> vLLM (n per prompt) -> verifier reward; the reward
                                     model's score combined with it (``reward.combine``)
    2. the current models            pi_old, entropy, V_old from passes (where the plan says), the
                                     reference's logprobs and the KL (when some KL is on)
    3. rewards                       the outcome reward on the last token, minus the KL penalty
                                     (``algorithm.kl_in: reward``)
    4. critic first (plan shortcut)  lambda_critic = 1 and one critic optimizer step: the targets
                                     need no values, and V_old is the update's own forward
    5. advantages                    Decoupled-GAE: lambda_actor for the actor, lambda_critic targets
    6. critic update                 (when it did not train first)
    7. actor update                  clipped surrogate (+ the KL term with ``kl_in: loss``); pi_old
                                     from the update where the plan says
    8. weight sync                   the actor's new weights into vLLM (split: to the rollout ranks)
    9. metrics                       the collapse diagnostics over the global batch
   10. KL controller                 the adaptive coefficient's next value (``algorithm.kl_target``)

The :class:`~vcppo.driver.plan.StepPlan` decides, once per run, which passes run and in which
order; value pretraining (VC-PPO sec. 4.1) is this step with the actor frozen (steps 7-8 skipped).
With the critic on ranks of its own (``plan.critic_remote``), its part of steps 2, 4 and 6 runs
there: the share goes to the critic rank as soon as its rewards are known, V_old comes back
before step 5, and the critic's update runs while this rank's actor trains; its metrics are
collected before step 9.
"""
from __future__ import annotations

import dataclasses

import torch

from vcppo.algos.kl import adaptive_kl_coef, kl_estimate
from vcppo.driver.advantages import estimate, returns_to_go
from vcppo.driver.checkpoint import RunState
from vcppo.driver.context import RunContext
from vcppo.driver.metrics import PhaseTimer, kl_metrics, step_metrics
from vcppo.driver.plan import Source, StepPlan
from vcppo.driver.sources import ExperienceSource
from vcppo.driver.update import update_actor, update_critic
from vcppo.engines.dist import global_sum
from vcppo.experience import ActorBatch, BeforeUpdate, CriticBatch, Rollout
from vcppo.schema import AlgorithmConfig


def kl_coef_now(state: RunState, alg: AlgorithmConfig) -> float:
    """The KL coefficient of this step: the adaptive controller's (``algorithm.kl_target`` set; its
    first step starts from ``algorithm.kl_coef``), else ``algorithm.kl_coef`` whatever a resumed
    checkpoint's controller held."""
    return state.kl_coef if alg.kl_target is not None and state.kl_coef is not None else alg.kl_coef


def current_models(ctx: RunContext, plan: StepPlan, rollout: Rollout, timer: PhaseTimer) -> BeforeUpdate:
    """Step 2: what the plan takes from passes before the updates (or from the sampler)."""
    out = BeforeUpdate()
    if plan.pi_old is Source.SAMPLER:
        out.old_logprobs = rollout.sampler_logprobs  # trusted by config; TIS weights are then 1
    elif plan.pi_old is Source.PASS:
        with timer("old_logprobs"):
            out.old_logprobs, out.entropy = ctx.actor.forward_logprobs(rollout, with_entropy=True)
    if plan.reference_pass:
        with timer("ref_logprobs"):
            out.ref_logprobs, _ = ctx.reference.forward_logprobs(rollout)
    if plan.kl_in_reward:
        out.kl = kl_estimate(out.old_logprobs, out.ref_logprobs, ctx.cfg.algorithm.kl_estimator) * rollout.response_mask
    if plan.v_old is Source.PASS and not plan.critic_remote:
        with timer("values"):
            out.old_values = ctx.critic.forward_values(rollout)
    return out


def critic_before_advantages(ctx: RunContext, plan: StepPlan, rollout: Rollout, rewards: torch.Tensor,
                             models: BeforeUpdate, step: int, timer: PhaseTimer) -> tuple[torch.Tensor | None, dict]:
    """Step 4: ``models.old_values`` set where V_old comes from the critic's ranks or its update;
    returns the value targets (B, R) when the critic trains first (Monte-Carlo returns: GAE
    telescopes at lambda = 1, so they need no values; else None), and that update's metrics."""
    returns, metrics = None, {}
    if plan.critic_remote:
        if plan.kl_in_reward:  # the rewards needed the actor's pi_old and the reference first
            ctx.critic.begin_step(plan.phase, step, rollout, rewards)
        with timer("wait_critic_values"):
            models.old_values = ctx.critic.values(ctx.dist.device)
    if plan.critic_first:
        returns = returns_to_go(rewards, rollout.response_mask, ctx.cfg.algorithm.gamma)
        if not plan.critic_remote:
            with timer("critic_update"):
                critic = update_critic(ctx.cfg, ctx.critic, plan, CriticBatch(**vars(rollout), returns=returns), step)
            models.old_values, metrics = critic.values, dict(critic.metrics)
    return returns, metrics


def rl_step(ctx: RunContext, source: ExperienceSource, plan: StepPlan, state: RunState, step: int) -> dict:
    """One step of ``plan.phase`` (``state``: the run's, for the KL coefficient and the reward
    model's running moments, which the step advances); its metrics."""
    alg, timer = ctx.cfg.algorithm, PhaseTimer(timeline=ctx.timeline)
    # 1. Sample and score (+ DAPO dynamic sampling and overlong shaping); in a split run, receive.
    with timer("rollout"):
        rollout, sample_metrics = source.make(plan.phase, step)
    if ctx.reward_model is not None:
        with timer("reward_model"):
            rollout, rm_metrics = ctx.reward_model.rescore(rollout, state)
        sample_metrics.update(rm_metrics)
    if plan.critic_remote and not plan.kl_in_reward:  # the critic ranks start now
        ctx.critic.begin_step(plan.phase, step, rollout, rollout.token_rewards)
    # 2. The current models.
    models = current_models(ctx, plan, rollout, timer)
    # 3. Rewards: the KL penalty folded into the per-token reward (PPO-RLHF; the paper uses kl_coef 0).
    kl_coef = kl_coef_now(state, alg)
    rewards = rollout.token_rewards - kl_coef * models.kl if plan.kl_in_reward else rollout.token_rewards
    # 4. The critic's V_old (from its ranks), or its update first.
    returns, update_metrics = critic_before_advantages(ctx, plan, rollout, rewards, models, step, timer)
    # 5. Advantages (the actor's; in value pretraining only the diagnostic).
    with timer("advantages"):
        adv = estimate(rollout, rewards, models.old_values, alg, plan.lambda_critic, for_update=plan.actor_trains)
        if plan.critic_first:
            adv = dataclasses.replace(adv, returns=returns)  # what the critic trained on
    # 6. Critic update (when it did not train first).
    if plan.v_old is Source.PASS and not plan.critic_remote:
        with timer("critic_update"):
            batch = CriticBatch(**vars(rollout), returns=adv.returns, old_values=models.old_values)
            update_metrics.update(update_critic(ctx.cfg, ctx.critic, plan, batch, step).metrics)
    # 7. Actor update.
    if plan.actor_trains:
        with timer("actor_update"):
            batch = ActorBatch(**vars(rollout), advantages=adv.advantages, old_logprobs=models.old_logprobs,
                               ref_logprobs=models.ref_logprobs if plan.kl_in_loss else None)
            actor = update_actor(ctx, plan, batch, step, kl_coef=kl_coef)
        update_metrics.update(actor.metrics)
        if plan.pi_old is Source.UPDATE:
            models.old_logprobs = actor.logprobs
        if plan.entropy is Source.UPDATE:
            models.entropy = actor.entropy
    # 8. Weight sync (and, in a split run, "step done" to the rollout ranks).
    if plan.actor_trains:
        with timer("weight_sync"):
            source.step_done(plan.phase, step, ctx.actor)
    else:
        source.step_done(plan.phase, step, None)
    if plan.critic_remote:
        with timer("wait_critic_update"):
            update_metrics.update(ctx.critic.finish_step())
    # 9. Metrics.
    metrics = step_metrics(ctx, plan, rollout, models, adv, timer)
    metrics.update(update_metrics)
    metrics.update(sample_metrics)
    if plan.reference_pass:
        metrics.update(kl_metrics(ctx, plan, rollout, models, rewards, kl_coef))
    # 10. The adaptive KL controller: the next step's coefficient, from this step's KL.
    if plan.reference_pass and alg.kl_target is not None:
        state.kl_coef = adaptive_kl_coef(kl_coef, metrics["actor/kl_ref"], alg.kl_target, alg.kl_horizon,
                                         n_samples=int(global_sum(float(rollout.size))))
    return metrics

