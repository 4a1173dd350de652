"""Making a step's experience: prompts -> vLLM samples -> scored :class:`~vcppo.experience.Rollout`.

:class:`ExperienceMaker` owns everything between the prompt stream and a scored batch: the
sampling seeds, this rank's share of the prompts, DAPO's dynamic sampling (arXiv 2503.14476,
sec. 3.2), and balancing tokens across ranks. The math is in :mod:`vcppo.algos.dapo`; the soft
overlong punishment is a term of the reward assembly (:mod:`vcppo.driver.step.reward_terms`), overlong
*filtering* a loss mask (:class:`vcppo.driver.step.update.PolicyLoss`).

Dynamic sampling, SPMD: every rank runs the same rounds. In a round each rank samples its usual
share of ``trainer.prompts_per_step`` fresh prompts (a prompt's samples never straddle ranks, so
a rank can judge its own groups) and keeps the groups whose rewards differ. Rounds continue while
ANY rank has fewer kept groups than its share of the first round (an all-reduced decision, so all
ranks make the same number of rounds, read the same prompt stream and enter the same
collectives), up to ``trainer.dynamic_sampling_max_tries``. Each rank then keeps its first
``share`` informative groups, topped up with dropped groups if the rounds ran out: every rank ends
with as many groups as its own prompt share. With ``trainer.balance_batch`` the final batch is
then balanced across ranks once (whole groups move by real tokens).
"""
from __future__ import annotations

import dataclasses
import hashlib

import torch

from vcppo.algos.dapo import informative_groups
from vcppo.data.dataset import PromptStream
from vcppo.driver.durability.guards import reward_tally, step_reward_failures
from vcppo.driver.state import Phase, seed_key
from vcppo.driver.step.sampler import balance_across_ranks, make_sampler, rollout_share
from vcppo.runtime import collectives
from vcppo.runtime.dist import DistInfo
from vcppo.engines.rollout import RolloutEngine
from vcppo.experience import Rollout, compact, concat_batches
from vcppo.rewards.verifier import RewardScorer
from vcppo.config.schema import Config


def sample_seed(seed: int, key: str, step: int, replica: int) -> int:
    """Sampling seed of one step of a phase on one rollout group: reproducible (resume gives the
    same samples), different across phases (``key``: :func:`~vcppo.driver.state.seed_key`),
    steps and rollout groups."""
    text = f"{seed}/{key}/{step}/{replica}".encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:4], "little")


def num_groups(batch: Rollout) -> int:
    return int(torch.unique(batch.group).numel())


def first_groups(batch: Rollout, k: int) -> Rollout | None:
    """The samples of the ``k`` groups with the smallest ids (= the earliest sampled); None if k = 0."""
    if k <= 0 or batch.size == 0:
        return None
    _, rank_of = torch.unique(batch.group, return_inverse=True)  # sorted ids: 0 = smallest
    return batch.select((rank_of < k).nonzero().flatten())


