"""The batch that flows from the sampler through the engines to the losses: :class:`Experience`.

Notation: B samples, P = longest prompt, R = longest response, L = P + R. Prompts are LEFT-padded
to P and responses RIGHT-padded to R (verl's layout), so response token t (0-based) sits at column
P + t and is predicted by the logits at column P + t - 1: response logprobs / values are read at
columns P-1 .. P+R-2.

The layout fields always exist; the rollout fields exist once the batch was sampled and scored
(:func:`vcppo.driver.sampling.collect_experience`); the PPO step fills the rest in order
(old logprobs -> reference KL -> values -> advantages). A field that a phase does not compute
stays ``None`` (value pretraining has no ``old_logprobs``, GRPO no ``old_values``).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

import torch

Tensor = torch.Tensor


@dataclass
class Experience:
    """One step's samples on this rank.

    Layout (:func:`make_experience`):
        input_ids        (B, L) long   prompt left-padded to P, then response right-padded to R
        attention_mask   (B, L) long   1 on real tokens
        position_ids     (B, L) long   cumsum(attention_mask) - 1, clamped at 0 (as vLLM saw them)
        responses        (B, R) long   response tokens (pad id after the end)
        response_mask    (B, R) float  1 on response tokens
        prompt_len       int           P
    Rollout (sampled and scored):
        scores           (B,)   float  verifier reward of the whole response
        token_rewards    (B, R) float  the score on the last response token, 0 elsewhere
        sampler_logprobs (B, R) float  vLLM's logprob of each sampled token (mismatch metric)
        group            (B,)   long   global index of the prompt (GRPO groups, pass@k)
        correct          (B,)   float  1.0 where the answer verified
        truncated        (B,)   float  1.0 where the response hit max_response_tokens
    Added by the PPO step:
        old_logprobs     (B, R) float  the actor's logprobs before the update (pi_old)
        entropy          (B, R) float  the actor's per-token entropy before the update
        kl               (B, R) float  per-token KL estimate against the reference policy
        old_values       (B, R) float  V(s_t) of the critic before the update
        lambda_actor     (B,)   float  per-sequence lambda_actor (VAPO's length-adaptive lambda)
        returns          (B, R) float  value targets (GAE with lambda_critic)
        raw_advantages   (B, R) float  advantages before whitening (diagnostics)
        advantages       (B, R) float  the actor's advantages as the loss uses them
    Every tensor is zero at padded response positions.
    """
    input_ids: Tensor
    attention_mask: Tensor
    position_ids: Tensor
    responses: Tensor
    response_mask: Tensor
    prompt_len: int
    scores: Optional[Tensor] = None
    token_rewards: Optional[Tensor] = None
    sampler_logprobs: Optional[Tensor] = None
    group: Optional[Tensor] = None
    correct: Optional[Tensor] = None
    truncated: Optional[Tensor] = None
    old_logprobs: Optional[Tensor] = None
    entropy: Optional[Tensor] = None
    kl: Optional[Tensor] = None
    old_values: Optional[Tensor] = None
    lambda_actor: Optional[Tensor] = None
    returns: Optional[Tensor] = None
    raw_advantages: Optional[Tensor] = None
    advantages: Optional[Tensor] = None

    @property
    def size(self) -> int:
        """B."""
        return int(self.input_ids.shape[0])

    def _map(self, fn) -> "Experience":
        """A copy with ``fn`` applied to every per-sample tensor."""
        return dataclasses.replace(self, **{f.name: fn(v) for f in dataclasses.fields(self)
                                            if isinstance(v := getattr(self, f.name), Tensor)})

    def select(self, idx: slice | Tensor | list[int]) -> "Experience":
        """Rows ``idx`` (a slice, index list or index tensor) of every per-sample tensor."""
        if isinstance(idx, slice):
            return self._map(lambda t: t[idx])
        idx_t = torch.as_tensor(idx, dtype=torch.long)
        return self._map(lambda t: t[idx_t.to(t.device)])

    def to(self, device: torch.device | str) -> "Experience":
        return self._map(lambda t: t.to(device))

    def split(self, n_chunks: int) -> list["Experience"]:
        """Contiguous chunks of (nearly) equal size, in order (the first ones take the remainder)."""
        B = self.size
        n_chunks = max(1, min(int(n_chunks), B))
        sizes = [B // n_chunks + (1 if i < B % n_chunks else 0) for i in range(n_chunks)]
        starts = [sum(sizes[:i]) for i in range(n_chunks)]
        return [self.select(slice(s, s + n)) for s, n in zip(starts, sizes)]

    def micro_batches(self, micro_batch_size: int | None) -> list["Experience"]:
        """Chunks of at most ``micro_batch_size`` rows (one chunk when None)."""
        B = self.size
        if not micro_batch_size or micro_batch_size >= B:
            return [self]
        return [self.select(slice(s, s + micro_batch_size)) for s in range(0, B, micro_batch_size)]


def make_experience(prompt_ids: list[list[int]], response_ids: list[list[int]], pad_id: int,
                    device: torch.device | str = "cpu") -> Experience:
    """The padded layout of ``B`` (prompt, response) token lists; rollout fields left unset."""
    if len(prompt_ids) != len(response_ids):
        raise ValueError(f"{len(prompt_ids)} prompts but {len(response_ids)} responses")
    if not prompt_ids:
        raise ValueError("empty batch")
    if any(len(p) == 0 for p in prompt_ids):
        raise ValueError("empty prompt: the first response token needs at least one prompt token")
    B = len(prompt_ids)
    P = max(len(p) for p in prompt_ids)
    R = max(1, max(len(r) for r in response_ids))
    input_ids = torch.full((B, P + R), pad_id, dtype=torch.long)
    attn = torch.zeros((B, P + R), dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompt_ids, response_ids)):
        input_ids[i, P - len(p):P] = torch.as_tensor(p, dtype=torch.long)
        attn[i, P - len(p):P] = 1
        if r:
            input_ids[i, P:P + len(r)] = torch.as_tensor(r, dtype=torch.long)
            attn[i, P:P + len(r)] = 1
    position_ids = (attn.cumsum(-1) - 1).clamp(min=0)
    return Experience(input_ids=input_ids.to(device), attention_mask=attn.to(device),
                      position_ids=position_ids.to(device), responses=input_ids[:, P:].clone().to(device),
                      response_mask=attn[:, P:].to(torch.float32).to(device), prompt_len=P)
