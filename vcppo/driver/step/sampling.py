"""From prompts to a scored :class:`~vcppo.experience.Rollout`: the part value pretraining, PPO,
the reward model and evaluation share."""
from __future__ import annotations

import torch

from vcppo.engines.dist import DistInfo

from vcppo.engines.collectives import all_gather_object
from vcppo.engines.packing import balanced_partitions, sequence_lengths
from vcppo.engines.rollout import RolloutEngine, sampled_logprobs_layout
from vcppo.engines.rollout_groups import RolloutGroups, contiguous_share
from vcppo.experience import Rollout, compact, concat_batches, last_token_rewards, make_layout
from vcppo.rewards.routing import data_source_of
from vcppo.rewards.verifier import RewardScorer
from vcppo.config.schema import RolloutConfig


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
    token_rewards = last_token_rewards(score_t, layout.response_mask)
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
