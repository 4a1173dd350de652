"""KL estimators and the adaptive coefficient, against hand-computed values."""
import math

import pytest
import torch

from vcppo.algos.kl import adaptive_kl_coef, kl_estimate, sequence_mean_kl


def test_each_estimator_hand_computed():
    lp = torch.tensor([[math.log(0.5)]])
    ref = torch.tensor([[math.log(0.25)]])
    x = math.log(2.0)  # log pi_theta - log pi_ref
    assert kl_estimate(lp, ref, "k1").item() == pytest.approx(x, rel=1e-6)
    assert kl_estimate(lp, ref, "k2").item() == pytest.approx(0.5 * x * x, rel=1e-6)
    assert kl_estimate(lp, ref, "k3").item() == pytest.approx(0.5 - 1 + x, rel=1e-6)  # pi_ref/pi = 0.5
    assert kl_estimate(lp, ref, "low_var_kl").item() == pytest.approx(0.5 - 1 + x, rel=1e-6)
    for est in ("k1", "k2", "k3", "low_var_kl"):
        assert kl_estimate(lp, lp, est).item() == 0.0
    with pytest.raises(ValueError, match="k4"):
        kl_estimate(lp, ref, "k4")


def test_low_var_kl_clamps_where_k3_explodes():
    lp = torch.tensor([[0.0, -30.0]])
    ref = torch.tensor([[-30.0, 0.0]])
    k3 = kl_estimate(lp, ref, "k3")
    low = kl_estimate(lp, ref, "low_var_kl")
    assert k3[0, 0].item() == pytest.approx(math.exp(-30) - 1 + 30, rel=1e-6)
    assert low[0, 0].item() == 10.0  # 29 clamped to 10
    assert k3[0, 1].item() > 1e12 and low[0, 1].item() == 10.0  # exp(30): log-ratio clamped, then the value


def test_the_loss_gradients_of_k1_k2_k3():
    """d/d logp of each estimator: k1 -> 1, k2 -> log_ratio, k3 -> 1 - pi_ref/pi."""
    ref = torch.tensor([math.log(0.25)])
    for est, expected in (("k1", 1.0), ("k2", math.log(2.0)), ("k3", 1 - 0.5)):
        lp = torch.tensor([math.log(0.5)], requires_grad=True)
        kl_estimate(lp, ref, est).sum().backward()
        assert lp.grad.item() == pytest.approx(expected, rel=1e-6), est


def test_on_policy_k2_and_k3_gradients_are_those_of_the_two_kls():
    """Exact expectations over a 3-token vocabulary: E_pi[grad k2] = grad KL(pi || ref) and
    E_pi[grad k3] = grad KL(ref || pi), with pi = softmax(theta)."""
    ref = torch.tensor([0.5, 0.3, 0.2])
    theta0 = torch.tensor([0.2, -0.1, 0.4])
    for est, kl_fn in (("k2", lambda p: (p * (p / ref).log()).sum()), ("k3", lambda p: (ref * (ref / p).log()).sum())):
        theta = theta0.clone().requires_grad_(True)
        logp = torch.log_softmax(theta, 0)
        p = logp.exp().detach()
        (p * kl_estimate(logp, ref.log(), est)).sum().backward()  # sum_a pi(a) * grad k(a), pi held fixed
        surrogate = theta.grad.clone()
        theta2 = theta0.clone().requires_grad_(True)
        kl_fn(torch.softmax(theta2, 0)).backward()
        assert torch.allclose(surrogate, theta2.grad, atol=1e-6), est


def test_sequence_mean_kl():
    kl = torch.tensor([[1.0, 3.0, 9.0], [2.0, 0.0, 0.0], [5.0, 5.0, 5.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    assert sequence_mean_kl(kl, mask).tolist() == [2.0, 2.0, 0.0]


def test_adaptive_coefficient_hand_computed():
    # observed above target: error 0.5 clipped to 0.2; 256 samples over a horizon of 10000
    assert adaptive_kl_coef(0.1, 0.3, 0.2, 10000, 256) == pytest.approx(0.1 * (1 + 0.2 * 256 / 10000))
    # below target: error 0.05 / 0.2 - 1 = -0.75 clipped to -0.2
    assert adaptive_kl_coef(0.1, 0.05, 0.2, 10000, 256) == pytest.approx(0.1 * (1 - 0.2 * 256 / 10000))
    # inside the band: proportional
    assert adaptive_kl_coef(0.1, 0.22, 0.2, 100, 10) == pytest.approx(0.1 * (1 + 0.1 * 10 / 100))
    assert adaptive_kl_coef(0.1, 0.2, 0.2, 100, 10) == 0.1
    with pytest.raises(ValueError):
        adaptive_kl_coef(0.1, 0.2, 0.0, 100, 10)


def test_the_controller_drives_a_simple_plant_to_its_target():
    """KL that falls as the coefficient rises (kl = 0.05 / coef): the coefficient settles where
    kl = target."""
    coef = 0.1
    for _ in range(400):
        coef = adaptive_kl_coef(coef, 0.05 / coef, target=0.2, horizon=1000, n_samples=64)
    assert 0.05 / coef == pytest.approx(0.2, rel=0.02)


def test_a_non_finite_kl_leaves_the_coefficient_as_it_is():
    for bad in (float("nan"), float("inf")):
        assert adaptive_kl_coef(0.1, bad, 0.2, 100, 10) == 0.1
