"""Colocated placement (``placement.mode=colocated``, the default): every rank samples its share with
its own vLLM engine between its updates (role ``both``), in one world of all the launched ranks.

:class:`Colocated` is the placement (its row: ``"colocated"`` in
:data:`vcppo.config.placement.PLACEMENTS`): its rules, its rank counts, its one process group, and its
source, :class:`ColocatedSource` (:class:`~vcppo.driver.parts.ExperienceSource`). Its ranks serve
nothing else and the critic trains beside the actor. Only its answers are imported with it (no torch);
its parts are imported where they are asked for.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from vcppo.config.placement import Placement
from vcppo.errors import ConfigError
from vcppo.driver.state import Phase, RunState

if TYPE_CHECKING:
    from vcppo.driver.context import RunContext
    from vcppo.driver.step.experience_maker import ExperienceMaker
    from vcppo.driver.step.step_plan import StepPlan
    from vcppo.engines.actor import ActorEngine
    from vcppo.experience import Rollout


class Colocated(Placement):
    name = "colocated"

    def check(self, cfg) -> None:
        if self.critic_ranks:
            raise ConfigError(f"config key 'placement.critic_ranks' ({self.critic_ranks}) needs placement.mode=split")
        if self.max_staleness:
            raise ConfigError(f"config key 'trainer.max_staleness' ({self.max_staleness}) needs placement.mode=split: "
                              "colocated ranks sample and train in turn, so a batch is never stale")

    def check_ranks(self, cfg, world: int) -> None:
        from vcppo.config.parallel import check_sequence_parallel_ranks
        check_sequence_parallel_ranks(cfg, world)
        super().check_ranks(cfg, world)

    def init_groups(self, cfg):
        from vcppo.runtime import dist as D
        return D.init_distributed(cfg.trainer.device, **D.timeouts(cfg.trainer))

    def source(self, ctx: RunContext, plan: StepPlan) -> "ColocatedSource":
        return ColocatedSource.for_run(ctx, plan)


class ColocatedSource:
    """Every rank samples its share with its own vLLM engine, between its updates."""

    def __init__(self, ctx: RunContext, maker: ExperienceMaker):
        self.ctx, self.maker = ctx, maker
        self.finished: list[tuple[int, dict]] = []  # validations not yet logged

    @classmethod
    def for_run(cls, ctx: RunContext, plan: StepPlan) -> "ColocatedSource":
        from vcppo.driver.step.experience_maker import ExperienceMaker
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
        from vcppo.driver.step.validation import validate_run
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

