"""Sequence parallelism (Ulysses): a group of ``sp`` ranks runs one packed row together, each rank
a contiguous slice of its tokens.

Notation (one micro-batch of the group):

    T            real tokens of the packed row (:func:`vcppo.engines.packing.pack`)
    s = ceil(T / sp)  tokens per rank; the row is padded to sp * s
    N            response tokens the row predicts (``PackedBatch.predict_index``, ascending)
    n_r          of those, the ones whose predicting position lies in rank r's slice

What a group holds. Each rank keeps its own share of the step's batch, as without SP; an engine
call first gathers the group's shares (:func:`group_batch`, their union in SP-rank order), forms
micro-batches over that union (``micro_batch_size`` / the token budget are per SP group) and runs
every micro-batch on all ranks of the group, each on its slice. Every layer but attention is per
token. Attention is DeepSpeed's Ulysses (:class:`UlyssesSPAttentionHF`): an all-to-all turns
(s tokens, all heads) into (sp * s tokens, heads / sp), the model's own attention function (the
varlen sdpa of :mod:`vcppo.engines.packing`, or flash-attention) runs over the whole row with the
gathered position ids, and a second all-to-all turns it back. Per-token outputs (logprobs,
entropies, values) are computed for the n_r positions of the slice and gathered
(:func:`gather_slices`), so every rank of the group holds the micro-batch's (b, R) outputs, and
:func:`group_batch`'s ``back`` returns the caller's own rows: the step never sees SP.

Gradients. Every rank of the group computes the same loss L from the same gathered outputs, and
back-propagates it through its own slice only (``gather_slices``' backward keeps the rank's
segment); Ulysses' all-to-all carries the attention gradients between the ranks. Summed over the
group the parameter gradients are dL/dθ once, so the engine's gradient contract (loss x world
size, DeepSpeed's mean over all ranks) holds unchanged, and so do the counts: each rank counts
its own rows (:class:`~vcppo.engines.loss_contract.GlobalCounts`).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as tdist

from vcppo.engines.packing import PackedBatch, set_attention
from vcppo.experience import Layout, concat_batches
from vcppo.errors import ConfigError


@dataclass
class SPGroup:
    """This rank's sequence-parallel group: ``size`` ranks, this one ``rank`` within it."""
    size: int
    rank: int
    group: object  # torch.distributed.ProcessGroup


def build_group(size: int, rank: int, world_size: int, key: str) -> SPGroup | None:
    """The groups of ``size`` consecutive ranks (collective: every rank builds every group, in
    order); None for size 1. ``key`` names the config key in the error."""
    if size <= 1:
        return None
    if world_size % size:
        raise ConfigError(f"config key '{key}' ({size}) must divide the number of training ranks ({world_size})")
    mine = None
    for first in range(0, world_size, size):
        ranks = list(range(first, first + size))
        group = tdist.new_group(ranks)
        if rank in ranks:
            mine = SPGroup(size=size, rank=rank - first, group=group)
    return mine


