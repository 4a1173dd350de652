"""The critic-free estimators (RLOO, REINFORCE++, REINFORCE++-baseline), Dr. GRPO's aggregation and
GSPO's loss against hand-computed cases: groups in any order, padding, a truncated response (its
mask runs to the last position), a group whose rewards are all equal, a group of one sample."""
import math

import pytest
import torch

from vcppo.algos.estimators import group_mean, reinforce_pp_baseline_returns, returns_to_go, rloo_advantages
from vcppo.algos.gspo import gspo_loss, sequence_log_ratio
from vcppo.algos.losses import aggregate_loss, policy_loss
from vcppo.algos.stats import grpo_advantages

# rows:     0   1   2   3   4   5   6   7   8
GROUP = torch.tensor([7, 3, 7, 3, 7, 3, 9, 9, 4])  # groups interleaved; 9: all equal; 4: one sample
SCORES = torch.tensor([1., -1., 1., 1., -1., -1., 1., 1., 1.])
LENGTHS = [2, 4, 1, 3, 4, 2, 3, 1, 2]  # T = 4: rows 1 and 4 are truncated (no padding after them)
T = 4


def _mask() -> torch.Tensor:
    return (torch.arange(T)[None, :] < torch.tensor(LENGTHS)[:, None]).float()


def _rewards(kl: float = 0.0) -> torch.Tensor:
    """The outcome on each last token, minus ``kl`` on every response token; garbage on padding."""
    mask = _mask()
    r = torch.where(mask > 0, torch.full((9, T), -kl), torch.full((9, T), 123.0))
    r[torch.arange(9), torch.tensor(LENGTHS) - 1] += SCORES
    return r


def test_group_mean_in_any_order():
    mean, count = group_mean(SCORES, GROUP)
    assert mean.tolist() == pytest.approx([1 / 3, -1 / 3, 1 / 3, -1 / 3, 1 / 3, -1 / 3, 1, 1, 1])
    assert count.tolist() == [3, 3, 3, 3, 3, 3, 2, 2, 1]


def test_rloo_hand_computed():
    # group 7 (rows 0, 2, 4) = (1, 1, -1): the others' means 0, 0, 1 -> 1, 1, -2
    # group 3 (rows 1, 3, 5) = (-1, 1, -1): the others' means 0, -1, 0 -> -1, 2, -1
    # group 9 all equal -> 0, 0; group 4 alone -> 0
    adv = rloo_advantages(SCORES, GROUP)
    assert adv.tolist() == pytest.approx([1, -1, 1, 2, -2, -1, 0, 0, 0])
    # = n/(n-1) (R - mean): GRPO's centring without the std, scaled
    centred = grpo_advantages(SCORES, GROUP, scale_by_std=False)
    assert adv[:6].tolist() == pytest.approx((1.5 * centred[:6]).tolist())


def test_rloo_baseline_leaves_the_sample_out():
    """Changing a sample's own return moves only its advantage by the change (its baseline holds),
    and moves each other sample of the group by -change / (n - 1)."""
    bumped = SCORES.clone()
    bumped[0] += 0.6
    delta = rloo_advantages(bumped, GROUP) - rloo_advantages(SCORES, GROUP)
    assert delta.tolist() == pytest.approx([0.6, 0, -0.3, 0, -0.3, 0, 0, 0, 0], abs=1e-6)


def test_returns_to_go_hand_computed_with_a_token_kl():
    # kl 0.1 per token, outcome on the last: row 3 (length 3, s = 1): rewards (-.1, -.1, .9)
    # gamma 1: G = (.7, .8, .9, 0); row 1 (truncated, s = -1): (-1.4, -1.3, -1.2, -1.1)
    g = returns_to_go(_rewards(0.1), _mask(), gamma=1.0)
    assert g[3].tolist() == pytest.approx([0.7, 0.8, 0.9, 0.0], abs=1e-6)
    assert g[1].tolist() == pytest.approx([-1.4, -1.3, -1.2, -1.1], abs=1e-6)
    assert g[7].tolist() == pytest.approx([0.9, 0, 0, 0], abs=1e-6)
    # gamma 0.5, row 3: G2 = .9, G1 = -.1 + .45 = .35, G0 = -.1 + .175 = .075
    g = returns_to_go(_rewards(0.1), _mask(), gamma=0.5)
    assert g[3].tolist() == pytest.approx([0.075, 0.35, 0.9, 0.0], abs=1e-6)
    assert (g * (1 - _mask())).abs().sum() == 0  # padding (garbage rewards there) stays 0


