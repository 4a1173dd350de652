"""From prompts to a scored :class:`~vcppo.experience.Experience`: the part value pretraining, PPO,
the reward model and evaluation share."""
from __future__ import annotations

import torch

from vcppo.engines.rollout import RolloutEngine
from vcppo.experience import Experience, make_experience
from vcppo.rewards.verifier import RewardScorer
from vcppo.schema import RolloutConfig


def rank_slice(items: list, rank: int, world_size: int) -> tuple[int, list]:
    """The contiguous share of ``items`` that ``rank`` works on, and its offset. Whole prompts stay
    on one rank so a prompt's group of samples never straddles ranks."""
    per = -(-len(items) // world_size)
    start = min(rank * per, len(items))
    return start, items[start:start + per]


def collect_experience(rows: list[dict], first_index: int, *, rollout: RolloutEngine, scorer: RewardScorer,
                       pad_id: int, device: torch.device, sampling: RolloutConfig, seed: int,
                       n: int | None = None) -> Experience:
    """Sample ``n`` (default ``sampling.n_samples_per_prompt``) responses per prompt row
    (``{"prompt_ids", "answer"}``), score them, and lay them out with the rollout fields set.

    ``first_index`` is the global index of ``rows[0]`` (for GRPO groups and pass@k).
    """
    samples = rollout.generate([r["prompt_ids"] for r in rows], n=n or sampling.n_samples_per_prompt,
                               temperature=sampling.temperature, top_p=sampling.top_p,
                               max_tokens=sampling.max_response_tokens, stop=sampling.stop or None, seed=seed)
    finish = [s.finish_reason for s in samples]
    scores, correct = scorer.judge([s.text for s in samples], [rows[s.prompt_index]["answer"] for s in samples],
                                   finish)

    batch = make_experience([s.prompt_ids for s in samples], [s.response_ids for s in samples],
                            pad_id=pad_id, device=device)
    B, R = batch.responses.shape
    lengths = batch.response_mask.sum(dim=1).long()
    batch.scores = torch.tensor(scores, dtype=torch.float32, device=device)
    # Outcome reward on the last generated token (the paper's setting: +1 / -1 at <eos>).
    batch.token_rewards = torch.zeros(B, R, dtype=torch.float32, device=device)
    batch.token_rewards[torch.arange(B, device=device), (lengths - 1).clamp(min=0)] = batch.scores
    batch.sampler_logprobs = torch.zeros(B, R, dtype=torch.float32, device=device)
    for i, s in enumerate(samples):
        if s.logprobs:
            batch.sampler_logprobs[i, :len(s.logprobs)] = torch.tensor(s.logprobs, dtype=torch.float32)
    batch.group = torch.tensor([first_index + s.prompt_index for s in samples], device=device)
    batch.correct = torch.tensor(correct, dtype=torch.float32, device=device)
    batch.truncated = torch.tensor([f == "length" for f in finish], dtype=torch.float32, device=device)
    return batch
