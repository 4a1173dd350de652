"""The step plan: where one RL step takes pi_old, V_old and the entropy from, decided once per run.

PPO's ratio needs pi_old, the log-probabilities of the weights that sampled; the clipped value
loss needs V_old. A step can take each from a separate forward pass before the updates, or, when
the update makes ONE optimizer step (one epoch of one mini-batch), from the update's own forward:
that forward runs on the weights of before the step, so its detached outputs ARE pi_old / V_old
(the ratio is exactly 1 at that step). Two caveats decide the rest:

* V_old from the critic's update is only usable when the value targets need no values: with
  lambda_critic = 1 they are the discounted returns-to-go (GAE telescopes), so the critic trains
  first and the actor's advantages follow from the values its forward kept.
* pi_old from the actor's update is unusable when the KL penalty is folded into the reward: the
  advantages need pi_old before the actor trains. Then it comes from a pass, or from the sampler
  (``algorithm.old_logprobs_from_sampler``: one pass less, trusted by config). KL as a loss term
  (``algorithm.kl_in: loss``) reads the update's own logprobs, so the shortcut stays.

Value pretraining (VC-PPO sec. 4.1) is the same step with the actor frozen: no pi_old, no actor
update, no weight sync, and its own lambda_critic (``value_pretrain.lambda_critic``).

With the critic on ranks of its own (``placement.critic_ranks``) the PPO step takes V_old from a
values pass on those ranks even where the update's forward would do: the actor's advantages then
wait only for that pass, not for the critic's whole update, which runs while the actor trains.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

from vcppo.config.placement import Placement
from vcppo.config.rules import logprob_users
from vcppo.driver.state import Phase
from vcppo.methods import POLICY_LOSSES, uses_critic
from vcppo.config.schema import Config, UpdateConfig


class Source(enum.Enum):
    """Where a step takes a per-token quantity from."""
    PASS = "a forward pass before the updates"
    UPDATE = "the update's own forward (one optimizer step: exact)"
    SAMPLER = "the sampler's logprobs"
    NONE = "not needed"


@dataclass(frozen=True)
class StepPlan:
    """How one step of a phase runs; built by :func:`ppo_plan` / :func:`pretrain_plan`.

    ``pi_old`` / ``v_old`` / ``entropy``: their :class:`Source`.
    ``critic_first``: the critic trains before the advantages exist (V_old from its update).
    ``kl_in_reward``: the reference policy's KL penalty is subtracted from the per-token reward.
    ``kl_in_loss``: the KL of the current policy to the reference is a term of the actor's loss.
    ``actor_trains``: False in value pretraining (the policy is frozen; the actor's advantages
    are then only the position-profile diagnostic, at the plain ``lambda_actor``, not whitened).
    ``lambda_critic``: the lambda of the critic's targets.
    ``sampler_logprobs``: the rollout asks vLLM for the sampled tokens' logprobs.
    ``critic_remote``: the critic's passes and update run on its own ranks
    (:mod:`vcppo.driver.placement.critic_ranks`), V_old comes back from there.
    """
    phase: Phase
    pi_old: Source
    v_old: Source
    entropy: Source
    critic_first: bool
    kl_in_reward: bool
    kl_in_loss: bool
    actor_trains: bool
    lambda_critic: float
    sampler_logprobs: bool
    critic_remote: bool = False

    def describe(self) -> str:
        """One line for the run's log."""
        order = "critic update, then advantages" if self.critic_first else "advantages, then critic update"
        if self.v_old is Source.NONE:
            order = "no critic"
        elif self.critic_remote:
            order += " on the critic's own ranks"
        return (f"{self.phase} step plan: pi_old from {self.pi_old.value}; V_old from {self.v_old.value}; "
                f"entropy from {self.entropy.value}; {order}; KL to the reference: {self.kl_where}; actor trains: {'yes' if self.actor_trains else 'no'}; "
                f"lambda_critic {self.lambda_critic}; sampler logprobs: {'yes' if self.sampler_logprobs else 'no'}")


    @property
    def critic_starts_at_sampling(self) -> bool:
        """The critic's step begins once the rollout is scored; with the KL penalty in the reward it
        waits for the reference pass (its targets are computed from the penalised rewards)."""
        return not self.kl_in_reward

    @property
    def reference_pass(self) -> bool:
        """The reference policy's logprobs are needed before the updates."""
        return self.kl_in_reward or self.kl_in_loss

    @property
    def kl_where(self) -> str:
        return "in the reward" if self.kl_in_reward else "in the actor's loss" if self.kl_in_loss else "off"


