"""From a step's rewards and values to its updates: the advantages and targets, then the losses and loops.

**Advantages** (:func:`estimate`, one call a step): from rewards and values to the actor's advantages
and the critic's targets. GAE presets (VC-PPO, PPO, VAPO) use Decoupled-GAE: advantages with ``lambda_actor`` (or VAPO's
length-adaptive lambda), value targets with ``lambda_critic`` (VC-PPO sec. 4.2), both from one
pass wherever the actor and the critic share a process. The critic-free
estimators give every token a group- or batch-relative return: GRPO (and Dr. GRPO without the std),
RLOO, REINFORCE++ and its group-baseline variant (:mod:`vcppo.methods` lists them, what each needs,
and its paper). The estimators return raw advantages; whitening touches only the actor's advantages
(never the critic's targets, which stay on the return's scale) and runs over the GLOBAL batch (every
rank), so the result does not depend on how many ranks share the batch. REINFORCE++'s global normalisation is that whitening.

**Updates**: the actor and critic updates, their losses (as :class:`~vcppo.engines.loss_contract.EngineLoss`)
and the PPO epochs x mini-batches loop. Normalisation over ranks and micro-batches is the engine's
job (:mod:`vcppo.engines.deepspeed_engine`); a loss only says what it averages over. Where pi_old
and V_old come from is the step plan's decision (:mod:`vcppo.driver.step.step_plan`): an update whose plan
takes them from its own forward keeps those outputs and returns them (:class:`UpdateResult`).
"""
from __future__ import annotations

import torch

from vcppo.algos import estimators, losses
from vcppo.algos.dapo import mask_truncated
from vcppo.algos.estimators import EstimatorInput
from vcppo.algos.gae import length_adaptive_lambda
from vcppo.algos.kl import kl_estimate
from vcppo.algos.mismatch import tis_weights
from vcppo.algos.stats import masked_whiten
from vcppo.config.schema import AlgorithmConfig, Config, CriticConfig, UpdateConfig
from vcppo.driver.step.step_plan import Source, StepPlan, one_optimizer_step
from vcppo.engines.deepspeed_engine import DeepSpeedModelEngine
from vcppo.engines.loss_contract import RESPONSE, EngineLoss, GlobalCounts, ModelOutputs, response_counts
from vcppo.experience import ActorBatch, Advantages, CriticBatch, Rollout, UpdateResult
from vcppo.methods import estimator_fn, policy_loss_fn
from vcppo.runtime.collectives import global_sum


def global_whiten(advantages: torch.Tensor, mask: torch.Tensor, zero_mean: bool = True,
                  eps: float = 1e-8) -> torch.Tensor:
    """Whiten (B, R) advantages over the valid tokens of the GLOBAL batch (all ranks), so the result
    does not depend on how many ranks the batch is split over. Masked positions stay 0."""
    return masked_whiten(advantages, mask, zero_mean=zero_mean, eps=eps, sum_fn=global_sum)