def group_batch(batch: Layout, sp: SPGroup) -> tuple[Layout, Callable[[torch.Tensor], torch.Tensor]]:
    """The group's union batch (every SP rank's rows, in SP-rank order, re-padded to common widths)
    and ``back``: a (B_u, R_u) tensor of the union -> this rank's (B, R) rows. Collective."""
    parts: list = [None] * sp.size
    tdist.all_gather_object(parts, batch.to("cpu"), group=sp.group)
    union = concat_batches(parts).to(batch.input_ids.device)
    first = sum(p.size for p in parts[:sp.rank])
    rows, width = batch.size, batch.responses.shape[1]

    def back(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t[first:first + rows, :width]
    return union, back


@dataclass
class SequenceShard:
    """This rank's slice of a packed row.

        input_ids, position_ids (1, s) long  tokens [r*s, (r+1)*s) of the row padded to sp * s
                                             (the pad is a sequence of its own: positions 0, 1, ..)
        local_predict (n_r,) long  positions within the slice that predict a response token
        take          slice        those tokens' range in the row's N predicted tokens
        counts        list[int]    n_r of every rank of the group
    """
    input_ids: torch.Tensor
    position_ids: torch.Tensor
    local_predict: torch.Tensor
    take: slice
    counts: list[int]
    start: int  # r * s: the slice's first position in the row

    def local_rows(self, full: torch.Tensor) -> torch.Tensor:
        """(1, T, ...) per-position inputs of the row -> this slice's (1, s, ...) (zeros past T)."""
        T, end = full.shape[1], self.start + self.input_ids.shape[1]
        piece = full[:, self.start:min(end, T)]
        if piece.shape[1] == self.input_ids.shape[1]:
            return piece
        pad = piece.new_zeros(piece.shape[0], self.input_ids.shape[1] - piece.shape[1], *piece.shape[2:])
        return torch.cat([piece, pad], dim=1)


def shard_packed(packed: PackedBatch, sp: SPGroup) -> SequenceShard:
    """This rank's slice of ``packed`` (see :class:`SequenceShard`)."""
    T = packed.input_ids.shape[1]
    s = -(-T // sp.size)
    pad = s * sp.size - T
    ids, pos = packed.input_ids, packed.position_ids
    if pad:
        ids = torch.cat([ids, ids.new_zeros(1, pad)], dim=1)
        pos = torch.cat([pos, torch.arange(pad, device=pos.device).unsqueeze(0)], dim=1)
    predict = packed.predict_index
    bounds = torch.arange(sp.size + 1, device=predict.device) * s
    # predict is ascending (row-major response positions), so each slice's tokens are one range
    ends = torch.searchsorted(predict, bounds).tolist()
    counts = [b - a for a, b in zip(ends[:-1], ends[1:])]
    lo = sp.rank * s
    take = slice(ends[sp.rank], ends[sp.rank + 1])
    return SequenceShard(input_ids=ids[:, lo:lo + s], position_ids=pos[:, lo:lo + s],
                         local_predict=predict[take] - lo, take=take, counts=counts, start=lo)


class _GatherSlices(torch.autograd.Function):
    """(n_r, ...) on every rank -> (N, ...) = the ranks' pieces in order; backward: this rank's
    segment of the incoming gradient (every rank back-propagates the same loss, see the module
    docstring)."""

    @staticmethod
    def forward(ctx, local, counts, rank, group):
        most = max(counts)
        padded = local.new_zeros(most, *local.shape[1:])
        padded[:local.shape[0]] = local
        pieces = [torch.empty_like(padded) for _ in counts]
        tdist.all_gather(pieces, padded.contiguous(), group=group)
        ctx.segment = (sum(counts[:rank]), sum(counts[:rank + 1]))
        return torch.cat([p[:n] for p, n in zip(pieces, counts)])

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.segment
        return grad[a:b].contiguous(), None, None, None


def gather_slices(local: torch.Tensor | None, shard: SequenceShard, sp: SPGroup) -> torch.Tensor | None:
    """This rank's (n_r, ...) per-token outputs -> the row's (N, ...) on every rank of the group."""
    if local is None:
        return None
    return _GatherSlices.apply(local, shard.counts, sp.rank, sp.group)


_NAMES = itertools.count()


def _attention_config(model: torch.nn.Module):
    """The transformers config that holds the attention shapes (a value model's backbone's)."""
    for m in model.modules():
        cfg = getattr(m, "config", None)
        if cfg is not None and hasattr(cfg, "num_attention_heads"):
            return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    raise ValueError("sequence parallelism: the model has no transformers config with attention heads")


def head_problem(size: int, heads: int, kv_heads: int) -> str | None:
    """Why ``size`` ranks cannot split these heads (Ulysses' rule: query heads divisible by the
    size; KV heads divisible by it, or dividing it, then replicated), or None."""
    if heads % size:
        return f"the model's {heads} attention heads are not divisible by it"
    if kv_heads % size and size % kv_heads:
        return f"the model's {kv_heads} key/value heads neither divide it nor are divisible by it"
    return None


def use_ulysses_attention(model: torch.nn.Module, sp: SPGroup, core: str) -> str:
    """Wrap the attention function ``core`` (registered in transformers) in DeepSpeed's Ulysses
    all-to-all for this model alone: registered under a name of its own, set on every config of
    ``model`` (DeepSpeed's ``register_with_transformers`` would replace ``core`` process-wide and
    keep one global group: the actor and the critic may differ). Returns that name."""
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF
    from transformers import AttentionInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    cfg = _attention_config(model)
    heads, kv = cfg.num_attention_heads, getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    problem = head_problem(sp.size, heads, kv)
    if problem:
        raise ConfigError(f"sequence_parallel_size {sp.size}: {problem}")
    ulysses = UlyssesSPAttentionHF(
        attn=ALL_ATTENTION_FUNCTIONS[core], batch_size=1, attn_head_count=heads,
        attn_head_size=getattr(cfg, "head_dim", None) or cfg.hidden_size // heads, kv_head_count=kv,
        num_hidden_layers=cfg.num_hidden_layers, process_group=sp.group, seq_length_is_variable=True)

    def attention(module, query, key, value, attention_mask, *args, **kwargs):
        # the mask transformers built is for the local slice; position ids carry the row's sequences
        return ulysses(module, query, key, value, None, *args, **kwargs)

    name = f"vcppo_ulysses_{next(_NAMES)}"
    AttentionInterface.register(name, attention)
    return set_attention(model, name)
