"""The actor and critic updates: their losses (as :class:`~vcppo.engines.deepspeed_engine.EngineLoss`)
and the PPO epochs x mini-batches loop. Normalisation over ranks and micro-batches is the engine's
job (:mod:`vcppo.engines.deepspeed_engine`); a loss only says what it averages over.
"""
from __future__ import annotations

import torch

from vcppo.algos import losses
from vcppo.algos.dapo import mask_truncated
from vcppo.algos.mismatch import tis_weights
from vcppo.driver.context import RunContext
from vcppo.engines.deepspeed_engine import (RESPONSE, DeepSpeedModelEngine, EngineLoss, GlobalCounts,
                                            ModelOutputs, response_counts, stitch_rows)
from vcppo.experience import Experience
from vcppo.schema import ActorConfig, AlgorithmConfig, CriticConfig

POSITIVE = "positive"  # VAPO's positive-example NLL averages over correct samples only


class PolicyLoss:
    """Clipped surrogate (+ entropy bonus, + VAPO's positive-example NLL), aggregated by
    ``algorithm.loss_agg`` over the global mini-batch; optionally re-weighted per token by truncated
    importance sampling against the sampler's logprobs (``algorithm.rollout_is_cap``) and without
    truncated responses (``algorithm.mask_truncated``, DAPO's overlong filtering)."""

    def __init__(self, alg: AlgorithmConfig, old_from_update: bool = False, keep_outputs: bool = False):
        self.alg = alg
        # old_from_update: pi_old is the update's own forward, detached (exact when the step makes
        # ONE optimizer step from the weights that sampled: see old_logprobs_from_update).
        # keep_outputs: the detached logprobs and entropies are kept for the step's metrics (the
        # step ran no separate old-logprobs pass that would have given them).
        self.old_from_update = old_from_update
        self.keep_outputs = keep_outputs or old_from_update
        self.needs_entropy = alg.entropy_coef > 0 or self.keep_outputs
        self.kept: list[tuple[torch.Tensor, torch.Tensor]] = []

    def loss_mask(self, batch: Experience) -> torch.Tensor:
        """(B, R): the tokens the policy loss averages over."""
        if self.alg.mask_truncated:
            return mask_truncated(batch.response_mask, batch.truncated)
        return batch.response_mask

    def count_masks(self, minibatch: Experience) -> dict[str, torch.Tensor]:
        masks = {RESPONSE: self.loss_mask(minibatch)}
        if self.alg.positive_lm_coef > 0:
            masks[POSITIVE] = masks[RESPONSE] * (minibatch.correct > 0)[:, None]
        return masks

    def __call__(self, outputs: ModelOutputs, micro: Experience, counts: GlobalCounts):
        a, mask = self.alg, self.loss_mask(micro)
        norm = dict(agg=a.loss_agg, global_token_count=counts.tokens[RESPONSE],
                    global_seq_count=counts.sequences[RESPONSE])
        old = outputs.logprobs.detach() if self.old_from_update else micro.old_logprobs
        if self.keep_outputs:
            self.kept.append((outputs.logprobs.detach(), outputs.entropy.detach()))
        weights = None
        if a.rollout_is_cap is not None:
            # The step's per-token weights are logged over the global batch (driver.metrics).
            weights, _ = tis_weights(old, micro.sampler_logprobs, mask, a.rollout_is_cap)
        loss, metrics = losses.policy_loss(outputs.logprobs, old, micro.advantages, mask,
                                           eps_low=a.eps_low, eps_high=a.eps_high, dual_clip_c=a.dual_clip_c,
                                           is_weights=weights, **norm)
        metrics = {f"actor/{k}": v for k, v in metrics.items()}
        # The loss above is this micro-batch's share of the global mean; report its own mean.
        metrics["actor/pg_loss"] = loss.detach() * counts.local_share(RESPONSE, mask, a.loss_agg)
        if a.entropy_coef > 0:
            loss = loss - a.entropy_coef * losses.aggregate_loss(outputs.entropy, mask, **norm)
        if a.positive_lm_coef > 0:
            # VAPO: imitation loss on correctly answered samples (self-imitation of positives).
            nll, m = losses.positive_example_nll(outputs.logprobs, mask, micro.correct > 0, agg=a.loss_agg,
                                                 global_token_count=max(counts.tokens[POSITIVE], 1.0),
                                                 global_seq_count=max(counts.sequences[POSITIVE], 1.0))
            loss = loss + a.positive_lm_coef * nll
            metrics.update({f"actor/{k}": v for k, v in m.items()})
        return loss, metrics


class ValueLoss:
    """Clipped value loss against the value targets, aggregated by ``algorithm.loss_agg``."""
    needs_entropy = False

    def __init__(self, critic: CriticConfig, agg: str, old_from_update: bool = False):
        self.clip, self.agg = critic.value_clip, agg
        # old_from_update: V_old is the update's own forward, detached (exact under
        # old_values_from_update); kept so the step's advantages can be computed from it afterwards.
        self.old_from_update = old_from_update
        self.kept: list[tuple[torch.Tensor]] = []

    count_masks = staticmethod(response_counts)

    def __call__(self, outputs: ModelOutputs, micro: Experience, counts: GlobalCounts):
        old = micro.old_values
        if self.old_from_update:
            old = outputs.values.detach()
            self.kept.append((old,))
        loss, metrics = losses.value_loss(outputs.values, old, micro.returns, micro.response_mask,
                                          clip_range=self.clip, agg=self.agg,
                                          global_token_count=counts.tokens[RESPONSE],
                                          global_seq_count=counts.sequences[RESPONSE])
        metrics = {f"critic/{k}": v for k, v in metrics.items()}
        metrics["critic/value_loss"] = loss.detach() * counts.local_share(RESPONSE, micro.response_mask, self.agg)
        return loss, metrics


