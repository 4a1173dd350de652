"""The engines of a training run, and where its critic starts.

**The pretrained-critic cache**: value pretraining's result, reused by every run it would be the
same for.

A pretrained critic is determined by the policy, the data, the critic's init and optimiser, the
pretraining, sampling and episode settings, and the reward -- not by the RL algorithm or the seed:
the schema's tags say which keys (:func:`vcppo.config.provenance.critic_cache_keys`). So every
preset and seed of a sweep that starts from the same SFT model reuses one critic, stored under
``value_pretrain.cache_dir/<key>`` and published atomically (concurrent runs never read half a
model).

**The engines**, built once at start-up: vLLM (where this rank samples), the
actor, the critic (GAE estimators: from the policy, an RM, a checkpoint or the value-pretraining
cache) and the reference policy (a KL on: a frozen copy, or a LoRA actor with its adapters off).
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from vcppo.config.critic_start import resolve_init_from
from vcppo.config.placement import Placement
from vcppo.config.provenance import CRITIC_CACHE_KEYS, PATH_KEYS
from vcppo.config.rules import combine_mode
from vcppo.config.schema import Config
from vcppo.driver.state import Phase, RunState
from vcppo.driver.step.critic_side import Critic, LocalCritic
from vcppo.engines.actor import ActorEngine
from vcppo.engines.critic import CriticEngine
from vcppo.engines.engine_setup import checkpoint_zero_stage, resolve_zero_stage
from vcppo.engines.lora import enabled as lora_enabled
from vcppo.engines.reference import AdapterFreeReference, ReferenceEngine
from vcppo.engines.rollout import RolloutEngine
from vcppo.engines.rollout_choice import make_rollout_engine, sequences_per_call
from vcppo.methods import uses_critic
from vcppo.runtime.dist import DistInfo
from vcppo.tracking import MetricsLogger


COMPLETE_MARKER = "vcppo_pretrain.json"


def fingerprint_path(path: str) -> dict:
    """Cheap identity of a file or directory (names, sizes, mtimes) for cache keys: hashing a 60 GB
    checkpoint to decide whether to reuse a critic would cost more than it saves."""
    p = Path(path)
    files = [p] if p.is_file() else sorted(x for x in p.rglob("*") if x.is_file())
    return {"path": str(p.resolve()),
            "files": [(str(f.relative_to(p)) if p.is_dir() else f.name, f.stat().st_size,
                       int(f.stat().st_mtime)) for f in files]}


def critic_source(cfg: Config) -> tuple[str, str]:
    """(init, directory) the critic is built from: the policy's backbone for ``critic_init: policy``
    (``model.critic_path`` names the RM / checkpoint of the other two kinds and is ignored here, even
    when a preset sets it: the demo's does, for ``critic_init=reward_model``)."""
    init = cfg.model.critic_init
    return init, (cfg.model.policy_path if init == "policy" else cfg.model.critic_path)


def key_value(cfg: Config, key: str):
    """What ``key`` contributes to the cache key: its value as the run reads it (a path by its
    files' fingerprint; ``model.critic_path`` nothing for a policy-initialised critic, which is the
    policy; ``reward.combine`` with null resolved)."""
    if key == "model.critic_path" and critic_source(cfg)[0] == "policy":
        return None
    if key == "reward.combine":
        return combine_mode(cfg)
    value = functools.reduce(getattr, key.split("."), cfg)
    if key in PATH_KEYS and value:
        return fingerprint_path(value)
    return value


def cache_key(cfg: Config) -> str:
    """A hash of every key the pretrained critic depends on (:data:`CRITIC_CACHE_KEYS`: the
    schema's ``math`` and ``fixed`` keys but those tagged ``critic_cache=False``), the same tags that
    refuse a resume that changes one. A key added to the schema changes every cache key once (the
    critic is pretrained again): reusing a critic the new key would have changed is the worse error."""
    relevant = {key: key_value(cfg, key) for key in CRITIC_CACHE_KEYS}
    blob = json.dumps(relevant, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def cache_path(cfg: Config) -> Path:
    return Path(cfg.value_pretrain.cache_dir) / cache_key(cfg)


def cached_critic(cfg: Config) -> Path | None:
    """The complete pretrained critic for ``cfg``, if the cache has one."""
    path = cache_path(cfg)
    return path if (path / COMPLETE_MARKER).exists() else None


def staging_path(cfg: Config, run_name: str) -> Path:
    """Where a run writes the critic before publishing it (the same path on every rank)."""
    target = cache_path(cfg)
    return target.with_name(f"{target.name}.tmp-{run_name}")


def publish(stage: Path, target: Path, info: dict) -> None:
    """Main rank, after the critic was exported into ``stage``: mark it complete and move it into
    place, unless another run got there first (then ours is dropped: both are the same critic)."""
    (stage / COMPLETE_MARKER).write_text(json.dumps(info, indent=1))
    if target.exists():
        shutil.rmtree(stage)
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(stage, target)


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
