"""What crosses the bridge in split placement, and the staleness rule (docs/architecture.md).

Trainer 0 -> rollout ranks (control, in order): :class:`Start` once, then per step
:class:`StepDone` (with the new weights when the actor trained), :class:`BeginPhase` when
value pretraining ends, :class:`Validate` where the run validates, :class:`Stop` at the end.
Rollout rank 0 -> trainer 0 (data, in order): :class:`SampledBatch` per step, and
:class:`ValidationResult` for each :class:`Validate`, which trainer 0 does not wait for: it trains
on while the rollout ranks validate, and logs the result when it arrives.

The staleness rule. Batch ``j`` of a phase may be sampled once the trainer has finished step
``j - 1 - lookahead``: with ``trainer.max_staleness = s`` the PPO lookahead is ``s``, and batch j is
sampled with the weights of step ``max(0, j - 1 - s)`` exactly, ``s`` actor updates behind the
weights that train on it (s = 0 is the synchronous order of a colocated run). Exactly, not "at
most": a rollout rank that may still sample its next batch takes the trainer's newer weights only
after sampling it (:func:`handle_now`), so which weights sample a batch never depends on which
side ran faster, and a run repeats, and resumes, exactly. In value pretraining the policy is
frozen, so running ahead costs no off-policy error at all: the lookahead is at least 1 there.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from vcppo.driver.state import Phase
from vcppo.runtime.bridge import WeightsLayout
from vcppo.experience import Rollout

def lookahead(phase: Phase, max_staleness: int) -> int:
    """Batches the rollout ranks may sample beyond the one the trainer needs next."""
    return max(1, max_staleness) if phase == Phase.VALUE_PRETRAIN else max_staleness


def may_sample(step: int, trainer_done: int, ahead: int) -> bool:
    """Whether batch ``step`` may be sampled once the trainer finished step ``trainer_done``."""
    return step <= trainer_done + 1 + ahead


def handle_now(msg, can_sample: bool) -> bool:
    """Whether a rollout rank handles the control message ``msg`` before sampling its next batch.
    Two messages wait while the next batch may still be sampled, since that batch belongs to the
    weights already loaded (those of step ``max(0, j - 1 - s)`` for batch j):

    * a PPO :class:`StepDone` (newer weights): taking them first would make the batch fresher than
      the rule, and only when the trainer happened to be ahead of the sampler: a run would not repeat;
    * a :class:`Validate` (of the loaded weights, which the batch uses too): the trainer needs the
      batch before the validation's result, so it trains on that batch while the rollout ranks
      validate. No newer weights can arrive in between: they are queued behind the Validate.
    """
    if not can_sample:
        return True
    return not (isinstance(msg, Validate) or (isinstance(msg, StepDone) and msg.phase == Phase.PPO))


def held_after_checkpoint(phase: Phase, step: int, total: int, max_staleness: int) -> range:
    """The in-flight batches a checkpoint at ``step`` must save: PPO batches sampled with weights
    older than the checkpoint's (steps ``step + 1 .. step + s``), which a resumed run could not
    sample again. Value-pretraining batches come from the frozen policy: sampled again from
    their seeds, never saved."""
    if phase != Phase.PPO:
        return range(0)
    return range(step + 1, min(step + max_staleness, total) + 1)


@dataclass
class Start:
    """The rollout ranks' first message: where to begin."""
    phase: Phase
    next_step: int                  # the first batch to sample
    trainer_done: int               # the last step the trainer finished in ``phase``
    version: int                    # the PPO step whose weights sample (0: the initial policy)
    prompt_state: dict | None       # the prompt stream's position before ``next_step`` (None: fresh)
    weights: WeightsLayout | None = None


@dataclass
class StepDone:
    """The trainer finished ``step``; with ``weights``, the actor's new weights follow."""
    phase: Phase
    step: int
    weights: WeightsLayout | None = None


@dataclass
class BeginPhase:
    """Value pretraining ended: drop what was sampled ahead, rewind the prompts, sample ``phase``."""
    phase: Phase
    prompt_state: dict


@dataclass
class Validate:
    step: int


@dataclass
class Stop:
    pass


@dataclass
class SampledBatch:
    """One step's scored samples over every rollout rank."""
    phase: Phase
    step: int
    version: int                    # the PPO step whose weights sampled it (0: the initial policy)
    rollout: Rollout
    metrics: dict
    prompt_state: dict              # the prompt stream's position after it
    seconds: float                  # the rollout ranks' time to sample and score it
    timings: dict = field(default_factory=dict)


@dataclass
class ValidationResult:
    step: int
    metrics: dict
