"""The phase loops (vcppo/driver/phases.py) around a scripted step: value pretraining stops where its
stopping rule says, and publishes a critic that records why."""
from types import SimpleNamespace

import pytest

from vcppo.config.schema import Config
from vcppo.driver import phases as loops
from vcppo.driver.state import Phase, RunState

# explained variance rising, then flat from step 4 on; a constant value loss
EV = [0.1, 0.3, 0.5, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6]


class Log:
    def __init__(self):
        self.lines, self.records = [], []

    def info(self, line):
        self.lines.append(line)

    def start_phase(self, *a, **k):
        pass

    def log(self, metrics, step, phase):
        self.records.append((str(phase), step))


def pretrain(monkeypatch, **vp) -> tuple[RunState, SimpleNamespace, list[dict]]:
    cfg = Config()
    cfg.trainer.save_every = 0
    for key, value in {"steps": len(EV), "min_steps": 4, "window": 2, **vp}.items():
        setattr(cfg.value_pretrain, key, value)
    published = []
    monkeypatch.setattr(loops, "rl_step", lambda ctx, source, plan, state, step: {
        "critic/explained_variance": EV[step - 1], "critic/value_loss": 1.0})
    monkeypatch.setattr(loops, "publish_critic", lambda ctx, info: published.append(info))
    ctx = SimpleNamespace(cfg=cfg, log=Log(), run_dir="run")
    state = RunState(phase=Phase.VALUE_PRETRAIN)
    loops.value_pretrain(ctx, source=None, plan=SimpleNamespace(describe=lambda: "plan"), state=state)
    return state, ctx, published


def test_value_pretraining_stops_once_settled(monkeypatch):
    """Step 7 is the first whose last two windows of 2 steps agree (0.6, 0.6 after 0.6, 0.6): the loop
    stops there, 5 steps short of its budget, and the published critic says why."""
    state, ctx, published = pretrain(monkeypatch)
    assert state.pretrain_step == 7 and [s for _, s in ctx.log.records] == list(range(1, 8))
    assert published == [{"steps": 7, "stop_reason": "explained variance and value loss settled", "run_dir": "run"}]
    assert "value pretraining stopped after 7 steps (explained variance and value loss settled)" in ctx.log.lines


@pytest.mark.parametrize("vp", [{"early_stop": False}, {"min_steps": 20}])
def test_value_pretraining_runs_its_budget_without_early_stop(monkeypatch, vp):
    state, ctx, published = pretrain(monkeypatch, **vp)
    assert state.pretrain_step == len(EV) and published[0]["stop_reason"] == "step budget"
