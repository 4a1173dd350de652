"""The actor's LM head answering with per-token logprobs (and entropies) instead of logits.

The model's forward is left as transformers wrote it (``logits = lm_head(hidden[:, keep])``); the
head module itself, while a :class:`LogprobRequest` is set on it, returns
``(logprobs (N,), entropy (N,) or None)`` from :func:`vcppo.algos.logprobs.token_logprobs`, so the
(tokens x vocab) logits are never held whole. Everything runs inside the head module's own call,
which is what DeepSpeed ZeRO-3 hooks: its weight is gathered for the forward and again for the
backward (where the chunks are recomputed), and its gradient is reduce-scattered like any other.
Tied heads (the weight is the input embedding's) and LoRA on the layers below work unchanged.

Without a request the head is the plain linear layer it was (exports, generation, SFT).
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from vcppo.algos.logprobs import token_logprobs

_REQUEST = "_vcppo_logprob_request"


@dataclass
class LogprobRequest:
    """What the head computes at its next call.

        targets (N,) long  the sampled token each predicting position scores
        index   (N,) long  rows of the head's flattened (b * k, H) input that predict them, or None
                           when the input holds exactly those N positions in order
    """
    targets: torch.Tensor
    index: torch.Tensor | None
    temperature: float
    chunk_size: int
    with_entropy: bool


def _forward_with_request(self, hidden: torch.Tensor):
    request: LogprobRequest | None = getattr(self, _REQUEST, None)
    if request is None:
        return F.linear(hidden, self.weight, self.bias)
    flat = hidden.reshape(-1, hidden.shape[-1])
    if request.index is not None:
        flat = flat.index_select(0, request.index)  # backward: index_add_, not index_put_
    return token_logprobs(flat, self.weight, request.targets, temperature=request.temperature,
                          chunk_size=request.chunk_size, with_entropy=request.with_entropy)


def install(model: torch.nn.Module) -> torch.nn.Module | None:
    """Give ``model``'s output embedding (its LM head) the request-answering forward; returns the
    head, or None where the chunked path cannot stand in for it (a head with a bias, or one that
    LoRA adapts, whose output is more than x W^T): the caller keeps the full-logits path there."""
    head = model.get_output_embeddings()
    if type(head) is not torch.nn.Linear or head.bias is not None:
        return None
    head.forward = _forward_with_request.__get__(head, type(head))
    return head


@contextmanager
def requesting(head: torch.nn.Module, request: LogprobRequest):
    """Within the block, ``head``'s calls answer ``request``."""
    setattr(head, _REQUEST, request)
    try:
        yield
    finally:
        setattr(head, _REQUEST, None)
