"""The training ranks' side of split placement: their experience source and, with critic ranks, their critic.

**RemoteSource**: batches arrive from the rollout ranks, weights go back. Trainer 0 talks to the rollout ranks
(:mod:`vcppo.driver.placement.rollout_ranks`) and hands each step's whole batch to the other training ranks,
which keep their share of it exactly as colocated ranks do after balancing. A validation is asked for, not
waited for: its result is logged once it has arrived, and a checkpoint first waits for every one asked for, so
its metrics hold them all. In-flight batches: a checkpoint at PPO step k with ``trainer.max_staleness = s``
first receives batches k+1..k+s (sampled with weights older than the checkpoint's, which a resumed run could
not sample again) and saves them with the checkpoint (``inflight.pt``); a resumed run trains on them first and
the rollout ranks go on from batch k+s+1, so the run continues exactly as if it had not stopped. Later
batches, and every value-pretraining batch (frozen policy), are sampled again from their seeds.

**RemoteCritic**: the critic as an actor rank sees it when the critic has ranks of its own
(``placement.critic_ranks``). :class:`RemoteCritic` is the :class:`~vcppo.driver.step.critic_side.Critic` of a
rank whose critic lives on a rank of its own: the run's calls (save, restore, export, the finite-weights
check) go to this rank's critic partner (:mod:`vcppo.driver.placement.critic_ranks`) and return when it has
run them there. Its step is two halves, so that the critic's update runs while the actor trains:
:meth:`begin_step` hands over the batch share, :meth:`values` waits for V_old, :meth:`finish_step` for the
targets and the update's metrics.
"""
from __future__ import annotations

import time
from pathlib import Path

import torch

from vcppo.driver.context import RunContext
from vcppo.driver.placement.critic_ranks import (Command, CriticStep, Done, Failed, Ready, StartCritic, StopCritic,
                                                 UpdateDone, Values)
from vcppo.driver.placement.rollout_ranks import (BeginPhase, SampledBatch, Start, StepDone, Stop, Validate,
                                                  ValidationResult, held_after_checkpoint)
from vcppo.driver.state import Phase, RunState
from vcppo.driver.step.sampler import share_of_step
from vcppo.engines.actor import ActorEngine
from vcppo.experience import CriticResult, Rollout
from vcppo.runtime import collectives
from vcppo.runtime.bridge import pack_weights


INFLIGHT = "inflight.pt"
WEIGHT_BUCKET_BYTES = 256 * 2 ** 20


def _batch_record(msg: SampledBatch) -> dict:
    """``msg`` as tensors and plain values (a checkpoint loads with ``weights_only``)."""
    return {"phase": str(msg.phase), "step": msg.step, "version": msg.version, "metrics": msg.metrics,
            "prompt_state": msg.prompt_state, "seconds": msg.seconds, "rollout": dict(vars(msg.rollout))}


def _batch_message(rec: dict) -> SampledBatch:
    return SampledBatch(phase=Phase(rec["phase"]), step=rec["step"], version=rec["version"], metrics=rec["metrics"],
                        prompt_state=rec["prompt_state"], seconds=rec["seconds"], rollout=Rollout(**rec["rollout"]))


