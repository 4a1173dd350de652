"""Stats: masked moments, whitening, explained variance, position diagnostics, GRPO, pass@k."""
import math

import numpy as np
import pytest
import torch

from vcppo.algos.stats import (
    advantage_position_correlation,
    advantage_position_profile,
    explained_variance,
    grpo_advantages,
    masked_mean,
    masked_var,
    masked_whiten,
    pass_at_k,
)


def test_masked_mean_and_var_ignore_masked_entries():
    x = torch.tensor([[1.0, 2.0, 3.0, float("nan")]])
    m = torch.tensor([[1, 1, 1, 0]])
    assert masked_mean(x, m).item() == pytest.approx(2.0)
    assert masked_var(x, m).item() == pytest.approx(1.0)                 # (1 + 0 + 1) / 2
    assert masked_var(x, m, unbiased=False).item() == pytest.approx(2 / 3)
    torch.testing.assert_close(masked_mean(torch.tensor([[1.0, 3.0], [5.0, 7.0]]),
                                           torch.tensor([[1, 1], [1, 0]]), dim=1),
                               torch.tensor([2.0, 5.0]))
    assert math.isnan(masked_mean(x, torch.zeros_like(m)).item())


def test_masked_whiten_zero_mean_flag():
    x = torch.tensor([[1.0, 3.0, 5.0, float("nan")]])
    m = torch.tensor([[1, 1, 1, 0]])
    # mean 3, unbiased var 4, std 2; the NaN under the mask changes nothing
    torch.testing.assert_close(masked_whiten(x, m), torch.tensor([[-1.0, 0.0, 1.0, 0.0]]))
    torch.testing.assert_close(masked_whiten(x, m, zero_mean=False), torch.tensor([[0.5, 1.5, 2.5, 0.0]]))


def test_masked_whiten_of_an_empty_or_one_token_batch_is_finite():
    x = torch.tensor([[2.0, 7.0]])
    assert torch.equal(masked_whiten(x, torch.zeros(1, 2, dtype=torch.bool)), torch.zeros(1, 2))
    # n = 1: mean 2, var := 0 (divisor max(n - 1, 1)), so the one entry becomes exactly 0
    assert torch.equal(masked_whiten(x, torch.tensor([[True, False]])), torch.zeros(1, 2))


def _global_whiten_before_the_merge(advantages, mask, zero_mean=True, eps=1e-8, global_sum=None):
    """The trainer's whitening as vcppo.driver.step.update.global_whiten computed it before it
    called masked_whiten: kept verbatim as the oracle for bitwise equality."""
    n = global_sum(mask.sum())
    mean = global_sum((advantages * mask).sum()) / max(n, 1.0)
    var = global_sum((((advantages - mean) * mask) ** 2).sum()) / max(n - 1.0, 1.0)
    centred = advantages - mean if zero_mean else advantages
    return centred * torch.rsqrt(torch.tensor(var + eps, dtype=advantages.dtype)) * mask


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.float32, torch.int64])
@pytest.mark.parametrize("zero_mean", [True, False])
def test_masked_whiten_is_bitwise_the_trainers_global_whiten(dtype, mask_dtype, zero_mean):
    from vcppo.runtime.collectives import global_sum  # what global_whiten passes as sum_fn

    if dtype == torch.bfloat16 and mask_dtype == torch.float32:
        pytest.skip("the old product promoted bf16 advantages to the fp32 mask's dtype; masked_whiten "
                    "keeps x's dtype (the trainer's advantages are fp32 with an fp32 mask)")
    g = torch.Generator().manual_seed(3)
    for B, T in [(64, 130), (7, 33), (1, 1), (3, 5)]:
        lengths = torch.randint(0, T + 1, (B,), generator=g)
        valid = torch.arange(T)[None, :] < lengths[:, None]
        valid[:, T // 3: T // 3 + 2] = False  # interior holes too
        # GAE-like input: exactly 0 at masked positions, a positive bias, a 1/x-ish spread
        x = torch.where(valid, torch.randn(B, T, generator=g) * 3.7 + 0.4, torch.zeros(()))
        x = x.to(dtype)
        mask = valid.to(mask_dtype)
        old = _global_whiten_before_the_merge(x, mask, zero_mean, global_sum=global_sum)
        for sum_fn in (global_sum, float):  # the trainer's reducer and the local default
            new = masked_whiten(x, mask, zero_mean=zero_mean, sum_fn=sum_fn)
            assert new.dtype == old.dtype and torch.equal(new, old), (B, T)
            # Bit for bit at every valid entry; masked entries are +0.0 (the old product gave
            # -0.0 where x - mean < 0, which == 0.0 and nothing downstream can tell apart).
            int_view = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float64: torch.int64}[dtype]
            assert torch.equal(new.view(int_view)[valid], old.view(int_view)[valid])
            assert not torch.signbit(new[~valid]).any()