def minibatches(batch: Experience, optim: ActorConfig, seed: int, step: int):
    """PPO epochs x shuffled mini-batches of this rank's share of the step's batch."""
    for epoch in range(optim.ppo_epochs):
        g = torch.Generator().manual_seed(seed * 7919 + step * 31 + epoch)
        order = torch.randperm(batch.size, generator=g)
        for idx in order.chunk(optim.ppo_mini_batches):
            yield batch.select(idx.sort().values)


def mean_metrics(records: list[dict]) -> dict:
    keys = {k for r in records for k in r}
    return {k: sum(float(r[k]) for r in records if k in r) / sum(k in r for r in records) for k in keys}


def run_update(engine: DeepSpeedModelEngine, loss: EngineLoss, optim: ActorConfig, batch: Experience,
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


def one_optimizer_step(optim: ActorConfig) -> bool:
    """One epoch of one mini-batch: the update's forward runs on the weights of before the step, and
    its micro-batches hold the batch's rows in order."""
    return optim.ppo_epochs == 1 and optim.ppo_mini_batches == 1


def kept_outputs(engine: DeepSpeedModelEngine, batch: Experience, kept: list[tuple]) -> list[torch.Tensor]:
    """What a loss kept from the update's forwards (one tuple per micro-batch), as (B, R) tensors
    in the batch's row order; valid under :func:`one_optimizer_step` (rank-padding passes come last)."""
    groups = engine.micro_batch_rows(batch)
    return stitch_rows(groups, kept[:len(groups)])


def old_values_from_update(critic: CriticConfig, lambda_critic: float) -> bool:
    """With one epoch of one mini-batch the critic update's forward runs on the weights of before the
    step, so its values ARE V_old, and the separate values pass can be skipped, provided the value
    targets do not need V: with lambda_critic = 1 they are the discounted returns-to-go (GAE
    telescopes), known from the rewards alone. The actor's advantages are then computed after the
    critic update, from the values it kept (GAE is per row, so micro-batching does not matter)."""
    return one_optimizer_step(critic) and lambda_critic == 1.0


def train_critic(ctx: RunContext, batch: Experience, step: int, lambda_critic: float | None = None) -> dict:
    """The critic's update; when ``batch.old_values`` is None (the step skipped their pass, see
    :func:`old_values_from_update`) the update's own detached values fill it afterwards.
    ``lambda_critic``: that of the targets in ``batch.returns`` (default: ``algorithm.lambda_critic``)."""
    from_update = batch.old_values is None
    lam = ctx.cfg.algorithm.lambda_critic if lambda_critic is None else lambda_critic
    if from_update and not old_values_from_update(ctx.cfg.critic, lam):
        raise RuntimeError("old_values missing but the value targets need them or the update makes "
                           "more than one optimizer step")
    loss = ValueLoss(ctx.cfg.critic, ctx.cfg.algorithm.loss_agg, old_from_update=from_update)
    out = run_update(ctx.critic, loss, ctx.cfg.critic, batch, ctx.cfg.trainer.seed, step, "critic")
    if from_update:
        batch.old_values, = kept_outputs(ctx.critic, batch, loss.kept)
    return out


def old_logprobs_from_update(actor: ActorConfig, kl_in_reward: bool) -> bool:
    """With one epoch of one mini-batch the update's forward runs on the weights that sampled, so
    its logprobs ARE pi_old (ratio exactly 1 at the single step): the separate old-logprobs pass can
    be skipped. Not when the KL penalty is folded into the reward: the advantages need pi_old's
    logprobs before the update."""
    return one_optimizer_step(actor) and not kl_in_reward


def pi_old_source(ctx: RunContext) -> str:
    """Where the step's pi_old comes from: ``"update"`` (the actor update's own forward, exact, see
    :func:`old_logprobs_from_update`), ``"sampler"`` (the rollout engine's logprobs,
    ``algorithm.old_logprobs_from_sampler``) or ``"pass"`` (a separate actor forward)."""
    if old_logprobs_from_update(ctx.cfg.actor, kl_in_reward=ctx.reference is not None):
        return "update"
    return "sampler" if ctx.cfg.algorithm.old_logprobs_from_sampler else "pass"


def train_actor(ctx: RunContext, batch: Experience, step: int) -> dict:
    """The actor's update; when ``batch.old_logprobs`` is None (the step skipped their pass, see
    :func:`old_logprobs_from_update`) the update's own detached logprobs fill it afterwards, and when
    ``batch.entropy`` is None the update's entropies fill that, for the step's metrics."""
    from_update = batch.old_logprobs is None
    if from_update and not old_logprobs_from_update(ctx.cfg.actor, ctx.reference is not None):
        raise RuntimeError("old_logprobs missing but the update makes more than one optimizer step")
    loss = PolicyLoss(ctx.cfg.algorithm, old_from_update=from_update,
                      keep_outputs=batch.entropy is None and one_optimizer_step(ctx.cfg.actor))
    out = run_update(ctx.actor, loss, ctx.cfg.actor, batch, ctx.cfg.trainer.seed, step, "actor")
    if loss.keep_outputs:
        logprobs, batch.entropy = kept_outputs(ctx.actor, batch, loss.kept)
        if from_update:
            batch.old_logprobs = logprobs
    return out
