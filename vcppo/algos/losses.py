"""PPO losses: clipped surrogate (clip-higher, dual-clip), clipped value loss,
entropy, VAPO's positive-example NLL, and the one place where token losses are aggregated.

Notation
--------
    B, T         batch size, padded response length
    logprobs     (B, T) log pi_theta(a_t | s_t) of the sampled tokens under the current policy
    old_logprobs (B, T) the same under the rollout policy pi_old (behaviour policy)
    ratio        r_t = exp(logprobs - old_logprobs)
    A_t          (B, T) advantages (already whitened or not: the caller decides)
    mask         (B, T) bool / 0-1, True on tokens the policy generated
    eps_low, eps_high   clip range [1 - eps_low, 1 + eps_high] (clip-higher: DAPO/VAPO use
                 eps_high = 0.28 > eps_low = 0.2 so low-probability tokens can still grow)

Every loss returns (loss, metrics): loss is a 0-d tensor to call backward() on, metrics a dict
of 0-d tensors (detached) for logging.
"""
from __future__ import annotations

from typing import Optional

import torch

from vcppo.algos.stats import _valid, masked_mean

__all__ = [
    "AGGREGATIONS", "aggregate_loss", "policy_loss", "value_loss",
    "entropy_from_logits", "positive_example_nll",
]

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