class RemoteSource:
    """A training rank's :class:`~vcppo.driver.parts.ExperienceSource` in a split run."""

    def __init__(self, ctx: RunContext, bridge):
        self.ctx, self.cfg, self.dist = ctx, ctx.cfg, ctx.dist
        self.bridge = bridge  # trainer 0 only (runtime.bridge.Bridge; None on the other training ranks)
        self.mailbox: dict[tuple, SampledBatch | ValidationResult] = {}
        self.phase = Phase.PPO
        self.consumed_state: dict | None = None  # the prompt position after the last batch trained on
        self.asked: list[int] = []  # main rank: the steps whose validation has not been logged yet

    # --- trainer 0's mailbox ---------------------------------------------------------------------
    def _receive_one(self) -> None:
        """The next message from the rollout ranks into the mailbox; batches of a phase that ended
        (sampled ahead of value pretraining's end) are dropped."""
        msg = self.bridge.receive()
        if isinstance(msg, ValidationResult):
            self.mailbox[("val", msg.step)] = msg
        elif msg.phase == self.phase:
            self.mailbox[("batch", msg.phase, msg.step)] = msg

    def _fetch(self, key: tuple) -> SampledBatch | ValidationResult:
        """(Left in the mailbox.) Receive until ``key`` (("batch", phase, step) or ("val", step)) is in."""
        while key not in self.mailbox:
            self._receive_one()
        return self.mailbox[key]

    def _take(self, key: tuple) -> SampledBatch | ValidationResult:
        """:meth:`_fetch`, and out of the mailbox."""
        self._fetch(key)
        return self.mailbox.pop(key)

    def _send(self, msg, weights: list[torch.Tensor] = ()) -> None:
        self.bridge.reap()
        self.bridge.broadcast_control(msg, weights)

    def _weights(self, actor: ActorEngine):
        """The actor's full weights packed for the bridge (collective: every training rank)."""
        named = list(actor.named_parameters_gathered())
        return pack_weights(named, WEIGHT_BUCKET_BYTES) if self.dist.is_main else (None, [])

    # --- the source ------------------------------------------------------------------------------
    def start(self, state: RunState, resumed: bool) -> None:
        self.phase = Phase(state.phase)
        done = state.phase_step
        held = self._load_inflight() if resumed else []
        layout, buckets = self._weights(self.ctx.actor) if (self.phase == Phase.PPO and state.step > 0) else (None, [])
        self.consumed_state = state.data if resumed else None
        if self.dist.is_main:
            for msg in held:
                self.mailbox[("batch", msg.phase, msg.step)] = msg
            prompt_state = held[-1].prompt_state if held else self.consumed_state
            self._send(Start(phase=self.phase, next_step=done + 1 + len(held), trainer_done=done,
                             version=state.step if self.phase == Phase.PPO else 0, prompt_state=prompt_state,
                             weights=layout), buckets)

    def make(self, phase: Phase, step: int) -> tuple[Rollout, dict]:
        start = time.perf_counter()
        msg = collectives.broadcast_object(self._take(("batch", phase, step)) if self.dist.is_main else None)
        self.consumed_state = msg.prompt_state
        batch = share_of_step(msg.rollout, self.dist, balance=self.cfg.trainer.balance_batch)
        metrics = dict(msg.metrics)
        metrics["time/sample_s"] = msg.seconds
        metrics["time/wait_rollout_s"] = time.perf_counter() - start
        if phase == Phase.PPO:  # actor updates between the sampling weights and the training ones
            metrics["staleness/steps_behind"] = float(step - 1 - msg.version)
        return batch.to(self.dist.device), metrics

    def step_done(self, phase: Phase, step: int, actor: ActorEngine | None) -> None:
        layout, buckets = self._weights(actor) if actor is not None else (None, [])
        if self.dist.is_main:
            self._send(StepDone(phase=phase, step=step, weights=layout), buckets)

    def begin_phase(self, phase: Phase) -> None:
        self.phase = phase
        if self.dist.is_main:
            self.mailbox = {k: m for k, m in self.mailbox.items() if k[0] == "val"}
            self._send(BeginPhase(phase=phase, prompt_state=self.consumed_state))

    def validate(self, step: int) -> None:
        """Asked of the rollout ranks, which validate with the weights of ``step`` while this rank
        trains on (:func:`~vcppo.driver.placement.rollout_ranks.handle_now`)."""
        if self.cfg.data.val_files and self.dist.is_main:
            self._send(Validate(step=step))
            self.asked.append(step)

    def finished_validations(self, wait: bool) -> list[tuple[int, dict]]:
        """Main rank: the results that have arrived (``wait``: every one asked for); others: []."""
        if not self.asked:
            return []
        while self.bridge.data_ready():
            self._receive_one()
        if wait:
            with self.ctx.timeline.span("wait_validation"):
                for step in self.asked:
                    self._fetch(("val", step))
        done = [step for step in self.asked if ("val", step) in self.mailbox]
        self.asked = [step for step in self.asked if step not in done]
        return [(step, self.mailbox.pop(("val", step)).metrics) for step in done]

    def checkpoint(self, stage: Path, state: RunState) -> dict:
        """Main rank: the in-flight batches saved with the checkpoint; the prompt position after them."""
        phase = Phase(state.phase)
        done = state.phase_step
        total = self.cfg.trainer.total_steps if phase == Phase.PPO else self.cfg.value_pretrain.steps
        held = [self._fetch(("batch", phase, j))
                for j in held_after_checkpoint(phase, done, total, self.cfg.trainer.max_staleness)]
        if held:
            torch.save({"batches": [_batch_record(m) for m in held]}, stage / INFLIGHT)
        return held[-1].prompt_state if held else self.consumed_state

    def _load_inflight(self) -> list[SampledBatch]:
        path = self.ctx.resume_point / INFLIGHT if self.ctx.resume_point is not None else None
        if path is None or not path.exists():
            return []
        return [_batch_message(r) for r in torch.load(path, weights_only=True)["batches"]]

    def close(self) -> None:
        if self.dist.is_main:
            self._send(Stop())
            self.bridge.flush()


