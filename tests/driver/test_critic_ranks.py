"""The critic on its own ranks, one process: the driver's step (:func:`vcppo.driver.step.rl_step.rl_step`)
with a :class:`~vcppo.driver.placement.training_ranks.RemoteCritic` whose critic rank is a
:class:`~vcppo.driver.placement.critic_ranks.CriticServer` answering over a loopback link, against the same
step with the critic on the training rank. Fake engines, milliseconds; the three real processes
are tests/driver/test_critic_ranks_e2e.py."""
import dataclasses
import json
import time
from collections import deque

import pytest
import torch

from tests.fakes import FakeEngine, FakeRun, scored, scripted_source
from vcppo.driver.state import RunState
from vcppo.driver.placement.critic_ranks import Command, Failed
from vcppo.driver.placement.critic_ranks import CriticServer
from vcppo.driver.step.step_plan import Source, ppo_plan, pretrain_plan
from vcppo.driver.placement.training_ranks import RemoteCritic
from vcppo.driver.step.rl_step import rl_step
from vcppo.driver.step.timeline import Timeline

CPU = torch.device("cpu")
ROLLOUT = [[1, -1], [1, 1], [-1, 1], [-1, -1]]
SPLIT = {"placement.mode": "split", "placement.critic_ranks": 1}


class Loopback:
    """Both ends of a critic link in one process: what the actor side sends is answered at once."""

    def __init__(self):
        self.to_actor: deque = deque()
        self.server = None

    def actor_end(self):
        loop = self

        class End:
            def send(self, msg):
                loop.server.answer(msg)

            def receive(self):
                return loop.to_actor.popleft()

            def flush(self):
                pass
        return End()

    def critic_end(self):
        loop = self

        class End:
            def send(self, msg):
                loop.to_actor.append(msg)
        return End()


def remote_run(**overrides):
    """A fake run whose critic is served by a CriticServer (on the run's own fake critic engine)."""
    run = FakeRun(**SPLIT, **overrides)
    loop = Loopback()
    loop.server = CriticServer(run.cfg, run.dist, loop.critic_end(), Timeline(None, "critic"))
    loop.server.critic = run.critic.engine
    run.critic = RemoteCritic(loop.actor_end())
    return run, loop.server


def step_metrics(run, plan, phase="ppo"):
    source = scripted_source(run, [scored(ROLLOUT)], logprobs=plan.sampler_logprobs)
    return rl_step(run, source, plan, RunState(phase=phase), step=1)


def without_times(m) -> str:
    """The metrics but timings, comparable with ``==`` (NaN included: JSON writes it as NaN)."""
    return json.dumps({k: v for k, v in m.items() if not k.startswith(("time/", "perf/"))}, sort_keys=True)


@pytest.mark.parametrize("overrides", [{}, {"algorithm.kl_coef": 0.1}, {"algorithm.lambda_critic": 0.95}])
def test_a_remote_critic_step_gives_what_the_same_plan_gives_on_the_training_rank(overrides):
    run, server = remote_run(**overrides)
    plan = ppo_plan(run.cfg, CPU)
    assert plan.critic_remote and plan.v_old is Source.PASS and not plan.critic_first
    t0 = time.perf_counter()
    remote = step_metrics(run, plan)
    step_s = time.perf_counter() - t0
    local_run = FakeRun(**SPLIT, **overrides)
    local = step_metrics(local_run, dataclasses.replace(plan, critic_remote=False))
    assert without_times(remote) == without_times(local)
    assert run.calls == local_run.calls  # the critic's pass and update ran, in the same order
    # the critic rank timed its values pass (a part of the step), and the actor rank its wait for the update
    assert 0 < remote["time/critic_rank_values_s"] < step_s and 0 <= remote["time/wait_critic_update_s"] < step_s
    assert server.critic.offset == 0.25  # its one optimizer step


def test_value_pretraining_on_critic_ranks_trains_the_critic_first_as_the_training_ranks_would():
    run, server = remote_run()
    plan = pretrain_plan(run.cfg, CPU)
    assert plan.critic_remote and plan.critic_first and plan.v_old is Source.UPDATE
    remote = step_metrics(run, plan, phase="value_pretrain")
    local_run = FakeRun(**SPLIT)
    local = step_metrics(local_run, dataclasses.replace(plan, critic_remote=False), phase="value_pretrain")
    assert without_times(remote) == without_times(local)
    assert remote["time/critic_rank_values_s"] == 0.0  # V_old was the update's own forward
    assert "actor:train_step" not in run.calls


def test_an_error_on_the_critic_rank_is_raised_on_the_actor_rank():
    run, _ = remote_run()
    with pytest.raises(AttributeError, match="export"):  # the fake engine cannot export
        run.critic.export("/nowhere")
    with pytest.raises(ValueError, match="unknown critic command 'reboot'"):
        run.critic._call("reboot")


class NeedsTwo(Exception):
    """Pickles, but does not unpickle (its one stored argument is not the two it takes)."""

    def __init__(self, a, b):
        super().__init__(f"{a} and {b}")


def test_an_error_that_does_not_cross_whole_crosses_as_its_text():
    failed = Failed.of(NeedsTwo("the", "reason"))
    assert isinstance(failed.error, RuntimeError) and "NeedsTwo: the and reason" in str(failed.error)
    assert Failed.of(ValueError("plain")).error.args == ("plain",)


def test_commands_reach_the_critic_engine_and_a_checkpoint_holds_its_rng(tmp_path, monkeypatch):
    run, server = remote_run()
    seen = []
    server.critic = FakeEngine("critic", [])
    server.critic.save_checkpoint = lambda d: seen.append(("save", d))
    monkeypatch.setattr("vcppo.driver.placement.critic_ranks.restore_engine",
                        lambda engine, d, universal=False: seen.append(("load", str(d), universal)))
    server.critic.check_finite_weights = lambda what: seen.append(("finite", what))
    run.critic.save_checkpoint(str(tmp_path / "critic"))
    drawn = torch.rand(3)  # the critic rank's stream after the checkpoint
    run.critic.check_finite_weights("the final critic export")
    run.critic.restore(tmp_path / "critic")
    assert torch.equal(torch.rand(3), drawn)  # restored to where the checkpoint left it
    assert seen == [("save", str(tmp_path / "critic")), ("finite", "the final critic export"),
                    ("load", str(tmp_path / "critic"), False)]
    assert (tmp_path / "rng_critic0.json").exists() and Command("export").kwargs == {}
