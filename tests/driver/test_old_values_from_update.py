"""One epoch of one critic mini-batch with lambda_critic = 1: the critic update's own forward, detached,
IS V_old, and the targets are the returns-to-go, so the step may skip the values pass and compute the
actor's advantages after the critic update. Real DeepSpeed engine (tiny Qwen2, one rank, fp32): the
skipped path gives the same value loss, gradient norm, clip fraction, weights after the step, old
values and actor advantages as the full one (rtol 1e-5 / atol 1e-6: eval vs train mode, no_grad vs
grad, and returns-to-go computed without the values' rounding; weights to 1e-3 of one AdamW step)."""
from types import SimpleNamespace

import pytest
import torch

from vcppo.driver.advantages import compute_advantages, returns_to_go
from vcppo.driver.update import old_values_from_update, pi_old_source, train_critic
from vcppo.experience import make_experience
from vcppo.schema import ActorConfig, AlgorithmConfig, CriticConfig

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    from tests.engines.conftest import build_tiny_model
    return build_tiny_model(tmp_path_factory.mktemp("tiny_qwen2"))


def _batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    b = make_experience([[5, 6], [7, 8, 9], [5], [9, 9, 8, 7], [6, 5]],
                        [[10, 11, 12], [13, 14], [20, 21, 22, 23], [15], [30, 31]], pad_id=0)
    mask = b.response_mask
    lengths = mask.sum(1).long()
    b.token_rewards = torch.zeros(mask.shape)
    b.token_rewards[torch.arange(5), lengths - 1] = torch.tensor([1.0, -1.0, 1.0, -1.0, -1.0])
    b.token_rewards -= 0.05 * torch.randn(mask.shape, generator=g) * mask  # a KL-like dense term
    return b


def test_the_rule():
    assert old_values_from_update(CriticConfig(), lambda_critic=1.0)
    assert not old_values_from_update(CriticConfig(), lambda_critic=0.95)  # the targets need V
    assert not old_values_from_update(CriticConfig(ppo_epochs=2), lambda_critic=1.0)
    assert not old_values_from_update(CriticConfig(ppo_mini_batches=2), lambda_critic=1.0)


def test_where_pi_old_comes_from():
    def ctx(kl: bool, from_sampler: bool, epochs: int = 1):
        cfg = SimpleNamespace(actor=ActorConfig(ppo_epochs=epochs),
                              algorithm=AlgorithmConfig(old_logprobs_from_sampler=from_sampler))
        return SimpleNamespace(cfg=cfg, reference=object() if kl else None)
    assert pi_old_source(ctx(kl=False, from_sampler=False)) == "update"  # exact and free: preferred
    assert pi_old_source(ctx(kl=False, from_sampler=True)) == "update"
    assert pi_old_source(ctx(kl=True, from_sampler=False)) == "pass"
    assert pi_old_source(ctx(kl=True, from_sampler=True)) == "sampler"
    assert pi_old_source(ctx(kl=False, from_sampler=False, epochs=2)) == "pass"


def test_returns_to_go_are_the_monte_carlo_targets():
    b = _batch()
    values = torch.randn(b.response_mask.shape) * b.response_mask
    from vcppo.algos.gae import decoupled_gae
    _, with_values = decoupled_gae(b.token_rewards, values, b.response_mask, gamma=0.9, lam_actor=0.95,
                                   lam_critic=1.0)
    torch.testing.assert_close(returns_to_go(b.token_rewards, b.response_mask, 0.9), with_values,
                               rtol=1e-5, atol=1e-6)


def test_skipping_the_values_pass_changes_no_loss_gradient_weight_or_advantage(info, tiny_model_dir):
    from vcppo.engines.critic import CriticEngine
    alg = AlgorithmConfig(lambda_actor=0.95, lambda_critic=1.0)
    critic_cfg = CriticConfig(lr=1e-2, micro_batch_size=2, value_clip=0.2)  # 3 micro-batches: stitching
    results = {}
    for path in ("full", "from_update"):
        critic = CriticEngine("policy", tiny_model_dir, critic_cfg, info, total_optimizer_steps=4)
        ctx = SimpleNamespace(cfg=SimpleNamespace(algorithm=alg, critic=critic_cfg, trainer=SimpleNamespace(seed=0)),
                              critic=critic)
        # A first, identical step moves the zero-initialised head: the compared step has real values.
        warm = _batch(seed=1)
        warm.old_values = critic.forward_values(warm)
        compute_advantages(warm, warm.token_rewards, alg)
        train_critic(ctx, warm, step=1)
        b = _batch()
        if path == "full":
            b.old_values = critic.forward_values(b)
            compute_advantages(b, b.token_rewards, alg)
            metrics = train_critic(ctx, b, step=2)
        else:
            b.returns = returns_to_go(b.token_rewards, b.response_mask, alg.gamma)
            metrics = train_critic(ctx, b, step=2)
            compute_advantages(b, b.token_rewards, alg, keep_returns=True)
        results[path] = (metrics, b, critic.full_state_dict())
        critic.close()
    (m_full, b_full, w_full), (m_upd, b_upd, w_upd) = results["full"], results["from_update"]
    tol = dict(rtol=1e-5, atol=1e-6)
    assert b_full.old_values.abs().max() > 0.01  # the warm-up step gave the compared step real values
    for field in ("old_values", "returns", "raw_advantages", "advantages"):
        torch.testing.assert_close(getattr(b_upd, field), getattr(b_full, field), **tol, msg=field)
    assert set(m_upd) == set(m_full)
    for key in m_full:  # value loss, clip fraction, grad norm, lr ...
        assert m_upd[key] == pytest.approx(m_full[key], rel=1e-5, abs=1e-6), key
    assert m_full["critic/grad_norm"] > 0
    for name, w in w_full.items():
        if name.endswith("k_proj.bias"):
            # Its true gradient is 0 (a bias on every key shifts all scores of a query equally, and
            # softmax ignores that); AdamW turns the ~1e-10 rounding noise into lr-sized steps.
            continue
        # AdamW's step is ~lr per element whatever the gradient's size, so rounding noise on a tiny
        # gradient moves a weight by up to ~1e-3 of lr: the weights are compared to that.
        torch.testing.assert_close(w_upd[name], w, rtol=1e-5, atol=1e-3 * critic_cfg.lr, msg=name)
