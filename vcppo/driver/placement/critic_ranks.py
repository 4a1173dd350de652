"""The critic on ranks of its own (``placement.critic_ranks``, split placement): what an actor rank and its
critic rank say to each other, and the critic ranks' side.

**The messages.** Actor rank i -> critic rank i, in order: :class:`StartCritic` once (the checkpoint the run resumes
from), then per step a :class:`CriticStep` (rank i's share of the batch and its per-token rewards),
a :class:`Command` wherever the driver calls the critic (save, load, export, the finite-weights
check), and :class:`StopCritic` at the end. Critic rank i -> actor rank i, in order: :class:`Ready`
after the start, per step the :class:`Values` (V_old) and then the update's :class:`UpdateDone` (the
targets and the metrics),
and per command :class:`Done`, or :class:`Failed` with the error the critic raised.

Every actor rank sends every message to its own partner, so the critic ranks run each step and
each command together (their collectives: ZeRO-3 among the critic ranks only).

**The critic ranks** run the critic's passes and update, beside the actor's. Critic rank i serves actor
rank i: it builds the critic as
the training ranks would (from the policy, a reward model, a checkpoint or the value-pretraining
cache; restored where the run resumes), then per step takes rank i's share of the batch and its
rewards, and runs the critic's half of the step that a training rank's local critic runs
(:class:`~vcppo.driver.step.critic_side.CriticHalf`): V_old, sent back at once, then the targets with
``lambda_critic`` from the same rewards and values and the update, whose targets and metrics follow. The
critic ranks' ZeRO-3 collectives run among themselves, while the actor ranks train. A checkpoint
also holds each critic rank's RNG states (``rng_critic{r}.json``: a critic with dropout, e.g.
LoRA's, resumes exactly), restored unless the run resumes on another number of ranks.
"""
from __future__ import annotations

import json
import pickle
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from vcppo.config.placement import CRITIC
from vcppo.config.schema import Config
from vcppo.driver.context import init_run_distributed, seed_process
from vcppo.driver.durability.checkpoint import peek_state, rng_state, set_rng_state
from vcppo.driver.durability.resume import restore_engine
from vcppo.driver.run_engines import build_critic
from vcppo.driver.state import Phase
from vcppo.driver.step.critic_side import CriticHalf
from vcppo.driver.step.step_plan import ppo_plan, pretrain_plan
from vcppo.driver.step.timeline import PeakRss, PhaseTimer, Timeline
from vcppo.experience import Rollout
from vcppo.runtime import dist as D
from vcppo.runtime.dist import DistInfo


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


class _Log:
    """The critic ranks' start-up lines, from critic rank 0, in the run logger's console format (the
    actor ranks hold the run's logger and its files)."""

    def __init__(self, enabled: bool):
        self.enabled = enabled

    def info(self, line: str) -> None:
        if self.enabled:
            print(f"[vcppo {time.strftime('%H:%M:%S')}] critic ranks: {line}", file=sys.stderr, flush=True)


class CriticServer:
    """One critic rank: its engine, the two phases' plans, and the link to its actor rank."""

    def __init__(self, cfg: Config, dist: DistInfo, link, timeline: Timeline):
        self.cfg, self.dist, self.link, self.timeline = cfg, dist, link, timeline
        self.plans = {Phase.VALUE_PRETRAIN: pretrain_plan(cfg, dist.device), Phase.PPO: ppo_plan(cfg, dist.device)}
        self.critic = None  # built at StartCritic

    def start(self, msg: StartCritic) -> None:
        point = Path(msg.resume_point) if msg.resume_point is not None else None
        resumed = peek_state(point) if point is not None else None
        self.critic, from_cache = build_critic(self.cfg, self.dist, _Log(self.dist.is_main), resumed, point)
        self.link.send(Ready(str(from_cache) if from_cache is not None else None))

    def step(self, msg: CriticStep) -> None:
        """The critic's half of the step (the one the training ranks' local critic runs), V_old sent
        as soon as it exists."""
        timer = PhaseTimer(timeline=self.timeline, rss=PeakRss())
        half = CriticHalf(self.cfg, self.critic, self.plans[msg.phase], msg.step, msg.rollout.to(self.dist.device),
                          msg.rewards.to(self.dist.device), timer)
        self.link.send(Values(half.values().cpu()))
        result = half.update()
        metrics = dict(result.metrics)
        metrics.update({"time/critic_rank_values_s": timer.seconds.get("values", 0.0),
                        "time/critic_rank_update_s": timer.seconds["critic_update"]})
        self.link.send(UpdateDone(result.returns.cpu(), metrics))

    def command(self, msg: Command) -> None:
        with self.timeline.span(msg.name):
            if msg.name == "load_checkpoint":
                directory, universal = Path(msg.args[0]), msg.kwargs.get("universal", False)
                restore_engine(self.critic, directory, universal=universal)
                rng = directory.parent / f"rng_critic{self.dist.rank}.json"
                if not universal and rng.exists():  # on another number of ranks the streams do not carry over
                    set_rng_state(json.loads(rng.read_text()))
            elif msg.name == "save_checkpoint":
                self.critic.save_checkpoint(*msg.args)
                (Path(msg.args[0]).parent / f"rng_critic{self.dist.rank}.json").write_text(json.dumps(rng_state()))
            elif msg.name in ("export", "check_finite_weights"):
                getattr(self.critic, msg.name)(*msg.args, **msg.kwargs)
            else:
                raise ValueError(f"unknown critic command {msg.name!r}")
        self.link.send(Done())

    def answer(self, msg) -> Exception | None:
        """Handle ``msg``; an error is sent to the actor rank (which raises it) and returned."""
        try:
            if isinstance(msg, StartCritic):
                self.start(msg)
            elif isinstance(msg, CriticStep):
                self.step(msg)
            else:
                self.command(msg)
        except Exception as e:  # noqa: BLE001 -- the actor rank raises it; then so does this rank
            self.link.send(Failed.of(e))
            return e
        return None

    def serve(self) -> None:
        """Until the actor rank says stop."""
        while not isinstance(msg := self.link.receive(), StopCritic):
            if (error := self.answer(msg)) is not None:
                try:
                    self.link.flush()  # the actor rank raises the error sent; it may have exited already
                except Exception:  # noqa: BLE001 -- this rank's own error is the one to raise
                    pass
                raise error
        self.link.flush()


def serve_critic(cfg: Config, run_dir: Path, placement) -> None:
    """A critic rank's whole life in a split run (``placement``: its Split, which holds the link to its
    actor rank); returns when its actor rank says stop."""
    dist = init_run_distributed(cfg, placement)
    seed_process(cfg)
    server = CriticServer(cfg, dist, placement.critic_link, Timeline(run_dir if cfg.logging.timeline else None, CRITIC))
    clean = False
    try:
        server.serve()
        clean = True
    finally:
        server.timeline.close()
        D.shutdown(wait_for_peers=clean)
