"""The step plan's shortcuts on the real DeepSpeed engine (tiny Qwen2, one rank, fp32).

With one epoch of one mini-batch the update's forward runs on the weights of before the step, so
its detached outputs ARE pi_old (actor) and V_old (critic): skipping the separate pass must give the
same loss, gradient norm, weights after the step, old logprobs / values, entropies and actor
advantages as running it. Tolerance rtol 1e-5 / atol 1e-6 (eval vs train mode, no_grad vs grad:
the same kernels; returns-to-go computed without the values' rounding); weights to 1e-3 of one
AdamW step where a near-zero gradient's rounding noise is amplified to an lr-sized step."""
import dataclasses
from types import SimpleNamespace

import pytest
import torch

from vcppo.algos.gae import decoupled_gae
from vcppo.driver.step.update import critic_targets, estimate, returns_to_go
from vcppo.driver.step.step_plan import Source, StepPlan
from vcppo.driver.step.update import update_actor, update_critic
from vcppo.experience import ActorBatch, CriticBatch, Rollout, make_layout
from vcppo.config.schema import ActorConfig, AlgorithmConfig, CriticConfig

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PLAN = StepPlan(phase="ppo", pi_old=Source.UPDATE, v_old=Source.UPDATE, entropy=Source.UPDATE, critic_first=True,
                kl_in_reward=False, kl_in_loss=False, actor_trains=True, lambda_critic=1.0, sampler_logprobs=True)
PASSES = dataclasses.replace(PLAN, pi_old=Source.PASS, v_old=Source.PASS, entropy=Source.PASS, critic_first=False)


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    from tests.engines.conftest import build_tiny_model
    return build_tiny_model(tmp_path_factory.mktemp("tiny_qwen2"))


def _rollout(seed: int = 0) -> tuple[Rollout, torch.Tensor]:
    """A rollout and its per-token rewards (the outcome at the last token and a KL-like dense term)."""
    g = torch.Generator().manual_seed(seed)
    r = Rollout.unscored(make_layout([[5, 6], [7, 8, 9], [5], [9, 9, 8, 7], [6, 5]],
                                     [[10, 11, 12], [13, 14], [20, 21, 22, 23], [15], [30, 31]], pad_id=0))
    mask = r.policy_mask
    r = dataclasses.replace(r, correct=torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0]),
                            sampler_logprobs=-torch.rand(mask.shape, generator=g) * 4 * mask)  # TIS weights bite
    rewards = torch.zeros(mask.shape)
    rewards[torch.arange(5), mask.sum(1).long() - 1] = torch.tensor([1.0, -1.0, 1.0, -1.0, -1.0])
    return r, rewards - 0.05 * torch.randn(mask.shape, generator=g) * mask


def _ctx(**parts):
    cfg = SimpleNamespace(algorithm=parts.pop("alg"), actor=parts.pop("actor_cfg", None),
                          critic=parts.pop("critic_cfg", None), trainer=SimpleNamespace(seed=0))
    return SimpleNamespace(cfg=cfg, **parts)


def test_returns_to_go_are_the_monte_carlo_targets():
    r, rewards = _rollout()
    values = torch.randn(r.policy_mask.shape) * r.policy_mask
    _, with_values = decoupled_gae(rewards, values, r.policy_mask, gamma=0.9, lam_actor=0.95, lam_critic=1.0)
    torch.testing.assert_close(returns_to_go(rewards, r.policy_mask, 0.9), with_values, rtol=1e-5, atol=1e-6)


