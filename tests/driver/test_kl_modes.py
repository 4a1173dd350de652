"""Where the KL to the reference lands (the reward or the actor's loss), with which coefficient,
and the adaptive controller's coefficient across steps: the real driver step on fake engines,
checked against hand-computed numbers."""
import pytest
import torch

from tests.fakes import FakeRun, scored, scripted_source
from vcppo.algos import losses
from vcppo.algos.kl import adaptive_kl_coef, kl_estimate
from vcppo.config.load import load_config
from vcppo.driver.state import RunState
from vcppo.driver.step.step_plan import Source, ppo_plan
from vcppo.driver.step.rl_step import rl_step
from vcppo.driver.step.update import PolicyLoss
from vcppo.engines.loss_contract import RESPONSE, GlobalCounts, ModelOutputs
from vcppo.experience import ActorBatch, Rollout, make_layout
from vcppo.config.schema import AlgorithmConfig
from vcppo.errors import ConfigError

CPU = torch.device("cpu")
ROLLOUT = [[1, -1], [1, 1], [-1, 1], [-1, -1]]
REF_OFFSET = 0.3  # the fake reference's logprobs sit 0.3 below the actor's: log-ratio 0.3 at every token


def step_with(state=None, **overrides):
    """One PPO step; what the critic and the actor trained on, the metrics, the state."""
    run = FakeRun(**overrides)
    run.reference.offset = REF_OFFSET
    seen = {}
    for name in ("critic", "actor"):
        engine = getattr(run, name)
        if engine is None:
            continue
        engine = getattr(engine, "engine", engine)  # the critic side's engine
        train_step = engine.train_step
        engine.train_step = (lambda ts, key: lambda mb, loss: seen.setdefault(key, mb) and ts(mb, loss))(train_step, name)
    plan = ppo_plan(run.cfg, CPU)
    state = state or RunState(phase="ppo")
    m = rl_step(run, scripted_source(run, [scored(ROLLOUT)], logprobs=plan.sampler_logprobs), plan, state, step=1)
    return seen, m, state, plan


def test_the_plans_of_the_two_places():
    reward = ppo_plan(load_config("vcppo", ["algorithm.kl_coef=0.1"]), CPU)
    loss = ppo_plan(load_config("vcppo", ["algorithm.kl_coef=0.1", "algorithm.kl_in=loss"]), CPU)
    assert (reward.kl_in_reward, reward.kl_in_loss, reward.pi_old) == (True, False, Source.PASS)
    # in the loss the KL reads the update's own logprobs: pi_old stays the update's, no extra pass
    assert (loss.kl_in_reward, loss.kl_in_loss, loss.pi_old) == (False, True, Source.UPDATE)
    assert reward.reference_pass and loss.reference_pass and "in the actor's loss" in loss.describe()
    off = ppo_plan(load_config("vcppo", ["algorithm.kl_in=loss"]), CPU)
    assert not off.reference_pass  # kl_coef 0: no reference engine, no pass


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3", "low_var_kl"])
def test_the_penalty_reaches_the_critics_targets_with_the_configured_coefficient(estimator):
    seen, m, _, _ = step_with(**{"algorithm.kl_coef": 0.5, "algorithm.kl_estimator": estimator})
    batch = seen["critic"]
    per_token = kl_estimate(torch.tensor([REF_OFFSET]), torch.tensor([0.0]), estimator).item()
    lengths = batch.policy_mask.sum(1)
    # lambda_critic = gamma = 1: the target at the first token is the sample's whole return
    expected = batch.scores - 0.5 * per_token * lengths
    assert torch.allclose(batch.returns[:, 0], expected, atol=1e-6)
    assert m["reward/kl_penalty"] == pytest.approx(0.5 * per_token * lengths.mean().item(), rel=1e-5)
    assert m["reward/with_kl_mean"] == pytest.approx(m["reward/mean"] - m["reward/kl_penalty"], abs=1e-6)
    assert m["actor/kl_ref"] == pytest.approx(per_token, rel=1e-5) and m["actor/kl_coef"] == 0.5


def test_grpo_with_the_penalty_in_the_reward_normalises_the_penalised_returns():
    seen, _, _, _ = step_with(**{"algorithm.advantage_estimator": "grpo", "algorithm.kl_coef": 0.5,
                                 "algorithm.kl_estimator": "k1", "algorithm.whiten_advantages": False})
    batch = seen["actor"]
    returns = batch.scores - 0.5 * REF_OFFSET * batch.policy_mask.sum(1)
    first = batch.advantages[:, 0]
    for g in batch.group.unique():
        rows = batch.group == g
        r = returns[rows]
        expected = (r - r.mean()) / (r.std() + 1e-6)
        assert torch.allclose(first[rows], expected, atol=1e-4), g


