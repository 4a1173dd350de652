"""From prompts to a scored, padded batch — the part value pretraining, PPO and evaluation share.

A batch is the dict of :func:`vcppo.engines.batch.make_batch` (prompts left-padded to P,
responses right-padded to R) plus, per sample::

    scores            (B,)    verifier reward of the whole response
    token_rewards     (B, R)  the score placed on the last response token, 0 elsewhere (outcome reward)
    sampler_logprobs  (B, R)  vLLM's logprob of each sampled token (for the mismatch metric)
    group             (B,)    global index of the prompt (GRPO groups; pass@k)
    correct           (B,)    1.0 where the answer verified
    truncated         (B,)    1.0 where the response hit max_response_tokens
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import torch

from vcppo.engines.batch import make_batch


@dataclass
class PhaseTimer:
    """Wall time per named phase of a step; ``with timer("rollout"): ...``."""
    seconds: dict = field(default_factory=dict)

    @contextlib.contextmanager
    def __call__(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def metrics(self) -> dict:
        out = {f"time/{k}_s": v for k, v in self.seconds.items()}
        out["time/step_s"] = sum(self.seconds.values())
        return out


def missing_path(args, names: tuple[str, ...]) -> str | None:
    """The first ``--name`` argument whose (given) path does not exist, as an error message."""
    import os
    for name in names:
        path = getattr(args, name)
        if path and not os.path.exists(path):
            return f"--{name.replace('_', '-')} path does not exist: {path}"
    return None


def verifier_scorer(reward_scorer):
    """Adapt a :class:`vcppo.rewards.verifier.RewardScorer` to ``(texts, truths, finish_reasons)
    -> (scores, correct flags)``; a sample is correct when it earned the configured correct score."""
    def score(texts, truths, finish_reasons):
        scores, _ = reward_scorer(texts, truths, finish_reasons)
        return scores, [s == reward_scorer.correct for s in scores]
    return score


def rank_slice(items: list, rank: int, world_size: int) -> tuple[int, list]:
    """The contiguous share of ``items`` that ``rank`` works on, and its offset. Whole prompts stay
    on one rank so a prompt's group of samples never straddles ranks."""
    per = -(-len(items) // world_size)
    start = min(rank * per, len(items))
    return start, items[start:start + per]


def collect_experience(rows: list[dict], first_index: int, *, rollout, scorer, pad_id: int,
                       device: torch.device, n: int, temperature: float, top_p: float,
                       max_tokens: int, stop: list[str] | None, seed: int) -> dict:
    """Sample ``n`` responses per prompt row (``{"prompt_ids", "answer"}``), score them, pad them.

    ``first_index`` is the global index of ``rows[0]`` (for GRPO groups and pass@k).
    """
    samples = rollout.generate([r["prompt_ids"] for r in rows], n=n, temperature=temperature,
                               top_p=top_p, max_tokens=max_tokens, stop=stop, seed=seed)
    truths = [rows[s.prompt_index]["answer"] for s in samples]
    finish = [s.finish_reason for s in samples]
    scores, correct = scorer([s.text for s in samples], truths, finish)

    batch = make_batch([s.prompt_ids for s in samples], [s.response_ids for s in samples],
                       pad_id=pad_id, device=device)
    B, R = batch["responses"].shape
    lengths = batch["response_mask"].sum(dim=1).long()
    scores_t = torch.tensor(scores, dtype=torch.float32, device=device)
    token_rewards = torch.zeros(B, R, dtype=torch.float32, device=device)
    # Outcome reward on the last generated token (the paper's setting: +1 / -1 at <eos>).
    token_rewards[torch.arange(B, device=device), (lengths - 1).clamp(min=0)] = scores_t
    sampler_lp = torch.zeros(B, R, dtype=torch.float32, device=device)
    for i, s in enumerate(samples):
        if s.logprobs:
            sampler_lp[i, :len(s.logprobs)] = torch.tensor(s.logprobs, dtype=torch.float32)
    batch.update(
        scores=scores_t,
        token_rewards=token_rewards,
        sampler_logprobs=sampler_lp,
        group=torch.tensor([first_index + s.prompt_index for s in samples], device=device),
        correct=torch.tensor(correct, dtype=torch.float32, device=device),
        truncated=torch.tensor([f == "length" for f in finish], dtype=torch.float32, device=device),
    )
    return batch
