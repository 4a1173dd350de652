"""What a step reports: phase timings, the collapse diagnostics over the global batch, validation.

**Samples** (:func:`log_samples`): what the policy wrote: a few of a step's samples as text, with what the step made of them
(``logging.log_samples``), for ``samples.jsonl``, a wandb table and ``vcppo report``.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from vcppo.algos import stats
from vcppo.algos.kl import kl_estimate, sequence_mean_kl
from vcppo.algos.mismatch import mismatch_stats, tis_weights
from vcppo.driver.parts import RunParts
from vcppo.driver.state import Phase
from vcppo.driver.step.sampler import SAMPLERS, sampler_kind
from vcppo.driver.step.step_plan import Source, StepPlan
from vcppo.driver.step.timeline import PhaseTimer
from vcppo.driver.step.validation import SAMPLES_KEY
from vcppo.experience import Advantages, BeforeUpdate, CriticResult, Rollout
from vcppo.runtime.collectives import gather_cat


def position_diagnostics(adv: torch.Tensor, mask: torch.Tensor, buckets: int) -> dict:
    """The paper's Figure-2 diagnostic: mean advantage by token position, and its correlation."""
    profile = stats.advantage_position_profile(adv, mask, num_buckets=buckets)
    return {"adv/position_corr": float(stats.advantage_position_correlation(adv, mask)),
            "adv/position_profile": [None if not np.isfinite(x) else float(x) for x in profile.means],
            "adv/position_edges": [float(x) for x in profile.edges]}


def _response_metrics(ctx: RunParts, batch: Rollout) -> dict:
    lengths = gather_cat(batch.response_lengths)
    m = {"reward/mean": gather_cat(batch.scores).mean().item(),
         "reward/accuracy": gather_cat(batch.correct).mean().item(),
         "response/length_mean": lengths.mean().item()}
    for q in (50, 90):
        m[f"response/length_p{q}"] = lengths.quantile(q / 100).item()
    m["response/length_max"] = lengths.max().item()
    m["response/truncated_frac"] = gather_cat(batch.truncated).mean().item()
    return m


