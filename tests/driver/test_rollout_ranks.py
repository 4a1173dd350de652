"""The rollout rank's loop (vcppo.driver.placement.rollout_ranks.RolloutServer.serve) against a simulated
trainer: whichever side runs faster, PPO batch j is sampled with the weights of step
max(0, j - 1 - max_staleness), so a split run repeats and resumes exactly; a validation uses the
weights of its step, after the batch the trainer needs next."""
from types import SimpleNamespace

import pytest

from vcppo.driver.placement.rollout_ranks import RolloutServer
from vcppo.driver.state import Phase
from vcppo.driver.placement.rollout_ranks import Start, StepDone, Stop, Validate
from vcppo.driver.step.timeline import Timeline


class SimulatedRun(RolloutServer):
    """A rollout rank with the engines, the bridge and the trainer replaced by a simulation.

    ``trainer_ahead``: the trainer trains each batch the moment it arrives, so its next weights
    are already waiting when the rollout rank decides what to do next; otherwise it trains only
    while the rollout rank waits for a message."""

    def __init__(self, max_staleness: int, total_steps: int, trainer_ahead: bool, val_every: int = 0):
        self.cfg = SimpleNamespace(trainer=SimpleNamespace(max_staleness=max_staleness, total_steps=total_steps),
                                   value_pretrain=SimpleNamespace(steps=0),
                                   placement=SimpleNamespace(mode="split", rollout_ranks=1, critic_ranks=0))
        self.bridge, self.timeline = self, Timeline(None, "rollout")
        self.prompts, self.initial_prompt_state = SimpleNamespace(load_state_dict=lambda state: None), None
        self.phase, self.next_step, self.trainer_done, self.version = Phase.PPO, 1, 0, 0
        self.started = self.stopped = False
        self.trainer_ahead, self.trained = trainer_ahead, 0
        self.queue = [Start(phase=Phase.PPO, next_step=1, trainer_done=0, version=0, prompt_state=None)]
        self.sampled: list[tuple[int, int]] = []  # (batch, the step whose weights sampled it)
        # the trainer asks for a validation at step 0 and after every val_every-th step, and goes on
        self.val_every, self.validated = val_every, []  # (step, the weights' step, batches sampled by then)
        if val_every:
            self.queue.append(Validate(step=0))

    # the trainer
    def train_next(self) -> None:
        if self.trained == self.cfg.trainer.total_steps:
            self.queue.append(Stop())
        elif self.trained < len(self.sampled):  # its batch has arrived
            self.trained += 1
            self.queue.append(StepDone(phase=Phase.PPO, step=self.trained))
            if self.val_every and self.trained % self.val_every == 0:
                self.queue.append(Validate(step=self.trained))
        else:
            raise AssertionError(f"deadlock: the trainer waits for batch {self.trained + 1}, the sampler for it")

    # the bridge, as the rollout rank sees it
    def receive_control(self):
        if not self.queue:
            self.train_next()
        return self.queue.pop(0)

    def flush(self) -> None:
        pass

    # the rollout rank's own collective and work
    def message_waiting(self) -> bool:
        return bool(self.queue)

    def validate(self, step: int) -> None:
        self.validated.append((step, self.version, len(self.sampled)))

    def sample_next(self) -> None:
        self.sampled.append((self.next_step, self.version))
        self.next_step += 1
        if self.trainer_ahead:
            while self.trained < len(self.sampled):
                self.train_next()


@pytest.mark.parametrize("trainer_ahead", [False, True], ids=["sampler_ahead", "trainer_ahead"])
@pytest.mark.parametrize("staleness", [0, 1, 2])
def test_each_batch_is_sampled_with_the_weights_the_staleness_rule_names(staleness, trainer_ahead):
    run = SimulatedRun(staleness, total_steps=6, trainer_ahead=trainer_ahead)
    run.serve()
    assert run.stopped and run.trained == 6
    # the staleness rule: batch j belongs to the weights of step max(0, j - 1 - s)
    assert run.sampled == [(j, max(0, j - 1 - staleness)) for j in range(1, 7)]


@pytest.mark.parametrize("trainer_ahead", [False, True], ids=["sampler_ahead", "trainer_ahead"])
@pytest.mark.parametrize("staleness", [0, 1, 2])
def test_a_validation_uses_its_steps_weights_after_the_batch_the_trainer_needs_next(staleness, trainer_ahead):
    total = 6
    run = SimulatedRun(staleness, total_steps=total, trainer_ahead=trainer_ahead, val_every=2)
    run.serve()
    assert run.sampled == [(j, max(0, j - 1 - staleness)) for j in range(1, total + 1)]  # unchanged by validating
    assert [step for step, _, _ in run.validated] == [0, 2, 4, 6]
    for step, weights, sampled in run.validated:
        assert weights == step  # the weights of its step, never newer ones
        # every batch those weights may sample was sampled first: the trainer trains on it meanwhile
        assert sampled == min(step + 1 + staleness, total)
