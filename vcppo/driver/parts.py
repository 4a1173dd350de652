"""The run's parts as the layers of the driver read them, at its bottom beside :mod:`vcppo.driver.state`
(nothing here imports the rest of the driver): the step, its metrics and the checkpoints take a
:class:`RunParts`, which the wiring's :class:`~vcppo.driver.context.RunContext` (built above them) is;
the checkpoints save a :class:`CheckpointedSource`, which every :class:`ExperienceSource` is. Protocols,
so that no layer names a type of one above it, not even for an annotation.

**Where a training rank's experience comes from**: its own vLLM engine (colocated,
:mod:`vcppo.driver.placement.colocated`) or the rollout ranks (split placement,
:mod:`vcppo.driver.placement.training_ranks`). The step sees one interface, :class:`ExperienceSource`:

    start(state, resumed)      before the first step: the data position, the resumed weights
    make(phase, step)          the step's scored batch on this rank, and its sampling metrics
    step_done(phase, step, ..) after the updates: the new weights to the sampler
    begin_phase(phase)         value pretraining ended
    validate(step)             ask for greedy pass@1 and pass@k with the weights of ``step``
    finished_validations(wait) the validations done since the last call: [(step, metrics)]
    checkpoint(stage, state)   the data position a checkpoint records (main rank)
    close()                    the run ended cleanly

Every training rank calls each of them at the same point (they may hold collectives).
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from vcppo.driver.state import Phase, RunState

if TYPE_CHECKING:  # types of the layers below the driver, for annotations only
    from vcppo.config.schema import Config
    from vcppo.engines.actor import ActorEngine
    from vcppo.experience import Rollout
    from vcppo.runtime.dist import DistInfo
    from vcppo.tracking import MetricsLogger


class RunParts(Protocol):
    """What a step and a checkpoint reach on this rank."""

    cfg: Config
    run_dir: Path
    dist: DistInfo
    actor: ActorEngine
    critic: Any          # a driver.step.critic_side.Critic (local or on ranks of its own), or None
    reference: Any       # the reference engine (a copy, or the LoRA actor with its adapters off), or None
    reward_model: Any    # the reward model's scorer on the training ranks, or None
    log: MetricsLogger
    timeline: Any        # the step's driver.step.timeline.Timeline
    tokenizer: Any       # the policy's tokenizer (samples as text), or None
    resume_point: Path | None
    universal_checkpoints: dict

    def barrier(self) -> None: ...

    def write_final_metrics(self, metrics: dict) -> None: ...


class CheckpointedSource(Protocol):
    """An experience source as a checkpoint saves it: its own files (in-flight batches, prompt-stream
    position) written into the staging directory, returned as the run state's ``data``."""

    def checkpoint(self, stage: Path, state: RunState) -> dict: ...


class ExperienceSource(Protocol):
    def start(self, state: RunState, resumed: bool) -> None: ...
    def make(self, phase: Phase, step: int) -> tuple[Rollout, dict]: ...
    def step_done(self, phase: Phase, step: int, actor: ActorEngine | None) -> None: ...
    def begin_phase(self, phase: Phase) -> None: ...
    def validate(self, step: int) -> None: ...
    def finished_validations(self, wait: bool) -> list[tuple[int, dict]]: ...
    def checkpoint(self, stage: Path, state: RunState) -> dict: ...
    def close(self) -> None: ...
