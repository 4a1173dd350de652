"""What the phases share: the run context (engines, data, logger), the actor / critic update
loops over PPO epochs and mini-batches, global advantage whitening, per-step metrics, validation.
"""
from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vcppo.algos import losses, stats
from vcppo.config import Config, ConfigError, save_config, to_dict
from vcppo.engines import dist as D
from vcppo.engines.batch import slice_batch
from vcppo.tracking import MetricsLogger

# -------------------------------------------------------------------------------------------------
# Run context


@dataclass
class RunContext:
    cfg: Config
    run_dir: Path
    dist: Any
    tokenizer: Any
    pad_id: int
    prompts: Any           # PromptStream over the training prompts
    val_rows: list         # validation prompt rows ({"prompt_ids", "answer", ...})
    scorer: Any            # (texts, truths, finish_reasons) -> (scores, correct flags)
    reward_scorer: Any     # the RewardScorer behind it (failure counts)
    rollout: Any
    actor: Any
    critic: Any | None
    reference: Any | None
    log: MetricsLogger
    critic_from_cache: Path | None = None   # a reused value-pretrained critic

    @classmethod
    def create(cls, cfg: Config, run_dir: Path) -> "RunContext":
        from transformers import AutoTokenizer

        from vcppo.data.dataset import load_prompts
        from vcppo.driver.checkpoint import find_resume_point
        from vcppo.driver.experience import verifier_scorer
        from vcppo.driver.value_pretrain import cached_critic
        from vcppo.engines.actor import ActorEngine
        from vcppo.engines.critic import CriticEngine
        from vcppo.engines.reference import ReferenceEngine
        from vcppo.engines.rollout import RolloutEngine

        dist = D.init_distributed(cfg.trainer.device)
        if cfg.trainer.prompts_per_step % dist.world_size:
            raise ConfigError(f"config key 'trainer.prompts_per_step' ({cfg.trainer.prompts_per_step}) "
                              f"must be divisible by the number of ranks ({dist.world_size})")
        seed_everything(cfg.trainer.seed)
        if cfg.trainer.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=True)

        tokenizer = AutoTokenizer.from_pretrained(cfg.model.tokenizer_path)
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        chat = {"auto": "auto", "true": True, "false": False}[cfg.data.use_chat_template]
        train_set = load_prompts(cfg.data.train_files, tokenizer, cfg.data.prompt_field, cfg.data.answer_field,
                                 cfg.data.max_prompt_tokens, chat, shuffle_seed=cfg.trainer.seed)
        val_rows = []
        if cfg.data.val_files:
            val_set = load_prompts(cfg.data.val_files, tokenizer, cfg.data.prompt_field, cfg.data.answer_field,
                                   cfg.data.max_prompt_tokens, chat, shuffle_seed=None,
                                   limit=cfg.trainer.val_max_prompts)
            val_rows = val_set.rows()

        resuming = find_resume_point(run_dir, cfg.trainer.resume) is not None
        log = MetricsLogger(run_dir, to_dict(cfg), enabled=dist.is_main, use_wandb=cfg.logging.wandb,
                            wandb_mode=cfg.logging.wandb_mode, wandb_project=cfg.logging.wandb_project,
                            run_name=run_dir.name, progress_bar=cfg.logging.progress_bar, resume=resuming)
        if dist.is_main:
            save_config(cfg, run_dir)
        log.info(f"run dir {run_dir} | ranks {dist.world_size} | device {dist.device} | "
                 f"{len(train_set)} train prompts ({train_set.num_dropped} dropped as too long), "
                 f"{len(val_rows)} val prompts")

        from vcppo.rewards.verifier import RewardScorer
        reward_scorer = RewardScorer(cfg.reward.function, correct=cfg.reward.correct_score,
                                     wrong=cfg.reward.wrong_score)
        scorer = verifier_scorer(reward_scorer)

        alg, vp = cfg.algorithm, cfg.value_pretrain
        per_step = lambda o: o.ppo_epochs * o.ppo_mini_batches  # noqa: E731 - optimizer steps per RL step
        max_len = cfg.data.max_prompt_tokens + cfg.rollout.max_response_tokens
        log.info("starting vLLM rollout engine")
        rollout = RolloutEngine(cfg.model.policy_path, cfg.rollout, dist, seed=cfg.trainer.seed,
                                max_model_len=max_len, dtype=cfg.model.dtype)
        log.info("starting actor engine (DeepSpeed ZeRO-%d)" % cfg.actor.zero_stage)
        actor = ActorEngine(cfg.model.policy_path, cfg.actor, dist,
                            total_optimizer_steps=max(1, cfg.trainer.total_steps * per_step(cfg.actor)),
                            dtype=cfg.model.dtype)
        critic, from_cache = None, None
        if alg.advantage_estimator == "gae":
            init, path = cfg.model.critic_init, cfg.model.critic_path or cfg.model.policy_path
            if vp.enabled and vp.reuse:
                from_cache = cached_critic(cfg)
                if from_cache is not None:
                    init, path = "checkpoint", str(from_cache)
            pre_steps = vp.steps if (vp.enabled and from_cache is None) else 0
            log.info(f"starting critic engine (init: {init} from {path})")
            critic = CriticEngine(init, path, cfg.critic, dist,
                                  total_optimizer_steps=max(1, (pre_steps + cfg.trainer.total_steps)
                                                            * per_step(cfg.critic)),
                                  dtype=cfg.model.dtype)
        reference = None
        if alg.kl_coef > 0:
            reference = ReferenceEngine(cfg.model.policy_path, dist, dtype=cfg.model.dtype)
        return cls(cfg=cfg, run_dir=run_dir, dist=dist, tokenizer=tokenizer, pad_id=pad_id,
                   prompts=train_set.stream(seed=cfg.trainer.seed), val_rows=val_rows, scorer=scorer,
                   reward_scorer=reward_scorer, rollout=rollout, actor=actor, critic=critic,
                   reference=reference, log=log, critic_from_cache=from_cache)

    # ---------------------------------------------------------------------------------------------
    def sample_seed(self, phase: str, step: int) -> int:
        """Sampling seed of one step on this rank: reproducible (resume gives the same samples),
        different across phases, steps and ranks."""
        key = f"{self.cfg.trainer.seed}/{phase}/{step}/{self.dist.rank}".encode()
        return int.from_bytes(hashlib.sha256(key).digest()[:4], "little")

    def sample_step(self, phase: str, step: int) -> dict:
        """This step's prompts (this rank's share of the global batch), sampled and scored."""
        from vcppo.driver.experience import collect_experience, rank_slice

        cfg = self.cfg
        rows = self.prompts.next_batch(cfg.trainer.prompts_per_step)
        offset, mine = rank_slice(rows, self.dist.rank, self.dist.world_size)
        return collect_experience(
            mine, first_index=offset, rollout=self.rollout, scorer=self.scorer, pad_id=self.pad_id,
            device=self.dist.device, n=cfg.rollout.n_samples_per_prompt, temperature=cfg.rollout.temperature,
            top_p=cfg.rollout.top_p, max_tokens=cfg.rollout.max_response_tokens, stop=cfg.rollout.stop or None,
            seed=self.sample_seed(phase, step))

    def sync_weights(self) -> float:
        """Stream the actor's (gathered) weights into vLLM; seconds."""
        return self.rollout.sync_weights(self.actor.named_parameters_gathered())

    def barrier(self) -> None:
        D.barrier()

    def log_validation(self, step: int, final: bool = False) -> dict:
        if not self.val_rows:
            return {}
        metrics = validate(self, step)
        self.log.log(metrics, step=step, phase="val")
        self.log.info(f"val step {step}: " + ", ".join(f"{k}={v:.3f}" for k, v in metrics.items()
                                                      if k.startswith("val/")))
        if final and self.dist.is_main:
            (self.run_dir / "final_metrics.json").write_text(json.dumps(metrics, indent=1))
        return metrics

    def export_final(self) -> None:
        """HF-format policy (and critic) for `vcppo eval` and downstream use."""
        self.actor.export_hf(str(self.run_dir / "final" / "actor"))
        if self.critic is not None:
            self.critic.export(str(self.run_dir / "final" / "critic"))
        self.barrier()

    def close(self) -> None:
        self.log.close()
        try:
            self.rollout.close()
        finally:
            D.shutdown()


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


