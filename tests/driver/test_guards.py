"""The step guards (vcppo.driver.durability.guards): streaks of non-finite steps and of all-failed rewards
abort the run at their limit, reset on a good step, and follow the state across a resume."""
import pytest

from vcppo.driver.state import RunState
from vcppo.driver.durability.guards import RewardFailureError, step_reward_failures, update_streaks
from vcppo.engines.deepspeed_engine import NonFiniteError
from vcppo.config.schema import TrainerConfig
from vcppo.errors import ConfigError

T = TrainerConfig(max_nonfinite_steps=3, max_failed_reward_steps=2)
SKIP = {"actor/nonfinite_skipped": 1.0, "critic/nonfinite_skipped": 0.0}
FINE = {"actor/nonfinite_skipped": 0.0, "critic/nonfinite_skipped": 0.0}
ALL_FAILED = {"reward/step_failures": 8.0, "reward/step_scored": 8.0}


def test_nonfinite_streak_aborts_at_its_limit_and_resets_on_a_good_step():
    s = RunState(phase="ppo")
    for metrics in (SKIP, SKIP, FINE, SKIP, {"critic/nonfinite_skipped": 2.0}):
        update_streaks(s, metrics, T, "PPO step")
    assert s.nonfinite_streak == 2
    with pytest.raises(NonFiniteError, match=r"3 steps in a row .*max_nonfinite_steps=3"):
        update_streaks(s, SKIP, T, "PPO step 6")
    assert issubclass(NonFiniteError, ConfigError)  # the CLI prints one line and exits 2


def test_the_first_skipped_step_of_each_streak_is_said_once():
    s, said = RunState(phase="ppo"), []
    for step, metrics in enumerate((FINE, SKIP, SKIP, FINE, SKIP), start=1):
        update_streaks(s, metrics, T, f"PPO step {step}", said.append)
    assert [m.split(":")[0] for m in said] == ["PPO step 2", "PPO step 5"]
    assert "no checkpoint is written until a step applies again" in said[0]


def test_reward_streak_counts_only_steps_where_every_sample_failed():
    s = RunState(phase="value_pretrain")
    update_streaks(s, ALL_FAILED, T, "x")
    update_streaks(s, {"reward/step_failures": 7.0, "reward/step_scored": 8.0}, T, "x")  # one scored
    assert s.reward_fail_streak == 0
    update_streaks(s, {"reward/step_failures": 0.0, "reward/step_scored": 0.0}, T, "x")  # nothing scored
    update_streaks(s, ALL_FAILED, T, "x")
    assert s.reward_fail_streak == 1
    with pytest.raises(RewardFailureError, match="failed on every sample for 2 steps"):
        update_streaks(s, ALL_FAILED, T, "value-pretraining step 5")


def test_streaks_travel_in_the_run_state():
    import dataclasses
    s = RunState(phase="ppo")
    update_streaks(s, {**SKIP, **ALL_FAILED}, T, "x")
    resumed = RunState(**dataclasses.asdict(s))
    with pytest.raises(RewardFailureError):
        update_streaks(resumed, ALL_FAILED, T, "x")
    assert RunState(**{"phase": "ppo", "step": 3}).nonfinite_streak == 0  # older state.json files load


class FakeScorer:
    num_failures, num_scored = 5, 10


def test_step_reward_failures_are_the_difference_since_the_tally():
    assert step_reward_failures(FakeScorer(), (1, 4)) == {"reward/step_failures": 4.0, "reward/step_scored": 6.0}


def test_an_env_that_fails_every_episode_is_named_in_the_abort():
    """Env failures count with the reward's; when every episode failed in the env, the abort names the
    env and where its errors are, not the reward function."""
    s = RunState(phase="ppo")
    env_failed = {**ALL_FAILED, "env/failures": ALL_FAILED["reward/step_scored"]}
    update_streaks(s, env_failed, T, "PPO step 1", env="tools")
    with pytest.raises(RewardFailureError) as err:
        update_streaks(s, env_failed, T, "PPO step 2", env="tools")
    assert "the env 'tools' (rollout.env) failed every episode for 2 steps" in str(err.value)
    assert "reward function" not in str(err.value) and "env 'tools' failed at turn" in str(err.value)
    s = RunState(phase="ppo")
    mixed = {**ALL_FAILED, "env/failures": 1.0}
    update_streaks(s, mixed, T, "x", env="tools")
    with pytest.raises(RewardFailureError, match="the reward function or the env 'tools'"):
        update_streaks(s, mixed, T, "x", env="tools")
