"""One epoch of one mini-batch: the actor update's own forward, detached, IS pi_old, so the step may
skip the old-logprobs pass. Real DeepSpeed engine (tiny Qwen2, one rank, fp32): the skipped path
gives the same loss, gradient norm, weights after the step, old logprobs and entropies as the full
one. Tolerance: rtol 1e-5 / atol 1e-6 (the two forwards run in eval vs train mode, no_grad vs grad:
the same kernels, so in practice the figures agree to float rounding)."""
from types import SimpleNamespace

import pytest
import torch

from vcppo.driver.update import old_logprobs_from_update, train_actor
from vcppo.experience import make_experience
from vcppo.schema import ActorConfig, AlgorithmConfig

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    from tests.engines.conftest import build_tiny_model
    return build_tiny_model(tmp_path_factory.mktemp("tiny_qwen2"))


def _batch():
    g = torch.Generator().manual_seed(0)
    b = make_experience([[5, 6], [7, 8, 9], [5], [9, 9, 8, 7], [6, 5]],
                        [[10, 11, 12], [13, 14], [20, 21, 22, 23], [15], [30, 31]], pad_id=0)
    mask = b.response_mask
    b.advantages = torch.randn(mask.shape, generator=g) * mask
    b.sampler_logprobs = -torch.rand(mask.shape, generator=g) * 4 * mask  # far off: TIS weights bite
    b.correct = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0])
    return b


def test_the_rule():
    assert old_logprobs_from_update(ActorConfig(), kl_in_reward=False)
    assert not old_logprobs_from_update(ActorConfig(), kl_in_reward=True)
    assert not old_logprobs_from_update(ActorConfig(ppo_epochs=2), kl_in_reward=False)
    assert not old_logprobs_from_update(ActorConfig(ppo_mini_batches=2), kl_in_reward=False)


def test_skipping_the_old_logprobs_pass_changes_no_loss_gradient_or_weight(info, tiny_model_dir):
    from vcppo.engines.actor import ActorEngine
    alg = AlgorithmConfig(rollout_is_cap=1.5, entropy_coef=0.0, positive_lm_coef=0.1)
    actor_cfg = ActorConfig(lr=1e-2, micro_batch_size=2)  # 3 micro-batches: the stitching is tested
    results = {}
    for path in ("full", "from_update"):
        actor = ActorEngine(tiny_model_dir, actor_cfg, info, total_optimizer_steps=4, temperature=0.7)
        ctx = SimpleNamespace(cfg=SimpleNamespace(algorithm=alg, actor=actor_cfg, trainer=SimpleNamespace(seed=0)),
                              actor=actor, reference=None)
        b = _batch()
        if path == "full":
            b.old_logprobs, b.entropy = actor.forward_logprobs(b, with_entropy=True)
        metrics = train_actor(ctx, b, step=1)
        results[path] = (metrics, b.old_logprobs, b.entropy, actor.full_state_dict())
        actor.close()
    (m_full, lp_full, ent_full, w_full), (m_upd, lp_upd, ent_upd, w_upd) = results["full"], results["from_update"]
    tol = dict(rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(lp_upd, lp_full, **tol)
    torch.testing.assert_close(ent_upd, ent_full, **tol)
    assert set(m_upd) == set(m_full)
    for key in m_full:  # pg_loss, grad_norm, clip fractions, approx_kl (0: the ratio is 1), ...
        assert m_upd[key] == pytest.approx(m_full[key], rel=1e-5, abs=1e-6), key
    assert m_full["actor/grad_norm"] > 0 and m_full["actor/nonfinite_skipped"] == 0
    for name, w in w_full.items():
        torch.testing.assert_close(w_upd[name], w, **tol)
    assert m_full["actor/lr"] > 0


def test_pi_old_from_the_sampler_still_logs_the_entropy(info, tiny_model_dir):
    """``algorithm.old_logprobs_from_sampler``: the step runs no old-logprobs pass, so the update's own
    entropies fill ``batch.entropy`` (the metric users watch), and the sampler's logprobs are pi_old."""
    from vcppo.engines.actor import ActorEngine
    alg = AlgorithmConfig(old_logprobs_from_sampler=True)
    actor_cfg = ActorConfig(lr=1e-2, micro_batch_size=2)
    actor = ActorEngine(tiny_model_dir, actor_cfg, info, total_optimizer_steps=4, temperature=0.7)
    ctx = SimpleNamespace(cfg=SimpleNamespace(algorithm=alg, actor=actor_cfg, trainer=SimpleNamespace(seed=0)),
                          actor=actor, reference=object())
    b = _batch()
    _, expected_entropy = actor.forward_logprobs(b, with_entropy=True)
    b.old_logprobs = b.sampler_logprobs
    metrics = train_actor(ctx, b, step=1)
    actor.close()
    assert b.old_logprobs is b.sampler_logprobs
    torch.testing.assert_close(b.entropy, expected_entropy, rtol=1e-5, atol=1e-6)
    assert metrics["actor/grad_norm"] > 0