# -------------------------------------------------------------------------------------------------
# Cross-rank helpers

def gather_cat(t: torch.Tensor, pad_value: float = 0.0) -> torch.Tensor:
    """Concatenate a (B_r, ...) tensor over ranks along dim 0, right-padding dim 1 to the longest.
    Metrics only: the per-step batch is small enough to gather (at cluster scale this would be
    replaced by reduced moments)."""
    if D.get_info() is None or D.get_info().world_size == 1:
        return t.detach().cpu()
    parts = D.all_gather_object(t.detach().cpu())
    if t.dim() >= 2:
        width = max(p.shape[1] for p in parts)
        parts = [torch.nn.functional.pad(p, (0, width - p.shape[1]), value=pad_value) for p in parts]
    return torch.cat(parts, dim=0)


def global_sum(x: float | torch.Tensor) -> float:
    t = torch.as_tensor(x, dtype=torch.float64).clone().reshape(1)
    return float(D.all_reduce_sum(t).item())


def global_whiten(advantages: torch.Tensor, mask: torch.Tensor, ctx: RunContext, zero_mean: bool = True,
                  eps: float = 1e-8) -> torch.Tensor:
    """Whiten over the valid tokens of the GLOBAL batch (all ranks), so the result does not depend on
    how many ranks the batch is split over. Masked positions stay 0."""
    n = global_sum(mask.sum())
    mean = global_sum((advantages * mask).sum()) / max(n, 1.0)
    var = global_sum((((advantages - mean) * mask) ** 2).sum()) / max(n - 1.0, 1.0)
    centred = advantages - mean if zero_mean else advantages
    return centred * torch.rsqrt(torch.tensor(var + eps, dtype=advantages.dtype)) * mask


