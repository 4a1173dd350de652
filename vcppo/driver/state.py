"""Where a run stands, at the bottom of the driver (nothing here imports the rest of it): the run's two
phases, under one name each wherever a phase is named (checkpoints and resume, the step plans, the
split-placement and critic protocols, ``metrics.jsonl``'s ``phase``), and :class:`RunState`, saved as
``state.json`` in every checkpoint (:mod:`vcppo.driver.durability.checkpoint`)."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Phase(str, enum.Enum):
    """Equal to (and hashed as) its value, so a checkpoint's or a record's text compares with it."""

    VALUE_PRETRAIN = "value_pretrain"
    PPO = "ppo"

    def __str__(self) -> str:
        return self.value


def seed_key(phase: str) -> str:
    """A phase's key in the sampling seeds (:func:`vcppo.driver.step.experience_maker.sample_seed`):
    ``pretrain`` for value pretraining (the key every run's samples were drawn with; changing it would
    change them), the text itself otherwise (``ppo``, ``ppo/retry1``, ``val``)."""
    return "pretrain" if phase == Phase.VALUE_PRETRAIN else str(phase)


@dataclass
class RunState:
    """Where a run stands; saved as ``state.json`` in every checkpoint."""
    phase: Phase                      # the phase to continue (state.json holds its value)
    step: int = 0                     # PPO steps done
    pretrain_step: int = 0            # value-pretraining steps done
    pretrain_ev: list = field(default_factory=list)    # explained variance per pretraining step
    pretrain_loss: list = field(default_factory=list)  # value loss per pretraining step
    data: dict = field(default_factory=dict)           # the prompt stream's position
    nonfinite_streak: int = 0         # steps in a row with a skipped non-finite optimizer step
    reward_fail_streak: int = 0       # steps in a row whose every sample's reward failed
    metrics_bytes: int | None = None  # size of metrics.jsonl at this checkpoint (None: older ones)
    kl_coef: float | None = None      # the adaptive KL controller's coefficient (None: algorithm.kl_coef)
    model_score_moments: list = field(default_factory=list)  # [count, mean, M2] of the reward model's scores
    divergence_baseline: dict = field(default_factory=dict)  # guarded metric -> its first PPO step's value
    divergence_since: dict = field(default_factory=dict)     # guarded metric out of range -> since which step

    def __post_init__(self):
        self.phase = Phase(self.phase)  # state.json's text

    @property
    def global_step(self) -> int:
        return self.pretrain_step + self.step

    @property
    def phase_step(self) -> int:
        """Steps done in the phase the run is in."""
        return self.step if self.phase == Phase.PPO else self.pretrain_step
