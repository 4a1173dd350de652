"""The wiring of a training run: process group, seeds, data, logger, reward, the engines, the run
directory's lock and its resume point, and closing them in order (:func:`close_parts`).

:class:`RunContext` is built once per run (:meth:`RunContext.create`) and handed to the phases
(value pretraining, PPO); it holds no training logic (sampling is
:class:`vcppo.driver.step.experience_maker.ExperienceMaker`'s, a step is :mod:`vcppo.driver.step.rl_step`).
"""
from __future__ import annotations

import dataclasses
import json
import os
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable

import numpy as np
import torch

from vcppo.config.load import save_config, to_dict
from vcppo.config.parallel import check_sequence_parallel_ranks
from vcppo.config.placement import BOTH, Placement, check_share
from vcppo.config.provenance import record_segment, summary
from vcppo.data.dataset import PromptSet, PromptStream, load_prompts
from vcppo.driver.durability import conversion, guards
from vcppo.driver.durability.checkpoint import find_resume_point, peek_state
from vcppo.driver.state import RunState
from vcppo.driver.step.critic_side import Critic
from vcppo.driver.run_engines import build_engines
from vcppo.driver.step.reward_terms import ModelReward
from vcppo.models.hub import model_sources
from vcppo.driver.step.timeline import Timeline
from vcppo.driver.durability.run_dir import RunDirInUse, check_resume, identity_conflict, release, try_lock_run_dir
from vcppo.driver.durability.run_records import prepare_run_dir, rewind_metrics
from vcppo.runtime import dist as D
from vcppo.runtime import collectives
from vcppo.runtime import launch_env
from vcppo.engines.actor import ActorEngine
from vcppo.runtime.dist import DistInfo
from vcppo.engines.lora import enabled as lora_enabled
from vcppo.engines.reference import AdapterFreeReference, ReferenceEngine
from vcppo.engines.rollout import RolloutEngine
from vcppo.rewards.pool import default_num_workers
from vcppo.rewards.verifier import RewardScorer
from vcppo.config.schema import Config
from vcppo.tracking import MetricsLogger


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def seed_process(cfg: Config) -> None:
    """Every rank that builds a model: the run's seed, and ``trainer.deterministic``."""
    seed_everything(cfg.trainer.seed)
    if cfg.trainer.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)


def pad_token_id(tokenizer) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def load_prompt_set(cfg: Config, path: str, tokenizer, *, max_prompt_tokens: int | None,
                    shuffle_seed: int | None, limit: int | None = None) -> PromptSet:
    """``path`` read with the ``data`` section's fields and chat-template setting (every command)."""
    chat = "auto" if cfg.data.use_chat_template is None else cfg.data.use_chat_template
    return load_prompts(path, tokenizer, prompt_field=cfg.data.prompt_field, answer_field=cfg.data.answer_field,
                        max_prompt_tokens=max_prompt_tokens, use_chat_template=chat, shuffle_seed=shuffle_seed,
                        limit=limit, reward_info=cfg.data.reward_info_fields)


def reward_workers(cfg: Config) -> int:
    """``reward.num_workers``, or by default the cores this node's ranks leave idle, per rank."""
    if cfg.reward.num_workers is not None:
        return cfg.reward.num_workers
    on_gpu = cfg.trainer.device == "cuda" or (cfg.trainer.device == "auto" and torch.cuda.is_available())
    busy = 1 if on_gpu else torch.get_num_threads()  # a GPU rank mostly keeps one core feeding it
    return default_num_workers(len(os.sched_getaffinity(0)), launch_env.local_world_size(), busy)


def make_scorer(cfg: Config) -> RewardScorer:
    """The reward scorer of every command; its worker processes start now, alongside the engines."""
    return RewardScorer(cfg.reward.function, correct=cfg.reward.correct_score, wrong=cfg.reward.wrong_score,
                        num_workers=reward_workers(cfg), timeout_s=cfg.reward.timeout_s,
                        functions_by_source=dict(cfg.reward.functions_by_source), verl_parity=cfg.reward.verl_parity)