def test_reinforce_pp_baseline_hand_computed():
    # baseline = the group's mean OUTCOME (KL not in it): group 7 1/3, group 3 -1/3, 9: 1, 4: 1
    a = reinforce_pp_baseline_returns(_rewards(0.1), _mask(), SCORES, GROUP, gamma=1.0)
    assert a[3].tolist() == pytest.approx([0.7 + 1 / 3, 0.8 + 1 / 3, 0.9 + 1 / 3, 0.0], abs=1e-6)
    assert a[4].tolist() == pytest.approx([-1.4 - 1 / 3, -1.3 - 1 / 3, -1.2 - 1 / 3, -1.1 - 1 / 3], abs=1e-6)
    # all-equal group and a group of one: only the KL is left; without KL every token gets 0
    assert a[6].tolist() == pytest.approx([-0.3, -0.2, -0.1, 0.0], abs=1e-6)
    assert a[8].tolist() == pytest.approx([-0.2, -0.1, 0, 0], abs=1e-6)
    plain = reinforce_pp_baseline_returns(_rewards(0.0), _mask(), SCORES, GROUP)
    assert plain[6:].abs().max() < 1e-6
    assert plain[0].tolist() == pytest.approx([2 / 3, 2 / 3, 0, 0], abs=1e-6)  # s - mean_g on every token


def test_dr_grpo_aggregation_hand_computed():
    loss_mat = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 9.0, 9.0], [0.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0]])  # a truncated row; an empty one
    # per sequence sum / C (C = 8): 10/8, 11/8; mean over the 2 sequences with tokens: 21/16
    assert aggregate_loss(loss_mat, mask, "seq-mean-token-sum-norm", norm_constant=8).item() == pytest.approx(21 / 16)
    # a global sequence count (several micro-batches) divides instead
    assert aggregate_loss(loss_mat, mask, "seq-mean-token-sum-norm", global_seq_count=4,
                          norm_constant=8).item() == pytest.approx(21 / 32)
    # no length bias: every token weighs 1 / (N_seq C), whatever its sequence's length
    x = torch.zeros(3, 4, requires_grad=True)
    aggregate_loss(x + loss_mat, mask, "seq-mean-token-sum-norm", norm_constant=8).backward()
    assert set(x.grad[mask.bool()].tolist()) == {1 / 16}
    with pytest.raises(ValueError, match="norm_constant"):
        aggregate_loss(loss_mat, mask, "seq-mean-token-sum-norm")


def _gspo_case():
    # seq 0: 2 tokens, log-ratios (0.2, 0.0) -> log s = 0.1; A = +1
    # seq 1: 3 tokens, log-ratios (-0.3, 0, 0) -> log s = -0.1; A = -1; position 3 masked garbage
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]], dtype=torch.bool)
    old = torch.full((2, 4), -1.0)
    logprobs = old + torch.tensor([[0.2, 0.0, 7.0, 7.0], [-0.3, 0.0, 0.0, 9.0]])
    adv = torch.tensor([[1.0, 1.0, float("nan"), 0.0], [-1.0, -1.0, -1.0, float("nan")]])
    return logprobs, old, adv, mask


