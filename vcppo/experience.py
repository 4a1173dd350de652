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


LAYOUT_FIELDS = ("input_ids", "attention_mask", "position_ids")  # (B, L) = (B, P + R)


def _pad_value(batch: Experience) -> int:
    """The pad id a batch was laid out with (0 when it has no pad position at all)."""
    pads = batch.input_ids[batch.attention_mask == 0]
    return int(pads[0]) if pads.numel() else 0


def _relayout(batch: Experience, P: int, R: int, pad_id: int) -> Experience:
    """``batch`` re-padded to prompt width ``P`` and response width ``R``: columns are added on the
    left of the prompt / the right of the response, or dropped there when narrower (the caller
    only drops all-pad columns: :func:`compact`), so every real token keeps its position id."""
    p0, r0 = batch.prompt_len, batch.responses.shape[1]
    dp, dr = P - p0, R - r0

    def fit(t: Tensor, left: int, right: int, fill) -> Tensor:
        if left < 0:
            t = t[:, -left:]
        if right < 0:
            t = t[:, :t.shape[1] + right]
        pad = (max(left, 0), max(right, 0))
        if pad == (0, 0):
            return t
        shape = (t.shape[0], pad[0] + t.shape[1] + pad[1])
        out = torch.full(shape, fill, dtype=t.dtype, device=t.device)
        out[:, pad[0]:pad[0] + t.shape[1]] = t
        return out

    changes: dict = {}
    for f in dataclasses.fields(batch):
        v = getattr(batch, f.name)
        if not isinstance(v, Tensor) or v.dim() != 2:
            continue
        if f.name in LAYOUT_FIELDS:
            changes[f.name] = fit(v, dp, dr, pad_id if f.name == "input_ids" else 0)
        else:  # (B, R) response-aligned
            changes[f.name] = fit(v, 0, dr, pad_id if f.name == "responses" else 0)
    attn = changes["attention_mask"]
    changes["position_ids"] = (attn.cumsum(-1) - 1).clamp(min=0)
    return dataclasses.replace(batch, prompt_len=P, **changes)


def compact(batch: Experience) -> Experience:
    """``batch`` without the prompt columns that are padding in every row and the response columns
    masked in every row (a row subset of a wide batch keeps the batch's width otherwise)."""
    prompt_real = batch.attention_mask[:, :batch.prompt_len].sum(0) > 0
    P = batch.prompt_len - int(prompt_real.long().argmax()) if bool(prompt_real.any()) else 1
    real_cols = (batch.response_mask.sum(0) > 0).nonzero()
    R = int(real_cols.max()) + 1 if real_cols.numel() else 1
    return _relayout(batch, P, R, _pad_value(batch))


def concat_experiences(batches: list[Experience], pad_id: int | None = None) -> Experience:
    """The rows of several batches (any prompt / response widths) in one batch, in order.

    Every field set in one batch must be set in all. ``pad_id`` defaults to the pad id found in
    the batches (0 if none has a pad position).
    """
    if not batches:
        raise ValueError("concat_experiences: no batches")
    names = [f.name for f in dataclasses.fields(Experience)]
    for f in names:
        set_in = [getattr(b, f) is not None for b in batches]
        if any(set_in) and not all(set_in):
            raise ValueError(f"concat_experiences: field {f!r} is set in some batches but not in others")
    if len(batches) == 1:
        return batches[0]
    if pad_id is None:
        pad_id = next((_pad_value(b) for b in batches if bool((b.attention_mask == 0).any())), 0)
    P = max(b.prompt_len for b in batches)
    R = max(b.responses.shape[1] for b in batches)
    wide = [_relayout(b, P, R, pad_id) for b in batches]
    return dataclasses.replace(wide[0], **{f: torch.cat([getattr(b, f) for b in wide])
                                            for f in names if isinstance(getattr(wide[0], f), Tensor)})
