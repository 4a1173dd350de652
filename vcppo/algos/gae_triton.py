"""Triton kernel for Decoupled-GAE: one read of (rewards, values, mask), one write of (adv, returns).

Notation: see `vcppo.algos.gae` (B sequences, T positions, c = gamma * lam per valid step).

Layout: each program owns BLOCK_B sequences and walks t = T-1 .. 0, carrying per sequence
    next_value    V of the next VALID token (0 after the last one: terminal value),
    running_actor A^{lam_actor} of the next valid token,
    running_critic A^{lam_critic} of the next valid token,
so a masked position (padding or tool output) is skipped without decay, exactly the
compressed-sequence definition of the module docstring of `vcppo.algos.gae`. The sequential
dependence is along T, so the parallelism is across sequences; consecutive t of one row share
cache lines, so the strided column loads are served from L1/L2 after the first touch.

Testing without a GPU: with TRITON_INTERPRET=1 set before `triton` is imported, the same kernel
runs on CPU tensors (slowly); tests/algos/test_gae.py does this in a subprocess.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _decoupled_gae_kernel(
    rewards_ptr, values_ptr, mask_ptr, decay_actor_ptr, decay_critic_ptr,
    advantages_ptr, returns_ptr,
    B, T, stride_r, stride_v, stride_m, stride_out,
    gamma,
    BLOCK_B: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    row_ok = rows < B
    rows64 = rows.to(tl.int64)  # B * T can exceed 2^31 for long-CoT batches
    decay_actor = tl.load(decay_actor_ptr + rows, mask=row_ok, other=0.0)
    decay_critic = tl.load(decay_critic_ptr + rows, mask=row_ok, other=0.0)

    next_value = tl.zeros([BLOCK_B], dtype=tl.float32)
    running_actor = tl.zeros([BLOCK_B], dtype=tl.float32)
    running_critic = tl.zeros([BLOCK_B], dtype=tl.float32)
    for i in range(0, T):
        t = T - 1 - i
        valid = tl.load(mask_ptr + rows64 * stride_m + t, mask=row_ok, other=0) != 0
        r = tl.load(rewards_ptr + rows64 * stride_r + t, mask=row_ok, other=0.0).to(tl.float32)
        v = tl.load(values_ptr + rows64 * stride_v + t, mask=row_ok, other=0.0).to(tl.float32)
        # delta_t = r_t + gamma * V(next valid) - V_t  (GAE, Schulman et al. 2015 eq. 16)
        delta = r + gamma * next_value - v
        actor_t = delta + decay_actor * running_actor
        critic_t = delta + decay_critic * running_critic
        # tl.where, not multiplication: NaN / inf at masked positions must not leak.
        running_actor = tl.where(valid, actor_t, running_actor)
        running_critic = tl.where(valid, critic_t, running_critic)
        next_value = tl.where(valid, v, next_value)
        out_offsets = rows64 * stride_out + t
        tl.store(advantages_ptr + out_offsets, tl.where(valid, actor_t, 0.0), mask=row_ok)
        tl.store(returns_ptr + out_offsets, tl.where(valid, critic_t + v, 0.0), mask=row_ok)


def decoupled_gae_triton(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    decay_actor: torch.Tensor,
    decay_critic: torch.Tensor,
    block_b: int = 32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decoupled-GAE with the Triton kernel; called by `vcppo.algos.gae.decoupled_gae` (impl
    "triton"), which turns each lambda into its per-row decay gamma * lambda.

    Args:
        rewards, values: (B, T) any float dtype (read once, accumulated in fp32).
        mask:            (B, T) bool or 0/1 of any dtype.
        gamma:           discount per valid step.
        decay_actor, decay_critic: (1,) or (B,) fp32 tensors, gamma * lambda per row.
        block_b:         sequences per program (a power of two).

    Returns:
        advantages (B, T) fp32 with lam_actor, returns (B, T) fp32 = A^{lam_critic} + V;
        0 at masked positions.
    """
    B, T = rewards.shape
    device = rewards.device
    # Rows must be unit-stride along T; a bool mask is read as bytes (same storage, no copy).
    rewards = rewards if rewards.stride(-1) == 1 else rewards.contiguous()
    values = values if values.stride(-1) == 1 else values.contiguous()
    mask = mask if mask.stride(-1) == 1 else mask.contiguous()
    if mask.dtype == torch.bool:
        mask = mask.view(torch.uint8)
    advantages = torch.empty(B, T, dtype=torch.float32, device=device)
    returns = torch.empty(B, T, dtype=torch.float32, device=device)
    if B == 0 or T == 0:
        return advantages, returns
    # One decay per row, as the kernel loads it (a scalar lambda is broadcast).
    decay_actor = decay_actor.expand(B).contiguous()
    decay_critic = decay_critic.expand(B).contiguous()
    grid = (triton.cdiv(B, block_b),)
    _decoupled_gae_kernel[grid](
        rewards, values, mask, decay_actor, decay_critic, advantages, returns,
        B, T, rewards.stride(0), values.stride(0), mask.stride(0), advantages.stride(0),
        float(gamma),
        BLOCK_B=block_b,
    )
    return advantages, returns
