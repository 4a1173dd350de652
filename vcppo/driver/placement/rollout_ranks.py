"""The rollout ranks of split placement: what crosses the bridge, the staleness rule, and the rollout
ranks' side (docs/architecture.md).

**The messages.** Trainer 0 -> rollout ranks (control, in order): :class:`Start` once, then per step
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

**The rollout ranks** sample and score batches, ahead of training within the staleness bound, and load
the actor's weights as they come (docs/launching.md). Every rollout rank runs :func:`serve_rollouts` (SPMD among the rollout ranks: they share each
step's prompts and make the same decisions, rollout rank 0 deciding). The loop: take the control
messages that have arrived (above), then sample the next batch if the
staleness rule allows it, else wait for the next message. A batch is sampled exactly as a
colocated rank samples it (:class:`~vcppo.driver.step.experience_maker.ExperienceMaker`, the same seeds),
gathered on rollout rank 0 and sent to trainer 0.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from vcppo.config.placement import ROLLOUT, Placement
from vcppo.config.schema import Config
from vcppo.driver.context import init_run_distributed, load_prompt_set, make_scorer, pad_token_id
from vcppo.driver.state import Phase
from vcppo.driver.step.experience_maker import ExperienceMaker
from vcppo.driver.step.step_plan import wants_sampler_logprobs
from vcppo.driver.step.timeline import Timeline
from vcppo.driver.step.validation import validate_run
from vcppo.engines.rollout_choice import make_rollout_engine, sequences_per_call
from vcppo.experience import Rollout, concat_batches
from vcppo.runtime import collectives
from vcppo.runtime import dist as D
from vcppo.runtime.bridge import WeightsLayout


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


class RolloutServer:
    """One rollout rank's state: the engine, the prompt stream, and where the run stands."""

    def __init__(self, cfg: Config, run_dir: Path, placement: Placement):
        from transformers import AutoTokenizer

        self.cfg, self.dist = cfg, init_run_distributed(cfg, placement)
        self.bridge = placement.bridge
        tokenizer = AutoTokenizer.from_pretrained(cfg.model.tokenizer_path)
        train_set = load_prompt_set(cfg, cfg.data.train_files, tokenizer, max_prompt_tokens=cfg.data.max_prompt_tokens,
                                    shuffle_seed=cfg.trainer.seed)
        self.val_rows = load_prompt_set(cfg, cfg.data.val_files, tokenizer, max_prompt_tokens=cfg.data.max_prompt_tokens,
                                        shuffle_seed=None, limit=cfg.trainer.val_max_prompts).rows() \
            if cfg.data.val_files else []
        self.prompts = train_set.stream(seed=cfg.trainer.seed)
        self.initial_prompt_state = self.prompts.state_dict()
        self.scorer = make_scorer(cfg)
        self.engine = make_rollout_engine(cfg.model.policy_path, cfg.rollout, self.dist, seed=cfg.trainer.seed,
                                          max_model_len=cfg.data.max_prompt_tokens + cfg.rollout.max_response_tokens,
                                          dtype=cfg.model.dtype, max_sequences=sequences_per_call(cfg))
        self.maker = ExperienceMaker(cfg, self.dist, self.prompts, self.engine, self.scorer, pad_token_id(tokenizer),
                                     logprobs=wants_sampler_logprobs(cfg, self.dist.device))
        self.timeline = Timeline(run_dir if cfg.logging.timeline else None, ROLLOUT)
        self.phase, self.next_step, self.trainer_done, self.version = Phase.PPO, 1, 0, 0
        self.started = self.stopped = False  # nothing is sampled before the trainer's Start

    # --- control ---------------------------------------------------------------------------------
    def total(self) -> int:
        return self.cfg.value_pretrain.steps if self.phase != Phase.PPO else self.cfg.trainer.total_steps

    def can_sample(self) -> bool:
        ahead = lookahead(self.phase, self.cfg.trainer.max_staleness)
        return self.started and self.next_step <= self.total() and may_sample(self.next_step, self.trainer_done, ahead)

    def message_waiting(self) -> bool:
        """Rollout rank 0's poll, shared so every rollout rank takes the same branch."""
        ready = float(self.bridge.control_ready()) if self.dist.rank == 0 else 0.0
        return bool(collectives.all_reduce_max(torch.tensor([ready])).item())

    def handle(self, msg) -> None:
        if isinstance(msg, (Start, StepDone)) and msg.weights is not None:
            with self.timeline.span("receive_weights"):
                named = self.bridge.receive_weights(msg.weights)
            with self.timeline.span("load_weights"):
                self.engine.sync_weights(named)
        if isinstance(msg, Start):
            self.phase, self.next_step, self.trainer_done, self.version = \
                msg.phase, msg.next_step, msg.trainer_done, msg.version
            self.started = True
            self.prompts.load_state_dict(msg.prompt_state or self.initial_prompt_state)
        elif isinstance(msg, StepDone):
            self.trainer_done = msg.step
            if msg.phase == Phase.PPO:  # new weights or none (the actor did not train): those of step msg.step
                self.version = msg.step
        elif isinstance(msg, BeginPhase):  # what was sampled ahead of the old phase is dropped
            self.phase, self.next_step, self.trainer_done = msg.phase, 1, 0
            self.prompts.load_state_dict(msg.prompt_state or self.initial_prompt_state)
        elif isinstance(msg, Validate):
            self.validate(msg.step)
        elif isinstance(msg, Stop):
            self.stopped = True

    # --- work ------------------------------------------------------------------------------------
    def sample_next(self) -> None:
        start = time.perf_counter()
        with self.timeline.span("sample"):
            batch, metrics = self.maker.make(self.phase, self.next_step)
        parts = collectives.all_gather_object(batch.to("cpu"))
        if self.dist.rank == 0:
            self.bridge.reap()
            self.bridge.send(SampledBatch(phase=self.phase, step=self.next_step, version=self.version,
                                          rollout=concat_batches(parts), metrics=metrics,
                                          prompt_state=self.prompts.state_dict(),
                                          seconds=time.perf_counter() - start))
        self.next_step += 1

    def validate(self, step: int) -> None:
        metrics = {}
        with self.timeline.span("validate"):
            if self.val_rows:
                metrics = validate_run(self.cfg, self.maker.sampler, self.val_rows, self.dist, step)
        if self.dist.rank == 0:
            self.bridge.send(ValidationResult(step=step, metrics=metrics))

    def serve(self) -> None:
        """Until the trainer says stop: take the control messages as they arrive, and sample the
        next batch whenever the staleness rule allows it, with the weights it belongs to (a PPO
        step's new weights, and a validation, wait while the batch before them may still be
        sampled: :func:`handle_now`)."""
        held = None  # a message received but not handled yet
        while not self.stopped:
            if held is None and (self.message_waiting() or not self.can_sample()):
                with self.timeline.span("wait"):
                    held = self.bridge.receive_control()
            if held is not None and handle_now(held, self.can_sample()):
                self.handle(held)
                held = None
            else:
                self.sample_next()
        self.bridge.flush()

    def close(self) -> None:
        self.timeline.close()
        self.scorer.close()
        self.engine.close()


def serve_rollouts(cfg: Config, run_dir: Path, placement: Placement) -> None:
    """A rollout rank's whole life in a split run; returns when the trainer says stop."""
    server = RolloutServer(cfg, run_dir, placement)
    clean = False
    try:
        server.serve()
        clean = True
    finally:
        server.close()
        D.shutdown(wait_for_peers=clean)
