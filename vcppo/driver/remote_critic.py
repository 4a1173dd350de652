"""The critic as an actor rank sees it when the critic has ranks of its own (``placement.critic_ranks``).

:class:`RemoteCritic` stands where a :class:`~vcppo.engines.critic.CriticEngine` would: the
driver's calls (save, load, export, the finite-weights check) go to this rank's critic partner
(:mod:`vcppo.driver.critic_worker`) and return when it has run them there. A step is two halves,
so that the critic's update runs while the actor trains: :meth:`begin_step` hands over the batch
share, :meth:`values` waits for V_old, :meth:`finish_step` for the update's metrics.
"""
from __future__ import annotations

from pathlib import Path

import torch

from vcppo.driver.critic_protocol import (Command, CriticStep, Done, Failed, Ready, Start, Stop, UpdateDone,
                                          Values)
from vcppo.experience import Rollout


class RemoteCritic:
    def __init__(self, link):
        self.link = link  # engines.bridge.CriticLink to this rank's critic rank

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
        self.link.send(Start(str(resume_point) if resume_point is not None else None))

    def ready(self) -> Path | None:
        """Wait for the critic ranks' engine; the cached pretrained critic it started from, if any."""
        msg = self._expect(Ready)
        return Path(msg.from_cache) if msg.from_cache is not None else None

    # --- a step ------------------------------------------------------------------------------------
    def begin_step(self, phase: str, step: int, rollout: Rollout, rewards: torch.Tensor) -> None:
        """This rank's share of the step (``rewards`` (B, R)); the critic ranks start at once."""
        self.link.send(CriticStep(phase, step, rollout.to("cpu"), rewards.detach().cpu()))

    def values(self, device: torch.device) -> torch.Tensor:
        """(B, R) V_old of the share, once the critic ranks have it."""
        return self._expect(Values).values.to(device)

    def finish_step(self) -> dict:
        """The critic update's metrics, once it ended."""
        return self._expect(UpdateDone).metrics

    # --- what the driver calls on a critic engine --------------------------------------------------
    def save_checkpoint(self, directory: str) -> None:
        self._call("save_checkpoint", directory)

    def load_checkpoint(self, directory: str, universal: bool = False) -> None:
        self._call("load_checkpoint", directory, universal=universal)

    def export(self, directory: str) -> None:
        self._call("export", directory)

    def check_finite_weights(self, what: str) -> None:
        self._call("check_finite_weights", what)

    def close(self) -> None:
        self.link.send(Stop())
        self.link.flush()
