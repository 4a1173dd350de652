"""The critic's side of a step, wherever the critic lives: one protocol, :class:`Critic`, and the one
function of the critic's half, :class:`CriticHalf`, that both placements run.

A step meets the critic four times, in the same order whatever the placement:

    begin_step(plan, step, rollout, rewards)  as soon as the per-token rewards are final
    values()                                   V_old (B, R), before the actor's advantages
    targets_lambda()                           the lambda_critic of the targets the step's one GAE
                                               pass should give it (None: it needs none from the step)
    update(targets)                            where the critic's update belongs in the step
    finish_step() -> CriticResult              the targets it trained on and its metrics

:class:`LocalCritic` runs the half on this rank's critic engine: ``values()`` is the values pass
(or the update itself when the plan trains the critic first), ``update(targets)`` the update on the
targets of the step's one GAE pass, before the actor's. :class:`~vcppo.driver.placement.training_ranks.RemoteCritic` hands the share to the critic's own ranks
(``placement.critic_ranks``), which run the same :class:`CriticHalf`; ``update()`` is then a no-op
(their update runs while this rank's actor trains) and ``finish_step()`` waits for it. Both also
take the run's calls on a critic (save, restore, export, the finite-weights check, close).
"""
from __future__ import annotations

from pathlib import Path
from typing import Protocol

import torch

from vcppo.driver.step.update import critic_targets, returns_to_go
from vcppo.driver.step.timeline import PhaseTimer
from vcppo.driver.step.step_plan import StepPlan
from vcppo.driver.durability.resume import restore_engine
from vcppo.driver.step.update import update_critic
from vcppo.experience import CriticBatch, CriticResult, Rollout
from vcppo.config.schema import Config


class CriticHalf:
    """The critic's half of one step, on the ranks that hold its engine: V_old, the value targets with
    the plan's ``lambda_critic`` from the same rewards and values, the update. With ``plan.critic_first``
    (Monte-Carlo targets, one optimizer step) the targets need no values: the update runs first
    and V_old is its own forward."""

    def __init__(self, cfg: Config, engine, plan: StepPlan, step: int, rollout: Rollout, rewards: torch.Tensor,
                 timer: PhaseTimer):
        self.cfg, self.engine, self.plan, self.step, self.timer = cfg, engine, plan, step, timer
        self.rollout, self.rewards = rollout, rewards
        self.old_values: torch.Tensor | None = None
        self.result: CriticResult | None = None

    def values(self) -> torch.Tensor:
        """(B, R) V_old."""
        if self.plan.critic_first:
            returns = returns_to_go(self.rewards, self.rollout.policy_mask, self.cfg.algorithm.gamma)
            with self.timer("critic_update"):
                batch = CriticBatch(**vars(self.rollout), returns=returns)
                out = update_critic(self.cfg, self.engine, self.plan, batch, self.step)
            self.old_values, self.result = out.values, CriticResult(returns, dict(out.metrics))
        else:
            with self.timer("values"):
                self.old_values = self.engine.forward_values(self.rollout)
        return self.old_values

    def targets_lambda(self) -> float | None:
        """The lambda of the GAE targets this half trains on; None when it trains first (its
        Monte-Carlo targets need no values, so no GAE pass)."""
        return None if self.plan.critic_first else self.plan.lambda_critic

    def update(self, targets: torch.Tensor | None = None) -> CriticResult:
        """The update (once; after :meth:`values`) on ``targets`` (B, R): the step's one GAE pass at
        :meth:`targets_lambda`; None where no pass gave them (the critic's own ranks): a scan of its own."""
        if self.result is None:
            returns = targets if targets is not None else critic_targets(
                self.rollout, self.rewards, self.old_values, self.cfg.algorithm, self.plan.lambda_critic)
            with self.timer("critic_update"):
                batch = CriticBatch(**vars(self.rollout), returns=returns, old_values=self.old_values)
                out = update_critic(self.cfg, self.engine, self.plan, batch, self.step)
            self.result = CriticResult(returns, dict(out.metrics))
        return self.result


class Critic(Protocol):
    """The critic as a step and a run see it (module docstring)."""

    def begin_step(self, plan: StepPlan, step: int, rollout: Rollout, rewards: torch.Tensor,
                   timer: PhaseTimer) -> None: ...
    def values(self) -> torch.Tensor: ...
    def targets_lambda(self) -> float | None: ...
    def update(self, targets: torch.Tensor | None) -> None: ...
    def finish_step(self) -> CriticResult: ...
    def save_checkpoint(self, directory: str) -> None: ...
    def restore(self, directory: Path, universal: bool = False) -> None: ...
    def export(self, directory: str, masters: bool = False) -> None: ...
    def check_finite_weights(self, what: str) -> None: ...
    def close(self) -> None: ...


class LocalCritic:
    """The critic on this rank's own engine (:class:`~vcppo.engines.critic.CriticEngine`)."""

    def __init__(self, cfg: Config, engine):
        self.cfg, self.engine = cfg, engine
        self._half: CriticHalf | None = None

    def begin_step(self, plan: StepPlan, step: int, rollout: Rollout, rewards: torch.Tensor,
                   timer: PhaseTimer) -> None:
        self._half = CriticHalf(self.cfg, self.engine, plan, step, rollout, rewards, timer)

    def values(self) -> torch.Tensor:
        return self._half.values()

    def targets_lambda(self) -> float | None:
        return self._half.targets_lambda()

    def update(self, targets: torch.Tensor | None) -> None:
        self._half.update(targets)

    def finish_step(self) -> CriticResult:
        result, self._half = self._half.update(), None
        return result

    def save_checkpoint(self, directory: str) -> None:
        self.engine.save_checkpoint(directory)

    def restore(self, directory: Path, universal: bool = False) -> None:
        restore_engine(self.engine, directory, universal=universal)

    def export(self, directory: str, masters: bool = False) -> None:
        self.engine.export(directory, masters=masters)

    def check_finite_weights(self, what: str) -> None:
        self.engine.check_finite_weights(what)

    def close(self) -> None:
        """Nothing to stop: the engine goes with the process group."""
