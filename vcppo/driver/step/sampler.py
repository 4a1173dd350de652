"""From prompts to a scored :class:`~vcppo.experience.Rollout`: the part value pretraining, PPO,
the reward model and evaluation share.

A run makes its samples one way, chosen once (:func:`make_sampler`): a :class:`Sampler` is either
:class:`SingleTurnSampler` (one response per sample, scored by the reward rule) or
:class:`EpisodeSampler` (a multi-turn episode with ``rollout.env``, :mod:`vcppo.driver.step.multi_turn`).
Everything that differs between the two (how a step's rows become a rollout, the step's sampling
figures, a validation sample, the per-turn metrics of a batch) is a method of the sampler, so the
step, its metrics and validation hold no branch on the kind.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch

from vcppo.algos import stats
from vcppo.driver.step.env_errors import step_summary
from vcppo.driver.step.multi_turn import (EpisodeRunner, episode_metrics, episode_runner, episodes_rollout,
                                        summed_episode_metrics)
from vcppo.runtime.dist import DistInfo
from vcppo.runtime.collectives import all_gather_object
from vcppo.engines.packing import balanced_partitions, sequence_lengths
from vcppo.engines.rollout import RolloutEngine, sampled_logprobs_layout
from vcppo.engines.rollout_groups import RolloutGroups, contiguous_share
from vcppo.experience import Rollout, compact, concat_batches, last_token_rewards, make_layout
from vcppo.rewards.routing import data_source_of
from vcppo.rewards.verifier import RewardScorer
from vcppo.config.schema import Config, RolloutConfig

logger = logging.getLogger(__name__)


def rank_slice(items: list, rank: int, world_size: int) -> tuple[int, list]:
    """The contiguous share of ``items`` that ``rank`` works on, and its offset. Whole prompts stay
    on one rank so a prompt's group of samples never straddles ranks."""
    share = contiguous_share(len(items), rank, world_size)
    return share.start, items[share.start:share.stop]


def rollout_share(n_rows: int, dist: DistInfo, tp_size: int) -> tuple[range, range]:
    """(global rows this rank's rollout group samples, the part of them this rank keeps, as indices
    into the group's rows). With tp_size 1 the group is the rank and it keeps everything."""
    groups = RolloutGroups(dist.world_size, tp_size)
    sampled = groups.group_prompts(n_rows, groups.group_of(dist.rank))
    kept = groups.train_prompts(n_rows, dist.rank)
    return sampled, range(kept.start - sampled.start, kept.stop - sampled.start)


def collect_rollout(rows: list[dict], first_index: int, *, rollout: RolloutEngine, scorer: RewardScorer,
                    pad_id: int, device: torch.device, sampling: RolloutConfig, seed: int,
                    n: int | None = None, keep: range | None = None, logprobs: bool = False) -> Rollout:
    """Sample ``n`` (default ``sampling.n_samples_per_prompt``) responses per prompt row
    (``{"prompt_ids", "answer"}``), score them, and lay them out.

    ``first_index`` is the global index of ``rows[0]`` (for GRPO groups and pass@k). ``keep``: the
    rows (indices into ``rows``) whose samples this rank keeps; the others were sampled only
    because a tensor-parallel group submits identical requests (:func:`rollout_share`).
    ``logprobs``: fill ``sampler_logprobs`` (the step plan's ``sampler_logprobs``); None otherwise.
    """
    samples = rollout.generate([r["prompt_ids"] for r in rows], n=n or sampling.n_samples_per_prompt,
                               temperature=sampling.temperature, top_p=sampling.top_p,
                               max_tokens=sampling.max_response_tokens, stop=sampling.stop or None, seed=seed,
                               logprobs=logprobs)
    if keep is not None and len(keep) < len(rows):
        samples = [s for s in samples if s.prompt_index in keep]
    finish = [s.finish_reason for s in samples]
    scores, correct = scorer.judge([s.text for s in samples], [rows[s.prompt_index]["answer"] for s in samples],
                                   finish)

    layout = make_layout([s.prompt_ids for s in samples], [s.response_ids for s in samples],
                         pad_id=pad_id, device=device)
    B, R = layout.responses.shape
    score_t = torch.tensor(scores, dtype=torch.float32, device=device)
    token_rewards = last_token_rewards(score_t, layout.policy_mask)
    has_rule = None
    if scorer.functions_by_source:  # which rows a rule of their own scored (reward.combine=model_without_rule)
        sources = [data_source_of(rows[s.prompt_index]["answer"]) for s in samples]
        has_rule = torch.tensor([src in scorer.functions_by_source for src in sources], dtype=torch.float32,
                                device=device)
    sampler_logprobs = sampled_logprobs_layout(samples, R, device) if logprobs else None
    return Rollout(**layout.layout_fields(), scores=score_t, token_rewards=token_rewards,
                   group=torch.tensor([first_index + s.prompt_index for s in samples], device=device),
                   correct=torch.tensor(correct, dtype=torch.float32, device=device),
                   truncated=torch.tensor([f == "length" for f in finish], dtype=torch.float32, device=device),
                   sampler_logprobs=sampler_logprobs, has_rule=has_rule)


