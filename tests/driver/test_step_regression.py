"""A fixed-number regression of one PPO update on the real DeepSpeed engines (tiny Qwen2 from a
seeded config, one rank, fp32 CPU): the critic's and the actor's losses and gradient norms after
the step plan's updates on a fixed rollout must stay what they were when this test was written.

A change that should not change behaviour (a refactor, a new option left off) keeps these; one
that does must explain the difference and update the numbers. Tolerance: rel 1e-4 — CPU hosts with
AVX2 and AVX-512 sum in different orders (~1e-6 relative apart); a real change of the math moves
these by far more."""
import dataclasses
from types import SimpleNamespace

import pytest
import torch

from vcppo.driver.step.update import estimate, returns_to_go
from vcppo.driver.step.step_plan import Source, StepPlan
from vcppo.driver.step.update import update_actor, update_critic
from vcppo.experience import ActorBatch, CriticBatch, Rollout, make_layout
from vcppo.config.schema import ActorConfig, AlgorithmConfig, CriticConfig

pytestmark = [pytest.mark.integration]

PLAN = StepPlan(phase="ppo", pi_old=Source.UPDATE, v_old=Source.UPDATE, entropy=Source.UPDATE, critic_first=True,
                kl_in_reward=False, kl_in_loss=False, actor_trains=True, lambda_critic=1.0, sampler_logprobs=False)

# Written on a 2-core AMD EPYC (Zen 4, AVX-512), torch 2.13.0+cpu, DeepSpeed 0.19.8.
EXPECTED = {
    "critic/value_loss@1": 0.5, "critic/grad_norm@1": 1.9527009725570679,
    "actor/pg_loss@1": 0.028168052434921265, "actor/grad_norm@1": 7.815482139587402,
    "values_sum@1": 0.0, "entropy_sum@1": 129.54026794433594,  # a fresh value head is zero
    "critic/value_loss@2": 0.48534052073955536, "critic/grad_norm@2": 1.9125480651855469,
    "actor/pg_loss@2": 0.02907564863562584, "actor/grad_norm@2": 5.946386337280273,
    "values_sum@2": 0.2927853763103485, "entropy_sum@2": 128.18191528320312,
}


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    from tests.engines.conftest import build_tiny_model
    return build_tiny_model(tmp_path_factory.mktemp("tiny_qwen2"), seed=0)


def _rollout() -> Rollout:
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(5, 60, (int(n),), generator=g).tolist() for n in (3, 5, 2, 4, 6, 3)]
    responses = [torch.randint(5, 60, (int(n),), generator=g).tolist() for n in (7, 2, 9, 4, 5, 8)]
    r = Rollout.unscored(make_layout(prompts, responses, pad_id=0))
    scores = torch.tensor([1.0, -1.0, 1.0, -1.0, -1.0, 1.0])
    rewards = torch.zeros_like(r.policy_mask)
    rewards[torch.arange(6), r.policy_mask.sum(1).long() - 1] = scores
    return dataclasses.replace(r, scores=scores, token_rewards=rewards, correct=(scores > 0).float(),
                               group=torch.tensor([0, 0, 1, 1, 2, 2]))


def one_step(info, model_dir) -> dict:
    from vcppo.engines.actor import ActorEngine
    from vcppo.engines.critic import CriticEngine
    alg = AlgorithmConfig(lambda_actor=0.95, lambda_critic=1.0, eps_high=0.28, positive_lm_coef=0.1)
    actor_cfg, critic_cfg = ActorConfig(lr=1e-3, micro_batch_size=4), CriticConfig(lr=1e-3, micro_batch_size=4)
    ctx = SimpleNamespace(cfg=SimpleNamespace(algorithm=alg, actor=actor_cfg, critic=critic_cfg,
                                              trainer=SimpleNamespace(seed=0)))
    ctx.actor = ActorEngine(model_dir, actor_cfg, info, total_optimizer_steps=4)
    ctx.critic = CriticEngine("policy", model_dir, critic_cfg, info, total_optimizer_steps=4)
    r = _rollout()
    out = {}
    for step in (1, 2):  # the second step sees a critic whose head the first one moved
        returns = returns_to_go(r.token_rewards, r.policy_mask, alg.gamma)
        critic = update_critic(ctx.cfg, ctx.critic, PLAN, CriticBatch(**vars(r), returns=returns), step)
        adv = estimate(r, r.token_rewards, critic.values, alg)
        actor = update_actor(ctx.cfg, ctx.actor, PLAN, ActorBatch(**vars(r), advantages=adv.advantages), step)
        for k in ("critic/value_loss", "critic/grad_norm"):
            out[f"{k}@{step}"] = critic.metrics[k]
        for k in ("actor/pg_loss", "actor/grad_norm"):
            out[f"{k}@{step}"] = actor.metrics[k]
        out[f"values_sum@{step}"] = float(critic.values.sum())
        out[f"entropy_sum@{step}"] = float(actor.entropy.sum())
    ctx.actor.close(), ctx.critic.close()
    return out


def test_one_step_keeps_its_numbers(info, tiny_model_dir):
    got = one_step(info, tiny_model_dir)
    assert set(got) == set(EXPECTED)
    for key, value in EXPECTED.items():
        assert got[key] == pytest.approx(value, rel=1e-4, abs=1e-7), key
