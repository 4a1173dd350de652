"""DAPO's batch-level techniques (arXiv 2503.14476) as the driver applies them to a step's batch:
dynamic sampling (sec. 3.2) and the soft overlong punishment (sec. 3.4). The math is in
:mod:`vcppo.algos.dapo`; overlong filtering (truncated samples out of the policy loss) is a loss
mask, applied in :class:`vcppo.driver.update.PolicyLoss`.

Dynamic sampling, SPMD: every rank runs the same rounds. In a round each rank samples its usual
share of ``trainer.prompts_per_step`` fresh prompts (:meth:`RunContext.sample_step`; a prompt's
samples never straddle ranks, so a rank can judge its own groups) and keeps the groups whose
rewards differ. Rounds continue while ANY rank has fewer kept groups than its share of the first
round (an all-reduced decision, so all ranks make the same number of rounds, read the same prompt
stream and enter the same collectives), up to ``trainer.dynamic_sampling_max_tries``. Each rank
then keeps its first ``share`` informative groups, topped up with dropped groups if the rounds ran
out: every rank ends with as many groups as its own prompt share. With ``trainer.balance_batch``
the final batch is then balanced across ranks once (whole groups move by real tokens).
"""
from __future__ import annotations

import torch

from vcppo.algos.dapo import informative_groups, overlong_penalty
from vcppo.driver.context import RunContext
from vcppo.driver.sampling import balance_across_ranks
from vcppo.engines import dist as D
from vcppo.experience import Experience, compact, concat_experiences
from vcppo.schema import Config


def num_groups(batch: Experience) -> int:
    return int(torch.unique(batch.group).numel())


def first_groups(batch: Experience, k: int) -> Experience | None:
    """The samples of the ``k`` groups with the smallest ids (= the earliest sampled); None if k = 0."""
    if k <= 0 or batch.size == 0:
        return None
    _, rank_of = torch.unique(batch.group, return_inverse=True)  # sorted ids: 0 = smallest
    return batch.select((rank_of < k).nonzero().flatten())


def sample_batch(ctx: RunContext, phase: str, step: int) -> tuple[Experience, dict]:
    """The step's scored batch on this rank, and its sampling metrics: DAPO dynamic sampling in the
    PPO phase when ``trainer.dynamic_sampling`` is on, then the soft overlong punishment when
    ``reward.overlong_buffer_tokens`` > 0 (both phases: the critic learns the reward PPO optimises)."""
    metrics: dict = {}
    if phase == "ppo" and ctx.cfg.trainer.dynamic_sampling:
        batch, metrics = dynamic_sample(ctx, phase, step)
    else:
        batch = ctx.sample_step(phase, step)
    metrics.update(apply_overlong_penalty(batch, ctx.cfg))
    return batch, metrics


def dynamic_sample(ctx: RunContext, phase: str, step: int) -> tuple[Experience, dict]:
    """DAPO dynamic sampling (sec. 3.2), see the module docstring."""
    tr = ctx.cfg.trainer
    kept, spare = [], []
    n_kept, share, tries = 0, None, 0
    while True:
        # Round 0 is exactly the batch the step samples without dynamic sampling (same seed).
        batch = ctx.sample_step(phase if tries == 0 else f"{phase}/retry{tries}", step, balance=False)
        # Group ids are the prompt's index within its round (< prompts_per_step): keep them unique.
        batch.group = batch.group + tries * tr.prompts_per_step
        share = num_groups(batch) if share is None else share
        informative = informative_groups(batch.scores, batch.group)
        if bool(informative.any()):
            kept.append(batch.select(informative.nonzero().flatten()))
            n_kept += num_groups(kept[-1])
        if not bool(informative.all()):
            spare.append(batch.select((~informative).nonzero().flatten()))
        tries += 1
        short = torch.tensor([float(max(share - n_kept, 0))], device=D.comm_device())
        if float(D.all_reduce_max(short).item()) == 0.0 or tries >= tr.dynamic_sampling_max_tries:
            break
    parts = [first_groups(concat_experiences(kept), share) if kept else None]
    missing = max(share - n_kept, 0)
    if missing:
        parts.append(first_groups(concat_experiences(spare), missing))
    out = compact(concat_experiences([p for p in parts if p is not None]))
    if tr.balance_batch:  # once, on the final batch (each round's own balance would be undone)
        out = balance_across_ranks(out, ctx.dist)
    dropped = sum(num_groups(b) for b in spare)
    return out, {"dynamic_sampling/tries": float(tries),
                 "dynamic_sampling/dropped_groups": D.global_sum(dropped),
                 "dynamic_sampling/sampled_groups": D.global_sum(dropped + n_kept),
                 "dynamic_sampling/filled_groups": D.global_sum(missing)}


def apply_overlong_penalty(batch: Experience, cfg: Config) -> dict:
    """Add DAPO's soft overlong punishment to ``batch.scores`` and to the reward on the last token
    (in place); its metrics. No-op when ``reward.overlong_buffer_tokens`` is 0."""
    buffer = cfg.reward.overlong_buffer_tokens
    if not buffer:
        return {}
    lengths = batch.response_mask.sum(1)
    penalty = overlong_penalty(lengths, cfg.rollout.max_response_tokens, buffer, cfg.reward.overlong_penalty)
    batch.scores = batch.scores + penalty
    rows = torch.arange(batch.size, device=lengths.device)
    batch.token_rewards = batch.token_rewards.clone()
    batch.token_rewards[rows, (lengths.long() - 1).clamp(min=0)] += penalty
    n = D.global_sum(float(batch.size))
    return {"reward/overlong_penalty_mean": D.global_sum(penalty.sum()) / max(n, 1.0),
            "reward/overlong_penalised_frac": D.global_sum((penalty < 0).sum()) / max(n, 1.0)}
