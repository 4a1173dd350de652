"""The policy's confidence in what it has written so far, as features a value head can read.

On `add` an error in the trace is usually a token the policy itself found unlikely, yet the last
hidden state of a policy-initialised critic does not say whether an earlier step was wrong: a
linear probe of the return on it explains ~0 of the variance, while the same probe on these three
features explains ~70% of what an error-aware oracle does (docs/results.md, "What a critic can
read"). Tensors in, tensors out.
"""
from __future__ import annotations

import math

import torch

N_FEATURES = 3
LOW = math.log(0.5)  # a token written with probability below 1/2 counts as a low-confidence step


def confidence_features(logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Features of the state before each response token t, from the tokens before t only.

    Args:
        logprobs: (B, R) the sampler's logprob of each response token (0 at padding).
        mask: (B, R) 1 at response tokens.
    Returns:
        (B, R, 3): the previous token's logprob, the lowest logprob so far, and log(1 + the number
        of tokens so far written with probability < 1/2); 0 at t = 0 and at padding.
    """
    lp = logprobs.float() * mask
    before = torch.cat([torch.zeros_like(lp[:, :1]), lp[:, :-1]], dim=1)  # token t-1's, 0 at t = 0
    lowest = torch.cummin(before, dim=1).values
    low_steps = torch.cumsum((before < LOW).float(), dim=1)
    feats = torch.stack([before, lowest, torch.log1p(low_steps)], dim=-1)
    return feats * mask.unsqueeze(-1)
