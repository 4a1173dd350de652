"""Padding-free passes: a micro-batch's sequences concatenated into one row, and micro-batches
formed by a token budget.

Long-CoT batches are uneven (a few hundred to tens of thousands of tokens per response), so the
padded (b, P+R) layout spends most of its compute and memory on pads. Packed, the model sees one
row of T = sum of real lengths tokens, positions restarting at 0 for every sequence; transformers
turns restarting position ids (with no attention mask) into a block-diagonal causal mask (sdpa /
eager on CPU) or variable-length flash attention (``flash_attention_2`` on GPU), so attention
never crosses sequences.

Attention kernel. transformers' own packed path builds a dense (T, T) block-diagonal mask for sdpa,
so one packed row costs O(T^2) attention — more than the padded layout when the row holds many
sequences (measured: the 1.6M demo model gained only 1.3x at 67% padding). So packed engines
switch the model to :data:`VARLEN_ATTENTION`: ``flash_attention_2`` where it is installed (CUDA;
varlen from the position ids), otherwise :func:`varlen_sdpa_attention`, which runs causal sdpa
without any mask on groups of near-equal-length sequences (one call per group, not per sequence:
a call's fixed cost dominated the SFT step of the demo, whose sequences are all ~139 tokens).

Only the model pass is packed. Logprobs, entropies and values come back in the (b, R) response
layout that GAE and the losses read: those are a few floats per token, while the heavy tensors
(hidden states, logits over the vocabulary) are computed for real tokens only, and the logits
only at the N positions that predict a response token.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from vcppo.experience import Layout


@dataclass
class PackedBatch:
    """b sequences without padding.

        input_ids     (1, T) long  the real tokens of every sequence, one after the other
        position_ids  (1, T) long  0 .. n_i - 1 within sequence i (as in the padded layout)
        predict_index (N,)   long  packed position whose output predicts response token (row, col);
                                   the state before that token, for the critic
        rows, cols    (N,)   long  where each of the N response tokens sits in the (b, R) layout
        shape         (b, R)
    """
    input_ids: torch.Tensor
    position_ids: torch.Tensor
    predict_index: torch.Tensor
    rows: torch.Tensor
    cols: torch.Tensor
    shape: tuple[int, int]

    def to_response_layout(self, per_token: torch.Tensor) -> torch.Tensor:
        """(N,) values, one per response token -> (b, R), zeros at padded positions."""
        return scatter_responses(per_token, self.rows, self.cols, self.shape)


def scatter_responses(per_token: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor,
                      shape: tuple[int, int]) -> torch.Tensor:
    """(N,) values at response positions (rows (N,), cols (N,)) -> (b, R), zeros elsewhere."""
    out = per_token.new_zeros(shape)
    out[rows, cols] = per_token
    return out


def pack(micro: Layout) -> PackedBatch:
    """The packed form of a padded micro-batch (real tokens in row-major order)."""
    real = micro.attention_mask.bool()
    # packed index of every padded (row, column); meaningful at real tokens only
    packed_index = (real.reshape(-1).cumsum(0) - 1).reshape(real.shape)
    P, R = micro.prompt_len, micro.responses.shape[1]
    rows, cols = micro.policy_mask.nonzero(as_tuple=True)
    # response token (row, t) sits at column P + t and is predicted from column P + t - 1
    predict_index = packed_index[:, P - 1:P + R - 1][rows, cols]
    return PackedBatch(input_ids=micro.input_ids[real].unsqueeze(0), position_ids=micro.position_ids[real].unsqueeze(0),
                       predict_index=predict_index, rows=rows, cols=cols, shape=(micro.size, R))


def sequence_lengths(batch: Layout) -> torch.Tensor:
    """(B,) real tokens (prompt + response) per sequence: what a packed pass costs."""
    return batch.attention_mask.sum(-1)


def token_budget_groups(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Row indices grouped into micro-batches of at most ``max_tokens`` real tokens.

    First-fit decreasing: the longest sequences are placed first, each into the first group it
    fits, so groups come out nearly full and few. A sequence longer than the budget gets a group
    of its own (it cannot be split: attention spans the whole sequence). Groups are returned
    longest first, each in ascending row order; the result depends only on the lengths.
    """
    if max_tokens <= 0:
        raise ValueError(f"max_tokens must be > 0, got {max_tokens}")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    groups: list[list[int]] = []
    room: list[int] = []
    for i in order:
        for g, free in enumerate(room):
            if lengths[i] <= free:
                groups[g].append(i)
                room[g] -= lengths[i]
                break
        else:
            groups.append([i])
            room.append(max_tokens - lengths[i])
    return [sorted(g) for g in groups]


def balanced_partitions(costs: list[float], parts: int) -> list[list[int]]:
    """Item indices split into ``parts`` sets of nearly equal total cost (longest processing time
    first: the most expensive item goes to the currently lightest set; ties go to the lower set).

    Greedy LPT is within 4/3 of the optimal largest set, and exact enough here: items are whole
    prompt groups, many per rank. Each set is returned in ascending index order; the result
    depends only on the costs, so every rank computes the same partition.
    """
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    order = sorted(range(len(costs)), key=lambda i: (-costs[i], i))
    sets: list[list[int]] = [[] for _ in range(parts)]
    load = [0.0] * parts
    for i in order:
        k = min(range(parts), key=lambda j: (load[j], len(sets[j]), j))
        sets[k].append(i)
        load[k] += costs[i]
    return [sorted(s) for s in sets]


