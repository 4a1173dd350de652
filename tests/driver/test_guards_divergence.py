"""The divergence guard (vcppo.driver.durability.guards): which metric left its range, by how much, since
which step; a warning, or with trainer.abort_on_divergence a stop; baselines survive a resume."""
import dataclasses
import json

import pytest

from vcppo.config.load import load_config
from vcppo.driver.state import RunState
from vcppo.driver.durability.guards import DivergenceError, check_divergence, out_of_range
from vcppo.errors import ConfigError

# `vcppo train vcppo actor.lr=1 critic.lr=1` on the tiny test model (value pretraining off), steps 1-4
LR_1 = [{"actor/entropy": 5.7325, "critic/value_loss": 0.5, "actor/grad_norm": 1.687, "critic/grad_norm": 5.812,
         "actor/approx_kl": 0.0},
        {"actor/entropy": 0.2351, "critic/value_loss": 825.98, "actor/grad_norm": 5.221, "critic/grad_norm": 48916.3,
         "actor/approx_kl": 0.0},
        {"actor/entropy": 0.00265, "critic/value_loss": 12964.5, "actor/grad_norm": 0.0064, "critic/grad_norm": 4865.1,
         "actor/approx_kl": 0.0},
        {"actor/entropy": 3.3e-40, "critic/value_loss": 19.13, "actor/grad_norm": 0.0, "critic/grad_norm": 138.8,
         "actor/approx_kl": 0.0}]
# the same command at the demo's learning rates (actor 5e-5, critic 3e-4), steps 1-8
NORMAL = [{"actor/entropy": e, "critic/value_loss": v, "actor/grad_norm": a, "critic/grad_norm": c,
           "actor/approx_kl": 0.0, "actor/nonfinite_skipped": 0.0, "critic/nonfinite_skipped": 0.0}
          for e, v, a, c in [(5.7325, 0.5, 1.687, 5.81), (5.7332, 0.485, 1.411, 6.47), (5.7323, 0.455, 1.472, 8.38),
                             (5.7330, 0.420, 1.621, 9.25), (5.7306, 0.385, 1.388, 9.41), (5.7321, 0.352, 1.463, 9.26),
                             (5.7320, 0.322, 1.559, 8.94), (5.7326, 0.292, 1.815, 8.58)]]
# a run that sharpens as it should: entropy 0.6 -> 0.1 over 40 steps, the value loss and norms wandering 3x
SHARPENING = [{"actor/entropy": 0.6 - 0.0125 * i, "critic/value_loss": 0.2 * (1 + (i % 5) / 2),
               "actor/grad_norm": 0.5 * (1 + (i % 3)), "critic/grad_norm": 2.0 * (1 + (i % 4) / 2),
               "actor/kl_ref": 0.002 * i, "actor/approx_kl": 0.01} for i in range(40)]


def _run(series, *overrides, state=None):
    cfg, state, said = load_config("vcppo", list(overrides)), state or RunState(phase="ppo"), []
    for step, metrics in enumerate(series, start=1):
        check_divergence(cfg, state, metrics, step, "step_000001", said.append)
    return said, state


def test_lr_1_warns_at_step_2_naming_each_metric_by_how_much_and_since_when():
    said, state = _run(LR_1[:2])
    assert len(said) == 1 and said[0].startswith("PPO step 2: the run is diverging")
    msg = said[0]
    assert "critic/value_loss 826 is 1.65e+03x its first PPO step's 0.5 (limit 100x and 40)" in msg
    assert "critic/grad_norm 4.892e+04 is 8.42e+03x" in msg
    assert "actor/entropy 0.2351 is 1/24.4 of its first PPO step's 5.732 (limit 1/20)" in msg
    assert msg.count("(since step 2)") == 3 and "trainer.abort_on_divergence=true" in msg
    assert state.divergence_since == {"actor/entropy": 2, "critic/value_loss": 2, "critic/grad_norm": 2}


def test_later_steps_say_only_what_is_new_and_when_it_is_back():
    said, state = _run(LR_1 + [LR_1[0]])
    assert [m.split(":")[0] for m in said] == ["PPO step 2", "PPO step 5"]
    assert "back in its range" in said[1] and state.divergence_since == {}


def test_normal_runs_never_trip_it():
    assert _run(NORMAL)[0] == []
    assert _run(SHARPENING, "algorithm.kl_coef=0.01")[0] == []


def test_abort_on_divergence_stops_before_the_steps_checkpoint():
    with pytest.raises(DivergenceError) as e:
        _run(LR_1, "trainer.abort_on_divergence=true")
    msg = str(e.value)
    assert msg.startswith("PPO step 2: the run is diverging") and "the last checkpoint kept is step_000001" in msg
    assert "\n" not in msg and issubclass(DivergenceError, ConfigError)  # the CLI: one line, exit 2


@pytest.mark.parametrize("metrics,needle", [
    ({"actor/entropy": float("nan")}, "actor/entropy is nan"),
    ({"critic/value_loss": float("inf")}, "critic/value_loss is inf"),
    ({"critic/nonfinite_skipped": 1.0}, "critic/nonfinite_skipped 1 > 0"),
    ({"actor/approx_kl": 2.5}, "actor/approx_kl 2.5 > 1"),
    ({"actor/kl_ref": 12.0}, "actor/kl_ref 12 > 10"),
])
def test_absolute_limits_and_non_finite_values(metrics, needle):
    cfg, state = load_config("vcppo"), RunState(phase="ppo")
    assert needle in out_of_range(cfg, state, metrics).values().__iter__().__next__()


def test_baselines_follow_the_state_across_a_resume():
    _, state = _run(LR_1[:1])
    resumed = RunState(**json.loads(json.dumps(dataclasses.asdict(state))))  # state.json round trip
    said, _ = _run(LR_1[1:2], state=resumed)
    assert said and "its first PPO step's 0.5" in said[0]


def test_a_state_written_before_the_guard_loads():
    old = {k: v for k, v in dataclasses.asdict(RunState(phase="ppo")).items() if not k.startswith("divergence")}
    assert RunState(**old).divergence_baseline == {}
