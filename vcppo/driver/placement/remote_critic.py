"""The critic as an actor rank sees it when the critic has ranks of its own (``placement.critic_ranks``).

:class:`RemoteCritic` is the :class:`~vcppo.driver.step.critic_side.Critic` of a rank whose critic lives on
a rank of its own: the run's calls (save, restore, export, the finite-weights check) go to this rank's
critic partner (:mod:`vcppo.driver.placement.critic_ranks`) and return when it has run them there. Its step
is two halves, so that the critic's update runs while the actor trains: :meth:`begin_step` hands
over the batch share, :meth:`values` waits for V_old, :meth:`finish_step` for the targets and the
update's metrics.
"""
from __future__ import annotations

from pathlib import Path

import torch

from vcppo.driver.placement.critic_ranks import (Command, CriticStep, Done, Failed, Ready, StartCritic, StopCritic,
                                          UpdateDone, Values)
from vcppo.experience import CriticResult, Rollout


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

    def export(self, directory: str) -> None:
        self._call("export", directory)

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
