"""The methods table drives the step: one GAE pass per step gives the actor's advantages AND the
critic's targets (at lambda_critic, never lambda_actor), a new estimator is one function plus one
row, and every policy loss is called through its row with one signature."""
import dataclasses
import inspect

import torch

from tests.fakes import FakeRun, scored, scripted_source
from vcppo.algos import estimators
from vcppo.algos.estimators import EstimatorInput, EstimatorOutput
from vcppo.algos.gae import decoupled_gae
from vcppo.driver.state import RunState
from vcppo.driver.step.rl_step import rl_step
from vcppo.driver.step.step_plan import Source, ppo_plan
from vcppo.methods import ESTIMATORS, POLICY_LOSSES, Estimator, policy_loss_fn

CPU = torch.device("cpu")
GROUPS = [[1, -1, 1], [1, 1, -1]]
LENGTHS = [2, 5, 3, 4, 1, 5]


def _step(run: FakeRun, rollout):
    """One PPO step on fake engines; the (actor, critic) training batches."""
    seen = {}
    for name, engine in (("actor", run.actor), ("critic", getattr(run.critic, "engine", None))):
        if engine is not None:
            train = engine.train_step
            engine.train_step = (lambda train, name: lambda mb, loss: seen.setdefault(name, mb) and train(mb, loss))(
                train, name)
    plan = ppo_plan(run.cfg, CPU)
    rl_step(run, scripted_source(run, [rollout], logprobs=plan.sampler_logprobs), plan, RunState(phase="ppo"), step=1)
    return seen, plan


def test_one_gae_pass_gives_the_advantages_and_the_critic_targets(monkeypatch):
    calls = []

    def counted(*args, **kwargs):
        calls.append((kwargs["lam_actor"], kwargs["lam_critic"]))
        return decoupled_gae(*args, **kwargs)

    monkeypatch.setattr(estimators, "decoupled_gae", counted)
    run = FakeRun(**{"rollout.n_samples_per_prompt": 3, "algorithm.lambda_actor": 0.5,
                     "algorithm.lambda_critic": 0.9, "algorithm.whiten_advantages": False})
    rollout = scored(GROUPS, lengths=LENGTHS)
    seen, plan = _step(run, rollout)
    assert plan.v_old is Source.PASS and not plan.critic_first  # a values pass, then one GAE pass
    assert calls == [(0.5, 0.9)], calls  # ONE call, both lambdas
    values = (0.01 * torch.arange(rollout.responses.shape[1]).float()) * rollout.policy_mask
    adv_actor, _ = decoupled_gae(rollout.token_rewards, values, rollout.policy_mask, 1.0, 0.5, 0.5)
    _, targets_critic = decoupled_gae(rollout.token_rewards, values, rollout.policy_mask, 1.0, 0.9, 0.9)
    _, targets_actor_lambda = decoupled_gae(rollout.token_rewards, values, rollout.policy_mask, 1.0, 0.5, 0.5)
    assert torch.equal(seen["actor"].advantages, adv_actor)
    assert torch.equal(seen["critic"].returns, targets_critic)
    assert not torch.allclose(seen["critic"].returns, targets_actor_lambda)  # not lambda_actor's targets


def test_critic_free_step_asks_no_targets(monkeypatch):
    calls = []
    monkeypatch.setattr(estimators, "decoupled_gae", lambda *a, **k: calls.append(k) or decoupled_gae(*a, **k))
    run = FakeRun(**{"rollout.n_samples_per_prompt": 3, "algorithm.advantage_estimator": "grpo"})
    _step(run, scored(GROUPS, lengths=LENGTHS))
    assert calls == []  # GRPO's estimator runs no GAE scan


def length_advantage(x: EstimatorInput) -> EstimatorOutput:
    """A dummy estimator for the test below: each token's advantage is its sample's outcome times its length."""
    return EstimatorOutput(x.outcomes[:, None] * x.mask.sum(-1, keepdim=True) * x.mask)


def test_a_new_estimator_is_one_function_and_one_row(monkeypatch):
    row = Estimator("by_length", critic=False, groups=False, whitens=False, source="a test's",
                    fn=f"{__name__}:length_advantage")
    monkeypatch.setitem(ESTIMATORS, row.name, row)
    run = FakeRun(**{"rollout.n_samples_per_prompt": 3, "algorithm.advantage_estimator": "by_length",
                     "algorithm.whiten_advantages": False})
    rollout = scored(GROUPS, lengths=LENGTHS)
    seen, plan = _step(run, rollout)
    assert run.critic is None and plan.v_old is Source.NONE
    expected = rollout.scores[:, None] * torch.tensor(LENGTHS, dtype=torch.float32)[:, None] * rollout.policy_mask
    assert torch.equal(seen["actor"].advantages, expected)


def test_every_row_names_a_function_of_the_shared_signature():
    params = lambda fn: [p for p in inspect.signature(fn).parameters]  # noqa: E731
    for row in ESTIMATORS.values():
        fn = estimators.__dict__[row.fn.split(":")[1]] if row.fn.startswith("vcppo.algos.estimators:") else None
        assert fn is not None and params(fn) == ["x"], row
    reference = set(params(policy_loss_fn("ppo")))
    for name in POLICY_LOSSES:
        assert set(params(policy_loss_fn(name))) == reference, name
    assert all(dataclasses.is_dataclass(t) for t in (EstimatorInput, EstimatorOutput))