def returns_to_go(rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """(B, R) discounted returns-to-go: the lambda = 1 GAE target, which telescopes to
    sum_k gamma^k r_{t+k} whatever the values (computed with V = 0, so without their rounding)."""
    return estimators.returns_to_go(rewards, mask, gamma)


def critic_targets(rollout: Rollout, rewards: torch.Tensor, values: torch.Tensor, alg: AlgorithmConfig,
                   lambda_critic: float) -> torch.Tensor:
    """(B, R) the critic's regression targets alone: GAE with ``lambda_critic`` plus V_old. Only where
    the critic lives on ranks of its own (the actor's rank computes only its advantages there);
    a process that holds both takes them from :func:`estimate`'s one pass."""
    return estimators.gae(EstimatorInput(rewards=rewards, mask=rollout.policy_mask, group=rollout.group,
                                         outcomes=rollout.token_rewards.sum(-1), values=values, gamma=alg.gamma,
                                         lam_actor=lambda_critic, lam_critic=lambda_critic)).returns


def estimate(rollout: Rollout, rewards: torch.Tensor, values: torch.Tensor | None, alg: AlgorithmConfig,
             for_update: bool = True, lambda_critic: float | None = None) -> Advantages:
    """The actor's :class:`~vcppo.experience.Advantages` from ``rewards`` (B, R) (the outcome reward,
    minus the KL penalty when there is one) and ``values`` (B, R) V_old (None without a critic), by
    the methods table's function for ``alg.advantage_estimator``, in ONE call.

    ``lambda_critic``: the critic trains in this process on targets at this lambda; the same call
    gives them (``Advantages.returns``; Decoupled-GAE's two outputs of one pass). None: no targets.
    ``for_update``: the actor trains on them: VAPO's length-adaptive lambda and whitening apply.
    Otherwise (value pretraining, actor frozen) they are only the position-profile diagnostic:
    plain ``lambda_actor``, not whitened."""
    lam_actor = None
    if for_update and alg.length_adaptive_lambda:
        # VAPO: longer responses get lambda closer to 1 (less bias on long sequences); an episode's
        # length counts its observation tokens (vcppo.experience.response_lengths says why)
        lam_actor = length_adaptive_lambda(rollout.response_lengths, alg.length_adaptive_alpha)
    x = EstimatorInput(rewards=rewards, mask=rollout.policy_mask, group=rollout.group,
                       outcomes=rollout.token_rewards.sum(-1), values=values, gamma=alg.gamma,
                       lam_actor=alg.lambda_actor if lam_actor is None else lam_actor, lam_critic=lambda_critic,
                       scale_by_std=alg.grpo_scale_by_std)
    out = estimator_fn(alg.advantage_estimator)(x)
    advantages = out.advantages
    if for_update and alg.whiten_advantages:
        advantages = global_whiten(out.advantages, rollout.policy_mask, zero_mean=alg.zero_mean_advantages)
    return Advantages(advantages=advantages, raw_advantages=out.advantages, lambda_actor=lam_actor,
                      returns=out.returns)


POSITIVE = "positive"  # VAPO's positive-example NLL averages over correct samples only
SUM_NORM = "seq-mean-token-sum-norm"  # Dr. GRPO's aggregation: each sequence's sum over a constant


def norm_constant(cfg: Config) -> float | None:
    """The constant of ``loss_agg: seq-mean-token-sum-norm``: the generation budget
    (``rollout.max_response_tokens``, as Dr. GRPO's); None for the other aggregations."""
    return float(cfg.rollout.max_response_tokens) if cfg.algorithm.loss_agg == SUM_NORM else None


class PolicyLoss:
    """``algorithm.policy_loss``: PPO's clipped surrogate per token or GSPO's per sequence (+ entropy
    bonus, + VAPO's positive-example NLL, + ``kl_coef`` x the KL to
    the reference when the batch carries its logprobs: ``algorithm.kl_in: loss``), aggregated by
    ``algorithm.loss_agg`` over the global mini-batch; optionally re-weighted per token by truncated
    importance sampling against the sampler's logprobs (``algorithm.rollout_is_cap``) and without
    truncated responses (``algorithm.mask_truncated``, DAPO's overlong filtering)."""

    def __init__(self, alg: AlgorithmConfig, old_from_update: bool = False, keep_outputs: bool = False,
                 kl_coef: float = 0.0, norm: float | None = None):
        self.alg, self.kl_coef, self.norm = alg, kl_coef, norm  # norm: the constant of SUM_NORM
        # old_from_update: pi_old is the update's own forward, detached (exact when the step makes
        # ONE optimizer step from the weights that sampled: vcppo.driver.step.step_plan).
        # keep_outputs: the detached logprobs and entropies are kept for the step's metrics (the
        # step ran no separate old-logprobs pass that would have given them).
        self.old_from_update = old_from_update
        self.keep_outputs = keep_outputs or old_from_update
        self.needs_entropy = alg.entropy_coef > 0 or self.keep_outputs
        self.kept: list[tuple[torch.Tensor, torch.Tensor]] = []

    def loss_mask(self, batch: ActorBatch) -> torch.Tensor:
        """(B, R): the tokens the policy loss averages over."""
        if self.alg.mask_truncated:
            return mask_truncated(batch.policy_mask, batch.truncated)
        return batch.policy_mask

    def count_masks(self, minibatch: ActorBatch) -> dict[str, torch.Tensor]:
        masks = {RESPONSE: self.loss_mask(minibatch)}
        if self.alg.positive_lm_coef > 0:
            masks[POSITIVE] = masks[RESPONSE] * (minibatch.correct > 0)[:, None]
        return masks

    def __call__(self, outputs: ModelOutputs, micro: ActorBatch, counts: GlobalCounts):
        a, mask = self.alg, self.loss_mask(micro)
        norm = dict(agg=a.loss_agg, global_token_count=counts.tokens[RESPONSE],
                    global_seq_count=counts.sequences[RESPONSE], norm_constant=self.norm)
        old = outputs.logprobs.detach() if self.old_from_update else micro.old_logprobs
        if self.keep_outputs:
            self.kept.append((outputs.logprobs.detach(), outputs.entropy.detach()))
        weights = None
        if a.rollout_is_cap is not None:
            # The step's per-token weights are logged over the global batch (driver.metrics).
            weights, _ = tis_weights(old, micro.sampler_logprobs, mask, a.rollout_is_cap)
        loss, metrics = policy_loss_fn(a.policy_loss)(outputs.logprobs, old, micro.advantages, mask,
                                                      eps_low=a.eps_low, eps_high=a.eps_high,
                                                      dual_clip_c=a.dual_clip_c, is_weights=weights, **norm)
        metrics = {f"actor/{k}": v for k, v in metrics.items()}
        # The loss above is this micro-batch's share of the global mean; report its own mean.
        metrics["actor/pg_loss"] = loss.detach() * counts.local_share(RESPONSE, mask, a.loss_agg)
        if a.entropy_coef > 0:
            loss = loss - a.entropy_coef * losses.aggregate_loss(outputs.entropy, mask, **norm)
        if a.positive_lm_coef > 0:
            # VAPO: imitation loss on correctly answered samples (self-imitation of positives).
            nll, m = losses.positive_example_nll(outputs.logprobs, mask, micro.correct > 0, agg=a.loss_agg,
                                                 global_token_count=max(counts.tokens[POSITIVE], 1.0),
                                                 global_seq_count=max(counts.sequences[POSITIVE], 1.0),
                                                 norm_constant=self.norm)
            loss = loss + a.positive_lm_coef * nll
            metrics.update({f"actor/{k}": v for k, v in m.items()})
        if micro.ref_logprobs is not None:
            # GRPO's KL term, on the CURRENT policy's logprobs (its gradient is the estimator's: kl.py)
            kl = losses.aggregate_loss(kl_estimate(outputs.logprobs, micro.ref_logprobs, a.kl_estimator), mask, **norm)
            loss = loss + self.kl_coef * kl
            metrics["actor/kl_loss"] = kl.detach() * counts.local_share(RESPONSE, mask, a.loss_agg)
        return loss, metrics


class ValueLoss:
    """Clipped value loss against the value targets, aggregated by ``algorithm.loss_agg``."""
    needs_entropy = False

    def __init__(self, critic: CriticConfig, agg: str, old_from_update: bool = False, norm: float | None = None):
        self.clip, self.agg, self.norm = critic.value_clip, agg, norm  # norm: the constant of SUM_NORM
        # old_from_update: V_old is the update's own forward, detached (exact with one optimizer
        # step); kept so the step's advantages can be computed from it afterwards.
        self.old_from_update = old_from_update
        self.kept: list[tuple[torch.Tensor]] = []

    count_masks = staticmethod(response_counts)

    def __call__(self, outputs: ModelOutputs, micro: CriticBatch, counts: GlobalCounts):
        old = micro.old_values
        if self.old_from_update:
            old = outputs.values.detach()
            self.kept.append((old,))
        loss, metrics = losses.value_loss(outputs.values, old, micro.returns, micro.policy_mask,
                                          clip_range=self.clip, agg=self.agg,
                                          global_token_count=counts.tokens[RESPONSE],
                                          global_seq_count=counts.sequences[RESPONSE], norm_constant=self.norm)
        metrics = {f"critic/{k}": v for k, v in metrics.items()}
        metrics["critic/value_loss"] = loss.detach() * counts.local_share(RESPONSE, micro.policy_mask, self.agg)
        return loss, metrics


def minibatches(batch: ActorBatch | CriticBatch, optim: UpdateConfig, seed: int, step: int):
    """PPO epochs x shuffled mini-batches of this rank's share of the step's batch."""
    for epoch in range(optim.ppo_epochs):
        g = torch.Generator().manual_seed(seed * 7919 + step * 31 + epoch)
        order = torch.randperm(batch.size, generator=g)
        for idx in order.chunk(optim.ppo_mini_batches):
            yield batch.select(idx.sort().values)


def mean_metrics(records: list[dict]) -> dict:
    keys = {k for r in records for k in r}
    return {k: sum(float(r[k]) for r in records if k in r) / sum(k in r for r in records) for k in keys}


def run_update(engine: DeepSpeedModelEngine, loss: EngineLoss, optim: UpdateConfig, batch: ActorBatch | CriticBatch,
               seed: int, step: int, role: str) -> dict:
    """PPO epochs x mini-batches of optimizer steps; metrics averaged, engine figures prefixed."""
    records = [engine.train_step(mb, loss) for mb in minibatches(batch, optim, seed, step)]
    out = mean_metrics(records)
    # a count, not a mean: optimizer steps skipped for non-finite values (the same on every rank)
    out["nonfinite_skipped"] = sum(r.get("nonfinite_skipped", 0.0) for r in records)
    for k in ("grad_norm", "lr", "nonfinite_skipped"):
        if k in out:
            out[f"{role}/{k}"] = out.pop(k)
    return out


def kept_outputs(engine: DeepSpeedModelEngine, batch: ActorBatch | CriticBatch,
                 kept: list[tuple]) -> list[torch.Tensor]:
    """What a loss kept from the update's forwards (one tuple per micro-batch), as (B, R) tensors
    in the batch's row order; valid with one optimizer step (rank-padding passes come last)."""
    return engine.train_step_outputs(batch, kept)


def _check_one_step(source: Source, optim: UpdateConfig, role: str) -> None:
    """An update's own forward is the pre-update model only for the first of its optimizer steps."""
    if source is Source.UPDATE and not one_optimizer_step(optim):
        raise ValueError(f"a step plan that takes the {role}'s old outputs from its update needs one optimizer "
                         f"step (ppo_epochs = ppo_mini_batches = 1), got {optim.ppo_epochs} x {optim.ppo_mini_batches}")


def update_critic(cfg: Config, critic: DeepSpeedModelEngine, plan: StepPlan, batch: CriticBatch,
                  step: int) -> UpdateResult:
    """The critic's update; with ``plan.v_old`` UPDATE its own detached values are V_old, returned."""
    _check_one_step(plan.v_old, cfg.critic, "critic")
    from_update = plan.v_old is Source.UPDATE
    loss = ValueLoss(cfg.critic, cfg.algorithm.loss_agg, old_from_update=from_update, norm=norm_constant(cfg))
    metrics = run_update(critic, loss, cfg.critic, batch, cfg.trainer.seed, step, "critic")
    if not from_update:
        return UpdateResult(metrics)
    values, = kept_outputs(critic, batch, loss.kept)
    return UpdateResult(metrics, values=values)


def update_actor(cfg: Config, actor: DeepSpeedModelEngine, plan: StepPlan, batch: ActorBatch, step: int,
                 kl_coef: float = 0.0) -> UpdateResult:
    """The actor's update; with ``plan.pi_old`` UPDATE its own detached logprobs are pi_old, and with
    ``plan.entropy`` UPDATE its entropies are the step's, both returned. ``kl_coef``: the weight of
    the KL term when the batch carries the reference's logprobs."""
    _check_one_step(plan.pi_old, cfg.actor, "actor")
    _check_one_step(plan.entropy, cfg.actor, "actor")
    loss = PolicyLoss(cfg.algorithm, old_from_update=plan.pi_old is Source.UPDATE,
                      keep_outputs=plan.entropy is Source.UPDATE, kl_coef=kl_coef, norm=norm_constant(cfg))
    metrics = run_update(actor, loss, cfg.actor, batch, cfg.trainer.seed, step, "actor")
    if not loss.keep_outputs:
        return UpdateResult(metrics)
    logprobs, entropy = kept_outputs(actor, batch, loss.kept)
    return UpdateResult(metrics, logprobs=logprobs if plan.pi_old is Source.UPDATE else None, entropy=entropy)