def balance_across_ranks(batch: Rollout, dist: DistInfo) -> Rollout:
    """Redistribute whole prompt groups over the ranks so each rank trains on about the same number
    of real tokens (verl's ``balance_batch``): with long, uneven responses one rank would otherwise
    work through the longest sequences while the others wait at every collective.

    Every rank gathers the step's batch (a few tensors of (B, L) per rank, small next to the
    models) and keeps its :func:`share_of_step` of it. One rank: unchanged.
    """
    if dist.world_size == 1:
        return batch
    whole = concat_batches(all_gather_object(batch.to("cpu")))
    return share_of_step(whole, dist, balance=True).to(batch.input_ids.device)


def share_of_step(whole: Rollout, dist: DistInfo, balance: bool) -> Rollout:
    """This rank's share of the step's whole batch, by whole prompt groups: with ``balance`` the
    same :func:`~vcppo.engines.packing.balanced_partitions` of the groups by real tokens on every
    rank, else contiguous groups. Trimmed to its own widest prompt and response. Groups stay whole,
    so GRPO's group statistics and pass@k stay rank-local."""
    if dist.world_size == 1:
        return whole
    groups = whole.group.tolist()
    order = list(dict.fromkeys(groups))  # groups in first-seen (rank, then row) order
    index = {g: i for i, g in enumerate(order)}
    if balance:
        cost = [0.0] * len(order)
        for g, n in zip(groups, sequence_lengths(whole).tolist()):
            cost[index[g]] += n
        mine = set(balanced_partitions(cost, dist.world_size)[dist.rank])
    else:
        mine = set(contiguous_share(len(order), dist.rank, dist.world_size))
    rows = [i for i, g in enumerate(groups) if index[g] in mine]
    if not rows:
        raise RuntimeError(f"rank {dist.rank} got no prompt group to train on: trainer.prompts_per_step "
                           f"({len(order)} groups) must be >= the number of ranks ({dist.world_size})")
    return compact(whole.select(rows))


@dataclass
class Scored:
    """One validation sample: its row (an index into the rank's rows), whether it is correct, its
    length in model tokens, its text, whether a limit cut it, and (an episode) its tool calls
    (None: a single response, which calls no tool)."""
    row: int
    correct: bool
    length: int
    text: str
    truncated: bool
    tool_calls: int | None = None


class Sampler(Protocol):
    """How this run makes a sample (module docstring). ``rollout``: the engine it samples with."""
    kind: ClassVar[str]
    rollout: RolloutEngine

    def begin_step(self) -> None:
        """A step (or validation) begins."""

    def sample(self, rows: list[dict], first_index: int, keep: range, seed: int, key: str) -> Rollout:
        """This rank's scored samples of ``rows`` (``first_index``: the global index of ``rows[0]``;
        ``keep``: the rows whose samples this rank keeps; ``key``: the phase's seed key)."""

    def step_metrics(self, where: str, rank: int) -> dict:
        """The step's sampling figures over every rank (collective); ``where`` names the step."""

    def validation_samples(self, rows: list[dict], keep: range, n: int, temperature: float, top_p: float,
                           seed: int) -> list[Scored]:
        """``n`` samples of each kept row, judged."""

    @staticmethod
    def batch_metrics(cfg: Config, advantages: torch.Tensor, mask: torch.Tensor,
                      values: torch.Tensor | None) -> dict:
        """Metrics of a gathered batch that only this kind of sample has (training side)."""


class SingleTurnSampler:
    """One response per sample, scored by the reward rule (``scorer``)."""
    kind = "single_turn"

    def __init__(self, rollout: RolloutEngine, scorer: RewardScorer, sampling: RolloutConfig, pad_id: int,
                 device, logprobs: bool):
        self.rollout, self.scorer, self.sampling = rollout, scorer, sampling
        self.pad_id, self.device, self.logprobs = pad_id, device, logprobs

    @classmethod
    def build(cls, cfg: Config, rollout: RolloutEngine, scorer: RewardScorer, pad_id: int, device, logprobs: bool,
              max_model_len: int | None) -> "SingleTurnSampler":
        return cls(rollout, scorer, cfg.rollout, pad_id, device, logprobs)

    def begin_step(self) -> None:
        pass

    def sample(self, rows: list[dict], first_index: int, keep: range, seed: int, key: str) -> Rollout:
        return collect_rollout(rows, first_index=first_index, keep=keep, rollout=self.rollout, scorer=self.scorer,
                               pad_id=self.pad_id, device=self.device, sampling=self.sampling, seed=seed,
                               logprobs=self.logprobs)

    def step_metrics(self, where: str, rank: int) -> dict:
        return {}

    def validation_samples(self, rows: list[dict], keep: range, n: int, temperature: float, top_p: float,
                           seed: int) -> list[Scored]:
        s = self.sampling
        out = self.rollout.generate([r["prompt_ids"] for r in rows], n=n, temperature=temperature, top_p=top_p,
                                    max_tokens=s.max_response_tokens, stop=s.stop or None, seed=seed, logprobs=False)
        out = [x for x in out if x.prompt_index in keep]
        ok = self.scorer.judge([x.text for x in out], [rows[x.prompt_index]["answer"] for x in out],
                               [x.finish_reason for x in out])[1]
        return [Scored(x.prompt_index, bool(c), len(x.response_ids), x.text, x.finish_reason == "length")
                for x, c in zip(out, ok)]

    @staticmethod
    def batch_metrics(cfg: Config, advantages: torch.Tensor, mask: torch.Tensor,
                      values: torch.Tensor | None) -> dict:
        return {}


