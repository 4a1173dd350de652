"""``algorithm.policy_loss: dis`` through the real driver step on fake engines: pi_old is the sampler's
logprobs, so no old-logprob pass runs even where PPO needs one (several optimizer steps a batch)."""
import pytest
import torch

from tests.fakes import FakeRun, scored, scripted_source
from vcppo.config.load import load_config
from vcppo.errors import ConfigError
from vcppo.driver.state import RunState
from vcppo.driver.step.rl_step import rl_step
from vcppo.driver.step.step_plan import Source, ppo_plan

CPU = torch.device("cpu")


def run_step(**overrides):
    run = FakeRun(**overrides)
    plan = ppo_plan(run.cfg, CPU)
    source = scripted_source(run, [scored([[1, -1], [1, 1], [-1, 1], [-1, -1]])], logprobs=plan.sampler_logprobs)
    return run, plan, rl_step(run, source, plan, RunState(phase=plan.phase), step=1)


@pytest.mark.parametrize("loss, forward_calls", [("ppo", 1), ("dis", 0)])
def test_dis_runs_no_old_logprob_pass(loss, forward_calls):
    run, plan, m = run_step(**{"algorithm.policy_loss": loss, "actor.ppo_epochs": 2,
                               "algorithm.eps_low": 0.8, "algorithm.eps_high": 3.0})
    assert run.calls.count("actor:forward") == forward_calls
    assert run.calls.count("actor:train_step") == 2
    if loss == "dis":
        assert plan.pi_old is Source.SAMPLER and plan.sampler_logprobs
        assert "actor/clip_frac_high" in m and "actor/pg_loss" in m


def test_dis_takes_pi_old_from_the_sampler_even_with_one_optimizer_step():
    plan = ppo_plan(load_config("vcppo", ["algorithm.policy_loss=dis"]), CPU)
    assert plan.pi_old is Source.SAMPLER and plan.sampler_logprobs


@pytest.mark.parametrize("overrides, key", [
    (["algorithm.policy_loss=dis", "algorithm.rollout_is_cap=2"], "algorithm.rollout_is_cap"),
    (["algorithm.policy_loss=dis", "rollout.sampler_logprobs=false"], "rollout.sampler_logprobs"),
])
def test_dis_refuses_what_contradicts_it_in_one_line(overrides, key):
    with pytest.raises(ConfigError, match=key):
        load_config("vcppo", overrides)
