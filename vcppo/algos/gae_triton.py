"""Triton kernel for Decoupled-GAE: a chunked associative scan over a (rows x chunks of T) grid.

Notation: see `vcppo.algos.gae` (B sequences, T positions, c = gamma * lam per valid step).

GAE as a composition of affine maps
-----------------------------------
Walking t = T-1 .. 0, the recurrence carries a state s = (A_actor, A_critic, V): the advantages of
the next VALID token under each lambda and that token's value (all 0 after the last one: the
terminal state). Position t maps the state of t+1 to the state of t:

    valid t:   A' = (r_t - V_t) + c * A + gamma * V   (per lambda: delta_t + c * A_{next})
               V' = V_t
    masked t:  identity (no reward, no decay: the compressed sequence of `vcppo.algos.gae`).

Every such map, and every composition of them, has the form (one (P, m, g) per lambda)

    A' = P + m * A + g * V,        V' = e * V + f,        e in {0, 1},

i.e. 8 numbers (P_a, m_a, g_a, P_c, m_c, g_c, e, f); a single valid position is
(r_t - V_t, c, gamma, ..., 0, V_t) and a masked one the identity (0, 1, 0, ..., 1, 0).
Composition is associative, so the recurrence is a scan (Blelloch 1990, section 1.4):

    pass 1 (grid B x n_chunks)  each program composes its chunk into one map;
    carry  (grid B)             a scan over a row's chunk maps gives each chunk its incoming state
                                (the composite of all chunks to its right applied to the terminal
                                state 0: A = P, V = f);
    pass 2 (grid B x n_chunks)  each program re-scans its chunk and applies every suffix map to
                                its incoming state: A_t at each position, written once.

With one chunk per row (T <= chunk) pass 1 and the carry are skipped. Traffic: rewards, values and
mask are read twice (once when one chunk covers T) and advantages, returns written once; no
program walks more than one chunk, so nothing serial grows with T except the carry scan over
n_chunks = ceil(T / chunk) lanes.

The scans are `tl.associative_scan(..., reverse=True)`: a forward scan of the flipped sequence,
so the combine function gets (composite of the positions to the right, current position), under
the CPU interpreter as on hardware (triton's test_scan2d checks a non-commutative recurrence in
both directions the same way).

Testing without a GPU: with TRITON_INTERPRET=1 set before `triton` is imported, the same kernels
run on CPU tensors (slowly); tests/algos/test_gae_triton.py does this in a subprocess.
"""
from __future__ import annotations

from typing import Optional, Union

import torch
import triton
import triton.language as tl

# Chunk length bounds (powers of two), run with chunk / 128 warps: 4 consecutive positions per
# thread, i.e. one 16-byte load per input array when rows are 16-byte aligned. Compiled for sm_90
# (ptxas, no GPU needed), the output kernel takes ~125 registers a thread at 4 positions (~170 at
# 8), so 1024 (8 warps) keeps two programs an SM resident.
MAX_CHUNK = 1024
MIN_CHUNK = 256


@triton.jit
def _compose(pa_r, ma_r, ga_r, pc_r, mc_r, gc_r, e_r, f_r,
             pa_l, ma_l, ga_l, pc_l, mc_l, gc_l, e_l, f_l):
    """L o R: first the map R of the positions to the right, then the map L of the current one."""
    pa = pa_l + ma_l * pa_r + ga_l * f_r
    ga = ma_l * ga_r + ga_l * e_r
    pc = pc_l + mc_l * pc_r + gc_l * f_r
    gc = mc_l * gc_r + gc_l * e_r
    return pa, ma_l * ma_r, ga, pc, mc_l * mc_r, gc, e_l * e_r, e_l * f_r + f_l