# -------------------------------------------------------------------------------------------------
# Updates

class _Normalised:
    """A loss over a mini-batch whose token / sequence normaliser counts every rank's share, so the
    summed gradient equals the gradient of the loss on the whole global mini-batch."""

    def __init__(self, minibatch: dict, agg: str):
        self.global_tokens = global_sum(minibatch["response_mask"].sum())
        self.global_seqs = global_sum(minibatch["response_mask"].shape[0])
        self.token_mean = agg == "token-mean"

    def share(self, micro: dict) -> float:
        """global count / this micro-batch's count: turns its share of the loss into its own mean."""
        if self.token_mean:
            return self.global_tokens / max(float(micro["response_mask"].sum()), 1.0)
        return self.global_seqs / max(float(micro["response_mask"].shape[0]), 1.0)


class PolicyLoss(_Normalised):
    def __init__(self, minibatch: dict, alg):
        super().__init__(minibatch, alg.loss_agg)
        self.alg = alg
        self.needs_entropy = alg.entropy_coef > 0
        if alg.positive_lm_coef > 0:  # the positive-example NLL is normalised over positive samples
            positive = minibatch["correct"] > 0
            self.positive_tokens = global_sum(minibatch["response_mask"][positive].sum())
            self.positive_seqs = global_sum(positive.sum())

    def __call__(self, outputs: dict, micro: dict):
        a = self.alg
        norm = dict(agg=a.loss_agg, global_token_count=self.global_tokens, global_seq_count=self.global_seqs)
        loss, metrics = losses.policy_loss(outputs["logprobs"], micro["old_logprobs"], micro["advantages"],
                                           micro["response_mask"], eps_low=a.eps_low, eps_high=a.eps_high,
                                           dual_clip_c=a.dual_clip_c, **norm)
        metrics = {f"actor/{k}": v for k, v in metrics.items()}
        # The loss above is this micro-batch's share of the global mean; report its own mean.
        metrics["actor/pg_loss"] = loss.detach() * self.share(micro)
        if a.entropy_coef > 0:
            ent = losses.aggregate_loss(outputs["entropy"], micro["response_mask"], **norm)
            loss = loss - a.entropy_coef * ent
        if a.positive_lm_coef > 0:
            # VAPO: imitation loss on correctly answered samples (self-imitation of positives).
            nll, m = losses.positive_example_nll(outputs["logprobs"], micro["response_mask"],
                                                 micro["correct"] > 0, agg=a.loss_agg,
                                                 global_token_count=max(self.positive_tokens, 1.0),
                                                 global_seq_count=max(self.positive_seqs, 1.0))
            loss = loss + a.positive_lm_coef * nll
            metrics.update({f"actor/{k}": v for k, v in m.items()})
        return loss, metrics


