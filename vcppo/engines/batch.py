"""The padded batch layout every engine reads (verl-style).

Notation: B samples, P = longest prompt, R = longest response, L = P + R.

    input_ids      (B, L)  prompt LEFT-padded to P, then response RIGHT-padded to R
    attention_mask (B, L)  1 on real tokens
    position_ids   (B, L)  cumsum(attention_mask) - 1, clamped at 0 (left padding -> first real
                           token has position 0, exactly as vLLM saw it)
    responses      (B, R)  response tokens (pad_id after the end)
    response_mask  (B, R)  float, 1 on response tokens
    prompt_len     int     P

Response token t (0-based) sits at column P + t and is predicted by the logits at column
P + t - 1, so response logprobs / values are read at columns P-1 .. P+R-2.

Any extra tensor the driver adds whose first dim is B (advantages, returns, old_logprobs, ...)
is sliced along with the rest by :func:`slice_batch` / :func:`split_batch`.
"""
from __future__ import annotations

from typing import Sequence

import torch


def make_batch(prompt_ids: list[list[int]], response_ids: list[list[int]], pad_id: int,
               device: torch.device | str = "cpu") -> dict:
    if len(prompt_ids) != len(response_ids):
        raise ValueError(f"{len(prompt_ids)} prompts but {len(response_ids)} responses")
    if not prompt_ids:
        raise ValueError("empty batch")
    B = len(prompt_ids)
    P = max(len(p) for p in prompt_ids)
    R = max(1, max(len(r) for r in response_ids))
    if any(len(p) == 0 for p in prompt_ids):
        raise ValueError("empty prompt: the first response token needs at least one prompt token")
    input_ids = torch.full((B, P + R), pad_id, dtype=torch.long)
    attn = torch.zeros((B, P + R), dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompt_ids, response_ids)):
        input_ids[i, P - len(p):P] = torch.as_tensor(p, dtype=torch.long)
        attn[i, P - len(p):P] = 1
        if r:
            input_ids[i, P:P + len(r)] = torch.as_tensor(r, dtype=torch.long)
            attn[i, P:P + len(r)] = 1
    position_ids = (attn.cumsum(-1) - 1).clamp(min=0)
    responses = input_ids[:, P:].clone()
    response_mask = attn[:, P:].to(torch.float32)
    return {
        "input_ids": input_ids.to(device),
        "attention_mask": attn.to(device),
        "position_ids": position_ids.to(device),
        "responses": responses.to(device),
        "response_mask": response_mask.to(device),
        "prompt_len": P,
    }


def batch_size(batch: dict) -> int:
    return int(batch["input_ids"].shape[0])


def slice_batch(batch: dict, idx) -> dict:
    """Rows ``idx`` (a slice, index list or index tensor) of every per-sample tensor.

    Tensors whose first dim is B are indexed; everything else (``prompt_len``, scalars, tensors
    of another leading size) is passed through unchanged. Lists of length B are indexed too.
    """
    B = batch_size(batch)
    if isinstance(idx, torch.Tensor):
        idx_t = idx.to(torch.long)
    elif isinstance(idx, slice):
        idx_t = torch.arange(B)[idx]
    else:
        idx_t = torch.as_tensor(list(idx), dtype=torch.long)
    out = {}
    for k, v in batch.items():
        if isinstance(v, torch.Tensor) and v.dim() >= 1 and v.shape[0] == B:
            out[k] = v[idx_t.to(v.device)]
        elif isinstance(v, list) and len(v) == B:
            out[k] = [v[i] for i in idx_t.tolist()]
        else:
            out[k] = v
    return out


def split_batch(batch: dict, n_chunks: int) -> list[dict]:
    """Contiguous chunks of (nearly) equal size, in order (the first ones take the remainder)."""
    B = batch_size(batch)
    n_chunks = max(1, min(int(n_chunks), B))
    sizes = [B // n_chunks + (1 if i < B % n_chunks else 0) for i in range(n_chunks)]
    out, start = [], 0
    for s in sizes:
        out.append(slice_batch(batch, slice(start, start + s)))
        start += s
    return out


def micro_batches(batch: dict, micro_batch_size: int | None) -> list[dict]:
    """Chunks of at most ``micro_batch_size`` rows (one chunk when None)."""
    B = batch_size(batch)
    if not micro_batch_size or micro_batch_size >= B:
        return [batch]
    return [slice_batch(batch, slice(s, s + micro_batch_size)) for s in range(0, B, micro_batch_size)]


def pad_response(t: torch.Tensor, R: int, value: float = 0.0) -> torch.Tensor:
    if t.shape[1] == R:
        return t
    out = t.new_full((t.shape[0], R), value)
    out[:, : t.shape[1]] = t
    return out


def to_device(batch: dict, device) -> dict:
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in batch.items()}


__all__: Sequence[str] = ["make_batch", "slice_batch", "split_batch", "micro_batches", "batch_size",
                          "to_device"]
