"""The engines of a training run, built once at start-up: vLLM (where this rank samples), the
actor, the critic (GAE estimators: from the policy, an RM, a checkpoint or the value-pretraining
cache) and the reference policy (a KL on: a frozen copy, or a LoRA actor with its adapters off).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from vcppo.driver.state import Phase, RunState
from vcppo.driver.durability.critic_cache import cached_critic, critic_source
from vcppo.driver.step.critic_side import Critic, LocalCritic
from vcppo.engines.actor import ActorEngine
from vcppo.engines.critic import CriticEngine
from vcppo.engines.engine_setup import checkpoint_zero_stage, resolve_zero_stage
from vcppo.runtime.dist import DistInfo
from vcppo.engines.lora import enabled as lora_enabled
from vcppo.engines.reference import AdapterFreeReference, ReferenceEngine
from vcppo.engines.rollout import RolloutEngine
from vcppo.engines.rollout_choice import make_rollout_engine, sequences_per_call
from vcppo.config.critic_start import resolve_init_from
from vcppo.config.placement import Placement
from vcppo.config.schema import Config
from vcppo.tracking import MetricsLogger
from vcppo.methods import uses_critic


def optimizer_steps_per_rl_step(optim) -> int:
    return optim.ppo_epochs * optim.ppo_mini_batches


@dataclass
class Engines:
    rollout: RolloutEngine | None
    actor: ActorEngine
    critic: Critic | None            # LocalCritic or RemoteCritic (placement.critic_ranks)
    reference: ReferenceEngine | AdapterFreeReference | None
    critic_from_cache: Path | None   # a reused value-pretrained critic


def pretrained_itself(resumed: RunState | None) -> bool:
    """A resumed run that ran value pretraining itself (it never reused a cached critic)."""
    return resumed is not None and (resumed.phase == Phase.VALUE_PRETRAIN or resumed.pretrain_step > 0)


def critic_pretrain_steps(cfg: Config, resumed: RunState | None, from_cache: Path | None) -> int:
    """Pretraining steps the critic's lr schedule spans: ``value_pretrain.steps`` when the run
    pretrains (or pretrained) its critic itself, 0 when it reuses a cached one. Fixed by how the
    run STARTED, not by the cache now: the critic this run published must not shorten its own
    schedule on resume (cosine would otherwise sit at its floor for the rest of the run)."""
    if not cfg.value_pretrain.enabled:
        return 0
    if resumed is not None:
        return cfg.value_pretrain.steps if pretrained_itself(resumed) else 0
    return 0 if from_cache is not None else cfg.value_pretrain.steps


def adapter_sync_rank(cfg: Config) -> int:
    """The LoRA rank vLLM is built for when it samples with the actor's adapters
    (``rollout.lora_sync=adapter``), else 0 (it loads merged full weights)."""
    lora = cfg.actor.lora
    return lora.rank if lora_enabled(lora) and cfg.rollout.lora_sync == "adapter" else 0


def with_zero_stage(engine_cfg, dist: DistInfo, log: MetricsLogger, role: str, checkpoint: Path | None = None):
    """``engine_cfg`` with its ZeRO stage resolved (``zero_stage: null`` = auto, see
    :func:`~vcppo.engines.engine_setup.resolve_zero_stage`); the choice is logged once per engine.
    ``checkpoint``: the engine's directory in the resume point (its layout fixes an auto stage)."""
    stage = resolve_zero_stage(engine_cfg.zero_stage, dist.world_size, str(checkpoint) if checkpoint else None)
    if engine_cfg.zero_stage is not None:
        why = "set in the config"
    elif checkpoint is not None and checkpoint_zero_stage(str(checkpoint)) is not None:
        why = "auto: the stage the checkpoint was written with"
    else:
        why = f"auto: {dist.world_size} rank(s)"
    log.info(f"{role} engine: DeepSpeed ZeRO-{stage} ({why})")
    return dataclasses.replace(engine_cfg, zero_stage=stage)


def log_sequence_parallel(engine, log: MetricsLogger, role: str) -> None:
    """One line where the engine runs DeepSpeed's Ulysses (the attention it registered)."""
    if engine.sp is not None:
        log.info(f"{role} engine: Ulysses sequence parallelism over {engine.sp.size} ranks (attention {engine.attention})")


