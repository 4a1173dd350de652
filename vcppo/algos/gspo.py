"""GSPO's policy loss (Group Sequence Policy Optimization, Zheng et al. 2025, arXiv 2507.18071):
the importance ratio and its clip are per SEQUENCE, not per token. Composes with any advantage
estimator (``algorithm.policy_loss: gspo``).

Notation
--------
    B, T          batch size, padded response length
    logprobs      (B, T) log pi_theta(y_t | x, y_<t) of the sampled tokens, current policy
    old_logprobs  (B, T) the same under pi_old
    A             (B, T) advantages; sequence-level estimators (GRPO, RLOO) give A_{i,t} = A_i
    mask          (B, T) response tokens; |y_i| = sum_t mask_{i,t}
    sg[.]         stop-gradient

    s_i      = exp( (1 / |y_i|) sum_t (log pi_theta - log pi_old)_{i,t} )       (eq. 7: the geometric
               mean of the token ratios, so its range does not grow with the length)
    s_{i,t}  = sg[s_i] * pi_theta(y_{i,t}) / sg[pi_theta(y_{i,t})]             (GSPO-token, eq. 13)
    l_{i,t}  = max( -A_{i,t} s_{i,t}, -A_{i,t} clip(s_{i,t}, 1 - eps_low, 1 + eps_high) )
    loss     = 1/G sum_i 1/|y_i| sum_t l_{i,t}                                  (seq-mean-token-mean)

s_{i,t} equals s_i in value, so the clip acts per sequence: a sequence is clipped whole or not at
all. With A_{i,t} = A_i, loss and gradient are GSPO's (eq. 5 / 10): d l_{i,t} = -A_i s_i d log pi_t,
summed over t and divided by |y_i| is -A_i d s_i. The paper clips far tighter than PPO does
(eps_low 3e-4, eps_high 4e-4): a sequence ratio moves much less than a token's.
"""
from __future__ import annotations

from typing import Optional

import torch

from vcppo.algos.losses import aggregate_loss
from vcppo.algos.stats import _valid, masked_mean

__all__ = ["GSPO_AGGREGATIONS", "sequence_log_ratio", "gspo_loss"]

GSPO_AGGREGATIONS = ("seq-mean-token-mean",)


def sequence_log_ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, T) x2, mask -> (B,) log s_i = mean over the sequence's valid tokens of the token log-ratio
    (0 for a sequence with no valid token). Differentiable in ``logprobs``."""
    valid = _valid(mask)
    log_ratio = torch.where(valid, logprobs.float() - old_logprobs.float(), torch.zeros((), device=logprobs.device))
    return log_ratio.sum(-1) / valid.sum(-1).clamp(min=1)


def gspo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float = 3e-4,
    eps_high: float = 4e-4,
    agg: str = "seq-mean-token-mean",
    global_token_count: Optional[float] = None,
    global_seq_count: Optional[float] = None,
    norm_constant: Optional[float] = None,
    is_weights: Optional[torch.Tensor] = None,
    dual_clip_c: Optional[float] = None,
) -> tuple[torch.Tensor, dict]:
    """GSPO's clipped sequence-ratio objective (module docstring), as a loss to minimise; the
    signature of :func:`vcppo.algos.losses.policy_loss` (the methods table calls both alike).

    Args:
        logprobs, old_logprobs, advantages, mask: (B, T).
        eps_low, eps_high: clip range of the sequence ratio (the paper: 3e-4 / 4e-4).
        agg: must be "seq-mean-token-mean" (the paper's 1/G sum_i 1/|y_i| sum_t); the other
            aggregations weigh sequences by their length, which GSPO does not define.
        global_token_count, global_seq_count, norm_constant: see `losses.aggregate_loss`.
        is_weights: None, or (B, T) per-token weights multiplying l_{i,t} (truncated IS for the
            sampler/trainer mismatch), detached.
        dual_clip_c: must be None (a whole sequence is clipped or not: there is no dual clip).

    Returns:
        loss (0-d), metrics over sequences with >= 1 valid token:
            clip_frac_low   share of sequences with A < 0 and s < 1 - eps_low (mean A over the
                            sequence's tokens); clip_frac_high: A > 0 and s > 1 + eps_high.
            approx_kl       token-level k3 estimate of KL(pi_old || pi_theta), as the PPO loss's.
            ratio_mean, ratio_max of s_i.
    """
    if dual_clip_c is not None:
        raise ValueError("GSPO has no dual clip (it clips whole sequences): dual_clip_c must be None")
    if agg not in GSPO_AGGREGATIONS:
        raise ValueError(f"GSPO defines the loss aggregation {GSPO_AGGREGATIONS}, got {agg!r}")
    valid = _valid(mask)
    log_s = sequence_log_ratio(logprobs, old_logprobs, valid)
    lp = torch.where(valid, logprobs.float(), torch.zeros((), device=logprobs.device))
    token_ratio = torch.exp(log_s.detach()[:, None] + lp - lp.detach())  # value s_i, gradient s_i d log pi_t
    adv = torch.where(valid, advantages.float(), torch.zeros_like(token_ratio))
    unclipped = -adv * token_ratio
    clipped = -adv * torch.clamp(token_ratio, 1.0 - eps_low, 1.0 + eps_high)
    per_token = torch.maximum(unclipped, clipped)
    if is_weights is not None:
        per_token = per_token * is_weights.detach().float()
    loss = aggregate_loss(per_token, valid, agg, global_token_count, global_seq_count, norm_constant)
    with torch.no_grad():
        has = valid.any(-1)
        s, seq_adv = log_s.exp(), masked_mean(adv, valid, dim=-1)
        as_share = lambda b: (b & has).float().sum() / has.float().sum().clamp(min=1)  # noqa: E731
        token_log_ratio = torch.where(valid, logprobs.float() - old_logprobs.float(), torch.zeros_like(adv))
        metrics = {
            "clip_frac_low": as_share((seq_adv < 0) & (s < 1.0 - eps_low)),
            "clip_frac_high": as_share((seq_adv > 0) & (s > 1.0 + eps_high)),
            "approx_kl": masked_mean(token_log_ratio.exp() - 1.0 - token_log_ratio, valid),
            "ratio_mean": (s * has).sum() / has.float().sum().clamp(min=1),
            "ratio_max": torch.where(has, s, torch.zeros_like(s)).max() if s.numel() else torch.zeros(()),
        }
    return loss, {k: v.detach() for k, v in metrics.items()}