def _critic_metrics(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> dict:
    return {"critic/explained_variance": float(stats.explained_variance(values, returns, mask)),
            "critic/value_mean": stats.masked_mean(values, mask).item(),
            "critic/return_mean": stats.masked_mean(returns, mask).item(),
            # Value at the first response token vs the final outcome: the init-bias diagnostic of
            # VC-PPO sec. 3.1 (an RM-initialised critic scores early tokens far below the return).
            "critic/value_first_token": values[:, 0].mean().item()}


def mismatch_metrics(old_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, mask: torch.Tensor,
                     tis_cap: float | None) -> dict:
    """Sampler (vLLM) vs trainer logprobs of the step's tokens: mean / max |delta|, k3 KL, and the
    truncated importance weights the policy loss uses when ``tis_cap`` is set."""
    m = {f"mismatch/{k}": float(v) for k, v in mismatch_stats(old_logprobs, sampler_logprobs, mask).items()}
    if tis_cap is not None:
        _, tis = tis_weights(old_logprobs, sampler_logprobs, mask, tis_cap)
        m.update({f"mismatch/tis_{k}": float(v) for k, v in tis.items()})
    return m


def step_metrics(ctx: RunParts, plan: StepPlan, rollout: Rollout, models: BeforeUpdate, adv: Advantages,
                 timer: PhaseTimer, critic: CriticResult | None = None) -> dict:
    """The per-step diagnostics over the global batch (gathered from every rank). ``models``: what
    the models said before the updates, with what the updates' own forwards gave filled in;
    ``critic``: the critic side's targets; a quantity the plan does not produce (no critic in
    GRPO, no pi_old in value pretraining) is not reported."""
    mask = gather_cat(rollout.policy_mask)
    m: dict[str, Any] = _response_metrics(ctx, rollout)
    raw = gather_cat(adv.raw_advantages)
    m["adv/mean"] = stats.masked_mean(raw, mask).item()
    m["adv/std"] = stats.masked_var(raw, mask).sqrt().item()
    m.update(position_diagnostics(raw, mask, ctx.cfg.logging.profile_buckets))
    values = gather_cat(models.old_values) if plan.v_old is not Source.NONE else None
    if values is not None:
        m.update(_critic_metrics(values, gather_cat(critic.returns), mask))
    m.update(SAMPLERS[sampler_kind(ctx.cfg)].batch_metrics(ctx.cfg, raw, mask, values))  # episodes: by turn
    if plan.sampler_logprobs and plan.pi_old in (Source.PASS, Source.UPDATE):
        # (pi_old taken from the sampler: nothing to compare)
        m.update(mismatch_metrics(gather_cat(models.old_logprobs), gather_cat(rollout.sampler_logprobs), mask,
                                  ctx.cfg.algorithm.rollout_is_cap))
    if plan.entropy is not Source.NONE:
        m["actor/entropy"] = stats.masked_mean(gather_cat(models.entropy), mask).item()
    m.update(timer.metrics())
    m["perf/response_tokens"] = mask.sum().item()
    m["perf/tokens_per_s"] = mask.sum().item() / max(m["time/step_s"], 1e-9)
    if "time/rollout_s" in m:
        m["perf/rollout_tokens_per_s"] = mask.sum().item() / max(m["time/rollout_s"], 1e-9)
    if torch.cuda.is_available():
        m["perf/gpu_mem_peak_gb"] = torch.cuda.max_memory_allocated() / 2 ** 30
    return m


def log_samples(ctx: RunParts, phase: Phase, step: int, rollout: Rollout, rewards: torch.Tensor,
                adv: Advantages) -> None:
    """``logging.log_samples`` of the main rank's samples, as text."""
    n = ctx.cfg.logging.log_samples
    if n and ctx.dist.is_main and ctx.tokenizer is not None:
        picked = pick_samples(rollout, rewards, adv.raw_advantages, ctx.tokenizer, n)
        ctx.log.log_samples([s.record() for s in picked], step=step, phase=str(phase))


def kl_metrics(ctx: RunParts, plan: StepPlan, rollout: Rollout, models: BeforeUpdate, rewards: torch.Tensor,
               kl_coef: float) -> dict:
    """The KL of pi_old to the reference over the global batch. ``actor/kl_ref``: the mean over
    samples of each sample's token-mean KL (what the adaptive controller reads, as verl's);
    ``actor/kl_coef``: this step's coefficient. With the KL in the reward, ``reward/kl_penalty``
    is what it took from a sample's return on average, and ``reward/with_kl_mean`` the mean return
    (sum of per-token rewards) that advantage estimation received."""
    mask = rollout.policy_mask
    kl = models.kl if models.kl is not None else \
        kl_estimate(models.old_logprobs, models.ref_logprobs, ctx.cfg.algorithm.kl_estimator) * mask
    m = {"actor/kl_ref": gather_cat(sequence_mean_kl(kl, mask)).mean().item(), "actor/kl_coef": float(kl_coef)}
    if plan.kl_in_reward:
        m["reward/kl_penalty"] = gather_cat(kl_coef * kl.sum(-1)).mean().item()
        m["reward/with_kl_mean"] = gather_cat((rewards * mask).sum(-1)).mean().item()
    return m


def validate(ctx: RunParts, source, step: int, final: bool = False) -> None:
    """Greedy pass@1 and sampled unbiased pass@k on the validation prompts, with the weights of
    ``step`` (``source.validate``). Colocated, it is done and logged here; in a split run the
    rollout ranks validate while training goes on, and :func:`log_validations` logs the result
    when it has arrived. ``final``: wait for it (and every earlier one) and write final_metrics.json."""
    source.validate(step)
    log_validations(ctx, source, wait=final, final_step=step if final else None)


def log_validations(ctx: RunParts, source, wait: bool = False, final_step: int | None = None) -> None:
    """Log the validations that have finished, in step order (``wait``: every one asked for, as a
    checkpoint must hold every record up to its step)."""
    for step, metrics in source.finished_validations(wait):
        if not metrics:
            continue
        ctx.log.log_samples(metrics.pop(SAMPLES_KEY, []), step=step, phase="val")
        ctx.log.log(metrics, step=step, phase="val")
        ctx.log.info(f"val step {step}: " + ", ".join(f"{k}={v:.3f}" for k, v in metrics.items()
                                                      if k.startswith("val/")))
        if step == final_step:
            ctx.write_final_metrics(metrics)


@dataclass(frozen=True)
class Sample:
    """One response and its scores. ``reward``: what advantage estimation received (the sum of the
    per-token rewards, the KL penalty included when it is in the reward); ``score``: the verifier's
    (plus overlong shaping); ``adv_*``: the actor's advantages over the response tokens, before whitening."""
    prompt: str
    response: str
    reward: float
    score: float
    correct: bool
    truncated: bool
    length: int
    adv_mean: float
    adv_min: float
    adv_max: float

    def record(self) -> dict:
        return dataclasses.asdict(self)


def pick_samples(rollout: Rollout, rewards: Tensor, advantages: Tensor, tokenizer, n: int) -> list[Sample]:
    """The first ``n`` samples of this rank's share as text. ``rewards``, ``advantages``: (B, R)."""
    P, out = rollout.prompt_len, []
    for i in range(min(n, rollout.size)):
        prompt = rollout.input_ids[i, :P][rollout.attention_mask[i, :P].bool()]
        on = rollout.policy_mask[i].bool()  # model tokens (an episode's observations are not)
        response = rollout.input_ids[i, P:][rollout.attention_mask[i, P:].bool()]  # the whole episode
        adv = advantages[i][on].float()
        out.append(Sample(
            prompt=tokenizer.decode(prompt.tolist(), skip_special_tokens=False),
            response=tokenizer.decode(response.tolist(), skip_special_tokens=False),
            reward=float(rewards[i][on].sum()), score=float(rollout.scores[i]), correct=bool(rollout.correct[i] > 0),
            truncated=bool(rollout.truncated[i] > 0), length=int(on.sum()),
            adv_mean=float(adv.mean()) if adv.numel() else 0.0, adv_min=float(adv.min()) if adv.numel() else 0.0,
            adv_max=float(adv.max()) if adv.numel() else 0.0))
    return out
