"""KL to the reference policy: per-token estimators and the adaptive coefficient.

Estimators (Schulman 2020, "Approximating KL divergence"), from tokens sampled by pi_theta, with
log_ratio = log pi_theta - log pi_ref:

    k1          log_ratio                                  unbiased for KL(pi_theta || pi_ref), can be < 0
    k2          0.5 * log_ratio^2                          biased, low variance, >= 0
    k3          exp(-log_ratio) - 1 + log_ratio            unbiased, low variance, >= 0
    low_var_kl  k3 with log_ratio clamped to [-20, 20] and the estimate to [-10, 10] (verl's name;
                the clamps keep one token far off the reference from dominating a batch)

As a penalty in the reward only their values matter. As a loss term (``algorithm.kl_in: loss``,
GRPO's way) their gradients do, and they differ (on-policy, in expectation): k1's gradient is
zero, k2's is the gradient of KL(pi_theta || pi_ref), k3's that of the reverse KL(pi_ref || pi_theta).

The adaptive coefficient is Ziegler et al. 2019 ("Fine-tuning language models from human
preferences", sec. 2.2), as verl's and OpenRLHF's ``AdaptiveKLController`` apply it.
"""
from __future__ import annotations

import math

import torch

KL_ESTIMATORS = ("k1", "k2", "k3", "low_var_kl")


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token KL estimate. logprobs, ref_logprobs (B, T) -> (B, T) float32; mask it yourself.
    Differentiable in ``logprobs`` (the loss form)."""
    log_ratio = logprobs.float() - ref_logprobs.float()
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio ** 2
    if estimator == "k3":
        return torch.expm1(-log_ratio) + log_ratio  # expm1: exact near 0, where exp(x) - 1 cancels
    if estimator == "low_var_kl":
        d = (-log_ratio).clamp(-20.0, 20.0)
        return (torch.expm1(d) - d).clamp(-10.0, 10.0)
    raise ValueError(f"KL estimator must be one of {KL_ESTIMATORS}, got {estimator!r}")


def sequence_mean_kl(kl: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, T) per-token KL -> (B,) its mean over each sequence's valid tokens (0 for an empty one):
    the per-sample KL the adaptive controller averages (verl: ``masked_mean(kl, mask, axis=-1)``)."""
    m = mask.float()
    return (kl.float() * m).sum(-1) / m.sum(-1).clamp(min=1.0)


def adaptive_kl_coef(coef: float, observed_kl: float, target: float, horizon: float, n_samples: int) -> float:
    """The next KL coefficient (Ziegler et al. 2019): proportional control toward ``target``.

        error = clip(observed_kl / target - 1, -0.2, 0.2)
        coef' = coef * (1 + error * n_samples / horizon)

    ``observed_kl``: the step's mean per-sample KL; ``n_samples``: the samples it was measured on
    (the step's batch); ``horizon``: samples over which the coefficient may change by a factor e^0.2.
    A non-finite ``observed_kl`` leaves the coefficient as it is.
    """
    if target <= 0 or horizon <= 0:
        raise ValueError(f"target and horizon must be > 0, got {target} and {horizon}")
    if not math.isfinite(observed_kl):
        return coef  # a non-finite step (skipped by the trainer) must not poison every later one
    error = min(max(observed_kl / target - 1.0, -0.2), 0.2)
    return coef * (1.0 + error * n_samples / horizon)