class EpisodeSampler:
    """Multi-turn episodes of ``rollout.env`` (``runner``); the reward is the env's. Their env
    failures count with the reward's (``scorer``'s tally: the same failure budget applies)."""
    kind = "episodes"

    def __init__(self, cfg: Config, runner: EpisodeRunner, scorer: RewardScorer, pad_id: int, device,
                 logprobs: bool):
        self.cfg, self.runner, self.scorer = cfg, runner, scorer
        self.rollout, self.pad_id, self.device, self.logprobs = runner.rollout, pad_id, device, logprobs
        self.figures: dict = {}

    @classmethod
    def build(cls, cfg: Config, rollout: RolloutEngine, scorer: RewardScorer | None, pad_id: int, device,
              logprobs: bool, max_model_len: int | None) -> "EpisodeSampler":
        """Its env in as many worker processes as the scorer has."""
        runner = episode_runner(cfg, rollout, getattr(scorer, "num_workers", 0), max_model_len)
        return cls(cfg, runner, scorer, pad_id, device, logprobs)

    def begin_step(self) -> None:
        self.runner.errors.take_step()  # the step's summary names the step's own first error

    def sample(self, rows: list[dict], first_index: int, keep: range, seed: int, key: str) -> Rollout:
        """The rows' episodes; their figures added to the step's. ``keep`` is every row: a
        tensor-parallel sampler does not run episodes (the config rules refuse it)."""
        start, before = time.perf_counter(), self.runner.env_seconds
        done = self.runner.run(rows, self.cfg.rollout.n_samples_per_prompt, seed, key, self.cfg.rollout.temperature,
                               self.logprobs)
        figures = episode_metrics(done, self.runner.env_seconds - before)
        figures["env/rollout_seconds"] = time.perf_counter() - start
        self.figures = {k: self.figures.get(k, 0.0) + v for k, v in figures.items()}
        self.scorer.num_scored += len(done)
        self.scorer.num_failures += sum(e.failed for e in done)
        return episodes_rollout(done, first_index, self.pad_id, self.device, self.logprobs)

    def step_metrics(self, where: str, rank: int) -> dict:
        """The step's episode figures; a summary line of its env errors in the log (first rank)."""
        metrics = summed_episode_metrics(self.figures)
        self.figures = {}
        line = step_summary(where, self.cfg.rollout.env, metrics, self.runner.errors.take_step())
        if line and rank == 0:  # the first rank that runs episodes (split: rollout rank 0)
            logger.warning(line)
        return metrics

    def validation_samples(self, rows: list[dict], keep: range, n: int, temperature: float, top_p: float,
                           seed: int) -> list[Scored]:
        """Correct where the env says the episode solved the task; the length is its model tokens."""
        done = self.runner.run(rows, n, seed, "val", temperature, logprobs=False)
        return [Scored(e.prompt_index, e.solved, int(sum(e.policy)), self.rollout.tokenizer.decode(e.tokens),
                       e.truncated, e.tool_calls) for e in done if e.prompt_index in keep]

    @staticmethod
    def batch_metrics(cfg: Config, advantages: torch.Tensor, mask: torch.Tensor,
                      values: torch.Tensor | None) -> dict:
        """The advantages (and the critic's values) by turn."""
        turns = cfg.rollout.max_turns
        m = {"env/adv_by_turn": stats.per_turn_means(advantages, mask, turns)}
        if values is not None:
            m["env/value_by_turn"] = stats.per_turn_means(values, mask, turns)
        return m


SAMPLERS: dict[str, type] = {SingleTurnSampler.kind: SingleTurnSampler, EpisodeSampler.kind: EpisodeSampler}


def sampler_kind(cfg: Config) -> str:
    """The run's kind of sample: episodes with ``rollout.env``, else single responses."""
    return EpisodeSampler.kind if cfg.rollout.env else SingleTurnSampler.kind


def make_sampler(cfg: Config, rollout: RolloutEngine, scorer: RewardScorer | None, *, pad_id: int = 0,
                 device="cpu", logprobs: bool = False, max_model_len: int | None = None) -> Sampler:
    """The run's :class:`Sampler`, chosen here once (``max_model_len``: the engine's context, default
    the run's)."""
    return SAMPLERS[sampler_kind(cfg)].build(cfg, rollout, scorer, pad_id, device, logprobs, max_model_len)