def one_optimizer_step(optim: UpdateConfig) -> bool:
    """One epoch of one mini-batch: the update's forward runs on the weights of before the step."""
    return optim.ppo_epochs == 1 and optim.ppo_mini_batches == 1


def wants_sampler_logprobs(cfg: Config, device) -> bool:
    """Whether a training step asks vLLM for the sampled tokens' logprobs (``rollout.sampler_logprobs``).
    null (auto): when a config key uses them, or when the sampler runs in bf16 / fp16
    (``model.dtype``), where sampler and trainer differ enough for the mismatch/* metrics to
    matter; in fp32 they agree to ~1e-7 and the metrics are not worth the share of a CPU rollout
    that vLLM's per-token logprob output costs (docs/performance.md)."""
    if cfg.rollout.sampler_logprobs is not None:
        return cfg.rollout.sampler_logprobs
    if cfg.rollout.top_p < 1.0:  # nucleus logprobs vs full-softmax ones: the metrics would show the truncation
        return False
    if logprob_users(cfg):
        return True
    import torch  # here, not at import: the capacity planner reads the plans without torch

    from vcppo.engines.engine_setup import resolve_dtype
    return resolve_dtype(cfg.model.dtype, device) != torch.float32


def _v_old(cfg: Config, lambda_critic: float, overlap: bool = False) -> Source:
    """``overlap``: the critic's update should run beside the actor's (critic ranks)."""
    if not uses_critic(cfg.algorithm.advantage_estimator):
        return Source.NONE  # a critic-free estimator (GRPO, RLOO, REINFORCE++)
    if one_optimizer_step(cfg.critic) and lambda_critic == 1.0 and not overlap:
        return Source.UPDATE
    return Source.PASS


def ppo_plan(cfg: Config, device=None, placement: Placement | None = None) -> StepPlan:
    """The PPO phase's plan (every preset and estimator) on ``device`` (a torch.device). ``device``
    None: the passes only (what `vcppo plan` counts), ``sampler_logprobs`` left False (it needs the
    dtype resolved on a device). ``placement``: the run's (None: built from ``cfg``)."""
    kl_on = cfg.algorithm.kl_coef > 0
    kl_in_reward = kl_on and cfg.algorithm.kl_in == "reward"
    one_step = one_optimizer_step(cfg.actor)
    if POLICY_LOSSES[cfg.algorithm.policy_loss].sampler_ratio:
        pi_old = Source.SAMPLER  # DIS: the ratio is against the sampler itself, never a pass
    elif one_step and not kl_in_reward:
        pi_old = Source.UPDATE
    elif cfg.algorithm.old_logprobs_from_sampler:
        pi_old = Source.SAMPLER  # the TIS weights are then 1
    else:
        pi_old = Source.PASS
    if pi_old is Source.PASS:
        entropy = Source.PASS
    else:
        entropy = Source.UPDATE if one_step else Source.NONE
    remote = (placement or Placement.of(cfg)).critic_apart
    v_old = _v_old(cfg, cfg.algorithm.lambda_critic, overlap=remote)
    return StepPlan(phase=Phase.PPO, pi_old=pi_old, v_old=v_old, entropy=entropy,
                    critic_first=v_old is Source.UPDATE, kl_in_reward=kl_in_reward,
                    kl_in_loss=kl_on and cfg.algorithm.kl_in == "loss", actor_trains=True,
                    lambda_critic=cfg.algorithm.lambda_critic,
                    sampler_logprobs=device is not None and wants_sampler_logprobs(cfg, device), critic_remote=remote)


def pretrain_plan(cfg: Config, device=None, placement: Placement | None = None) -> StepPlan:
    """Value pretraining's plan: the PPO step with the actor frozen and Monte-Carlo targets."""
    lam = cfg.value_pretrain.lambda_critic
    v_old = _v_old(cfg, lam)
    return StepPlan(phase=Phase.VALUE_PRETRAIN, pi_old=Source.NONE, v_old=v_old, entropy=Source.NONE,
                    critic_first=v_old is Source.UPDATE, kl_in_reward=False, kl_in_loss=False,
                    actor_trains=False, lambda_critic=lam,
                    sampler_logprobs=device is not None and wants_sampler_logprobs(cfg, device),
                    critic_remote=(placement or Placement.of(cfg)).critic_apart)