class ValueLoss(_Normalised):
    needs_entropy = False

    def __init__(self, minibatch: dict, cfg):
        super().__init__(minibatch, cfg.algorithm.loss_agg)
        self.clip, self.agg = cfg.critic.value_clip, cfg.algorithm.loss_agg

    def __call__(self, outputs: dict, micro: dict):
        loss, metrics = losses.value_loss(outputs["values"], micro["old_values"], micro["returns"],
                                          micro["response_mask"], clip_range=self.clip, agg=self.agg,
                                          global_token_count=self.global_tokens,
                                          global_seq_count=self.global_seqs)
        metrics = {f"critic/{k}": v for k, v in metrics.items()}
        metrics["critic/value_loss"] = loss.detach() * self.share(micro)
        return loss, metrics


def _epochs_of_minibatches(ctx: RunContext, batch: dict, optim_cfg, step: int):
    """PPO epochs x shuffled mini-batches of this rank's share of the step's batch."""
    B = batch["input_ids"].shape[0]
    for epoch in range(optim_cfg.ppo_epochs):
        g = torch.Generator().manual_seed(ctx.cfg.trainer.seed * 7919 + step * 31 + epoch)
        order = torch.randperm(B, generator=g)
        for idx in order.chunk(optim_cfg.ppo_mini_batches):
            yield slice_batch(batch, idx.sort().values)


def _mean_metrics(records: list[dict]) -> dict:
    keys = {k for r in records for k in r}
    out = {}
    for k in keys:
        vals = [float(r[k]) for r in records if k in r]
        out[k] = sum(vals) / len(vals)
    return out


def _update(ctx: RunContext, engine, make_loss, optim_cfg, batch: dict, step: int, role: str) -> dict:
    """PPO epochs x mini-batches of optimizer steps; metrics averaged, engine figures prefixed."""
    records = [engine.train_step(mb, make_loss(mb), optim_cfg.micro_batch_size)
               for mb in _epochs_of_minibatches(ctx, batch, optim_cfg, step)]
    out = _mean_metrics(records)
    for k in ("grad_norm", "lr"):
        if k in out:
            out[f"{role}/{k}"] = out.pop(k)
    return out


def train_critic(ctx: RunContext, batch: dict, step: int) -> dict:
    return _update(ctx, ctx.critic, lambda mb: ValueLoss(mb, ctx.cfg), ctx.cfg.critic, batch, step, "critic")


def train_actor(ctx: RunContext, batch: dict, step: int) -> dict:
    return _update(ctx, ctx.actor, lambda mb: PolicyLoss(mb, ctx.cfg.algorithm), ctx.cfg.actor, batch, step,
                   "actor")


# -------------------------------------------------------------------------------------------------
# Metrics

