"""The packed layout and token-budget grouping: pure index arithmetic, no engine (fast)."""
import pytest
import torch

from vcppo.engines.packing import pack, sequence_lengths, token_budget_groups
from vcppo.experience import make_layout

PROMPTS = [[5, 6, 7], [8], [9, 10]]
RESPONSES = [[11], [12, 13, 14, 15], [16, 17]]   # a length-1 and a max-length response


def test_pack_keeps_real_tokens_positions_and_prediction_sites():
    b = make_layout(PROMPTS, RESPONSES, pad_id=0)
    p = pack(b)
    flat = [t for pr, r in zip(PROMPTS, RESPONSES) for t in pr + r]
    assert p.input_ids.tolist() == [flat]
    assert p.position_ids.tolist() == [[0, 1, 2, 3, 0, 1, 2, 3, 4, 0, 1, 2, 3]]
    assert p.shape == (3, 4) and len(p.predict_index) == sum(map(len, RESPONSES))
    # the position predicting response token (row, col) holds the token just before it
    for i, r, c in zip(p.predict_index.tolist(), p.rows.tolist(), p.cols.tolist()):
        before = (PROMPTS[r] + RESPONSES[r])[len(PROMPTS[r]) + c - 1]
        assert flat[i] == before and b.responses[r, c].item() == RESPONSES[r][c]
    back = p.to_response_layout(torch.arange(1.0, 8.0))
    assert back.tolist() == [[1, 0, 0, 0], [2, 3, 4, 5], [6, 7, 0, 0]]


def test_token_budget_groups_fit_the_budget_and_cover_every_row_once():
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 300, (200,), generator=g).tolist() + [900]  # one longer than the budget
    groups = token_budget_groups(lengths, 512)
    rows = sorted(r for grp in groups for r in grp)
    assert rows == list(range(len(lengths)))
    for grp in groups:
        assert sum(lengths[r] for r in grp) <= 512 or len(grp) == 1
    assert [200] in groups  # the over-budget sequence runs alone
    # first-fit decreasing packs nearly full: within 15% of the lower bound here
    assert len(groups) <= 1.15 * (sum(lengths) / 512) + 1
    assert token_budget_groups(lengths, 512) == groups  # deterministic
    with pytest.raises(ValueError, match="max_tokens"):
        token_budget_groups(lengths, 0)


def test_sequence_lengths_count_prompt_and_response():
    b = make_layout(PROMPTS, RESPONSES, pad_id=0)
    assert sequence_lengths(b).tolist() == [4, 5, 4]


def test_balanced_partitions_even_out_costs_and_cover_every_item_once():
    from vcppo.engines.packing import balanced_partitions
    g = torch.Generator().manual_seed(0)
    # long-tailed costs (most short, a few long): what long-CoT groups look like
    costs = (torch.rand(64, generator=g) ** 4 * 2000 + 32).tolist()
    for parts in (1, 2, 4, 8):
        sets = balanced_partitions(costs, parts)
        assert sorted(i for s in sets for i in s) == list(range(len(costs)))
        loads = [sum(costs[i] for i in s) for s in sets]
        # LPT bound: the heaviest set is at most the mean plus the largest single item
        assert max(loads) <= sum(costs) / parts + max(costs) + 1e-6
        assert balanced_partitions(costs, parts) == sets  # deterministic
    sets = balanced_partitions(costs, 4)
    contiguous = [sum(costs[i * 16:(i + 1) * 16]) for i in range(4)]
    assert max(sum(costs[i] for i in s) for s in sets) < max(contiguous)  # better than slicing here
    assert balanced_partitions([5.0, 1.0, 1.0, 1.0, 1.0, 1.0], 2) == [[0], [1, 2, 3, 4, 5]]
    with pytest.raises(ValueError, match="parts"):
        balanced_partitions(costs, 0)