def test_masked_whiten_sum_fn_reduces_over_shards_like_one_batch():
    # Two "ranks" as threads whose sum_fn all-reduces through a barrier: each shard is whitened
    # with the statistics of the whole batch, as vcppo.runtime.collectives.global_sum does across ranks.
    import threading

    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 20, generator=g) * 2 + 1
    mask = torch.rand(8, 20, generator=g) > 0.3
    shards = [(x[:3], mask[:3]), (x[3:], mask[3:])]
    posted, barrier, out = [0.0, 0.0], threading.Barrier(2), [None, None]

    def run(rank):
        def all_reduce(t):
            posted[rank] = float(t)
            barrier.wait()
            total = sum(posted)
            barrier.wait()
            return total
        out[rank] = masked_whiten(*shards[rank], sum_fn=all_reduce)

    threads = [threading.Thread(target=run, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    torch.testing.assert_close(torch.cat(out), masked_whiten(x, mask))


def test_explained_variance():
    returns = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    m = torch.ones(1, 4)
    assert explained_variance(returns, returns, m).item() == pytest.approx(1.0)
    assert explained_variance(torch.zeros_like(returns), returns, m).item() == pytest.approx(0.0)
    # residual R - V = [0, 0, 0, 4] -> Var = 4 ; Var(R) = 5/3 -> 1 - 12/5 = -1.4
    assert explained_variance(torch.tensor([[1.0, 2.0, 3.0, 0.0]]), returns, m).item() == pytest.approx(-1.4)
    assert math.isnan(explained_variance(returns, torch.ones_like(returns), m).item())


def test_advantage_position_profile_and_correlation():
    adv = torch.tensor([[4.0, 3.0, 2.0, 1.0], [8.0, 6.0, 99.0, 99.0]])
    m = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    prof = advantage_position_profile(adv, m, num_buckets=2)
    assert prof.edges.tolist() == [0, 2, 4]
    assert prof.counts.tolist() == [4, 2]
    torch.testing.assert_close(prof.means, torch.tensor([(4 + 3 + 8 + 6) / 4, 1.5]))
    # Early tokens with larger advantages -> negative correlation (the VC-PPO collapse sign).
    decreasing = torch.arange(10.0, 0.0, -1.0)[None]
    assert advantage_position_correlation(decreasing, torch.ones(1, 10)).item() == pytest.approx(-1.0)
    assert advantage_position_correlation(-decreasing, torch.ones(1, 10)).item() == pytest.approx(1.0)
    empty_bucket = advantage_position_profile(adv, torch.tensor([[1, 0, 0, 0], [1, 0, 0, 0]]), 2)
    assert empty_bucket.counts.tolist() == [2, 0] and math.isnan(empty_bucket.means[1].item())


def test_grpo_advantages():
    scores = torch.tensor([1.0, 0.0, 1.0, 1.0, 5.0])
    adv = grpo_advantages(scores, group_ids=torch.tensor([0, 0, 1, 1, 2]))
    s = 1 / math.sqrt(0.5)  # group 0: mean .5, unbiased std sqrt(.5)
    torch.testing.assert_close(adv, torch.tensor([0.5 * s, -0.5 * s, 0.0, 0.0, 0.0]), atol=1e-4, rtol=1e-5)
    adv_by_n = grpo_advantages(scores[:4], n_samples=2, scale_by_std=False)
    torch.testing.assert_close(adv_by_n, torch.tensor([0.5, -0.5, 0.0, 0.0]))
    with pytest.raises(ValueError):
        grpo_advantages(scores, n_samples=2)


def test_pass_at_k_hand_computed_and_vectorised():
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(10, 3, 2) == pytest.approx(1 - 21 / 45)       # 1 - C(7,2)/C(10,2)
    assert pass_at_k(10, 0, 5) == 0.0
    assert pass_at_k(10, 8, 3) == 1.0                                # n - c = 2 < k
    assert pass_at_k(1000, 500, 10) == pytest.approx(1 - math.comb(500, 10) / math.comb(1000, 10), rel=1e-12)
    got = pass_at_k(np.array([10, 10, 16]), np.array([3, 0, 16]), 2)
    np.testing.assert_allclose(got, [1 - 21 / 45, 0.0, 1.0])
    with pytest.raises(ValueError):
        pass_at_k(5, 6, 1)


def test_per_turn_means_of_an_episode():
    from vcppo.algos.stats import per_turn_means, turn_index
    mask = torch.tensor([[1., 1, 0, 0, 1, 0, 1, 1], [1., 1, 1, 0, 0, 0, 0, 0]])
    assert turn_index(mask).tolist() == [[0, 0, -1, -1, 1, -1, 2, 2], [0, 0, 0, -1, -1, -1, -1, -1]]
    x = torch.tensor([[1., 3, 9, 9, 5, 9, 7, 9], [2., 2, 2, 9, 9, 9, 9, 9]])
    assert per_turn_means(x, mask, 4) == [2.0, 5.0, 8.0, None]  # turn 0: (1 + 3 + 2 + 2 + 2) / 5