def build_critic(cfg: Config, dist: DistInfo, log, resumed: RunState | None,
                 resume_point: Path | None) -> tuple[CriticEngine, Path | None]:
    """The critic engine (on the training ranks, or on the critic's own ranks) and the cached
    value-pretrained critic it starts from (None: not reused)."""
    vp = cfg.value_pretrain
    init, path = critic_source(cfg)
    from_cache = None
    # a run resumed from its own pretraining continues it, even once the cache holds the
    # critic it published before it was killed: the rerun then finishes as an uninterrupted one
    if cfg.critic.init_from:  # a warm start replaces value pretraining and the cache
        init, path = "checkpoint", resolve_init_from(cfg.critic.init_from)
        from_cache = Path(path)
    elif vp.enabled and vp.reuse and not pretrained_itself(resumed):
        from_cache = cached_critic(cfg)
        if from_cache is not None:
            init, path = "checkpoint", str(from_cache)
    pre_steps = critic_pretrain_steps(cfg, resumed, from_cache)
    log.info(f"starting critic engine (init: {init} from {path})")
    critic_steps = (pre_steps + cfg.trainer.total_steps) * optimizer_steps_per_rl_step(cfg.critic)
    checkpoint = resume_point / "critic" if resume_point is not None else None
    critic_cfg = with_zero_stage(cfg.critic, dist, log, "critic", checkpoint)
    critic = CriticEngine(init, path, critic_cfg, dist, total_optimizer_steps=max(1, critic_steps),
                          dtype=cfg.model.dtype)
    log_sequence_parallel(critic, log, "critic")
    return critic, from_cache


def build_engines(cfg: Config, dist: DistInfo, log: MetricsLogger, placement: Placement,
                  resumed: RunState | None = None, resume_point: Path | None = None) -> Engines:
    """vLLM first (its start-up module scan must precede any numba / llvmlite import), then the DeepSpeed engines. ``resumed``:
    the state of the checkpoint the run resumes from, in ``resume_point`` (None: a fresh start).
    ``placement``: whether this rank samples, and where the critic starts
    (:meth:`~vcppo.config.placement.Placement.remote_critic`: on ranks of its own, or here)."""
    alg, temperature = cfg.algorithm, cfg.rollout.temperature
    ckpt = (lambda role: resume_point / role) if resume_point is not None else (lambda role: None)
    rollout = None  # a rank that does not sample holds no vLLM
    if placement.samples_on(dist.role):
        rollout = make_rollout_engine(cfg.model.policy_path, cfg.rollout, dist, seed=cfg.trainer.seed,
                                      max_model_len=cfg.data.max_prompt_tokens + cfg.rollout.max_response_tokens,
                                      dtype=cfg.model.dtype, lora_rank=adapter_sync_rank(cfg), log=log.info,
                                      max_sequences=sequences_per_call(cfg))
    # a critic on ranks of its own starts there while the actor starts here
    remote = placement.remote_critic(resume_point) if uses_critic(alg.advantage_estimator) else None
    actor_steps = cfg.trainer.total_steps * optimizer_steps_per_rl_step(cfg.actor)
    actor_cfg = with_zero_stage(cfg.actor, dist, log, "actor", ckpt("actor"))
    actor = ActorEngine(cfg.model.policy_path, actor_cfg, dist, total_optimizer_steps=max(1, actor_steps),
                        dtype=cfg.model.dtype, temperature=temperature)
    log_sequence_parallel(actor, log, "actor")
    critic, from_cache = None, None
    if remote is not None:
        critic, from_cache = remote, remote.ready()
    elif uses_critic(alg.advantage_estimator):
        engine, from_cache = build_critic(cfg, dist, log, resumed, resume_point)
        critic = LocalCritic(cfg, engine)
    reference = None
    if alg.kl_coef > 0 and lora_enabled(cfg.actor.lora):
        log.info("reference policy: the actor with its LoRA adapters off (no second copy of the model)")
        reference = AdapterFreeReference(actor)
    elif alg.kl_coef > 0:
        ref_cfg = with_zero_stage(cfg.reference, dist, log, "reference")
        reference = ReferenceEngine(cfg.model.policy_path, ref_cfg, dist, dtype=cfg.model.dtype,
                                    temperature=temperature)
    return Engines(rollout, actor, critic, reference, from_cache)
