"""`vcppo train` at actor.lr=1 critic.lr=1 (the largest accepted): the divergence guard warns by
PPO step 2, and with trainer.abort_on_divergence stops there (exit 2, one line) keeping the
checkpoint from before it; a run at the demo's learning rates never trips it."""
import pytest

from tests.driver.test_train_e2e import base_overrides, train
from vcppo.driver.durability.checkpoint import checkpoint_root, list_complete

pytestmark = [pytest.mark.integration]
LR_1 = {"actor.lr": 1, "critic.lr": 1, "value_pretrain.enabled": False, "trainer.total_steps": 3}


@pytest.mark.slow
def test_lr_1_warns_by_step_2_and_goes_on(tiny_artifacts, tmp_path):
    res = train("vcppo", base_overrides(tiny_artifacts, tmp_path, **LR_1), cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-4000:]
    warned = [line for line in res.stderr.splitlines() if "the run is diverging" in line]
    assert warned and "PPO step 2: the run is diverging" in warned[0], res.stderr[-4000:]
    assert "critic/value_loss" in warned[0] and "(since step 2)" in warned[0]


@pytest.mark.slow
def test_lr_1_with_abort_on_divergence_stops_keeping_the_checkpoint_from_before(tiny_artifacts, tmp_path):
    o = dict(LR_1, **{"trainer.abort_on_divergence": True, "trainer.save_every": 1, "trainer.keep_last": 4})
    res = train("vcppo", base_overrides(tiny_artifacts, tmp_path, **o), cwd=tmp_path)
    assert res.returncode == 2, res.stderr[-4000:]
    lines = [line for line in res.stderr.splitlines() if line.startswith("vcppo train:")]
    assert len(lines) == 1 and "PPO step 2: the run is diverging" in lines[0]
    assert "the last checkpoint kept is step_000001" in lines[0] and "Traceback" not in res.stderr
    run = tmp_path / "vcppo-seed0"
    assert [p.name for p in list_complete(checkpoint_root(run))] == ["step_000001"]
    assert not (run / "final").exists()


@pytest.mark.slow
def test_a_run_at_the_demos_learning_rates_never_trips_it(tiny_artifacts, tmp_path):
    o = {"actor.lr": 5e-5, "critic.lr": 3e-4, "trainer.total_steps": 6, "trainer.abort_on_divergence": True}
    res = train("vcppo", base_overrides(tiny_artifacts, tmp_path, **o), cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-4000:]
    assert "diverging" not in res.stderr