def aggregate_loss(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    agg: str = "token-mean",
    global_token_count: Optional[float] = None,
    global_seq_count: Optional[float] = None,
    norm_constant: Optional[float] = None,
) -> torch.Tensor:
    """Reduce a per-token loss (B, T) to a scalar. The only place aggregation happens.

    Modes:
        "token-mean":          sum_{b,t} m * l / N_tok. Every token weighs the same, so long
                               responses are not down-weighted (VAPO section 3.3, "token-level
                               loss"; DAPO). N_tok = number of valid tokens in this call, or
                               `global_token_count`.
        "seq-mean-token-mean": mean over sequences of (per-sequence token mean): every sequence
                               weighs the same (original PPO-for-LLM / GRPO). Divides by
                               N_seq = sequences with >= 1 valid token, or `global_seq_count`.
        "seq-mean-token-sum":  mean over sequences of the per-sequence token SUM.
        "seq-mean-token-sum-norm": mean over sequences of (per-sequence token sum) / C, with C =
                               `norm_constant` the same for every sequence (Dr. GRPO, arXiv
                               2503.20783 sec. 3.2: C = the generation budget, max response
                               tokens). seq-mean-token-mean divides each sequence by its own
                               length, so the tokens of a long wrong answer are penalised less
                               than a short one's (the length bias); token-mean divides by the
                               batch's token count, which changes from batch to batch. Needs
                               `norm_constant`.

    Gradient accumulation / data parallelism: pass the count for the WHOLE optimiser step (all
    micro-batches, all ranks) as `global_token_count` (token-mean) or `global_seq_count` (seq
    modes). Each call then returns a partial sum, and summing the calls equals the full-batch
    loss exactly. Note that DDP / DeepSpeed AVERAGE gradients over ranks: multiply the loss by the
    world size (or use a SUM all-reduce) to keep that equality across ranks.

    Empty mask: returns 0 (connected to the graph, zero gradient), never NaN.

    Args:
        loss_mat: (B, T) per-token loss. mask: (B, T).
    Returns:
        0-d tensor.
    """
    valid = _valid(mask)
    zero = torch.zeros((), dtype=loss_mat.dtype, device=loss_mat.device)
    masked = torch.where(valid, loss_mat, zero)
    if agg == "token-mean":
        count = valid.sum() if global_token_count is None else global_token_count
        return masked.sum() / max(float(count), 1.0)
    if agg in ("seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"):
        tokens_per_seq = valid.sum(dim=-1)
        per_seq = masked.sum(dim=-1)
        if agg == "seq-mean-token-mean":
            per_seq = per_seq / tokens_per_seq.clamp(min=1)
        elif agg == "seq-mean-token-sum-norm":
            if norm_constant is None or norm_constant <= 0:
                raise ValueError(f"agg 'seq-mean-token-sum-norm' needs norm_constant > 0, got {norm_constant}")
            per_seq = per_seq / float(norm_constant)
        count = (tokens_per_seq > 0).sum() if global_seq_count is None else global_seq_count
        return per_seq.sum() / max(float(count), 1.0)
    raise ValueError(f"agg must be one of {AGGREGATIONS}, got {agg!r}")


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    dual_clip_c: Optional[float] = None,
    agg: str = "token-mean",
    global_token_count: Optional[float] = None,
    global_seq_count: Optional[float] = None,
    is_weights: Optional[torch.Tensor] = None,
    norm_constant: Optional[float] = None,
) -> tuple[torch.Tensor, dict]:
    """Clipped surrogate objective (PPO, arXiv 1707.06347 eq. 7) with clip-higher and dual-clip.

    Per token:  l_t = max(-A_t r_t, -A_t clip(r_t, 1 - eps_low, 1 + eps_high))
    Dual-clip (arXiv 1912.09729 eq. 5), only for A_t < 0:  l_t = min(l_t, -c A_t), c > 1: caps
    the loss of a negative-advantage token whose ratio exploded (otherwise unbounded).

    Args:
        logprobs, old_logprobs, advantages, mask: (B, T).
        eps_low, eps_high: clip range; eps_high > eps_low is clip-higher (VAPO: 0.2 / 0.28).
        dual_clip_c: None (off) or c > 1 (3.0 is common).
        agg, global_token_count, global_seq_count, norm_constant: see `aggregate_loss`.
        is_weights: None, or (B, T) per-token importance weights multiplying l_t after clipping
            (truncated IS for the sampler/trainer mismatch, `vcppo.algos.mismatch.tis_weights`);
            treated as constants (detached here), so the gradient is the weighted gradient.

    Returns:
        loss (0-d), metrics:
            clip_frac_low   fraction of valid tokens with A < 0 and r < 1 - eps_low (clipped:
                            no gradient); clip_frac_high: A > 0 and r > 1 + eps_high.
            dual_clip_frac  fraction with A < 0 and r > c (dual clip active); 0 when off.
            approx_kl       mean k3 estimate of KL(pi_old || pi_theta) = (r - 1) - log r:
                            unbiased for samples from pi_old, always >= 0 (Schulman 2020).
            ratio_mean, ratio_max over valid tokens.
    """
    if dual_clip_c is not None and dual_clip_c <= 1.0:
        raise ValueError(f"dual_clip_c must be > 1, got {dual_clip_c}")
    valid = _valid(mask)
    log_ratio = (logprobs.float() - old_logprobs.float())
    # Masked positions may hold garbage (padding logprobs); keep them out of exp().
    log_ratio = torch.where(valid, log_ratio, torch.zeros_like(log_ratio))
    ratio = torch.exp(log_ratio)
    adv = torch.where(valid, advantages.float(), torch.zeros_like(log_ratio))
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    per_token = torch.maximum(unclipped, clipped)
    negative = adv < 0
    if dual_clip_c is not None:
        per_token = torch.where(negative, torch.minimum(per_token, -dual_clip_c * adv), per_token)
    if is_weights is not None:
        per_token = per_token * is_weights.detach().float()
    loss = aggregate_loss(per_token, valid, agg, global_token_count, global_seq_count, norm_constant)

    with torch.no_grad():
        as_float = lambda b: masked_mean(b.float(), valid)  # noqa: E731
        metrics = {
            "clip_frac_low": as_float(negative & (ratio < 1.0 - eps_low)),
            "clip_frac_high": as_float((adv > 0) & (ratio > 1.0 + eps_high)),
            "dual_clip_frac": as_float(negative & (ratio > dual_clip_c))
            if dual_clip_c is not None else torch.zeros(()),
            "approx_kl": masked_mean((ratio - 1.0) - log_ratio, valid),
            "ratio_mean": masked_mean(ratio, valid),
            "ratio_max": torch.where(valid, ratio, torch.zeros_like(ratio)).max(),
        }
    return loss, {k: v.detach() for k, v in metrics.items()}


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip_range: Optional[float] = 0.2,
    agg: str = "token-mean",
    global_token_count: Optional[float] = None,
    global_seq_count: Optional[float] = None,
    norm_constant: Optional[float] = None,
) -> tuple[torch.Tensor, dict]:
    """Clipped value loss: 0.5 * max((V - R)^2, (V_clip - R)^2), V_clip = V_old + clip(V - V_old, +-eps).

    Args:
        values:     (B, T) current critic output. old_values: (B, T) critic at rollout time.
        returns:    (B, T) value targets (lam_critic GAE returns; Monte-Carlo when lam = 1).
        mask:       (B, T).
        clip_range: eps; None disables clipping (plain 0.5 * (V - R)^2, as used during value
                    pretraining where there is no trust region to respect).
        agg, global_*_count, norm_constant: see `aggregate_loss`.

    Returns:
        loss (0-d), metrics: value_clip_frac (fraction of valid tokens where the clipped term
        is the larger one, i.e. the gradient is cut). The values' statistics (explained
        variance, means) are the step's, over the global batch (driver/step/metrics.py): a
        micro-batch's would be averaged over micro-batches and ranks.
    """
    valid = _valid(mask)
    values_f = values.float()
    returns_f = returns.float()
    unclipped = (values_f - returns_f) ** 2
    if clip_range is None:
        per_token = 0.5 * unclipped
        clipped_active = torch.zeros_like(valid)
    else:
        old = old_values.float()
        values_clipped = old + torch.clamp(values_f - old, -clip_range, clip_range)
        clipped = (values_clipped - returns_f) ** 2
        per_token = 0.5 * torch.maximum(unclipped, clipped)
        clipped_active = clipped > unclipped
    loss = aggregate_loss(per_token, valid, agg, global_token_count, global_seq_count, norm_constant)
    with torch.no_grad():
        metrics = {
            "value_clip_frac": masked_mean(clipped_active.float(), valid),
        }
    return loss, metrics


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the categorical distribution softmax(logits) per position. (B, T, V) -> (B, T) fp32.

    H = -sum_v p_v log p_v with log p = logits - logsumexp(logits): stable for any logit scale;
    -inf logits (banned tokens) contribute exactly 0.
    """
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    probs = log_probs.exp()
    plogp = torch.where(probs > 0, probs * log_probs, torch.zeros_like(probs))
    return -plogp.sum(dim=-1)


def positive_example_nll(
    logprobs: torch.Tensor,
    mask: torch.Tensor,
    is_positive: torch.Tensor,
    agg: str = "token-mean",
    global_token_count: Optional[float] = None,
    global_seq_count: Optional[float] = None,
    norm_constant: Optional[float] = None,
) -> tuple[torch.Tensor, dict]:
    """VAPO's positive-example LM loss (arXiv 2504.05118 sec. 3.3): NLL of correct samples only.

    Args:
        logprobs:    (B, T) current-policy log-probs of the sampled tokens.
        mask:        (B, T).
        is_positive: (B,) bool, True for samples whose answer was verified correct.
        agg, global_*_count, norm_constant: see `aggregate_loss` (counts refer to POSITIVE tokens /
            sequences).

    Returns:
        loss (0-d; add mu * loss, mu = 0.1 in VAPO), metrics {num_positive, nll}. No positive
        sample -> loss 0 (still differentiable, zero gradient), no NaN.
    """
    valid = _valid(mask) & is_positive.bool()[:, None]
    loss = aggregate_loss(-logprobs.float(), valid, agg, global_token_count, global_seq_count, norm_constant)
    return loss, {"num_positive": is_positive.bool().sum().float(), "nll": loss.detach()}
