"""DAPO's batch shaping math: the group filter of dynamic sampling, the soft overlong punishment
and the truncated-sample mask (hand-computed)."""
import pytest
import torch

from vcppo.algos.dapo import informative_groups, mask_truncated, overlong_penalty


def test_informative_groups_drops_groups_with_equal_rewards():
    # group 7: all wrong; group 3: mixed; group 5: all right; group 9: one sample (never informative)
    group = torch.tensor([7, 3, 7, 5, 3, 5, 9, 3])
    scores = torch.tensor([-1.0, 1.0, -1.0, 1.0, -1.0, 1.0, 1.0, 1.0])
    keep = informative_groups(scores, group)
    assert keep.tolist() == [False, True, False, False, True, False, False, True]
    # Not only +-1: any difference in a group counts, a difference below atol does not.
    assert informative_groups(torch.tensor([0.2, 0.2 + 1e-8, 0.5, 0.7]), torch.tensor([0, 0, 1, 1])).tolist() \
        == [False, False, True, True]


def test_overlong_penalty_is_linear_in_the_buffer():
    lengths = torch.tensor([0, 12, 13, 14, 16, 20, 25])
    # L_max = 20, L_cache = 8: free up to 12 tokens, then -(l - 12) / 8 down to -1 at 20; beyond: -1.
    p = overlong_penalty(lengths, max_len=20, buffer=8, penalty=1.0)
    torch.testing.assert_close(p, torch.tensor([0.0, 0.0, -0.125, -0.25, -0.5, -1.0, -1.0]))
    torch.testing.assert_close(overlong_penalty(lengths, 20, 8, penalty=0.5), 0.5 * p)
    assert overlong_penalty(torch.tensor([19, 20]), 20, 20).tolist() == pytest.approx([-0.95, -1.0])
    for bad in (0, 21):
        with pytest.raises(ValueError, match="overlong buffer"):
            overlong_penalty(lengths, 20, bad)


def test_mask_truncated_zeroes_truncated_rows():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    out = mask_truncated(mask, torch.tensor([0.0, 1.0, 0.0]))
    assert out.dtype == mask.dtype
    assert out.tolist() == [[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]]
    assert mask_truncated(mask.bool(), torch.tensor([1.0, 0.0, 0.0])).tolist() == \
        [[False, False, False], [True, True, True], [True, False, False]]
