"""Exact resume in units: metrics.jsonl cut back to the checkpoint (no duplicate records),
replayed records not sent to wandb / TensorBoard again, and the critic's lr-schedule length fixed
by how the run started, not by the cache."""
import json
from pathlib import Path

from vcppo.driver.state import RunState
from vcppo.driver.durability.run_records import metrics_size, rewind_metrics
from vcppo.driver.run_engines import critic_pretrain_steps
from vcppo.config.schema import Config
from vcppo.tracking import MetricsLogger


def _log(run_dir, records, **kw):
    log = MetricsLogger(run_dir, {}, use_wandb=False, progress_bar=False, **kw)
    for phase, step in records:
        log.log({"x": float(step)}, step=step, phase=phase)
    return log


def test_rewind_cuts_the_records_past_the_checkpoint_and_names_them(tmp_path):
    _log(tmp_path, [("value_pretrain", 1), ("value_pretrain", 2)]).close()
    state = RunState(phase="value_pretrain", pretrain_step=2, metrics_bytes=metrics_size(tmp_path))
    _log(tmp_path, [("val", 0), ("ppo", 1)]).close()
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"phase": "ppo", "st')  # the kill cut a line short
    assert rewind_metrics(tmp_path, state) == {("val", 0), ("ppo", 1)}
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [(json.loads(x)["phase"], json.loads(x)["step"]) for x in lines] == [("value_pretrain", 1),
                                                                                 ("value_pretrain", 2)]
    assert rewind_metrics(tmp_path, state) == set()  # nothing past it
    assert rewind_metrics(tmp_path, RunState(phase="ppo")) == set()  # older checkpoints: untouched
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 2


class FakeSink:
    def __init__(self):
        self.sent = []

    def log(self, scalars):
        self.sent.append(scalars["global_step"])

    def finish(self):
        pass


def test_replayed_records_are_not_sent_to_wandb_again(tmp_path):
    log = MetricsLogger(tmp_path, {}, use_wandb=False, progress_bar=False, already_sent={("ppo", 3), ("val", 0)})
    log._wandb = FakeSink()
    for phase, step in [("val", 0), ("ppo", 3), ("ppo", 4)]:
        log.log({"x": 1.0}, step=step, phase=phase)
    assert log._wandb.sent == [4]
    log.close()
    assert len((Path(tmp_path) / "metrics.jsonl").read_text().splitlines()) == 3  # the file has them all


def test_the_critic_schedule_length_is_fixed_by_how_the_run_started():
    cfg = Config()
    cfg.value_pretrain.enabled, cfg.value_pretrain.steps = True, 7
    cache = Path("/cache/critic")
    assert critic_pretrain_steps(cfg, None, None) == 7          # fresh, pretrains itself
    assert critic_pretrain_steps(cfg, None, cache) == 0         # fresh, reuses a cached critic
    pretrained = RunState(phase="ppo", step=2, pretrain_step=5)  # early-stopped at 5: still 7
    assert critic_pretrain_steps(cfg, pretrained, cache) == 7   # its own published critic is in the cache
    assert critic_pretrain_steps(cfg, RunState(phase="value_pretrain", pretrain_step=2), cache) == 7
    assert critic_pretrain_steps(cfg, RunState(phase="ppo", step=2), None) == 0  # it had reused one
    cfg.value_pretrain.enabled = False
    assert critic_pretrain_steps(cfg, pretrained, None) == 0
