"""Numba CPU kernel for Decoupled-GAE: one read of (rewards, values, mask), one write of (adv, returns).

Notation: see `vcppo.algos.gae` (B sequences, T positions, c = gamma * lam per valid step).

The CPU twin of `vcppo.algos.gae_triton`: rows are split across threads (`prange`), and each row
is walked once from t = T-1 down to 0 carrying
    next_value     V of the next VALID token (0 after the last one: terminal value),
    running_actor  A^{lam_actor} of the next valid token,
    running_critic A^{lam_critic} of the next valid token,
so a masked position (padding or tool output) is skipped without decay, exactly the
compressed-sequence definition of `vcppo.algos.gae`; its reward and value are never read and its
outputs are written as 0. Arithmetic is fp32 (fastmath off, so no reassociation): the same
operations in the same order as the Triton kernel.

Latency: the recurrence A = delta + c * A is a dependent multiply-add chain per row (~8 cycles a
step without FMA contraction), which alone would cost more than the memory traffic. The kernel
therefore walks ROWS_PER_STEP rows in lock-step inside one thread, giving the core independent
chains to overlap (measured in docs/performance.md).

Compile cost: the first call in a fresh environment JIT-compiles (a few seconds per mask dtype;
docs/performance.md); `cache=True` stores the machine code in __pycache__ next to this file, so
later processes load it in well under a second. Threads: numba's thread count follows torch's
(`torch.get_num_threads()`), on numba's workqueue threading layer (see below: its OpenMP layer
slowed torch's later sdpa calls ~100x); torch's setting is restored should a layer reset it.
"""
from __future__ import annotations

import os

import numba
import numpy as np
import torch

# Numba's default threading layer on this stack is OpenMP. In a process that had called
# torch.set_num_threads, ONE parallel numba call on it left every later torch sdpa call ~100x
# slower for the rest of the process (measured 2026-12-02 on the 2-core CPU machine: 3 ms ->
# 380 ms; `vcppo bench step` 10 s -> 87 s per step, its updates run right after GAE;
# docs/performance.md). The workqueue layer (numba's own pthreads, idle between calls) leaves
# torch alone. It must be chosen before the first parallel launch; a layer the user picked with
# NUMBA_THREADING_LAYER is kept.
if "NUMBA_THREADING_LAYER" not in os.environ:
    numba.config.THREADING_LAYER = "workqueue"

# Rows advanced together by one thread (independent dependency chains for the out-of-order core).
ROWS_PER_STEP = 4


@numba.njit(inline="always")
def _step(r, v, m, b, t, gamma, decay_a, decay_c, nv, ra, rc, adv, ret):
    """One position of one row; returns the new (next_value, running_actor, running_critic)."""
    if m[b, t] != 0:
        v_t = v[b, t]
        delta = r[b, t] + gamma * nv - v_t       # GAE delta (Schulman et al. 2015, eq. 16)
        ra = delta + decay_a * ra
        rc = delta + decay_c * rc
        adv[b, t] = ra
        ret[b, t] = rc + v_t
        return v_t, ra, rc
    adv[b, t] = 0.0
    ret[b, t] = 0.0
    return nv, ra, rc


@numba.njit(parallel=True, fastmath=False, cache=True, nogil=True)
def _decoupled_gae_kernel(r, v, m, decay_actor, decay_critic, gamma, adv, ret):
    """r, v: (B, T) fp32 C-contiguous; m: (B, T) any numeric dtype, != 0 means valid;
    decay_actor / decay_critic: (B,) fp32 gamma * lam; gamma: fp32; adv, ret: (B, T) fp32 outputs."""
    B, T = r.shape
    n_groups = (B + ROWS_PER_STEP - 1) // ROWS_PER_STEP
    zero = np.float32(0.0)
    for g in numba.prange(n_groups):
        b0 = g * ROWS_PER_STEP
        if b0 + ROWS_PER_STEP <= B:
            # Four rows in lock-step: four independent recurrences per iteration.
            b1, b2, b3 = b0 + 1, b0 + 2, b0 + 3
            da0, dc0 = decay_actor[b0], decay_critic[b0]
            da1, dc1 = decay_actor[b1], decay_critic[b1]
            da2, dc2 = decay_actor[b2], decay_critic[b2]
            da3, dc3 = decay_actor[b3], decay_critic[b3]
            nv0 = ra0 = rc0 = zero
            nv1 = ra1 = rc1 = zero
            nv2 = ra2 = rc2 = zero
            nv3 = ra3 = rc3 = zero
            for i in range(T):
                t = T - 1 - i
                nv0, ra0, rc0 = _step(r, v, m, b0, t, gamma, da0, dc0, nv0, ra0, rc0, adv, ret)
                nv1, ra1, rc1 = _step(r, v, m, b1, t, gamma, da1, dc1, nv1, ra1, rc1, adv, ret)
                nv2, ra2, rc2 = _step(r, v, m, b2, t, gamma, da2, dc2, nv2, ra2, rc2, adv, ret)
                nv3, ra3, rc3 = _step(r, v, m, b3, t, gamma, da3, dc3, nv3, ra3, rc3, adv, ret)
        else:
            for b in range(b0, B):  # the last < ROWS_PER_STEP rows, one at a time
                da, dc = decay_actor[b], decay_critic[b]
                nv = ra = rc = zero
                for i in range(T):
                    nv, ra, rc = _step(r, v, m, b, T - 1 - i, gamma, da, dc, nv, ra, rc, adv, ret)


