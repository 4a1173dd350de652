"""SAO's DIS loss (vcppo.algos.dis) against a hand computation, how it differs from PPO's clip on the
same tokens, and where the outcome reward of an episode sits (its last MODEL token)."""
import math

import pytest
import torch

from vcppo.algos.dis import dis_loss
from vcppo.algos.losses import policy_loss
from vcppo.experience import last_token_rewards

# sampler logprob log 0.5 everywhere; the policy's probabilities give ratios 0.1, 1, 2, 5 (and a padded 5th token)
MU = torch.log(torch.full((1, 5), 0.5))
PI = torch.log(torch.tensor([[0.05, 0.5, 1.0, 2.5, 123.0]]))
ADV = torch.tensor([[1.0, 2.0, -3.0, 1.0, 7.0]])
MASK = torch.tensor([[1, 1, 1, 1, 0]])


def test_dis_masks_both_sides_and_keeps_the_ratio_inside_by_hand():
    logprobs = PI.clone().requires_grad_(True)
    loss, m = dis_loss(logprobs, MU, ADV, MASK, eps_low=0.8, eps_high=3.0)  # region [0.2, 4.0]
    # r = [0.1 (out, low), 1 (in), 2 (in), 5 (out, high)]: l = [0, -2*1, -(-3)*2, 0] -> mean over 4 tokens
    assert loss.item() == pytest.approx((0.0 - 2.0 + 6.0 + 0.0) / 4)
    loss.backward()
    # d l_t / d log pi_t = -A_t r_t inside, 0 outside (and at the padded token)
    assert logprobs.grad[0].tolist() == pytest.approx([0.0, -2.0 / 4, 6.0 / 4, 0.0, 0.0])
    assert m["clip_frac_low"].item() == pytest.approx(0.25) and m["clip_frac_high"].item() == pytest.approx(0.25)
    assert m["ratio_max"].item() == pytest.approx(5.0)
    k3 = [(r - 1) - math.log(r) for r in (0.1, 1.0, 2.0, 5.0)]
    assert m["approx_kl"].item() == pytest.approx(sum(k3) / 4, rel=1e-5)


def test_dis_differs_from_ppos_clip_on_the_same_tokens():
    """PPO's clip (0.2) keeps the gradient of the A > 0 token whose ratio fell to 0.1 (the unclipped
    term is the larger loss) and cuts the A < 0 token at r = 2; DIS keeps the second and masks the first."""
    dis_lp, ppo_lp = PI.clone().requires_grad_(True), PI.clone().requires_grad_(True)
    dis_loss(dis_lp, MU, ADV, MASK, eps_low=0.8, eps_high=3.0)[0].backward()
    policy_loss(ppo_lp, MU, ADV, MASK, eps_low=0.2, eps_high=0.2)[0].backward()
    assert ppo_lp.grad[0, 0].item() == pytest.approx(-0.1 / 4) and dis_lp.grad[0, 0].item() == 0.0
    assert ppo_lp.grad[0, 2].item() == pytest.approx(6.0 / 4)  # A < 0, r = 2 > 1.2: PPO's max picks r, no clip
    assert dis_lp.grad[0, 2].item() == pytest.approx(6.0 / 4)


def test_dis_refuses_tis_weights_and_a_dual_clip():
    with pytest.raises(ValueError, match="rollout_is_cap"):
        dis_loss(PI, MU, ADV, MASK, is_weights=torch.ones_like(PI))
    with pytest.raises(ValueError, match="dual_clip_c"):
        dis_loss(PI, MU, ADV, MASK, dual_clip_c=3.0)


def test_an_episodes_reward_sits_on_its_last_model_token_not_on_a_trailing_observation():
    # turn 1 (2 tokens), an observation (2), turn 2 (1 token), the env's closing observation (2), padding (1)
    mask = torch.tensor([[1, 1, 0, 0, 1, 0, 0, 0]])
    rewards = last_token_rewards(torch.tensor([1.0]), mask)
    assert rewards.tolist() == [[0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]]
