"""DAPO's batch shaping (arXiv 2503.14476): dynamic sampling's group filter (sec. 3.2) and the two
overlong treatments of sec. 3.4 (overlong filtering, soft overlong punishment). Pure tensor math;
the driver decides when to apply them (:mod:`vcppo.driver.dynamic_sampling`,
:mod:`vcppo.driver.step.update`).

Notation
--------
    B, T        batch size, padded response length
    scores      (B,) outcome reward of each sample
    group       (B,) long: the prompt each sample belongs to (all samples of one prompt = a group)
    lengths     (B,) response length in tokens
    L_max       rollout.max_response_tokens: where generation is cut off
    L_cache     the soft-punishment buffer: the last L_cache tokens before L_max
"""
from __future__ import annotations

import torch

__all__ = ["informative_groups", "overlong_penalty", "mask_truncated"]


def informative_groups(scores: torch.Tensor, group: torch.Tensor, atol: float = 1e-6) -> torch.Tensor:
    """Which samples belong to a group whose scores are NOT all equal (DAPO sec. 3.2).

    A group where every sample scored the same (all correct or all wrong) has zero group-relative
    advantage, hence no policy gradient, and only shrinks the effective batch; dynamic sampling
    drops such groups and samples more prompts instead. A group of one sample is never informative.

    Args:
        scores: (B,) float. group: (B,) integer group ids (any values, any order).
        atol: scores closer than this count as equal.

    Returns:
        (B,) bool, True for samples of informative groups.
    """
    _, gid = torch.unique(group, return_inverse=True)
    n = int(gid.max()) + 1 if gid.numel() else 0
    s = scores.float()
    hi = torch.full((n,), -float("inf"), device=s.device).scatter_reduce(0, gid, s, "amax")
    lo = torch.full((n,), float("inf"), device=s.device).scatter_reduce(0, gid, s, "amin")
    return (hi - lo > atol)[gid]


def overlong_penalty(lengths: torch.Tensor, max_len: int, buffer: int, penalty: float = 1.0) -> torch.Tensor:
    """DAPO's soft overlong punishment (sec. 3.4), added to the outcome reward:

        R_len(l) = 0                                     l <= L_max - L_cache
                 = -penalty * (l - (L_max - L_cache)) / L_cache    L_max - L_cache < l <= L_max
                 = -penalty                              l > L_max

    so the longer a response runs into the buffer, the larger its penalty; DAPO uses penalty 1
    (L_max = 20480 with L_cache = 4096).

    Args:
        lengths: (B,) response lengths. max_len: L_max. buffer: L_cache, 1 <= L_cache <= L_max.
        penalty: the penalty at (and beyond) L_max, >= 0.

    Returns:
        (B,) float32, <= 0.
    """
    if not 1 <= buffer <= max_len:
        raise ValueError(f"overlong buffer must be in [1, max_len={max_len}], got {buffer}")
    over = (lengths.float() - (max_len - buffer)).clamp(min=0.0, max=float(buffer))
    return -float(penalty) * over / float(buffer)


def mask_truncated(mask: torch.Tensor, truncated: torch.Tensor) -> torch.Tensor:
    """DAPO's overlong filtering (sec. 3.4): truncated samples leave the loss. A response cut off at
    L_max is scored wrong although its reasoning may have been sound; its gradient would teach the
    policy that length is bad. Shapes: mask (B, T), truncated (B,) 0/1 -> (B, T), mask's dtype."""
    keep = (truncated == 0)[:, None]
    return mask * keep.to(mask.dtype) if mask.dtype != torch.bool else mask & keep