def test_pi_old_from_the_actor_update_changes_no_loss_gradient_or_weight(info, tiny_model_dir):
    from vcppo.engines.actor import ActorEngine
    alg = AlgorithmConfig(rollout_is_cap=1.5, entropy_coef=0.0, positive_lm_coef=0.1)
    actor_cfg = ActorConfig(lr=1e-2, micro_batch_size=2)  # 3 micro-batches: the stitching is tested
    advantages = torch.randn(5, 4, generator=torch.Generator().manual_seed(0))
    results = {}
    for plan in (PASSES, PLAN):
        actor = ActorEngine(tiny_model_dir, actor_cfg, info, total_optimizer_steps=4, temperature=0.7)
        r, _ = _rollout()
        old = entropy = None
        if plan.pi_old is Source.PASS:
            old, entropy = actor.forward_logprobs(r, with_entropy=True)
        batch = ActorBatch(**vars(r), advantages=advantages * r.policy_mask, old_logprobs=old)
        out = update_actor(_ctx(alg=alg, actor_cfg=actor_cfg).cfg, actor, plan, batch, step=1)
        results[plan.pi_old] = (out.metrics, old if old is not None else out.logprobs,
                                entropy if entropy is not None else out.entropy, actor.full_state_dict())
        actor.close()
    (m_full, lp_full, ent_full, w_full), (m_upd, lp_upd, ent_upd, w_upd) = results[Source.PASS], results[Source.UPDATE]
    tol = dict(rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(lp_upd, lp_full, **tol)
    torch.testing.assert_close(ent_upd, ent_full, **tol)
    assert set(m_upd) == set(m_full)
    for key in m_full:  # pg_loss, grad_norm, clip fractions, approx_kl (0: the ratio is 1), ...
        assert m_upd[key] == pytest.approx(m_full[key], rel=1e-5, abs=1e-6), key
    assert m_full["actor/grad_norm"] > 0 and m_full["actor/nonfinite_skipped"] == 0 and m_full["actor/lr"] > 0
    for name, w in w_full.items():
        torch.testing.assert_close(w_upd[name], w, **tol)


def test_pi_old_from_the_sampler_still_reports_the_entropy(info, tiny_model_dir):
    """``algorithm.old_logprobs_from_sampler``: no old-logprobs pass, so the update's own entropies
    are the step's (the metric users watch), and the sampler's logprobs are pi_old."""
    from vcppo.engines.actor import ActorEngine
    alg = AlgorithmConfig(old_logprobs_from_sampler=True)
    actor_cfg = ActorConfig(lr=1e-2, micro_batch_size=2)
    actor = ActorEngine(tiny_model_dir, actor_cfg, info, total_optimizer_steps=4, temperature=0.7)
    r, _ = _rollout()
    _, expected_entropy = actor.forward_logprobs(r, with_entropy=True)
    plan = dataclasses.replace(PLAN, pi_old=Source.SAMPLER, kl_in_reward=True)
    batch = ActorBatch(**vars(r), advantages=torch.ones_like(r.policy_mask), old_logprobs=r.sampler_logprobs)
    out = update_actor(_ctx(alg=alg, actor_cfg=actor_cfg).cfg, actor, plan, batch, step=1)
    actor.close()
    assert out.logprobs is None  # pi_old is the sampler's, not the update's
    torch.testing.assert_close(out.entropy, expected_entropy, rtol=1e-5, atol=1e-6)
    assert out.metrics["actor/grad_norm"] > 0


def test_v_old_from_the_critic_update_changes_no_loss_gradient_weight_or_advantage(info, tiny_model_dir):
    from vcppo.engines.critic import CriticEngine
    alg = AlgorithmConfig(lambda_actor=0.95, lambda_critic=1.0)
    critic_cfg = CriticConfig(lr=1e-2, micro_batch_size=2, value_clip=0.2)  # 3 micro-batches: stitching
    results = {}
    for plan in (PASSES, PLAN):
        critic = CriticEngine("policy", tiny_model_dir, critic_cfg, info, total_optimizer_steps=4)
        ctx = _ctx(alg=alg, critic_cfg=critic_cfg, critic=critic)
        # A first, identical step moves the zero-initialised head: the compared step has real values.
        warm, warm_rewards = _rollout(seed=1)
        warm_values = critic.forward_values(warm)
        warm_returns = critic_targets(warm, warm_rewards, warm_values, alg, 1.0)
        update_critic(ctx.cfg, ctx.critic, PASSES,
                      CriticBatch(**vars(warm), returns=warm_returns, old_values=warm_values), step=1)
        r, rewards = _rollout()
        if plan.v_old is Source.PASS:
            values = critic.forward_values(r)
            returns = critic_targets(r, rewards, values, alg, 1.0)
            out = update_critic(ctx.cfg, ctx.critic, plan,
                                CriticBatch(**vars(r), returns=returns, old_values=values), step=2)
        else:
            returns = returns_to_go(rewards, r.policy_mask, alg.gamma)
            out = update_critic(ctx.cfg, ctx.critic, plan, CriticBatch(**vars(r), returns=returns), step=2)
            values = out.values
        adv = estimate(r, rewards, values, alg)
        results[plan.v_old] = (out.metrics, values, (adv, returns), critic.full_state_dict())
        critic.close()
    (m_full, v_full, a_full, w_full), (m_upd, v_upd, a_upd, w_upd) = results[Source.PASS], results[Source.UPDATE]
    tol = dict(rtol=1e-5, atol=1e-6)
    assert v_full.abs().max() > 0.01  # the warm-up step gave the compared step real values
    torch.testing.assert_close(v_upd, v_full, **tol)
    torch.testing.assert_close(a_upd[1], a_full[1], **tol, msg="returns")
    for field in ("raw_advantages", "advantages"):
        torch.testing.assert_close(getattr(a_upd[0], field), getattr(a_full[0], field), **tol, msg=field)
    assert set(m_upd) == set(m_full)
    for key in m_full:  # value loss, clip fraction, grad norm, lr ...
        assert m_upd[key] == pytest.approx(m_full[key], rel=1e-5, abs=1e-6), key
    assert m_full["critic/grad_norm"] > 0
    for name, w in w_full.items():
        if name.endswith("k_proj.bias"):
            # Its true gradient is 0 (a bias on every key shifts all scores of a query equally, and
            # softmax ignores that); AdamW turns the ~1e-10 rounding noise into lr-sized steps.
            continue
        # AdamW divides each gradient by its own running scale, so an element whose gradient is small turns
        # float rounding into ~1e-3 lr of weight (1.3e-3 seen on an AVX2 host); a wrong V_old moves weights by ~lr.
        torch.testing.assert_close(w_upd[name], w, rtol=1e-5, atol=1e-2 * critic_cfg.lr, msg=name)
