"""The rollout ranks of split placement: sample and score batches, ahead of training within the
staleness bound, and load the actor's weights as they come (docs/launching.md).

Every rollout rank runs :func:`serve_rollouts` (SPMD among the rollout ranks: they share each
step's prompts and make the same decisions, rollout rank 0 deciding). The loop: take the control
messages that have arrived (:mod:`vcppo.driver.placement.split_protocol`), then sample the next batch if the
staleness rule allows it, else wait for the next message. A batch is sampled exactly as a
colocated rank samples it (:class:`~vcppo.driver.step.experience_maker.ExperienceMaker`, the same seeds),
gathered on rollout rank 0 and sent to trainer 0.
"""
from __future__ import annotations

import time
from pathlib import Path

import torch

from vcppo.config.placement import ROLLOUT, Placement
from vcppo.driver.context import init_run_distributed, load_prompt_set, make_scorer, pad_token_id
from vcppo.driver.step.experience_maker import ExperienceMaker
from vcppo.driver.step.step_plan import wants_sampler_logprobs
from vcppo.driver.state import Phase
from vcppo.driver.placement.split_protocol import (BeginPhase, SampledBatch, Start, StepDone, Stop, Validate,
                                         ValidationResult, handle_now, lookahead, may_sample)
from vcppo.driver.step.timeline import Timeline
from vcppo.driver.step.validation import validate_run
from vcppo.runtime import dist as D
from vcppo.runtime import collectives
from vcppo.engines.rollout_choice import make_rollout_engine, sequences_per_call
from vcppo.experience import concat_batches
from vcppo.config.schema import Config


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
        sampled: :func:`~vcppo.driver.placement.split_protocol.handle_now`)."""
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