def make_logger(cfg: Config, out_dir: Path, dist: DistInfo, run_name: str, resume: bool = False,
                already_sent: set[tuple] | None = None) -> MetricsLogger:
    """metrics.jsonl + wandb (``logging`` section) + progress bar, written by the main rank."""
    lg = cfg.logging
    return MetricsLogger(out_dir, to_dict(cfg), enabled=dist.is_main, use_wandb=lg.wandb, wandb_mode=lg.wandb_mode,
                         wandb_project=lg.wandb_project, run_name=run_name, progress_bar=lg.progress_bar,
                         resume=resume, use_tensorboard=lg.tensorboard, already_sent=already_sent)


def open_records(cfg: Config, run_dir: Path, dist: DistInfo, point: Path | None, resumed: RunState | None,
                 replays: bool) -> MetricsLogger:
    """The run's logger, once the records of the steps it replays are cut (``replays``: it resumes
    from its own checkpoint ``point``, or starts without one, so every record is replayed): main rank,
    before the logger opens (:func:`rewind_metrics`). The stopped run sent those to wandb already, so
    they are not sent again, and a run that stopped before its first checkpoint goes on in wandb."""
    sent = rewind_metrics(run_dir, resumed) if (replays and dist.is_main) else set()
    log = make_logger(cfg, run_dir, dist, run_dir.name, resume=resumed is not None or bool(sent), already_sent=sent)
    if sent:
        log.info(f"metrics.jsonl: {len(sent)} record(s) of steps past the last sealed checkpoint "
                 f"({point or 'none yet'}) removed; the run records them again as it replays them")
    return log


def record_config(cfg: Config, run_dir: Path, point: Path | None, resumed: RunState | None, changes: list,
                  say) -> None:
    """Main rank, once the resume is accepted: ``config.yaml`` is this segment's config, and
    ``config_history.jsonl`` says where the segment began and what it changed (vcppo.config.provenance)."""
    if changes:
        say(f"resuming with a changed config: {summary(changes)}")
    phase = resumed.phase if resumed is not None else "start"
    try:
        record_segment(run_dir, phase=phase, step=resumed.step if resumed else 0,
                       global_step=resumed.global_step if resumed else 0, resumed_from=point, changes=changes,
                       models=model_sources(cfg))
        save_config(cfg, run_dir)
    except OSError as error:
        raise guards.write_error("the run's config (config.yaml, config_history.jsonl)", run_dir, error) \
            or error


def init_run_distributed(cfg: Config, placement: Placement) -> DistInfo:
    """The run's process groups, as ``placement`` sets them up (:meth:`Placement.init_groups`: one world,
    or split placement's role worlds and bridge). The rank counts are checked on every rank before
    anything starts: a config error then exits before any process group or DeepSpeed shm segment exists
    (an error after it leaves none either: :func:`vcppo.runtime.dist.init_distributed`)."""
    if D.get_info() is None:  # before the group exists: the peers are not waited for
        placement.check_ranks(cfg, launch_env.launched_world_size())
    return placement.init_groups(cfg)


def _describe_prompts(placement: Placement, train_set, val_rows: list) -> str:
    """The start-up line's account of the prompts (a rank that samples nothing reads none)."""
    if train_set is None:
        return placement.describe()
    return (f"{len(train_set)} train prompts ({train_set.num_dropped} dropped as too long), "
            f"{len(val_rows)} val prompts")


