"""Trainer 0's side of split placement's validation (vcppo.driver.placement.training_ranks.RemoteSource): it
asks, trains on, and logs a result when it has arrived; at a checkpoint and at the end it waits."""
from types import SimpleNamespace

from vcppo.driver.placement.training_ranks import RemoteSource
from vcppo.driver.state import Phase
from vcppo.driver.placement.rollout_ranks import SampledBatch, Validate, ValidationResult
from vcppo.driver.step.timeline import Timeline


class FakeBridge:
    """Trainer 0's bridge: ``arrived`` messages are ready; ``in_transit`` ones arrive only when a
    blocking receive waits for them."""

    def __init__(self):
        self.sent, self.arrived, self.in_transit = [], [], []

    def reap(self):
        pass

    def broadcast_control(self, msg, weights=()):
        self.sent.append(msg)

    def data_ready(self) -> bool:
        return bool(self.arrived)

    def receive(self):
        if not self.arrived:
            self.arrived.append(self.in_transit.pop(0))
        return self.arrived.pop(0)


def source(is_main=True, val_files="val.parquet") -> RemoteSource:
    src = RemoteSource.__new__(RemoteSource)
    src.cfg = SimpleNamespace(data=SimpleNamespace(val_files=val_files))
    src.dist = SimpleNamespace(is_main=is_main)
    src.bridge, src.mailbox, src.phase, src.asked = FakeBridge(), {}, Phase.PPO, []
    src.ctx = SimpleNamespace(timeline=Timeline(None, "train"))
    return src


def batch(step):
    return SampledBatch(phase=Phase.PPO, step=step, version=0, rollout=None, metrics={}, prompt_state={}, seconds=0.0)


def result(step):
    return ValidationResult(step=step, metrics={"val/greedy_pass@1": step / 10})


def test_the_trainer_asks_and_goes_on_then_logs_what_has_arrived():
    src = source()
    src.validate(0)
    assert src.bridge.sent == [Validate(step=0)]
    assert src.finished_validations(wait=False) == []  # nothing arrived: no wait
    src.bridge.arrived += [batch(1), result(0)]  # the rollout rank sampled the next batch first
    assert src.finished_validations(wait=False) == [(0, {"val/greedy_pass@1": 0.0})]
    assert ("batch", Phase.PPO, 1) in src.mailbox  # kept for the step that needs it
    assert src.finished_validations(wait=False) == []


def test_waiting_receives_every_validation_asked_for_in_step_order():
    src = source()
    src.validate(2)
    src.validate(4)
    src.bridge.in_transit += [batch(5), result(2), batch(6), result(4)]
    assert [step for step, _ in src.finished_validations(wait=True)] == [2, 4]
    assert {k for k in src.mailbox} == {("batch", Phase.PPO, 5), ("batch", Phase.PPO, 6)}
    assert src.asked == []


def test_only_trainer_0_asks_and_only_with_validation_data():
    for src in (source(is_main=False), source(val_files=None)):
        src.validate(2)
        assert src.bridge.sent == [] and src.finished_validations(wait=True) == []


def test_an_inflight_batch_is_saved_as_plain_values(tmp_path):
    """A checkpoint's in-flight batches load with ``weights_only``: the phase goes in as its text."""
    import torch

    from vcppo.driver.placement.training_ranks import _batch_message, _batch_record
    from vcppo.experience import Rollout, make_layout
    rollout = Rollout.unscored(make_layout([[5, 6]], [[7, 8]], pad_id=0))
    msg = SampledBatch(phase=Phase.VALUE_PRETRAIN, step=2, version=0, rollout=rollout, metrics={"m": 1.0},
                       prompt_state={}, seconds=0.5)
    torch.save({"batches": [_batch_record(msg)]}, tmp_path / "inflight.pt")
    (back,) = [_batch_message(r) for r in torch.load(tmp_path / "inflight.pt", weights_only=True)["batches"]]
    assert back.phase is Phase.VALUE_PRETRAIN and back.step == 2 and torch.equal(back.rollout.input_ids, rollout.input_ids)
