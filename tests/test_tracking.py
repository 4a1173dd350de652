"""MetricsLogger's TensorBoard output: the event files in <run dir>/tensorboard hold every
scalar as <phase>/<metric> at its step, and a resumed run's records are read back with the rest."""
import pytest

from vcppo.tracking import MetricsLogger, read_metrics


def scalars(run_dir):
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer
    mux = EventMultiplexer().AddRunsFromDirectory(str(run_dir / "tensorboard"))
    mux.Reload()
    out = {}
    for run in mux.Runs():
        for tag in mux.GetAccumulator(run).Tags()["scalars"]:
            out.setdefault(tag, []).extend((e.step, e.value) for e in mux.Scalars(run, tag))
    return {tag: sorted(v) for tag, v in out.items()}


def test_tensorboard_event_file_holds_the_scalars(tmp_path):
    log = MetricsLogger(tmp_path, {}, use_wandb=False, progress_bar=False, use_tensorboard=True)
    log.log({"reward/mean": 0.25, "critic/explained_variance": float("nan"), "adv/position_profile": [1.0, 2.0],
             "note": "text"}, step=1, phase="ppo")
    log.log({"reward/mean": -0.5}, step=2, phase="ppo")
    log.log({"critic/value_loss": 1.5}, step=1, phase="value_pretrain")
    log.close()
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    got = scalars(tmp_path)
    # NaN (null in metrics.jsonl), lists and text are not scalars
    assert got == {"ppo/reward/mean": [(1, 0.25), (2, -0.5)], "value_pretrain/critic/value_loss": [(1, 1.5)]}
    assert len(read_metrics(tmp_path)) == 3

    resumed = MetricsLogger(tmp_path, {}, use_wandb=False, progress_bar=False, use_tensorboard=True, resume=True)
    resumed.log({"reward/mean": 1.0}, step=3, phase="ppo")
    resumed.close()
    assert scalars(tmp_path)["ppo/reward/mean"] == [(1, 0.25), (2, -0.5), (3, 1.0)]


def test_off_by_default_and_silent_on_other_ranks(tmp_path):
    MetricsLogger(tmp_path / "a", {}, use_wandb=False, progress_bar=False).close()
    assert not (tmp_path / "a" / "tensorboard").exists()
    quiet = MetricsLogger(tmp_path / "b", {}, enabled=False, use_tensorboard=True)
    quiet.log({"x": 1.0}, step=1, phase="ppo")
    quiet.close()
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize("value", [True, 3])
def test_integer_and_bool_metrics_are_scalars_too(tmp_path, value):
    log = MetricsLogger(tmp_path, {}, use_wandb=False, progress_bar=False, use_tensorboard=True)
    log.log({"n": value}, step=4, phase="val")
    log.close()
    assert scalars(tmp_path) == {"val/n": [(4, float(value))]}