class ExperienceMaker:
    """This rank's scored samples of each step (SPMD: every rank calls :meth:`make` in step).

    ``logprobs``: ask vLLM for the sampled tokens' logprobs (the step plan's ``sampler_logprobs``).
    ``sampler``: how a sample is made, a single response or a multi-turn episode
    (:func:`~vcppo.driver.step.sampler.make_sampler`, chosen here once for the run).
    """

    def __init__(self, cfg: Config, dist: DistInfo, prompts: PromptStream, rollout: RolloutEngine,
                 scorer: RewardScorer, pad_id: int, logprobs: bool):
        self.cfg, self.dist, self.prompts = cfg, dist, prompts
        self.rollout, self.scorer, self.pad_id, self.logprobs = rollout, scorer, pad_id, logprobs
        self.sampler = make_sampler(cfg, rollout, scorer, pad_id=pad_id, device=dist.device, logprobs=logprobs)

    def seed(self, phase: str, step: int) -> int:
        return sample_seed(self.cfg.trainer.seed, seed_key(phase), step, self.rollout.replica)

    def make(self, phase: Phase, step: int) -> tuple[Rollout, dict]:
        """The step's batch on this rank, scored by the rule (the rest of the reward is the reward
        assembly's: :mod:`vcppo.driver.step.reward_terms`), and its sampling metrics: dynamic sampling in
        the PPO phase when ``trainer.dynamic_sampling`` is on."""
        tally = reward_tally(self.scorer)
        metrics: dict = {}
        self.sampler.begin_step()
        if phase == Phase.PPO and self.cfg.trainer.dynamic_sampling:
            batch, metrics = self.dynamic_sample(phase, step)
        else:
            batch = self.sample_round(phase, step)
        where = f"{'PPO' if phase == Phase.PPO else 'value-pretraining'} step {step}"
        metrics.update(self.sampler.step_metrics(where, self.dist.rank))
        metrics.update(step_reward_failures(self.scorer, tally))
        metrics["reward/failures_total"] = collectives.global_sum(self.scorer.num_failures)
        metrics["reward/timeouts_total"] = collectives.global_sum(self.scorer.num_timeouts)  # stuck samples (reward pool)
        return batch, metrics

    def sample_round(self, phase: str, step: int, balance: bool = True) -> Rollout:
        """The next ``trainer.prompts_per_step`` prompts (this rank's share), sampled and scored
        (``phase``: the phase, or a dynamic-sampling retry's key, ``ppo/retry1``);
        with ``balance`` (and ``trainer.balance_batch``) whole groups then move between ranks to
        even out their tokens."""
        rows = self.prompts.next_batch(self.cfg.trainer.prompts_per_step)
        sampled, kept = rollout_share(len(rows), self.dist, self.cfg.rollout.tensor_parallel_size)
        batch = self.sampler.sample(rows[sampled.start:sampled.stop], sampled.start, kept, self.seed(phase, step),
                                    seed_key(phase))
        return balance_across_ranks(batch, self.dist) if balance and self.cfg.trainer.balance_batch else batch

    def dynamic_sample(self, phase: Phase, step: int) -> tuple[Rollout, dict]:
        """DAPO dynamic sampling (sec. 3.2), see the module docstring."""
        tr = self.cfg.trainer
        kept, spare = [], []
        n_kept, share, tries = 0, None, 0
        while True:
            # Round 0 is exactly the batch the step samples without dynamic sampling (same seed).
            batch = self.sample_round(phase if tries == 0 else f"{phase}/retry{tries}", step, balance=False)
            # Group ids are the prompt's index within its round (< prompts_per_step): keep them unique.
            batch = dataclasses.replace(batch, group=batch.group + tries * tr.prompts_per_step)
            share = num_groups(batch) if share is None else share
            informative = informative_groups(batch.scores, batch.group)
            if bool(informative.any()):
                kept.append(batch.select(informative.nonzero().flatten()))
                n_kept += num_groups(kept[-1])
            if not bool(informative.all()):
                spare.append(batch.select((~informative).nonzero().flatten()))
            tries += 1
            short = torch.tensor([float(max(share - n_kept, 0))], device=collectives.comm_device())
            if float(collectives.all_reduce_max(short).item()) == 0.0 or tries >= tr.dynamic_sampling_max_tries:
                break
        parts = [first_groups(concat_batches(kept), share) if kept else None]
        missing = max(share - n_kept, 0)
        if missing:
            parts.append(first_groups(concat_batches(spare), missing))
        out = compact(concat_batches([p for p in parts if p is not None]))
        if tr.balance_batch:  # once, on the final batch (each round's own balance would be undone)
            out = balance_across_ranks(out, self.dist)
        dropped = sum(num_groups(b) for b in spare)
        return out, {"dynamic_sampling/tries": float(tries),
                     "dynamic_sampling/dropped_groups": collectives.global_sum(dropped),
                     "dynamic_sampling/sampled_groups": collectives.global_sum(dropped + n_kept),
                     "dynamic_sampling/filled_groups": collectives.global_sum(missing)}