class RemoteCritic:
    def __init__(self, link):
        self.link = link  # runtime.bridge.CriticLink to this rank's critic rank

    def _expect(self, kind: type):
        msg = self.link.receive()
        if isinstance(msg, Failed):
            raise msg.error
        if not isinstance(msg, kind):
            raise RuntimeError(f"the critic rank answered {type(msg).__name__}, expected {kind.__name__}")
        return msg

    def _call(self, name: str, *args, **kwargs) -> None:
        self.link.send(Command(name, args, kwargs))
        self._expect(Done)

    # --- start-up ----------------------------------------------------------------------------------
    def start(self, resume_point: Path | None) -> None:
        """The critic ranks build their engine (alongside the actor's start-up on these ranks)."""
        self.link.send(StartCritic(str(resume_point) if resume_point is not None else None))

    def ready(self) -> Path | None:
        """Wait for the critic ranks' engine; the cached pretrained critic it started from, if any."""
        msg = self._expect(Ready)
        return Path(msg.from_cache) if msg.from_cache is not None else None

    # --- a step (vcppo.driver.step.critic_side.Critic) ------------------------------------------------
    def begin_step(self, plan, step: int, rollout: Rollout, rewards: torch.Tensor, timer) -> None:
        """This rank's share of the step (``rewards`` (B, R)); the critic ranks start at once."""
        self._device, self._timer = rollout.policy_mask.device, timer
        self.link.send(CriticStep(plan.phase, step, rollout.to("cpu"), rewards.detach().cpu()))

    def values(self) -> torch.Tensor:
        """(B, R) V_old of the share, once the critic ranks have it."""
        with self._timer("wait_critic_values"):
            return self._expect(Values).values.to(self._device)

    def targets_lambda(self) -> None:
        """None: the critic ranks compute their targets (this rank's pass gives only the advantages)."""
        return None

    def update(self, targets: torch.Tensor | None) -> None:
        """Nothing here: the critic ranks update while this rank's actor trains."""

    def finish_step(self) -> CriticResult:
        """The targets the critic ranks trained on and their update's metrics, once it ended."""
        with self._timer("wait_critic_update"):
            done = self._expect(UpdateDone)
        return CriticResult(done.returns.to(self._device), done.metrics)

    # --- what the driver calls on a critic engine --------------------------------------------------
    def save_checkpoint(self, directory: str) -> None:
        self._call("save_checkpoint", directory)

    def restore(self, directory: Path, universal: bool = False) -> None:
        """Restored on the critic's own ranks (with their RNG states)."""
        self._call("load_checkpoint", str(directory), universal=universal)

    def export(self, directory: str, masters: bool = False) -> None:
        self._call("export", directory, masters=masters)

    def check_finite_weights(self, what: str) -> None:
        self._call("check_finite_weights", what)

    def close(self) -> None:
        self.link.send(StopCritic())
        self.link.flush()


def start_remote_critic(link, resume_point: Path | None) -> RemoteCritic:
    """This training rank's critic, on its critic rank (``placement.critic_ranks``, over ``link``): asked to
    build its engine from ``resume_point`` (None: a fresh start), which it does while this rank builds the actor."""
    remote = RemoteCritic(link)
    remote.start(resume_point)
    return remote