def test_varlen_sdpa_attention_equals_a_block_diagonal_causal_mask():
    from vcppo.engines.packing import sequence_starts, varlen_sdpa_attention
    lengths = [1, 5, 3, 7]
    position_ids = torch.cat([torch.arange(n) for n in lengths])[None]
    assert sequence_starts(position_ids) == [0, 1, 6, 9, 16]
    g = torch.Generator().manual_seed(0)
    T, H, Hkv, D = sum(lengths), 4, 2, 8
    q, k, v = (torch.randn(1, h, T, D, generator=g) for h in (H, Hkv, Hkv))
    seq = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    mask = (seq[:, None] == seq[None, :]) & torch.ones(T, T, dtype=torch.bool).tril()
    expect = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), attn_mask=mask, scale=0.3)
    module = torch.nn.Module().eval()
    out, weights = varlen_sdpa_attention(module, q, k, v, None, scaling=0.3, position_ids=position_ids)
    assert weights is None and out.shape == (1, T, H, D)
    torch.testing.assert_close(out, expect.transpose(1, 2), rtol=1e-5, atol=1e-6)
    # a token never sees another sequence: changing sequence 0 leaves sequence 1's outputs alone
    v2 = v.clone()
    v2[:, :, 0] += 5
    out2, _ = varlen_sdpa_attention(module, q, k, v2, None, scaling=0.3, position_ids=position_ids)
    assert torch.equal(out2[:, 1:], out[:, 1:]) and not torch.equal(out2[:, :1], out[:, :1])
    with pytest.raises(ValueError, match="position_ids"):
        varlen_sdpa_attention(module, q, k, v, None)


def test_attention_buckets_group_near_equal_lengths_and_cover_every_sequence_once():
    from vcppo.engines.packing import attention_buckets
    assert attention_buckets([135] * 4) == [[0, 1, 2, 3]]  # equal lengths: one call
    assert attention_buckets([1000, 32, 40, 36]) == [[0], [2, 3, 1]]  # the long one alone
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 400, (50,), generator=g).tolist()
    groups = attention_buckets(lengths, slack=0.25)
    assert sorted(i for grp in groups for i in grp) == list(range(50))
    for grp in groups:  # padded cost within the slack of the real cost
        assert len(grp) * lengths[grp[0]] ** 2 <= 1.25 * sum(lengths[i] ** 2 for i in grp)


def test_bucketed_attention_matches_the_mask_in_values_and_gradients():
    """Sequences batched into one right-padded causal call (lengths 9, 9, 8, 8, 7 share a group)
    give the block-diagonal reference's outputs and input gradients."""
    from vcppo.engines.packing import attention_buckets, varlen_sdpa_attention
    lengths = [8, 9, 1, 7, 9, 8, 2]
    assert max(len(grp) for grp in attention_buckets(lengths)) >= 3
    position_ids = torch.cat([torch.arange(n) for n in lengths])[None]
    g = torch.Generator().manual_seed(1)
    T, H, Hkv, D = sum(lengths), 4, 2, 8
    q, k, v = (torch.randn(1, h, T, D, generator=g, requires_grad=True) for h in (H, Hkv, Hkv))
    seq = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    mask = (seq[:, None] == seq[None, :]) & torch.ones(T, T, dtype=torch.bool).tril()
    expect = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), attn_mask=mask).transpose(1, 2)
    out, _ = varlen_sdpa_attention(torch.nn.Module().eval(), q, k, v, None, position_ids=position_ids)
    torch.testing.assert_close(out, expect, rtol=1e-5, atol=1e-6)
    w = torch.randn(expect.shape, generator=g)
    grads = torch.autograd.grad((out * w).sum(), (q, k, v))
    grads_ref = torch.autograd.grad((expect * w).sum(), (q, k, v))
    for a, b in zip(grads, grads_ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_bucketed_attention_backward_runs_no_accumulating_index_put():
    """The gathers are index_select (backward: index_add_), not advanced indexing, whose backward
    is an accumulating index_put_: ~0.9 ms a call on CPU and 8% of a demo-model PPO step."""
    import torch.profiler as tp

    from vcppo.engines.packing import varlen_sdpa_attention
    lengths = [8, 9, 1, 7, 9, 8, 2]
    position_ids = torch.cat([torch.arange(n) for n in lengths])[None]
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, h, sum(lengths), 8, generator=g, requires_grad=True) for h in (4, 2, 2))
    with tp.profile(activities=[tp.ProfilerActivity.CPU]) as prof:
        out, _ = varlen_sdpa_attention(torch.nn.Module().train(), q, k, v, None, position_ids=position_ids)
        out.square().sum().backward()
    ops = {e.key for e in prof.key_averages()}
    assert "aten::index_select" in ops and "aten::index_add_" in ops
    assert not ops & {"aten::index_put_", "aten::_index_put_impl_"}, sorted(ops)