def test_in_the_loss_the_rewards_stay_and_the_actor_gets_the_reference():
    seen, m, _, plan = step_with(**{"algorithm.kl_coef": 0.5, "algorithm.kl_in": "loss",
                                    "algorithm.kl_estimator": "k2"})
    assert torch.allclose(seen["critic"].returns[:, 0], seen["critic"].scores)  # no penalty in the reward
    actor = seen["actor"]
    assert actor.ref_logprobs is not None and plan.pi_old is Source.UPDATE
    # the fake actor's logprobs at the update = pi_old: the k2 term is 0.5 * 0.3^2 on every token
    # (the fake engine sums its micro-batches' metrics: 3 rows each)
    n_micro = -(-actor.size // 3)
    assert m["actor/kl_loss"] == pytest.approx(n_micro * 0.5 * REF_OFFSET ** 2, rel=1e-5)
    assert "reward/kl_penalty" not in m and m["actor/kl_ref"] == pytest.approx(0.5 * REF_OFFSET ** 2, rel=1e-5)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_the_loss_term_is_the_coefficient_times_the_aggregated_estimate(agg):
    g = torch.Generator().manual_seed(0)
    lengths = [1, 4, 2]
    r = Rollout.unscored(make_layout([[1, 2]] * 3, [[3] * n for n in lengths], pad_id=0))
    mask = r.policy_mask
    batch = ActorBatch(**vars(r), advantages=torch.randn(mask.shape, generator=g) * mask,
                       old_logprobs=-torch.rand(mask.shape, generator=g) * mask,
                       ref_logprobs=-torch.rand(mask.shape, generator=g) * mask)
    logprobs = (batch.old_logprobs + 0.05) * mask
    counts = GlobalCounts.over_ranks({RESPONSE: mask})
    outputs = ModelOutputs(logprobs=logprobs, entropy=torch.zeros_like(mask))
    alg = AlgorithmConfig(loss_agg=agg, kl_estimator="k3")
    with_kl, metrics = PolicyLoss(alg, kl_coef=0.2)(outputs, batch, counts)
    without, _ = PolicyLoss(alg, kl_coef=0.2)(outputs, ActorBatch(**{**vars(batch), "ref_logprobs": None}), counts)
    term = losses.aggregate_loss(kl_estimate(logprobs, batch.ref_logprobs, "k3"), mask, agg,
                                 counts.tokens[RESPONSE], counts.sequences[RESPONSE])
    assert (with_kl - without).item() == pytest.approx(0.2 * term.item(), rel=1e-5)
    assert metrics["actor/kl_loss"].item() == pytest.approx(term.item(), rel=1e-5)


def test_the_adaptive_controller_moves_the_coefficient_step_by_step():
    overrides = {"algorithm.kl_coef": 0.2, "algorithm.kl_estimator": "k1", "algorithm.kl_target": 0.1,
                 "algorithm.kl_horizon": 40.0}
    _, m1, state, _ = step_with(**overrides)
    n = sum(len(g) for g in ROLLOUT)
    # observed 0.3 against a target 0.1: the error is clipped to +0.2
    assert m1["actor/kl_coef"] == 0.2
    assert state.kl_coef == pytest.approx(adaptive_kl_coef(0.2, REF_OFFSET, 0.1, 40.0, n))
    assert state.kl_coef == pytest.approx(0.2 * (1 + 0.2 * n / 40.0))
    _, m2, state2, _ = step_with(state=state, **overrides)  # the next step uses the stored coefficient
    assert m2["actor/kl_coef"] == pytest.approx(0.2 * (1 + 0.2 * n / 40.0))
    assert state2.kl_coef == pytest.approx(m2["actor/kl_coef"] * (1 + 0.2 * n / 40.0))


def test_kl_settings_that_cannot_work_are_config_errors():
    with pytest.raises(ConfigError, match="algorithm.kl_target"):
        load_config("vcppo", ["algorithm.kl_target=0.1"])  # kl_coef 0: the controller would stay at 0
    with pytest.raises(ConfigError, match="algorithm.kl_in"):
        load_config("vcppo", ["algorithm.kl_in=both"])
    with pytest.raises(ConfigError, match="algorithm.kl_estimator"):
        load_config("vcppo", ["algorithm.kl_estimator=k4"])


def test_a_stored_coefficient_counts_only_while_the_controller_is_on():
    from vcppo.driver.step.rl_step import kl_coef_now
    state = RunState(phase="ppo", kl_coef=0.3)  # a checkpoint of a run with the controller
    assert kl_coef_now(state, AlgorithmConfig(kl_coef=0.1, kl_target=0.05)) == 0.3
    assert kl_coef_now(state, AlgorithmConfig(kl_coef=0.1)) == 0.1  # resumed without it: the config's
    assert kl_coef_now(RunState(phase="ppo"), AlgorithmConfig(kl_coef=0.1, kl_target=0.05)) == 0.1
