"""Sampler / trainer mismatch: how far vLLM's logprobs are from the trainer's, and the truncated
importance-sampling (TIS) correction of the policy gradient.

The rollout engine (vLLM, bf16 kernels, its own sampler) and the trainer (DeepSpeed, another
kernel set) compute slightly different probabilities for the same tokens, so the samples come from
the sampler's policy mu, not from the trainer's pi_old that PPO's ratio assumes. The policy
gradient is re-weighted token by token with the importance ratio pi_old / mu, truncated at a cap
so that a token mu found unlikely but pi_old likes does not blow up the variance (truncated IS,
Ionides 2008; the same correction verl, OpenRLHF and TRL offer for rollout/trainer mismatch).

Notation
--------
    B, T              batch size, padded response length
    old_logprobs      (B, T) log pi_old(a_t | s_t): the trainer's logprobs before the update
    sampler_logprobs  (B, T) log mu(a_t | s_t): the sampler's (vLLM's) logprobs of the same tokens
    mask              (B, T) bool / 0-1, True on generated tokens
    rho_t             exp(old_logprobs - sampler_logprobs) = pi_old / mu
    w_t               min(rho_t, cap): the TIS weight (a constant: no gradient flows through it)
"""
from __future__ import annotations

import torch

from vcppo.algos.stats import _valid, masked_mean

__all__ = ["tis_weights", "mismatch_stats"]


def tis_weights(old_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, mask: torch.Tensor,
                cap: float) -> tuple[torch.Tensor, dict]:
    """Per-token truncated importance weights w_t = min(pi_old / mu, cap), detached.

    Multiplying the per-token policy-gradient loss by ``w`` turns the expectation under mu (what
    was sampled) back into one under pi_old (what PPO's objective assumes), with variance bounded
    by ``cap``. Only the upper side is truncated: a weight below 1 (the trainer finds the token
    less likely than the sampler did) only shrinks that token's gradient.

    Args:
        old_logprobs, sampler_logprobs, mask: (B, T).
        cap: the truncation level, >= 1 (cap = 1 never up-weights a token; verl's default is 2).

    Returns:
        weights (B, T) float32, 1 at masked positions (so garbage there is inert), no grad;
        metrics (0-d, over valid tokens): weight_mean, weight_max, truncated_frac (share of tokens
        with rho > cap).
    """
    if cap < 1.0:
        raise ValueError(f"the TIS cap must be >= 1, got {cap}")
    valid = _valid(mask)
    with torch.no_grad():
        log_rho = torch.where(valid, old_logprobs.float() - sampler_logprobs.float(),
                              torch.zeros_like(old_logprobs, dtype=torch.float32))
        rho = torch.exp(log_rho)
        weights = torch.clamp(rho, max=float(cap))
        metrics = {"weight_mean": masked_mean(weights, valid),
                   "weight_max": torch.where(valid, weights, torch.zeros_like(weights)).max(),
                   "truncated_frac": masked_mean((rho > cap).float(), valid)}
    return weights.detach(), metrics


def mismatch_stats(old_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor,
                   mask: torch.Tensor) -> dict:
    """How far the sampler's logprobs are from the trainer's, over valid tokens.

    Args:
        old_logprobs, sampler_logprobs, mask: (B, T).

    Returns (0-d float32 tensors):
        logprob_abs_mean, logprob_abs_max   mean / max of |log pi_old - log mu|
        kl_k3  mean k3 estimate of KL(mu || pi_old) from tokens sampled by mu:
               (rho - 1) - log rho, rho = pi_old / mu; unbiased, >= 0 (Schulman 2020).
    """
    valid = _valid(mask)
    d = torch.where(valid, old_logprobs.float() - sampler_logprobs.float(),
                    torch.zeros_like(old_logprobs, dtype=torch.float32))
    return {"logprob_abs_mean": masked_mean(d.abs(), valid),
            "logprob_abs_max": d.abs().max() if d.numel() else torch.zeros(()),
            "kl_k3": masked_mean(torch.expm1(d) - d, valid)}