def test_gspo_sequence_ratio_and_unclipped_loss_hand_computed():
    logprobs, old, adv, mask = _gspo_case()
    assert sequence_log_ratio(logprobs, old, mask).tolist() == pytest.approx([0.1, -0.1])
    lp = logprobs.clone().requires_grad_(True)
    loss, m = gspo_loss(lp, old, adv, mask, eps_low=0.2, eps_high=0.2)
    s0, s1 = math.exp(0.1), math.exp(-0.1)
    # each token of a sequence carries -A_i s_i; seq-mean-token-mean: (-s0 + s1) / 2
    assert loss.item() == pytest.approx((-s0 + s1) / 2, rel=1e-6)
    loss.backward()
    # d/d log pi_t = 1/G * 1/|y_i| * (-A_i s_i) = -A_i / G * d s_i / d log pi_t (GSPO's gradient)
    want = torch.tensor([[-s0 / 4, -s0 / 4, 0, 0], [s1 / 6, s1 / 6, s1 / 6, 0]])
    torch.testing.assert_close(lp.grad, want)
    assert m["ratio_mean"].item() == pytest.approx((s0 + s1) / 2, rel=1e-6)
    assert m["clip_frac_low"].item() == 0 and m["clip_frac_high"].item() == 0


def test_gspo_clips_whole_sequences():
    logprobs, old, adv, mask = _gspo_case()
    lp = logprobs.clone().requires_grad_(True)
    # eps 0.05: s0 = 1.105 > 1.05 with A > 0 -> -1.05 a token; s1 = 0.905 < 0.95 with A < 0 -> 0.95
    loss, m = gspo_loss(lp, old, adv, mask, eps_low=0.05, eps_high=0.05)
    assert loss.item() == pytest.approx((-1.05 + 0.95) / 2, rel=1e-6)
    loss.backward()
    assert lp.grad.abs().max() == 0  # every token of a clipped sequence is clipped
    assert m["clip_frac_high"].item() == 0.5 and m["clip_frac_low"].item() == 0.5
    # a PPO token ratio would clip token 0 of seq 0 alone (e^0.2 > 1.05) and leave token 1 free
    _, ppo = policy_loss(logprobs, old, torch.nan_to_num(adv), mask, eps_low=0.05, eps_high=0.05)
    assert 0 < ppo["clip_frac_high"].item() < 0.5


def test_gspo_on_policy_is_the_ppo_loss_with_sequence_mean_aggregation():
    """At ratio 1 (the first optimizer step from the sampling weights) the sequence ratio and the
    token ratios are all 1 with gradient 1 per token: GSPO's loss and gradient are PPO's."""
    _, old, adv, mask = _gspo_case()
    adv = torch.nan_to_num(adv) * torch.tensor([[1.0], [0.5]])
    grads = []
    for fn in (gspo_loss, policy_loss):
        lp = old.clone().requires_grad_(True)
        loss, _ = fn(lp, old, adv, mask, eps_low=3e-4, eps_high=4e-4, agg="seq-mean-token-mean")
        loss.backward()
        grads.append((loss.detach(), lp.grad))
    torch.testing.assert_close(grads[0][0], grads[1][0])
    torch.testing.assert_close(grads[0][1], grads[1][1])


def test_gspo_one_sequence_and_an_empty_one():
    old = torch.zeros(2, 3)
    lp = torch.tensor([[0.3, 0.0, 0.0], [5.0, 5.0, 5.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 1], [0, 0, 0]])
    loss, m = gspo_loss(lp, old, torch.ones(2, 3), mask, eps_low=0.5, eps_high=0.5)
    assert loss.item() == pytest.approx(-math.exp(0.1), rel=1e-6)  # the empty row is not a sequence
    assert m["ratio_max"].item() == pytest.approx(math.exp(0.1), rel=1e-6)
    loss.backward()
    assert torch.isfinite(lp.grad).all() and lp.grad[1].abs().sum() == 0


def test_gspo_defines_one_aggregation():
    _, old, adv, mask = _gspo_case()
    with pytest.raises(ValueError, match="seq-mean-token-mean"):
        gspo_loss(old, old, adv, mask, agg="token-mean")
