"""One RL step, as the algorithm reads (docs/architecture.md), for PPO and value pretraining alike.

    1. sample and score              prompts -> vLLM (n per prompt) -> verifier reward; the outcome
                                     assembled (:mod:`vcppo.driver.step.reward_terms`: overlong shaping,
                                     the reward model combined with the rule)
    2. the current models            pi_old, entropy from passes (where the plan says), the
                                     reference's logprobs and the KL (when some KL is on)
    3. rewards                       the outcome reward on the last token, minus the KL penalty
                                     (``algorithm.kl_in: reward``): the assembly's last term
    4. V_old                         a values pass; or, the plan's shortcut with lambda_critic = 1 and
                                     one critic optimizer step, the critic's update first: the targets
                                     need no values, and V_old is the update's own forward
    5. advantages                    ONE Decoupled-GAE pass: lambda_actor advantages for the actor and
                                     the critic's lambda_critic targets (critic-free: the method's estimator)
    6. critic update                 on those targets (when it did not train first)
    7. actor update                  clipped surrogate (+ the KL term with ``kl_in: loss``); pi_old
                                     from the update where the plan says
    8. weight sync                   the actor's new weights into vLLM (split: to the rollout ranks)
    9. metrics                       the collapse diagnostics over the global batch
   10. KL controller                 the adaptive coefficient's next value (``algorithm.kl_target``)

The :class:`~vcppo.driver.step.step_plan.StepPlan` decides, once per run, which passes run and in which
order; value pretraining (VC-PPO sec. 4.1) is this step with the actor frozen (steps 7-8 skipped).
The critic is met through one protocol wherever it lives (:mod:`vcppo.driver.step.critic_side`): it
begins as soon as the rewards are final, gives V_old at step 4, updates at step 6 (on ranks of its
own, while this rank's actor trains), and hands back its targets and metrics after step 8.
"""
from __future__ import annotations

from vcppo.algos.kl import adaptive_kl_coef, kl_estimate
from vcppo.driver.step.update import estimate
from vcppo.driver.parts import RunParts
from vcppo.driver.state import RunState
from vcppo.driver.step.metrics import kl_metrics, log_samples, step_metrics
from vcppo.driver.step.reward_terms import RewardAssembly
from vcppo.driver.step.timeline import PeakRss, PhaseTimer
from vcppo.driver.step.step_plan import Source, StepPlan
from vcppo.driver.parts import ExperienceSource
from vcppo.driver.step.update import update_actor
from vcppo.runtime.collectives import global_sum
from vcppo.experience import ActorBatch, BeforeUpdate, Rollout
from vcppo.config.schema import AlgorithmConfig


def kl_coef_now(state: RunState, alg: AlgorithmConfig) -> float:
    """The KL coefficient of this step: the adaptive controller's (``algorithm.kl_target`` set; its
    first step starts from ``algorithm.kl_coef``), else ``algorithm.kl_coef`` whatever a resumed
    checkpoint's controller held."""
    return state.kl_coef if alg.kl_target is not None and state.kl_coef is not None else alg.kl_coef


def current_models(ctx: RunParts, plan: StepPlan, rollout: Rollout, timer: PhaseTimer) -> BeforeUpdate:
    """Step 2: the policy's and the reference's outputs the plan takes from passes before the updates
    (or from the sampler); V_old is the critic side's (step 4)."""
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
        out.kl = kl_estimate(out.old_logprobs, out.ref_logprobs, ctx.cfg.algorithm.kl_estimator) * rollout.policy_mask
    return out


def rl_step(ctx: RunParts, source: ExperienceSource, plan: StepPlan, state: RunState, step: int) -> dict:
    """One step of ``plan.phase`` (``state``: the run's, for the KL coefficient and the reward
    model's running moments, which the step advances); its metrics."""
    alg, timer = ctx.cfg.algorithm, PhaseTimer(timeline=ctx.timeline, rss=PeakRss())
    critic = ctx.critic if plan.v_old is not Source.NONE else None
    reward = RewardAssembly(ctx.cfg, ctx.reward_model, plan.phase)
    # 1. Sample and score (+ DAPO dynamic sampling); in a split run, receive. The outcome assembled.
    with timer("rollout"):
        rollout, sample_metrics = source.make(plan.phase, step)
    rollout, reward_metrics = reward.outcome(rollout, state, timer)
    sample_metrics.update(reward_metrics)
    if critic is not None and plan.critic_starts_at_sampling:  # the rewards are final already
        critic.begin_step(plan, step, rollout, rollout.token_rewards, timer)
    # 2. The current models.
    models = current_models(ctx, plan, rollout, timer)
    # 3. Rewards: the KL penalty folded into the per-token reward (PPO-RLHF; the paper uses kl_coef 0).
    kl_coef = kl_coef_now(state, alg)
    rewards = reward.per_token(rollout, models.kl if plan.kl_in_reward else None, kl_coef)
    if critic is not None and not plan.critic_starts_at_sampling:
        critic.begin_step(plan, step, rollout, rewards, timer)
    # 4. V_old: a values pass, or the critic's update first (Monte-Carlo targets need no values).
    if critic is not None:
        models.old_values = critic.values()
    # 5. Advantages (the actor's; in value pretraining only the diagnostic) and, from the same pass,
    #    the critic's targets where it trains in this process.
    with timer("advantages"):
        adv = estimate(rollout, rewards, models.old_values, alg, for_update=plan.actor_trains,
                       lambda_critic=critic.targets_lambda() if critic is not None else None)
    # 6. Critic update on those targets (unless it trained first).
    if critic is not None:
        critic.update(adv.returns)
    # 7. Actor update.
    actor_metrics = {}
    if plan.actor_trains:
        with timer("actor_update"):
            batch = ActorBatch(**vars(rollout), advantages=adv.advantages, old_logprobs=models.old_logprobs,
                               ref_logprobs=models.ref_logprobs if plan.kl_in_loss else None)
            actor = update_actor(ctx.cfg, ctx.actor, plan, batch, step, kl_coef=kl_coef)
        actor_metrics = actor.metrics
        if plan.pi_old is Source.UPDATE:
            models.old_logprobs = actor.logprobs
        if plan.entropy is Source.UPDATE:
            models.entropy = actor.entropy
    # 8. Weight sync (and, in a split run, "step done" to the rollout ranks); the critic's side ends.
    if plan.actor_trains:
        with timer("weight_sync"):
            source.step_done(plan.phase, step, ctx.actor)
    else:
        source.step_done(plan.phase, step, None)
    targets = critic.finish_step() if critic is not None else None
    # 9. Metrics.
    log_samples(ctx, plan.phase, step, rollout, rewards, adv)  # logging.log_samples: a few as text
    metrics = step_metrics(ctx, plan, rollout, models, adv, timer, targets)
    metrics.update({**(targets.metrics if targets is not None else {}), **actor_metrics})
    metrics.update(sample_metrics)
    if plan.reference_pass:
        metrics.update(kl_metrics(ctx, plan, rollout, models, rewards, kl_coef))
    # 10. The adaptive KL controller: the next step's coefficient, from this step's KL.
    if plan.reference_pass and alg.kl_target is not None:
        state.kl_coef = adaptive_kl_coef(kl_coef, metrics["actor/kl_ref"], alg.kl_target, alg.kl_horizon,
                                         n_samples=int(global_sum(float(rollout.size))))
    return metrics

