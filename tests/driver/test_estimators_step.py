"""Each advantage estimator and policy loss through the real driver step on fake engines (milliseconds):
the registry names the same estimators everywhere, a critic-free estimator plans no critic pass,
the actor trains on the estimator's hand-computable advantages, VAPO's length-adaptive lambda
reaches the advantages, and the new losses split over micro-batches exactly."""
import dataclasses
import math

import pytest
import torch

from tests.fakes import FakeRun, scored, scripted_source
from vcppo.algos import losses
from vcppo.algos.gae import gae_reference
from vcppo.algos.stats import masked_whiten
from vcppo.config.load import load_config
from vcppo.algos.gae import decoupled_gae
from vcppo.driver.step.update import critic_targets, estimate
from vcppo.driver.state import RunState
from vcppo.driver.step.step_plan import Source, ppo_plan
from vcppo.driver.step.rl_step import rl_step
from vcppo.driver.step.update import PolicyLoss
from vcppo.engines.loss_contract import GlobalCounts, ModelOutputs
from vcppo.experience import ActorBatch
from vcppo.methods import ESTIMATORS, POLICY_LOSSES, estimator_fn
from vcppo.config.schema import AlgorithmConfig

CPU = torch.device("cpu")
ROLLOUT = [[1, -1, 1], [1, 1, 1], [-1, 1, -1]]  # group 1: all equal
LENGTHS = [2, 5, 3, 4, 1, 5, 3, 2, 4]
NEW_PRESETS = ["rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "drgrpo", "gspo"]


def test_one_registry_of_names():
    assert all(callable(estimator_fn(name)) for name in ESTIMATORS)
    fields = {f.name: f for f in dataclasses.fields(AlgorithmConfig)}
    assert set(fields["advantage_estimator"].metadata["choices"]) == set(ESTIMATORS)
    assert set(fields["policy_loss"].metadata["choices"]) == set(POLICY_LOSSES)
    assert set(fields["loss_agg"].metadata["choices"]) == set(losses.AGGREGATIONS)
    assert all(e.source for e in ESTIMATORS.values()) and all(p.source for p in POLICY_LOSSES.values())


def step_with(rollout=None, **overrides):
    """One PPO step on fake engines; (the actor's training batch, metrics, plan)."""
    run = FakeRun(**{"rollout.n_samples_per_prompt": 3, **overrides})
    seen = {}
    train_step = run.actor.train_step
    run.actor.train_step = lambda mb, loss: seen.setdefault("actor", mb) and train_step(mb, loss)
    plan = ppo_plan(run.cfg, CPU)
    rollout = rollout or scored(ROLLOUT, lengths=LENGTHS)
    m = rl_step(run, scripted_source(run, [rollout], logprobs=plan.sampler_logprobs), plan, RunState(phase="ppo"),
                step=1)
    return seen["actor"], m, plan, run


def _preset_overrides(name: str) -> dict:
    """The algorithm section of a shipped preset, as FakeRun overrides."""
    alg = load_config(name).algorithm
    keys = ("advantage_estimator", "policy_loss", "loss_agg", "whiten_advantages", "zero_mean_advantages",
            "grpo_scale_by_std", "eps_low", "eps_high", "kl_coef", "kl_in", "kl_estimator")
    return {f"algorithm.{k}": getattr(alg, k) for k in keys}


def _mask():
    return (torch.arange(5)[None, :] < torch.tensor(LENGTHS)[:, None]).float()


SCORES = torch.tensor([s for g in ROLLOUT for s in g], dtype=torch.float32)


def _expected(preset: str, batch: ActorBatch) -> torch.Tensor:
    """Each estimator's advantages, by hand, from the scores and lengths (KL: the fake reference is
    the actor, so the penalty is 0)."""
    mask = _mask()
    if preset == "rloo":
        # group 0 (1, -1, 1): others' means 0, 1, 0 -> 1, -2, 1; group 1 all equal -> 0;
        # group 2 (-1, 1, -1) -> -1, 2, -1
        return torch.tensor([1., -2, 1, 0, 0, 0, -1, 2, -1])[:, None] * mask
    # group 0 (1, -1, 1): mean 1/3, centred (2/3, -4/3, 2/3); group 2 its negative; group 1: 0
    centred = torch.tensor([2 / 3, -4 / 3, 2 / 3, 0, 0, 0, -2 / 3, 4 / 3, -2 / 3])[:, None] * mask
    if preset == "drgrpo":  # the group-centred score, no std
        return centred
    if preset == "gspo":  # GRPO's: centred / (unbiased group std + 1e-6); std = sqrt((4 + 16 + 4) / 9 / 2)
        return centred / (math.sqrt(4 / 3) + 1e-6)
    if preset == "reinforce_plus_plus":  # every token's return is the score; whitened over tokens
        return masked_whiten(SCORES[:, None] * mask, mask)
    if preset == "reinforce_plus_plus_baseline":  # score - group mean on every token; whitened
        return masked_whiten(centred, mask)
    raise AssertionError(preset)


@pytest.mark.parametrize("preset", NEW_PRESETS)
def test_each_critic_free_preset_trains_the_actor_on_its_advantages(preset):
    batch, m, plan, run = step_with(**_preset_overrides(preset))
    assert plan.v_old is Source.NONE and run.critic is None and "no critic" in plan.describe()
    assert not any(k.startswith("critic/") for k in m)
    torch.testing.assert_close(batch.advantages, _expected(preset, batch), rtol=1e-5, atol=1e-6)
    assert "actor/pg_loss" in m and math.isfinite(m["actor/pg_loss"])
    if preset.startswith("reinforce"):  # the token-level KL in the reward: a reference pass
        assert plan.kl_in_reward and "reference:forward" in run.calls and m["reward/kl_penalty"] == 0.0


def test_reinforce_pp_carries_the_token_kl_in_its_returns():
    """A reference 0.3 below the actor (k1 = 0.3 a token, coefficient 0.01): each token's return
    is the score minus 0.003 per token from it to the end, before the global normalisation."""
    run_overrides = _preset_overrides("reinforce_plus_plus")
    run = FakeRun(**{"rollout.n_samples_per_prompt": 3, **run_overrides})
    run.reference.offset = 0.3
    plan = ppo_plan(run.cfg, CPU)
    source = scripted_source(run, [scored(ROLLOUT, lengths=LENGTHS)], logprobs=plan.sampler_logprobs)
    seen = {}
    train_step = run.actor.train_step
    run.actor.train_step = lambda mb, loss: seen.setdefault("actor", mb) and train_step(mb, loss)
    rl_step(run, source, plan, RunState(phase="ppo"), step=1)
    mask = _mask()
    to_end = mask.flip(-1).cumsum(-1).flip(-1) * mask  # tokens from t to the end
    raw = (SCORES[:, None] - 0.01 * 0.3 * to_end) * mask
    torch.testing.assert_close(seen["actor"].advantages, masked_whiten(raw, mask), rtol=1e-5, atol=1e-5)


def test_vapo_length_adaptive_lambda_reaches_the_advantages():
    """VAPO's call site: the advantages the actor trains on differ from the same step with the
    length-adaptive lambda off, and equal GAE at lambda_i = 1 - 1 / (alpha * l_i) per sequence
    (clamped to [0.5, 0.999]), whitened."""
    lengths = [30, 45, 60, 80, 100, 120]
    vapo = {"algorithm.length_adaptive_lambda": True, "algorithm.length_adaptive_alpha": 0.05,
            "algorithm.eps_high": 0.28, "rollout.n_samples_per_prompt": 2}
    rollout = scored([[1, -1], [-1, 1], [1, 1]], lengths=lengths)
    on, m_on, plan, _ = step_with(rollout, **vapo)
    off, _, _, _ = step_with(rollout, **{**vapo, "algorithm.length_adaptive_lambda": False})
    assert plan.critic_first and plan.v_old is Source.UPDATE  # V_old: the critic update's own forward
    assert (on.advantages - off.advantages).abs().max() > 1e-2
    mask = rollout.policy_mask
    values = 0.01 * torch.arange(mask.shape[1], dtype=torch.float32)[None, :] * mask  # the fake critic's
    rows = []
    for i, n in enumerate(lengths):
        lam = min(max(1 - 1 / (0.05 * n), 0.5), 0.999)  # 30 tokens: 0.333 -> 0.5; 120: 0.8333
        rows.append(gae_reference(rollout.token_rewards[i:i + 1], values[i:i + 1], mask[i:i + 1], 1.0, lam)[0])
    torch.testing.assert_close(on.advantages, masked_whiten(torch.cat(rows), mask), rtol=1e-4, atol=1e-5)
    lam_095 = gae_reference(rollout.token_rewards, values, mask, 1.0, 0.95)[0]
    torch.testing.assert_close(off.advantages, masked_whiten(lam_095, mask), rtol=1e-4, atol=1e-5)


def test_estimate_keeps_gae_and_grpo():
    """The dispatch leaves the shipped estimators' arithmetic as it was (decoupled GAE; GRPO's)."""
    r = scored(ROLLOUT, lengths=LENGTHS)
    values = 0.1 * r.policy_mask
    alg = AlgorithmConfig(lambda_actor=0.9)
    adv = estimate(r, r.token_rewards, values, alg)
    raw, _ = gae_reference(r.token_rewards, values, r.policy_mask, 1.0, 0.9)
    torch.testing.assert_close(adv.raw_advantages, raw, rtol=1e-5, atol=1e-6)
    assert adv.lambda_actor is None
    _, targets = gae_reference(r.token_rewards, values, r.policy_mask, 1.0, 1.0)  # the critic's, lambda_critic 1
    torch.testing.assert_close(critic_targets(r, r.token_rewards, values, alg, 1.0), targets, rtol=1e-5, atol=1e-6)
    joint = decoupled_gae(r.token_rewards, values, r.policy_mask, 1.0, lam_actor=0.9, lam_critic=0.8)[1]
    assert torch.equal(critic_targets(r, r.token_rewards, values, alg, 0.8), joint)  # the bits of a joint call
    g = estimate(r, r.token_rewards, None, AlgorithmConfig(advantage_estimator="grpo", whiten_advantages=False))
    assert torch.equal(g.advantages, g.raw_advantages)


def _actor_batch(seed=0):
    from tests.driver.test_update import _batch
    return _batch(seed)


@pytest.mark.parametrize("alg", [
    AlgorithmConfig(policy_loss="gspo", loss_agg="seq-mean-token-mean", eps_low=0.05, eps_high=0.05,
                    entropy_coef=0.01, rollout_is_cap=1.5),
    AlgorithmConfig(loss_agg="seq-mean-token-sum-norm", positive_lm_coef=0.1, dual_clip_c=3.0),
])
def test_new_losses_split_over_micro_batches_exactly(alg):
    """With the engine's global counts, the micro-batches' losses (and gradients) add up to the
    whole mini-batch's: ranks and gradient accumulation leave GSPO and Dr. GRPO's loss unchanged."""
    from tests.driver.test_update import _loss_of
    loss = PolicyLoss(alg, norm=16.0)
    b = _actor_batch()
    counts = GlobalCounts.over_ranks(loss.count_masks(b))
    base = b.old_logprobs + 0.1 * torch.randn(b.policy_mask.shape, generator=torch.Generator().manual_seed(1))
    full_params = base.clone().requires_grad_(True)
    full = _loss_of(loss, b, full_params, counts)
    full.backward()
    parts_params = base.clone().requires_grad_(True)
    total = sum(_loss_of(loss, b.select(idx), parts_params[idx], counts) for idx in ([0, 1], [2], [3, 4, 5]))
    total.backward()
    torch.testing.assert_close(total, full, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(parts_params.grad, full_params.grad, rtol=1e-6, atol=1e-7)
    _, metrics = loss(ModelOutputs(logprobs=base * b.policy_mask, entropy=base.abs() * b.policy_mask), b, counts)
    assert {"actor/clip_frac_low", "actor/clip_frac_high", "actor/approx_kl", "actor/pg_loss"} <= set(metrics)