def step_metrics(ctx: RunContext, batch: dict, timer) -> dict:
    """The per-step diagnostics, over the global batch (gathered from every rank)."""
    mask = gather_cat(batch["response_mask"])
    lengths = mask.sum(1)
    m: dict[str, Any] = {}
    scores = gather_cat(batch["scores"])
    m["reward/mean"] = scores.mean().item()
    m["reward/accuracy"] = gather_cat(batch["correct"]).mean().item()
    m["reward/failures_total"] = float(global_sum(ctx.reward_scorer.num_failures))
    m["response/length_mean"] = lengths.mean().item()
    for q in (50, 90):
        m[f"response/length_p{q}"] = lengths.quantile(q / 100).item()
    m["response/length_max"] = lengths.max().item()
    m["response/truncated_frac"] = gather_cat(batch["truncated"]).mean().item()

    if "raw_advantages" in batch:
        adv = gather_cat(batch["raw_advantages"])
        m["adv/mean"] = stats.masked_mean(adv, mask).item()
        m["adv/std"] = stats.masked_var(adv, mask).sqrt().item()
        m.update(position_diagnostics(adv, mask, ctx.cfg.logging.profile_buckets))

    if "old_values" in batch:
        values, returns = gather_cat(batch["old_values"]), gather_cat(batch["returns"])
        m["critic/explained_variance"] = float(stats.explained_variance(values, returns, mask))
        m["critic/value_mean"] = stats.masked_mean(values, mask).item()
        m["critic/return_mean"] = stats.masked_mean(returns, mask).item()
        # Value at the first response token vs the final outcome: the init-bias diagnostic of
        # VC-PPO sec. 3.1 (an RM-initialised critic scores early tokens far below the return).
        m["critic/value_first_token"] = values[:, 0].mean().item()
    if "old_logprobs" in batch:
        old_lp, samp_lp = gather_cat(batch["old_logprobs"]), gather_cat(batch["sampler_logprobs"])
        diff = (old_lp - samp_lp).abs() * mask
        m["mismatch/logprob_abs_mean"] = (diff.sum() / mask.sum().clamp(min=1)).item()
        m["mismatch/logprob_abs_max"] = diff.max().item()
    if batch.get("entropy") is not None:
        m["actor/entropy"] = stats.masked_mean(gather_cat(batch["entropy"]), mask).item()
    if "kl" in batch:
        m["actor/kl_ref"] = stats.masked_mean(gather_cat(batch["kl"]), mask).item()
    m.update(timer.metrics())
    m["perf/response_tokens"] = mask.sum().item()
    m["perf/tokens_per_s"] = mask.sum().item() / max(m["time/step_s"], 1e-9)
    if "time/rollout_s" in m:
        m["perf/rollout_tokens_per_s"] = mask.sum().item() / max(m["time/rollout_s"], 1e-9)
    if torch.cuda.is_available():
        m["perf/gpu_mem_peak_gb"] = torch.cuda.max_memory_allocated() / 2 ** 30
    return m


def position_diagnostics(adv: torch.Tensor, mask: torch.Tensor, buckets: int) -> dict:
    """The paper's Figure-2 diagnostic: mean advantage by token position, and its correlation."""
    profile = stats.advantage_position_profile(adv, mask, num_buckets=buckets)
    return {"adv/position_corr": float(stats.advantage_position_correlation(adv, mask)),
            "adv/position_profile": [None if not np.isfinite(x) else float(x) for x in profile.means],
            "adv/position_edges": [float(x) for x in profile.edges]}


# -------------------------------------------------------------------------------------------------
# Validation

def validate(ctx: RunContext, step: int) -> dict:
    """Greedy pass@1 and sampled unbiased pass@k on the validation prompts."""
    from vcppo.driver.evaluate import evaluate

    cfg = ctx.cfg
    return evaluate(ctx.rollout, ctx.val_rows, ctx.scorer, dist=ctx.dist,
                    max_tokens=cfg.rollout.max_response_tokens, n_samples=cfg.trainer.val_n_samples,
                    ks=cfg.trainer.val_k, temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
                    stop=cfg.rollout.stop or None, seed=ctx.sample_seed("val", step))


def fingerprint_path(path: str) -> dict:
    """Cheap identity of a file or directory (names, sizes, mtimes) for cache keys: hashing a 60 GB
    checkpoint to decide whether to reuse a critic would cost more than it saves."""
    p = Path(path)
    files = [p] if p.is_file() else sorted(x for x in p.rglob("*") if x.is_file())
    return {"path": str(p.resolve()),
            "files": [(str(f.relative_to(p)) if p.is_dir() else f.name, f.stat().st_size,
                       int(f.stat().st_mtime)) for f in files]}
