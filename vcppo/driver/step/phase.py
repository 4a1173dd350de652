"""A run's two phases, under one name each wherever a phase is named: checkpoints and resume
(:class:`~vcppo.driver.durability.checkpoint.RunState`), the step plans, the split-placement and critic
protocols, the logged records (``metrics.jsonl``'s ``phase``)."""
from __future__ import annotations

import enum


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
