"""`vcppo bench gae`: time the fused Decoupled-GAE against the reference loop and a copy floor.

    vcppo bench gae [--shapes 256x1024,1024x4096,512x16384] [--repeats 5] [--threads N]
                    [--json PATH] [--ref-repeats N] [--holes] [--triton-chunks 256,512,1024]

What is timed, per (B, T) with random response lengths (right padding):
  * ref x2   — two `gae_reference` loops (actor lambda + critic lambda): what the anchors do
               (one Python loop over T per lambda; verl, OpenRLHF, TRL). Timed like the fused
               calls: one warm-up, then `--repeats` runs (`--ref-repeats` lowers it for a quick
               look at large shapes; the JSON records the runs of each figure).
  * torch / triton — one `decoupled_gae(impl=...)` call producing both outputs, per
               implementation available on the device: torch (the blocked GEMM scan) always;
               triton (the chunked associative-scan kernel, grid rows x chunks of T; the row
               records its chunk length) on CUDA when installed. "fused" = the one
               `impl="auto"` picks there (`vcppo.algos.gae.auto_impl`); a row where another
               implementation was faster is flagged (`auto_is_fastest`, and a WARNING line).
  * floor    — moving the same bytes: read 3 and write 2 fp32 (B, T) arrays with one
               elementwise op each, into preallocated outputs: the memory-bandwidth floor for a
               kernel that reads rewards, values, mask once and writes advantages and returns.
Each figure is the median of `--repeats` runs after one warm-up (min is also recorded); the
warm-up also absorbs Triton's one-off compile.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Callable

import torch

from vcppo.algos.gae import auto_impl, decoupled_gae, gae_reference, triton_available
from vcppo.tracking import machine_info

DEFAULT_SHAPES = "256x1024,1024x4096,512x16384"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time(fn: Callable[[], object], repeats: int, device: torch.device, warmup: int = 1) -> dict:
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append((time.perf_counter() - start) * 1e3)
    return {"median_ms": statistics.median(times), "min_ms": min(times), "runs": len(times)}


def _make_batch(B: int, T: int, device: torch.device, holes: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    if holes:  # a tool-output span inside every response (interior masked positions)
        start = (lengths // 3)[:, None]
        span = torch.arange(T)[None, :] - start
        mask &= ~((span >= 0) & (span < 16))
    rewards = torch.zeros(B, T)
    rewards[torch.arange(B), lengths - 1] = torch.randint(0, 2, (B,), generator=g).float() * 2 - 1
    values = torch.randn(B, T, generator=g) * 0.1
    return rewards.to(device), values.to(device), mask.to(device)


def bench_gae(B: int, T: int, repeats: int, ref_repeats: int, device: torch.device, holes: bool,
              triton_chunks: tuple[int, ...] = ()) -> dict:
    rewards, values, mask = _make_batch(B, T, device, holes)
    lam_actor, lam_critic, gamma = 0.95, 1.0, 1.0
    row: dict = {"B": B, "T": T, "device": str(device), "interior_holes": holes}

    def reference_pair():
        gae_reference(rewards, values, mask, gamma, lam_actor)
        gae_reference(rewards, values, mask, gamma, lam_critic)

    row["ref_x2"] = _time(reference_pair, ref_repeats, device, warmup=1)
    for impl in _impls(device):
        row["fused_" + impl] = _time(
            lambda impl=impl: decoupled_gae(rewards, values, mask, gamma, lam_actor, lam_critic, impl=impl),
            repeats, device,
        )

    # Memory floor: 3 fp32 (B, T) reads and 2 fp32 (B, T) writes, outputs preallocated.
    mask_f32 = mask.float()
    out_a, out_b = torch.empty_like(rewards), torch.empty_like(rewards)

    def floor():
        torch.add(rewards, values, out=out_a)
        out_b.copy_(mask_f32)

    row["floor"] = _time(floor, max(repeats, 5), device)
    if "triton" in _impls(device):
        row["triton_chunk"] = _triton_chunk(B, T, device)
        if triton_chunks:
            row["triton_chunk_sweep"] = _chunk_sweep(rewards, values, mask, gamma, lam_actor, lam_critic,
                                                     triton_chunks, repeats, device)
    return _summarise(row, device)


def _summarise(row: dict, device: torch.device) -> dict:
    """Speed-ups and floor ratios per implementation; which one `auto` picks, which was fastest."""
    for impl in _impls(device):
        t = row["fused_" + impl]["median_ms"]
        row["fused_" + impl]["speedup_vs_ref_x2"] = row["ref_x2"]["median_ms"] / t
        row["fused_" + impl]["over_floor"] = t / row["floor"]["median_ms"]
    row["fused_impl"] = auto_impl(device)
    row["fastest_impl"] = min(_impls(device), key=lambda impl: row["fused_" + impl]["median_ms"])
    row["auto_is_fastest"] = row["fastest_impl"] == row["fused_impl"]
    fused = row["fused_" + row["fused_impl"]]["median_ms"]
    row["speedup_vs_ref_x2"] = row["ref_x2"]["median_ms"] / fused
    row["fused_over_floor"] = fused / row["floor"]["median_ms"]
    return row


def _chunk_sweep(rewards, values, mask, gamma, lam_actor, lam_critic, chunks, repeats, device) -> dict:
    """The Triton kernel timed at each given chunk length (to tune `chunk_length` on a GPU)."""
    from vcppo.algos.gae_triton import decoupled_gae_triton

    return {str(c): _time(lambda c=c: decoupled_gae_triton(rewards, values, mask, gamma, gamma * lam_actor,
                                                            gamma * lam_critic, chunk=c), repeats, device)
            for c in chunks}


def _triton_chunk(B: int, T: int, device: torch.device) -> dict:
    """The chunk length the Triton kernel picks for (B, T) here, and the chunks per row."""
    from vcppo.algos.gae_triton import chunk_length, num_sms

    chunk = chunk_length(B, T, num_sms(device))
    return {"chunk": chunk, "chunks_per_row": -(-T // chunk)}


def _impls(device: torch.device) -> list[str]:
    """Implementations timed on this device: torch always, plus the Triton kernel on CUDA (its
    CPU interpreter is for tests, not timing)."""
    impls = ["torch"]
    if device.type == "cuda" and triton_available():
        impls.append("triton")
    return impls


def _print_row(row: dict, device: torch.device) -> None:
    """One table line per implementation (+ the chunk sweep), and a WARNING if auto was beaten."""
    B, T = row["B"], row["T"]
    for i, impl in enumerate(_impls(device)):
        fig = row["fused_" + impl]
        name = impl + ("*" if impl == row["fused_impl"] else "")
        ref = f"{row['ref_x2']['median_ms']:>10.1f}" if i == 0 else f"{'':>10}"
        floor = f"{row['floor']['median_ms']:>8.2f}" if i == 0 else f"{'':>8}"
        note = ""
        if impl == "triton":
            note = f"  ({row['triton_chunk']['chunks_per_row']} chunk(s) of {row['triton_chunk']['chunk']})"
        print(f"{f'{B}x{T}' if i == 0 else '':>12} {name:>7} {ref} {fig['median_ms']:>9.2f} "
              f"{fig['speedup_vs_ref_x2']:>7.1f}x {floor} {fig['over_floor']:>10.1f}x{note}", flush=True)
    for chunk, fig in row.get("triton_chunk_sweep", {}).items():
        print(f"{'':>12} {'c=' + chunk:>7} {'':>10} {fig['median_ms']:>9.2f}", flush=True)
    if not row["auto_is_fastest"]:
        print(f"WARNING {B}x{T}: impl='auto' picks {row['fused_impl']}, but {row['fastest_impl']} "
              "was faster here", flush=True)


def _parse_shapes(text: str) -> list[tuple[int, int]]:
    shapes = []
    for item in text.split(","):
        b, t = item.lower().split("x")
        shapes.append((int(b), int(t)))
    return shapes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vcppo bench gae", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default=DEFAULT_SHAPES, help="comma list of BxT")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of fused / floor")
    parser.add_argument("--ref-repeats", type=int, default=None,
                        help="timed runs of the slow loop (default: --repeats, so both medians are alike)")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--holes", action="store_true", help="add an interior masked span per row")
    parser.add_argument("--triton-chunks", default="",
                        help="also time the Triton kernel at these chunk lengths (comma list of powers "
                             "of two; CUDA only)")
    parser.add_argument("--json", default=None, help="write the figures to this file")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if args.ref_repeats is None:
        args.ref_repeats = args.repeats

    rows = []
    print("Decoupled-GAE: 'ref x2' = two reference loops (actor lam + critic lam), as the anchors "
          "do;\none decoupled_gae(impl=...) call per implementation produces both outputs "
          "(* = what impl='auto' picks);\ntorch = blocked GEMM scan, triton = chunked associative-scan "
          "kernel (rows x chunks of T);\n'floor' = read 3 + write 2 fp32 (B, T) arrays into "
          f"preallocated outputs.\nMedians in ms; device={device}, torch threads={torch.get_num_threads()}.")
    header = f"{'B x T':>12} {'impl':>7} {'ref x2':>10} {'fused':>9} {'speedup':>8} {'floor':>8} {'fused/floor':>11}"
    print(header)
    chunks = tuple(int(c) for c in args.triton_chunks.split(",") if c)
    for B, T in _parse_shapes(args.shapes):
        row = bench_gae(B, T, args.repeats, args.ref_repeats, device, args.holes, chunks)
        rows.append(row)
        _print_row(row, device)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"machine": machine_info(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                       "args": vars(args), "results": rows}, f, indent=2)
        print(f"wrote {args.json}")
    return 0
