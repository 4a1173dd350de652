"""Masked statistics and diagnostics: mean / var / whiten, explained variance, advantage-vs-position
profile (VC-PPO Figure 2), GRPO group advantages, unbiased pass@k.

Notation
--------
    B, T    batch size and padded length; x, mask are (B, T) unless stated
    mask    bool / 0-1; True = the entry counts. Entries under a False mask never change a
            statistic, even when they hold NaN / inf (selection uses torch.where, not products).
    n       number of valid entries
"""
from __future__ import annotations

from typing import Callable, NamedTuple, Optional, Sequence, Union

import numpy as np
import torch

__all__ = [
    "masked_sum", "masked_mean", "masked_var", "masked_whiten", "explained_variance",
    "PositionProfile", "advantage_position_profile", "advantage_position_correlation",
    "grpo_advantages", "pass_at_k",
]


def _valid(mask: torch.Tensor) -> torch.Tensor:
    """The mask as bool (True = the entry counts); a bool mask is returned as it is, no copy.
    The one definition for `vcppo.algos` (losses and mismatch import it)."""
    return mask if mask.dtype == torch.bool else mask != 0


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    """Sum of x over valid entries (over everything, or along `dim`). x, mask broadcastable."""
    selected = torch.where(_valid(mask), x, torch.zeros((), dtype=x.dtype, device=x.device))
    return selected.sum() if dim is None else selected.sum(dim=dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    """Mean of x over valid entries: sum(x * m) / n. NaN when n = 0 (the mean is undefined).

    Shapes: x (B, T) (or any shape), mask broadcastable to x; dim=None reduces everything.
    """
    valid = _valid(mask).expand_as(x)
    count = valid.sum() if dim is None else valid.sum(dim=dim)
    return masked_sum(x, valid, dim) / count


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of x over valid entries (all dims pooled). 0-d tensor.

    unbiased=True divides by n - 1 (Bessel); NaN when n < 2 (or n < 1 with unbiased=False).
    Two-pass (mean first, then squared deviations) for numerical stability.
    """
    valid = _valid(mask).expand_as(x)
    n = valid.sum()
    mean = masked_sum(x, valid) / n
    squared_deviation = masked_sum((x - mean) ** 2, valid)
    return squared_deviation / (n - 1 if unbiased else n)


def masked_whiten(
    x: torch.Tensor,
    mask: torch.Tensor,
    zero_mean: bool = True,
    eps: float = 1e-8,
    sum_fn: Callable[[torch.Tensor], float] = float,
) -> torch.Tensor:
    """Divide x by its masked standard deviation; subtract the mean first only if `zero_mean`.

    Args:
        x:         (B, T) e.g. advantages.
        mask:      (B, T), or broadcastable to x.
        zero_mean: True  -> (x - mean) / std   (standard advantage whitening)
                   False -> x / std            (rescales only: a batch whose advantages are
                            mostly positive stays mostly positive)
        eps:       added to the variance.
        sum_fn:    reduces a 0-d local partial sum to the Python float summed over the whole
                   batch. The default `float` reduces over the local tensor only;
                   `vcppo.runtime.collectives.global_sum` sums over all ranks, so the result does not
                   depend on how many ranks the batch is split over.

    Returns:
        (B, T) same dtype as x; exactly 0 at masked positions.

    Statistics (each reduced by `sum_fn`): n valid entries, mean = sum(x) / max(n, 1), unbiased
    var = sum((x - mean)^2) / max(n - 1, 1), so an empty or one-token batch gives var 0 and no
    NaN. The mean and variance are Python floats (float64); the scale rsqrt(var + eps) is taken
    in x's dtype on the CPU. Two passes (mean first, then squared deviations) for numerical
    stability. Masked entries are removed by selection (torch.where), so NaN / inf there
    change nothing.
    """
    valid = _valid(mask).expand_as(x)
    n = sum_fn(valid.sum())
    mean = sum_fn(masked_sum(x, valid)) / max(n, 1.0)
    var = sum_fn(masked_sum((x - mean) ** 2, valid)) / max(n - 1.0, 1.0)
    scale = torch.rsqrt(torch.tensor(var + eps, dtype=x.dtype))
    whitened = (x - mean if zero_mean else x) * scale
    return torch.where(valid, whitened, torch.zeros((), dtype=whitened.dtype, device=whitened.device))


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """1 - Var(R - V) / Var(R) over valid tokens (pooled over the batch). 0-d tensor.

    1 = perfect critic, 0 = no better than predicting the mean return, < 0 = worse than that.
    VC-PPO section 4.1 uses it (with the value loss) to decide when value pretraining has
    converged. Returns NaN when Var(R) is zero up to fp32 round-off (e.g. all rewards equal, so
    every Monte-Carlo return is the same number): explained variance is undefined there, and a
    ratio of two round-off residues (seen: -7e8) would be a misleading number.
    """
    valid = _valid(mask).expand_as(values)
    var_returns = masked_var(returns.float(), valid)
    var_residual = masked_var((returns - values).float(), valid)
    scale = masked_mean(returns.float().square(), valid)
    if var_returns <= 1e-10 * (scale + 1e-30):  # relative to the returns' magnitude: fp32 round-off
        return torch.tensor(float("nan"), device=values.device)
    return 1.0 - var_residual / var_returns


class PositionProfile(NamedTuple):
    """Mean advantage per position bucket; bucket i covers positions [edges[i], edges[i+1])."""

    edges: torch.Tensor   # (num_buckets + 1,) int64 positions
    means: torch.Tensor   # (num_buckets,) float32; NaN for an empty bucket
    counts: torch.Tensor  # (num_buckets,) int64 number of valid tokens in the bucket


def advantage_position_profile(
    advantages: torch.Tensor, mask: torch.Tensor, num_buckets: int = 16
) -> PositionProfile:
    """Mean advantage as a function of token position: the diagnostic of VC-PPO Figure 2.

    Args:
        advantages: (B, T).
        mask:       (B, T).
        num_buckets: absolute positions 0..T-1 are split into this many equal-width buckets
                     (fewer when T < num_buckets).

    Returns:
        PositionProfile(edges, means, counts) pooled over the batch.

    Why: a critic initialised from a reward model under-values early tokens, so GAE gives early
    tokens a positive advantage bias (VC-PPO section 3.1); the profile then slopes downward.
    """
    B, T = advantages.shape
    num_buckets = max(1, min(num_buckets, T))
    edges = torch.div(torch.arange(num_buckets + 1) * T, num_buckets, rounding_mode="floor")
    positions = torch.arange(T, device=advantages.device)
    bucket_of_position = torch.bucketize(positions, edges[1:-1].to(advantages.device), right=True)
    valid = _valid(mask)
    bucket = bucket_of_position.expand(B, T)[valid]
    adv = advantages.float()[valid]
    sums = torch.zeros(num_buckets, device=adv.device).index_add_(0, bucket, adv)
    counts = torch.zeros(num_buckets, dtype=torch.long, device=adv.device).index_add_(
        0, bucket, torch.ones_like(bucket)
    )
    return PositionProfile(edges=edges, means=sums / counts, counts=counts)


def advantage_position_correlation(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Pearson correlation between token position t and advantage over valid tokens. 0-d tensor.

    Sign: the collapse signature of VC-PPO (section 3.1, Figure 2) is early tokens with inflated
    advantages, i.e. advantage DEcreasing with position -> a NEGATIVE correlation. A well-
    calibrated critic gives a correlation near 0. NaN when positions or advantages are constant
    (e.g. fewer than 2 valid tokens).
    """
    B, T = advantages.shape
    valid = _valid(mask)
    positions = torch.arange(T, device=advantages.device, dtype=torch.float64).expand(B, T)[valid]
    adv = advantages.double()[valid]
    positions = positions - positions.mean()
    adv = adv - adv.mean()
    denominator = torch.sqrt((positions**2).sum() * (adv**2).sum())
    return ((positions * adv).sum() / denominator).float()


def grpo_advantages(
    scores: torch.Tensor,
    group_ids: Optional[torch.Tensor] = None,
    n_samples: Optional[int] = None,
    eps: float = 1e-6,
    scale_by_std: bool = True,
) -> torch.Tensor:
    """Group-normalised per-sequence advantages (GRPO, DeepSeekMath arXiv 2402.03300 sec. 4.1.2).

    Args:
        scores:       (B,) outcome reward per sequence.
        group_ids:    (B,) int, the prompt each sample belongs to; or
        n_samples:    samples per prompt, consecutive in the batch (B % n_samples == 0).
        eps:          added to the group std.
        scale_by_std: False gives (score - group mean) only (Dr. GRPO, arXiv 2503.20783).

    Returns:
        (B,) float32: (s_i - mean_g) / (std_g + eps), std unbiased. A group of size 1 has no
        baseline information and gets advantage 0. Broadcast over tokens with adv[:, None] * mask.
    """
    scores = scores.float()
    if group_ids is None:
        if n_samples is None or scores.numel() % n_samples:
            raise ValueError("pass group_ids, or n_samples dividing the batch size")
        group_ids = torch.arange(scores.numel(), device=scores.device) // n_samples
    _, group = torch.unique(group_ids, return_inverse=True)
    n_groups = int(group.max()) + 1 if group.numel() else 0
    count = torch.zeros(n_groups, device=scores.device).index_add_(0, group, torch.ones_like(scores))
    mean = torch.zeros(n_groups, device=scores.device).index_add_(0, group, scores) / count
    centred = scores - mean[group]
    if not scale_by_std:
        return torch.where(count[group] > 1, centred, torch.zeros_like(centred))
    sq = torch.zeros(n_groups, device=scores.device).index_add_(0, group, centred**2)
    std = torch.sqrt(sq / (count - 1).clamp(min=1))
    advantages = centred / (std[group] + eps)
    return torch.where(count[group] > 1, advantages, torch.zeros_like(advantages))


ArrayLike = Union[int, Sequence[int], np.ndarray]


def pass_at_k(n: ArrayLike, c: ArrayLike, k: ArrayLike) -> Union[float, np.ndarray]:
    """Unbiased pass@k = 1 - C(n - c, k) / C(n, k) (Chen et al. 2021, arXiv 2107.03374, sec. 2.1).

    Args (scalars or broadcastable arrays of ints):
        n: samples drawn per problem; c: correct samples among them; k: budget, 1 <= k <= n.

    Returns:
        float for scalar inputs, else an array of the broadcast shape.

    Numerically stable product form: C(n-c, k) / C(n, k) = prod_{j=0}^{c-1} (1 - k / (n - j));
    it is exactly 1 - 1 = 0 when c = 0, and pass@k = 1 when n - c < k (every k-subset
    contains a correct sample). No factorials, so large n does not overflow.
    """
    n_arr, c_arr, k_arr = np.broadcast_arrays(
        np.asarray(n, dtype=np.int64), np.asarray(c, dtype=np.int64), np.asarray(k, dtype=np.int64)
    )
    if np.any(c_arr < 0) or np.any(c_arr > n_arr) or np.any(k_arr < 1) or np.any(k_arr > n_arr):
        raise ValueError("need 0 <= c <= n and 1 <= k <= n")
    max_c = int(c_arr.max()) if c_arr.size else 0
    j = np.arange(max_c, dtype=np.float64)                       # (max_c,)
    n_f, c_f, k_f = (a[..., None].astype(np.float64) for a in (n_arr, c_arr, k_arr))
    # Denominators n - j stay >= n - c + 1 >= 1 for the used j < c; unused entries become 1.
    terms = np.where(j < c_f, 1.0 - k_f / np.maximum(n_f - j, 1.0), 1.0)
    result = 1.0 - np.prod(terms, axis=-1)
    result = np.where(n_arr - c_arr < k_arr, 1.0, result)
    return float(result) if result.ndim == 0 else result


def turn_index(mask: torch.Tensor) -> torch.Tensor:
    """(B, T) policy mask with holes -> (B, T) long: each masked-in token's turn (0-based: a turn is
    a maximal run of 1s), -1 elsewhere. One run per row (a single-turn response) is turn 0."""
    m = mask > 0
    starts = m & ~torch.nn.functional.pad(m[:, :-1], (1, 0), value=False)
    return torch.where(m, starts.long().cumsum(1) - 1, torch.full_like(starts, -1, dtype=torch.long))


def per_turn_means(x: torch.Tensor, mask: torch.Tensor, max_turns: int) -> list[float | None]:
    """(B, T) x, (B, T) policy mask -> the mean of x over the model tokens of turn k, k = 0 ..
    max_turns - 1, over every episode (None where no episode has that turn)."""
    turns = turn_index(mask)
    out: list[float | None] = []
    for k in range(max_turns):
        sel = turns == k
        out.append(float(x[sel].float().mean()) if bool(sel.any()) else None)
    return out