@dataclass
class RunContext:
    cfg: Config
    run_dir: Path
    dist: DistInfo
    pad_id: int
    prompts: PromptStream | None  # the training prompts, endless and resumable (None: split training rank)
    val_rows: list[dict]         # validation prompt rows ({"prompt_ids", "answer", ...})
    scorer: RewardScorer
    rollout: RolloutEngine | None  # None on the training ranks of a split run
    actor: ActorEngine
    critic: Critic | None  # LocalCritic, or RemoteCritic on its own ranks (placement.critic_ranks)
    reference: ReferenceEngine | AdapterFreeReference | None
    log: MetricsLogger
    critic_from_cache: Path | None = None
    reward_model: ModelReward | None = None  # reward.model_path: scores on the training ranks
    run_lock: IO | None = None   # main rank: the run directory's lock (driver/durability/run_dir.py)
    resume_point: Path | None = None  # the verified checkpoint the run continues from (None: fresh)
    # resuming on another number of ranks: {engine role: its checkpoint in DeepSpeed's universal format}
    universal_checkpoints: dict = dataclasses.field(default_factory=dict)
    timeline: Timeline = dataclasses.field(default_factory=lambda: Timeline(None, BOTH))
    tokenizer: Any = None  # the policy's tokenizer (samples as text: logging.log_samples)

    @classmethod
    def create(cls, cfg: Config, run_dir: Path, placement: Placement) -> "RunContext":
        """Every part of the run on this rank, where ``placement`` (built once for the run) puts them."""
        from transformers import AutoTokenizer

        dist = init_run_distributed(cfg, placement)
        check_sequence_parallel_ranks(cfg, dist.world_size)
        check_share(cfg.trainer.prompts_per_step, dist.world_size, "number of ranks")  # this rank's role world
        seed_process(cfg)

        tokenizer = AutoTokenizer.from_pretrained(cfg.model.tokenizer_path)
        max_tokens = cfg.data.max_prompt_tokens
        sampler = placement.samples_on(dist.role)  # a rank that does not sample reads no prompts
        train_set = load_prompt_set(cfg, cfg.data.train_files, tokenizer, max_prompt_tokens=max_tokens,
                                    shuffle_seed=cfg.trainer.seed) if sampler else None
        val_rows = []
        if cfg.data.val_files and sampler:
            val_rows = load_prompt_set(cfg, cfg.data.val_files, tokenizer, max_prompt_tokens=max_tokens,
                                       shuffle_seed=None, limit=cfg.trainer.val_max_prompts).rows()
        held, problem = try_lock_run_dir(run_dir) if dist.is_main else (None, None)
        if (problem := collectives.all_gather_object(problem)[0]) is not None:  # every rank stops, not only the main
            raise RunDirInUse(problem)
        try:  # from here on, a failure must not leave the lock held by this (still living) process
            notes = prepare_run_dir(run_dir, cfg.trainer.resume) if dist.is_main else []
            # verified here, before the engines start: a damaged checkpoint is skipped (or named)
            point = find_resume_point(run_dir, cfg.trainer.resume, dist.rank, dist.world_size,
                                      gather=collectives.all_gather_object)
            own = point is not None and point.resolve().parent == (run_dir / "checkpoints").resolve()
            conflict = identity_conflict(run_dir, cfg) if own and dist.is_main else None
            if (problem := collectives.all_gather_object(conflict)[0]) is not None:
                raise RunDirInUse(problem)
            # the config against the checkpoint's: refused (one line naming the key) before any work
            same_ranks = point is None or conversion.written_world_size(point) in (None, dist.world_size)
            changes = check_resume(cfg, point, same_ranks)
            # written on another number of training ranks: engine checkpoints converted for this one
            universal = conversion.prepare(point, run_dir, cfg, dist.is_main, dist.world_size, collectives.all_gather_object,
                                        placement) \
                if point is not None else {}
            resumed = peek_state(point) if point is not None else None
            log = open_records(cfg, run_dir, dist, point, resumed, replays=own or point is None)
            for note in notes:
                log.info(note)
            if dist.is_main:
                record_config(cfg, run_dir, point, resumed, changes, log.info)
            log.info(f"run dir {run_dir} | ranks {dist.world_size} | device {dist.device} | "
                     f"{_describe_prompts(placement, train_set, val_rows)}")
            scorer = make_scorer(cfg)
            engines = build_engines(cfg, dist, log, placement, resumed, resume_point=point)
            reward_model = ModelReward.build(cfg, dist, tokenizer, log.info)  # None without reward.model_path
            return cls(cfg=cfg, run_dir=run_dir, dist=dist, pad_id=pad_token_id(tokenizer),
                       prompts=train_set.stream(seed=cfg.trainer.seed) if sampler else None, val_rows=val_rows,
                       scorer=scorer,
                       rollout=engines.rollout, actor=engines.actor, critic=engines.critic,
                       reference=engines.reference, log=log, critic_from_cache=engines.critic_from_cache,
                       reward_model=reward_model,
                       run_lock=held, resume_point=point, universal_checkpoints=universal,
                       timeline=Timeline(run_dir if cfg.logging.timeline else None, dist.role), tokenizer=tokenizer)
        except BaseException:
            release(held)
            raise

    def sync_weights(self) -> float:
        """Give vLLM the actor: its gathered weights (adapters merged, with LoRA), or with
        ``rollout.lora_sync=adapter`` only its adapters, loaded as vLLM's LoRA; seconds."""
        if self.rollout.uses_adapters:
            return self.rollout.sync_adapter(lambda d: self.actor.export_adapter(d, every_rank=True))
        return self.rollout.sync_weights(self.actor.named_parameters_gathered())

    def barrier(self) -> None:
        collectives.barrier()

    def write_final_metrics(self, metrics: dict) -> None:
        if self.dist.is_main:
            (self.run_dir / "final_metrics.json").write_text(json.dumps(metrics, indent=1))

    def export_final(self) -> None:
        """HF-format policy (and critic) for `vcppo eval` and downstream use; refused
        (NonFiniteError) before anything is written when a weight is non-finite."""
        self.actor.check_finite_weights("the final actor export")
        if self.critic is not None:
            self.critic.check_finite_weights("the final critic export")
        self.actor.export_hf(str(self.run_dir / "final" / "actor"))
        if lora_enabled(self.cfg.actor.lora):  # also the adapters alone, over the initial policy
            self.actor.export_adapter(str(self.run_dir / "final" / "actor_adapter"))
        if self.critic is not None:
            self.critic.export(str(self.run_dir / "final" / "critic"))
        self.barrier()

    def close(self, clean: bool = False) -> None:
        """Tear the engines down (:func:`close_parts`); ``clean``: the run
        ended without an error, so ranks meet first."""
        parts = [("logger", self.log.close), ("reward scorer", self.scorer.close), ("timeline", self.timeline.close)]
        if clean and self.critic is not None:  # critic ranks, if any: after an error they stop as this rank exits
            parts.insert(0, ("critic", self.critic.close))
        if self.rollout is not None:
            parts.append(("vLLM engine", lambda: self.rollout.close(final=True)))
        try:
            close_parts(parts, clean)
        finally:
            release(self.run_lock)
            D.shutdown(wait_for_peers=clean)


def close_parts(parts: list[tuple[str, Callable[[], None]]], clean: bool) -> None:
    """Call each ``(name, close)`` in order, whatever the others do, so that the error a user sees is
    the run's own: after an error every part is still closed, and a part that fails too (wandb writing
    into a run directory that has just turned read-only) is named in one line, so the run's error stays
    the one printed last; after a clean run the first failure is raised once every part has closed."""
    first_failure = None
    for name, close_part in parts:
        try:
            close_part()
        except Exception as e:  # noqa: BLE001 -- reported, and the other parts still close
            if clean:
                first_failure = first_failure or e
            else:
                print(f"[vcppo] while stopping after the error below, the {name} failed to close too: "
                      f"{type(e).__name__}: {e}", file=sys.stderr, flush=True)
    if first_failure is not None:
        raise first_failure
