"""Where a training rank's experience comes from: its own vLLM engine (colocated,
:mod:`vcppo.driver.placement.colocated`) or the rollout ranks (split placement,
:mod:`vcppo.driver.placement.remote_source`). The step sees one interface, :class:`ExperienceSource`:

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
from typing import Protocol

from vcppo.driver.state import Phase, RunState
from vcppo.engines.actor import ActorEngine
from vcppo.experience import Rollout


class ExperienceSource(Protocol):
    def start(self, state: RunState, resumed: bool) -> None: ...
    def make(self, phase: Phase, step: int) -> tuple[Rollout, dict]: ...
    def step_done(self, phase: Phase, step: int, actor: ActorEngine | None) -> None: ...
    def begin_phase(self, phase: Phase) -> None: ...
    def validate(self, step: int) -> None: ...
    def finished_validations(self, wait: bool) -> list[tuple[int, dict]]: ...
    def checkpoint(self, stage: Path, state: RunState) -> dict: ...
    def close(self) -> None: ...