@triton.jit
def _chunk_suffix_maps(rewards_ptr, values_ptr, mask_ptr, row, chunk, T,
                       stride_r, stride_v, stride_m, decay_a, decay_c, gamma,
                       CHUNK: tl.constexpr):
    """Load chunk `chunk` of row `row` and scan it from its right end.

    Returns the 8 (CHUNK,) suffix-map components (lane i: positions chunk end .. t = chunk start
    + i composed), then t, the valid flags and the fp32 values (0 at masked positions).
    """
    t = chunk * CHUNK + tl.arange(0, CHUNK)
    in_row = t < T
    row64 = row.to(tl.int64)  # B * T can exceed 2^31 for long-CoT batches
    valid = tl.load(mask_ptr + row64 * stride_m + t, mask=in_row, other=0) != 0
    r = tl.load(rewards_ptr + row64 * stride_r + t, mask=in_row, other=0.0).to(tl.float32)
    v = tl.load(values_ptr + row64 * stride_v + t, mask=in_row, other=0.0).to(tl.float32)
    # tl.where, not multiplication: NaN / inf at masked positions must not leak.
    v = tl.where(valid, v, 0.0)
    p = tl.where(valid, r - v, 0.0)
    one = tl.full([CHUNK], 1.0, tl.float32)
    zero = tl.zeros([CHUNK], dtype=tl.float32)
    ma = tl.where(valid, decay_a, one)
    mc = tl.where(valid, decay_c, one)
    g = tl.where(valid, gamma, zero)
    e = tl.where(valid, zero, one)
    pa, ma, ga, pc, mc, gc, e, f = tl.associative_scan((p, ma, g, p, mc, g, e, v), 0, _compose,
                                                         reverse=True)
    return pa, ma, ga, pc, mc, gc, e, f, t, in_row, valid, v


@triton.jit
def _row_decay(decay, row, PER_ROW: tl.constexpr):
    """c = gamma * lambda of row `row`: decay is a (B,) fp32 pointer when PER_ROW, else a float."""
    if PER_ROW:
        c = tl.load(decay + row)
    else:
        c = decay
    return c


@triton.jit
def _first_lane(x, CHUNK: tl.constexpr):
    """x[0] of a (CHUNK,) tensor, as a scalar."""
    return tl.sum(tl.where(tl.arange(0, CHUNK) == 0, x, 0.0), axis=0)


@triton.jit
def _gae_chunk_summary_kernel(
    rewards_ptr, values_ptr, mask_ptr, decay_actor, decay_critic, summary_ptr,
    T, n_chunks, plane, stride_r, stride_v, stride_m, gamma,
    CHUNK: tl.constexpr, ACTOR_PER_ROW: tl.constexpr, CRITIC_PER_ROW: tl.constexpr,
):
    """Pass 1: summary[k, row, chunk] = component k of the map of the whole chunk."""
    pid = tl.program_id(0)
    row = pid // n_chunks
    chunk = pid % n_chunks
    decay_a = _row_decay(decay_actor, row, ACTOR_PER_ROW)
    decay_c = _row_decay(decay_critic, row, CRITIC_PER_ROW)
    pa, ma, ga, pc, mc, gc, e, f, _t, _in_row, _valid, _v = _chunk_suffix_maps(
        rewards_ptr, values_ptr, mask_ptr, row, chunk, T, stride_r, stride_v, stride_m,
        decay_a, decay_c, gamma, CHUNK)
    # Lane 0 composes the whole chunk.
    out = summary_ptr + row.to(tl.int64) * n_chunks + chunk
    tl.store(out, _first_lane(pa, CHUNK))
    tl.store(out + plane, _first_lane(ma, CHUNK))
    tl.store(out + 2 * plane, _first_lane(ga, CHUNK))
    tl.store(out + 3 * plane, _first_lane(pc, CHUNK))
    tl.store(out + 4 * plane, _first_lane(mc, CHUNK))
    tl.store(out + 5 * plane, _first_lane(gc, CHUNK))
    tl.store(out + 6 * plane, _first_lane(e, CHUNK))
    tl.store(out + 7 * plane, _first_lane(f, CHUNK))


