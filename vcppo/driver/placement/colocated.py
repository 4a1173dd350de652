"""The colocated source: every training rank samples its share with its own rollout engine, between
its updates (:class:`~vcppo.driver.step.sources.ExperienceSource`); :func:`make_source` picks it or the
rollout ranks' (:class:`~vcppo.driver.placement.remote_source.RemoteSource`) from the rank's role."""
from __future__ import annotations

from pathlib import Path

from vcppo.config.placement import Placement
from vcppo.driver.context import RunContext
from vcppo.driver.state import Phase, RunState
from vcppo.driver.placement.remote_source import RemoteSource
from vcppo.driver.step.experience_maker import ExperienceMaker
from vcppo.driver.step.sources import ExperienceSource
from vcppo.driver.step.step_plan import StepPlan
from vcppo.driver.step.validation import validate_run
from vcppo.engines.actor import ActorEngine
from vcppo.experience import Rollout


class ColocatedSource:
    """Every rank samples its share with its own vLLM engine, between its updates."""

    def __init__(self, ctx: RunContext, maker: ExperienceMaker):
        self.ctx, self.maker = ctx, maker
        self.finished: list[tuple[int, dict]] = []  # validations not yet logged

    @classmethod
    def for_run(cls, ctx: RunContext, plan: StepPlan) -> "ColocatedSource":
        return cls(ctx, ExperienceMaker(ctx.cfg, ctx.dist, ctx.prompts, ctx.rollout, ctx.scorer, ctx.pad_id,
                                        logprobs=plan.sampler_logprobs))

    def start(self, state: RunState, resumed: bool) -> None:
        if resumed:
            self.ctx.prompts.load_state_dict(state.data)
            if state.phase == Phase.PPO and state.step > 0:
                self.ctx.sync_weights()  # vLLM started from the initial policy; give it the resumed actor

    def make(self, phase: Phase, step: int) -> tuple[Rollout, dict]:
        batch, metrics = self.maker.make(phase, step)
        # GPU: hand vLLM's memory to training; a no-op on CPU and for the hf engine (metric 0)
        metrics["rollout/asleep_while_training"] = float(bool(self.ctx.rollout.sleep()))
        return batch, metrics

    def step_done(self, phase: Phase, step: int, actor: ActorEngine | None) -> None:
        self.ctx.rollout.wake_up()
        if actor is not None:
            self.ctx.sync_weights()

    def begin_phase(self, phase: Phase) -> None:
        pass  # the prompt stream already stands after the last batch trained on

    def validate(self, step: int) -> None:
        """Done at once: these ranks sample and train in turn."""
        ctx = self.ctx
        if ctx.val_rows:
            self.finished.append((step, validate_run(ctx.cfg, self.maker.sampler, ctx.val_rows, ctx.dist, step)))

    def finished_validations(self, wait: bool) -> list[tuple[int, dict]]:
        finished, self.finished = self.finished, []
        return finished

    def checkpoint(self, stage: Path, state: RunState) -> dict:
        return self.ctx.prompts.state_dict()

    def close(self) -> None:
        pass


def make_source(ctx: RunContext, plan: StepPlan) -> ExperienceSource:
    """The run's source: this rank's own engine where it samples (colocated), else the rollout ranks'
    (the training ranks of a split run)."""
    if Placement.of(ctx.cfg).samples_on(ctx.dist.role):
        return ColocatedSource.for_run(ctx, plan)
    return RemoteSource(ctx)
