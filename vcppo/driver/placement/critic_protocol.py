"""What an actor rank and its critic rank say to each other (``placement.critic_ranks``).

Actor rank i -> critic rank i, in order: :class:`StartCritic` once (the checkpoint the run resumes
from), then per step a :class:`CriticStep` (rank i's share of the batch and its per-token rewards),
a :class:`Command` wherever the driver calls the critic (save, load, export, the finite-weights
check), and :class:`StopCritic` at the end. Critic rank i -> actor rank i, in order: :class:`Ready`
after the start, per step the :class:`Values` (V_old) and then the update's :class:`UpdateDone` (the
targets and the metrics),
and per command :class:`Done`, or :class:`Failed` with the error the critic raised.

Every actor rank sends every message to its own partner, so the critic ranks run each step and
each command together (their collectives: ZeRO-3 among the critic ranks only).
"""
from __future__ import annotations

import pickle
from dataclasses import dataclass, field

import torch

from vcppo.driver.state import Phase
from vcppo.experience import Rollout


@dataclass
class StartCritic:
    resume_point: str | None  # the verified checkpoint the actor ranks resume from (None: fresh)


@dataclass
class Ready:
    from_cache: str | None  # the value-pretrained critic the critic started from (None: not reused)


@dataclass
class CriticStep:
    """One step's share: ``rollout`` (B, ...) and ``rewards`` (B, R), the per-token rewards the
    critic's targets are computed from (the KL penalty already in, where it is)."""
    phase: Phase
    step: int
    rollout: Rollout
    rewards: torch.Tensor


@dataclass
class Values:
    values: torch.Tensor  # (B, R) V_old of the step's share


@dataclass
class UpdateDone:
    returns: torch.Tensor  # (B, R) the value targets the critic trained on
    metrics: dict  # the critic update's metrics (and the critic rank's own timings)


@dataclass
class Command:
    """A call of the critic engine, collective on the critic ranks."""
    name: str  # save_checkpoint | load_checkpoint | export | check_finite_weights
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)


@dataclass
class Done:
    pass


@dataclass
class Failed:
    error: BaseException

    @classmethod
    def of(cls, error: BaseException) -> "Failed":
        """``error`` as it will cross (one that does not pickle and unpickle becomes a RuntimeError
        naming it)."""
        try:
            pickle.loads(pickle.dumps(error))
            return cls(error)
        except Exception:  # noqa: BLE001 -- any pickling failure: send its text instead
            return cls(RuntimeError(f"on the critic rank: {type(error).__name__}: {error}"))


@dataclass
class StopCritic:
    pass