@triton.jit
def _gae_carry_kernel(summary_ptr, carry_ptr, n_chunks, plane, NC: tl.constexpr):
    """Carry: carry[:, row, j] = (A_actor, A_critic, V) entering chunk j from the right."""
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.arange(0, NC)
    ok = chunk < n_chunks
    src = summary_ptr + row * n_chunks + chunk
    # Padding lanes hold the identity map (0, 1, 0, 0, 1, 0, 1, 0).
    pa = tl.load(src, mask=ok, other=0.0)
    ma = tl.load(src + plane, mask=ok, other=1.0)
    ga = tl.load(src + 2 * plane, mask=ok, other=0.0)
    pc = tl.load(src + 3 * plane, mask=ok, other=0.0)
    mc = tl.load(src + 4 * plane, mask=ok, other=1.0)
    gc = tl.load(src + 5 * plane, mask=ok, other=0.0)
    e = tl.load(src + 6 * plane, mask=ok, other=1.0)
    f = tl.load(src + 7 * plane, mask=ok, other=0.0)
    pa, ma, ga, pc, mc, gc, e, f = tl.associative_scan((pa, ma, ga, pc, mc, gc, e, f), 0, _compose,
                                                       reverse=True)
    # Lane j composes chunks n-1 .. j; applied to the terminal state 0 it gives (A = P, V = f),
    # the state entering chunk j - 1. The rightmost chunk enters with the terminal state.
    dest = carry_ptr + row * n_chunks + (chunk - 1)
    has_left = ok & (chunk >= 1)
    tl.store(dest, pa, mask=has_left)
    tl.store(dest + plane, pc, mask=has_left)
    tl.store(dest + 2 * plane, f, mask=has_left)
    last = carry_ptr + row * n_chunks + (n_chunks - 1)
    tl.store(last, 0.0)
    tl.store(last + plane, 0.0)
    tl.store(last + 2 * plane, 0.0)


@triton.jit
def _gae_chunk_output_kernel(
    rewards_ptr, values_ptr, mask_ptr, decay_actor, decay_critic, carry_ptr,
    advantages_ptr, returns_ptr,
    T, n_chunks, plane, stride_r, stride_v, stride_m, stride_out, gamma,
    CHUNK: tl.constexpr, ACTOR_PER_ROW: tl.constexpr, CRITIC_PER_ROW: tl.constexpr,
    HAS_CARRY: tl.constexpr,
):
    """Pass 2: A_t = P_t + m_t * A_in + g_t * V_in at every position of the chunk, written once."""
    pid = tl.program_id(0)
    row = pid // n_chunks
    chunk = pid % n_chunks
    decay_a = _row_decay(decay_actor, row, ACTOR_PER_ROW)
    decay_c = _row_decay(decay_critic, row, CRITIC_PER_ROW)
    pa, ma, ga, pc, mc, gc, e, f, t, in_row, valid, v = _chunk_suffix_maps(
        rewards_ptr, values_ptr, mask_ptr, row, chunk, T, stride_r, stride_v, stride_m,
        decay_a, decay_c, gamma, CHUNK)
    if HAS_CARRY:
        src = carry_ptr + row.to(tl.int64) * n_chunks + chunk
        actor_in = tl.load(src)
        critic_in = tl.load(src + plane)
        value_in = tl.load(src + 2 * plane)
        actor = pa + ma * actor_in + ga * value_in
        critic = pc + mc * critic_in + gc * value_in
    else:  # one chunk per row: the incoming state is the terminal state 0
        actor = pa
        critic = pc
    out = row.to(tl.int64) * stride_out + t
    tl.store(advantages_ptr + out, tl.where(valid, actor, 0.0), mask=in_row)
    tl.store(returns_ptr + out, tl.where(valid, critic + v, 0.0), mask=in_row)