def _per_row_decay(lam, gamma: float, B: int) -> np.ndarray:
    """gamma * lam as a contiguous (B,) fp32 array (broadcasting a scalar lambda)."""
    if isinstance(lam, torch.Tensor):
        lam_t = lam.detach().to(device="cpu", dtype=torch.float32)
    else:
        lam_t = torch.tensor(float(lam), dtype=torch.float32)
    if lam_t.dim() > 0 and lam_t.shape != (B,):
        raise ValueError(f"per-sequence lambda must have shape ({B},), got {tuple(lam_t.shape)}")
    return (gamma * lam_t).expand(B).contiguous().numpy()


def _as_fp32_array(x: torch.Tensor) -> np.ndarray:
    """A C-contiguous fp32 numpy view of x: no copy for contiguous fp32 input (bf16 / fp16 /
    fp64 / strided inputs cost one conversion pass)."""
    x = x.detach()
    if x.dtype != torch.float32:
        x = x.to(torch.float32)
    return x.contiguous().numpy()


def _as_mask_array(mask: torch.Tensor) -> np.ndarray:
    """A C-contiguous numpy view of the mask, tested as `!= 0` by the kernel. bool is reinterpreted
    as uint8 (same bytes, no copy); other numpy-representable dtypes pass as they are; only dtypes
    numpy lacks (bf16) cost a `!= 0` pass."""
    mask = mask.detach().contiguous()
    if mask.dtype == torch.bool:
        return mask.view(torch.uint8).numpy()
    if mask.dtype in (torch.uint8, torch.int8, torch.int32, torch.int64, torch.float32, torch.float64):
        return mask.numpy()
    return (mask != 0).view(torch.uint8).numpy()


def decoupled_gae_numba(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    lam_actor,
    lam_critic,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decoupled-GAE with the numba kernel; same contract as `vcppo.algos.gae.decoupled_gae`.

    Args:
        rewards, values: (B, T) CPU tensors, any float dtype (non-fp32 is converted to fp32 in one
                         pass first; accumulation is fp32). requires_grad inputs are detached.
        mask:            (B, T) bool or 0/1 of any dtype.
        gamma:           discount per valid step.
        lam_actor, lam_critic: float or (B,) tensor.

    Returns:
        advantages (B, T) fp32 with lam_actor, returns (B, T) fp32 = A^{lam_critic} + V;
        0 at masked positions.
    """
    if rewards.device.type != "cpu":
        raise ValueError(f"the numba kernel needs CPU tensors, got {rewards.device}")
    B, T = rewards.shape
    advantages = torch.empty(B, T, dtype=torch.float32)
    returns = torch.empty(B, T, dtype=torch.float32)
    decay_actor = _per_row_decay(lam_actor, gamma, B)
    decay_critic = _per_row_decay(lam_critic, gamma, B)
    if B == 0 or T == 0:
        return advantages, returns
    # Same thread count as torch's intra-op pool (capped by numba's pool size).
    torch_threads = torch.get_num_threads()
    numba.set_num_threads(max(1, min(torch_threads, numba.config.NUMBA_NUM_THREADS)))
    _decoupled_gae_kernel(
        _as_fp32_array(rewards), _as_fp32_array(values), _as_mask_array(mask),
        decay_actor, decay_critic, np.float32(gamma), advantages.numpy(), returns.numpy(),
    )
    # Numba's OpenMP threading layer shares libgomp with torch, and starting its pool (first
    # call in a process) resets omp_set_num_threads to numba's pool size, silently undoing a
    # torch.set_num_threads(n). Put torch's setting back.
    if torch.get_num_threads() != torch_threads:
        torch.set_num_threads(torch_threads)
    return advantages, returns