VARLEN_ATTENTION = "vcppo_varlen_sdpa"


def sequence_starts(position_ids: torch.Tensor) -> list[int]:
    """(1, T) packed position ids (restarting at 0 per sequence) -> [start_0, ..., start_k, T]."""
    pos = position_ids[0]
    starts = (pos == 0).nonzero().flatten().tolist()
    if not starts or starts[0] != 0:
        starts = [0] + starts
    return starts + [int(pos.shape[0])]


def attention_buckets(lengths: list[int], slack: float = 0.25) -> list[list[int]]:
    """Sequence indices grouped for one batched causal sdpa call per group.

    Longest first; a group grows while its padded cost (members x longest^2) stays within
    ``1 + slack`` of its real cost (sum of n_i^2). Equal lengths always share a group. On CPU one
    sdpa call over b sequences costs less than b calls (measured on the demo model's shapes,
    16 x 135 tokens, forward + backward: 23 ms batched vs 39 ms one by one), so near-equal
    lengths are worth a little padding; very uneven ones are not.
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    groups: list[list[int]] = []
    real = 0
    for i in order:
        n = lengths[i]
        if groups:
            longest = lengths[groups[-1][0]]
            if (len(groups[-1]) + 1) * longest ** 2 <= (1 + slack) * (real + n ** 2):
                groups[-1].append(i)
                real += n ** 2
                continue
        groups.append([i])
        real = n ** 2
    return groups


def varlen_sdpa_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          attention_mask=None, dropout: float = 0.0, scaling: float | None = None,
                          position_ids: torch.Tensor | None = None, **kwargs):
    """Causal attention within each sequence of a packed row (a transformers attention function).

    query (1, H, T, D), key / value (1, H_kv, T, D), position_ids (1, T) restarting at 0 per
    sequence -> (output (1, T, H, D), None). Each sequence attends only to itself, and no (T, T)
    mask is ever built: the sequences of an :func:`attention_buckets` group are gathered into a
    (g, H, n_max, D) batch, right-padded with whatever tokens follow them, and run through ONE
    causal sdpa call. Right padding is exact under a causal mask: a real query at position
    i < n_j sees keys 0..i, all its own; only the padded queries see the filler, and their outputs
    are dropped (so no gradient reaches the filler either).
    """
    if position_ids is None or query.shape[0] != 1:
        raise ValueError("varlen_sdpa_attention needs one packed row and its position_ids")
    bounds = sequence_starts(position_ids)
    starts = torch.tensor(bounds[:-1], device=query.device)
    lengths = [e - s for s, e in zip(bounds[:-1], bounds[1:])]
    T, gqa = query.shape[2], query.shape[1] != key.shape[1]
    drop = dropout if module.training else 0.0
    pieces, where = [], []
    for group in attention_buckets(lengths):
        n = lengths[group[0]]
        cols = torch.arange(n, device=query.device)
        index = (starts[group].unsqueeze(1) + cols).clamp(max=T - 1)  # (g, n) packed positions
        g, flat = len(group), index.reshape(-1)
        # index_select, not advanced indexing: its backward is index_add_, where x[index]'s is an
        # accumulating index_put_ (~0.9 ms a call on CPU, 8% of a demo-model PPO step). Same
        # sums: a filler position's slot only ever receives exact zeros from the other sequences.
        gather = lambda x: x[0].index_select(1, flat).unflatten(1, (g, n)).transpose(0, 1)  # noqa: E731
        out = F.scaled_dot_product_attention(gather(query), gather(key), gather(value), is_causal=True,
                                             scale=scaling, enable_gqa=gqa, dropout_p=drop)  # (g, H, n, D)
        real = cols < torch.tensor([lengths[i] for i in group], device=query.device).unsqueeze(1)
        keep = real.reshape(-1).nonzero().squeeze(1)
        # (tokens, H, D) of the group's real positions, and where they sit in the packed row
        pieces.append(out.transpose(1, 2).flatten(0, 1).index_select(0, keep))
        where.append(flat.index_select(0, keep))
    order = torch.cat(where)
    result = torch.cat(pieces).index_select(0, torch.argsort(order))  # back to packed order, (T, H, D)
    return result.unsqueeze(0).contiguous(), None


def use_packed_attention(model: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> str:
    """Switch every transformers config in ``model`` to the packed-row attention; returns its name.

    flash_attention_2 when the package is importable, ``device`` is CUDA and ``dtype`` is 16-bit
    (flash-attn has no fp32 kernels; its varlen path reads the restarting position ids), else
    :func:`varlen_sdpa_attention`.
    """
    from transformers import AttentionInterface

    name = VARLEN_ATTENTION
    if device.type == "cuda" and dtype in (torch.bfloat16, torch.float16):
        try:
            import flash_attn  # noqa: F401
            name = "flash_attention_2"
        except ImportError:
            pass
    if name == VARLEN_ATTENTION and name not in AttentionInterface._global_mapping:
        AttentionInterface.register(name, varlen_sdpa_attention)
    return set_attention(model, name)


def set_attention(model, name: str) -> str:
    """Every (sub)model config of ``model`` runs the registered attention ``name``; returns it."""
    for m in model.modules():
        cfg = getattr(m, "config", None)
        if cfg is not None and hasattr(cfg, "_attn_implementation"):
            cfg._attn_implementation = name
    return name