def chunk_length(B: int, T: int, sms: int) -> int:
    """Positions per program: the power of two covering T, at most MAX_CHUNK, halved (down to
    MIN_CHUNK) while the B x n_chunks grid would leave fewer than 2 programs per SM (sms of them).

    One chunk per row saves pass 1 (inputs read once); more chunks give idle SMs work. Not tuned
    on hardware: `decoupled_gae_triton(chunk=...)` overrides it.
    """
    chunk = min(MAX_CHUNK, max(MIN_CHUNK, triton.next_power_of_2(max(T, 1))))
    while chunk > MIN_CHUNK and B * triton.cdiv(T, chunk) < 2 * sms:
        chunk //= 2
    return chunk


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device; 1 elsewhere (the CPU interpreter)."""
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count


def _row_major(x: torch.Tensor) -> torch.Tensor:
    """x with unit stride along T (no copy when it already has it); a bool mask read as bytes."""
    x = x if x.stride(-1) == 1 else x.contiguous()
    return x.view(torch.uint8) if x.dtype == torch.bool else x


def decoupled_gae_triton(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    decay_actor: Union[float, torch.Tensor],
    decay_critic: Union[float, torch.Tensor],
    chunk: Optional[int] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decoupled-GAE with the chunked-scan kernels; called by `vcppo.algos.gae.decoupled_gae`
    (impl "triton"), which turns each lambda into its decay c = gamma * lambda.

    Args:
        rewards, values: (B, T) any float dtype (read as fp32).
        mask:            (B, T) bool or 0/1 of any dtype.
        gamma:           discount per valid step.
        decay_actor, decay_critic: c for the whole batch (a float, passed to the kernels as an
                         fp32 argument) or per row (a (B,) fp32 tensor on the inputs' device).
        chunk:           positions per program, a power of two; None = `chunk_length`.

    Returns:
        advantages (B, T) fp32 with lam_actor, returns (B, T) fp32 = A^{lam_critic} + V;
        0 at masked positions.
    """
    B, T = rewards.shape
    device = rewards.device
    rewards, values, mask = _row_major(rewards), _row_major(values), _row_major(mask)
    advantages = torch.empty(B, T, dtype=torch.float32, device=device)
    returns = torch.empty(B, T, dtype=torch.float32, device=device)
    if B == 0 or T == 0:
        return advantages, returns
    chunk = chunk or chunk_length(B, T, num_sms(device))
    if chunk & (chunk - 1):
        raise ValueError(f"chunk must be a power of two, got {chunk}")
    n_chunks = triton.cdiv(T, chunk)
    plane = B * n_chunks
    per_row = [isinstance(d, torch.Tensor) for d in (decay_actor, decay_critic)]
    if any(p and d.shape != (B,) for d, p in zip((decay_actor, decay_critic), per_row)):
        raise ValueError(f"a per-row decay must have shape ({B},)")
    decays = [d.contiguous() if p else float(d) for d, p in zip((decay_actor, decay_critic), per_row)]
    common = dict(CHUNK=chunk, ACTOR_PER_ROW=per_row[0], CRITIC_PER_ROW=per_row[1],
                  num_warps=max(1, min(16, chunk // 128)))
    strides = (rewards.stride(0), values.stride(0), mask.stride(0))
    carry = advantages  # not read when one chunk covers T
    if n_chunks > 1:
        summary = torch.empty(8, B, n_chunks, dtype=torch.float32, device=device)
        carry = torch.empty(3, B, n_chunks, dtype=torch.float32, device=device)
        _gae_chunk_summary_kernel[(plane,)](rewards, values, mask, *decays, summary, T, n_chunks,
                                            plane, *strides, float(gamma), **common)
        nc = triton.next_power_of_2(n_chunks)
        _gae_carry_kernel[(B,)](summary, carry, n_chunks, plane, NC=nc,
                                num_warps=max(1, min(8, nc // 128)))
    _gae_chunk_output_kernel[(plane,)](rewards, values, mask, *decays, carry, advantages, returns,
                                       T, n_chunks, plane, *strides, advantages.stride(0),
                                       float(gamma), HAS_CARRY=n_chunks > 1, **common)
    return advantages, returns
