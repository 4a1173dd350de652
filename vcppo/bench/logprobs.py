"""`vcppo bench logprobs`: the actor's full-logits path against the chunked logprob path.

    vcppo bench logprobs [--size qwen2.5-0.5b-shape] [--shapes 1x512+4096,8x128+384]
                         [--chunks 0,1024] [--phases forward,train_step] [--checkpointing] [--entropy]
                         [--rounds 2] [--repeats 1] [--threads 2] [--json PATH]
    vcppo bench logprobs --head-only 4096 [--chunks 0,256,1024,4096] [--rounds 3]

A shape ``NxP+R`` is N sequences of P prompt and R response tokens, one packed micro-batch (the
per-micro-batch peak is what a longer batch of the same micro-batches reaches too). Chunk 0 is the
full-logits path (``actor.logprob_chunk_size=0``): every response position's fp32 logits and
log-softmax at once; any other value is the chunked path with that many positions per chunk.

Each (shape, chunk) runs in a fresh process through the real
:class:`~vcppo.engines.actor.ActorEngine` (DeepSpeed, one rank, fp32 on CPU), and the chunk
settings alternate ``--rounds`` times (A B A B) so drift in a shared machine's load hits all alike:
  * forward     — ``forward_logprobs`` (old logprobs / reference pass; ``--entropy``: with entropies)
  * train step  — one ``train_step`` with the PPO policy loss (forward + backward + AdamW)
Each phase runs once untimed first on a 1 x (8 + 8) batch (first-call allocations, AdamW's states
among them, stay outside the figures), then ``--repeats`` timed calls on the shape. Figures: real
tokens / s (median) and the peak resident memory above the level before the timed calls (sampled
every 2 ms, with the resident set made to track the live tensors: :func:`resident_is_live`): the
phase's activations and transient buffers, the weights and AdamW's states left out; the gradients,
which each backward creates, are in. The train step's peak is also given per segment
(:func:`train_segments`: forward, backward, optimizer). Ratios are against the first ``--chunks``
entry.

``--head-only TOKENS`` times the logprob function alone (:func:`head_only`), what the chunk size trades.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

import torch

from vcppo.bench import write_json
from vcppo.bench.train import PeakRSS, resident_is_live, spawn_worker, train_segments


def _parse(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="vcppo bench logprobs", description=__doc__.split("\n")[0])
    ap.add_argument("--size", default="qwen2.5-0.5b-shape", help="model size (vcppo.models.factory.SIZES)")
    ap.add_argument("--model", default=None, help="an existing local model dir instead of --size")
    ap.add_argument("--shapes", default="1x512+4096,8x128+384", help="NxP+R micro-batches, comma-separated")
    ap.add_argument("--chunks", default="0,1024", help="logprob_chunk_size values; the first is the baseline")
    ap.add_argument("--phases", default="forward,train_step")
    ap.add_argument("--checkpointing", action="store_true", help="gradient checkpointing in the train step")
    ap.add_argument("--entropy", action="store_true", help="the forward also returns entropies")
    ap.add_argument("--rounds", type=int, default=2, help="processes per (shape, chunk), alternated")
    ap.add_argument("--repeats", type=int, default=1, help="timed calls per phase and process")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--head-only", type=int, default=0, metavar="TOKENS",
                    help="time the LM head's logprob function alone on TOKENS positions, per --chunks value")
    ap.add_argument("--json", default=None)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # "MODEL_DIR|SHAPE|CHUNK|OUT_JSON"
    return ap.parse_args(argv)


def parse_shape(shape: str) -> tuple[int, int, int]:
    """``"8x128+384"`` -> (8, 128, 384)."""
    try:
        n, rest = shape.split("x")
        p, r = rest.split("+")
        return int(n), int(p), int(r)
    except ValueError:
        raise SystemExit(f"--shapes: {shape!r} is not NxP+R (e.g. 1x512+4096)") from None


def _batch(n: int, p: int, r: int, vocab: int):
    from vcppo.experience import ActorBatch, Rollout, make_layout
    g = torch.Generator().manual_seed(0)
    layout = make_layout([torch.randint(5, vocab, (p,), generator=g).tolist() for _ in range(n)],
                         [torch.randint(5, vocab, (r,), generator=g).tolist() for _ in range(n)], pad_id=0)
    b = Rollout.unscored(layout)
    return ActorBatch(**{**vars(b), "correct": torch.ones(n)},
                      advantages=torch.randn(b.policy_mask.shape, generator=g) * b.policy_mask)


def _phase(warm_up, fn, repeats: int, segments=None) -> dict:
    import time
    warm_up()  # untimed, on a tiny batch: first-call allocations (AdamW's states) stay out of the figures
    times = []
    with PeakRSS() as mem:
        restore = segments(mem) if segments else None
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        if restore:
            restore()
    out = {"s": times, "peak_mib": mem.mib}
    if segments:
        out["segments_mib"] = dict(mem.segments)
    return out


def run_one(model_dir: str, shape: str, chunk: int, args) -> dict:
    """One (shape, chunk) in this process (the --worker side)."""
    from vcppo.driver.step.update import PolicyLoss
    from vcppo.runtime import dist
    from vcppo.engines.actor import ActorEngine
    from vcppo.config.schema import ActorConfig, AlgorithmConfig

    torch.set_num_threads(args.threads)
    resident_is_live()
    info = dist.init_distributed("cpu")
    n, p, r = parse_shape(shape)
    cfg = ActorConfig(lr=1e-6, micro_batch_size=n, packed=True, logprob_chunk_size=chunk,
                      gradient_checkpointing=args.checkpointing)
    actor = ActorEngine(model_dir, cfg, info, total_optimizer_steps=10 * (args.repeats + 1))
    vocab = min(1000, actor.module.config.vocab_size)
    batch, tiny = _batch(n, p, r, vocab), _batch(1, 8, 8, vocab)
    out = {"shape": shape, "chunk": chunk, "real_tokens": n * (p + r), "response_tokens": n * r}
    phases = args.phases.split(",")
    if "forward" in phases:
        out["forward"] = _phase(lambda: actor.forward_logprobs(tiny, with_entropy=args.entropy),
                                lambda: actor.forward_logprobs(batch, with_entropy=args.entropy), args.repeats)
    if "train_step" in phases:
        batch.old_logprobs, _ = actor.forward_logprobs(batch)
        tiny.old_logprobs, _ = actor.forward_logprobs(tiny)
        loss = PolicyLoss(AlgorithmConfig())
        out["train_step"] = _phase(lambda: actor.train_step(tiny, loss), lambda: actor.train_step(batch, loss),
                                   args.repeats, lambda mem: train_segments(actor, mem))
    dist.shutdown()
    return out


def _spawn(model_dir: str, shape: str, chunk: int, argv: list[str], threads: int) -> dict:
    return spawn_worker("vcppo.bench.logprobs", argv, [model_dir, shape, str(chunk)], "|", threads)


def merge(runs: list[dict], phases: list[str]) -> dict:
    """One setting's processes: tokens/s from the median of every timed call, the highest peak."""
    out = {k: v for k, v in runs[0].items() if k not in phases}
    for ph in phases:
        times = [t for r in runs for t in r[ph]["s"]]
        out[ph] = {"tokens_per_s": out["real_tokens"] / statistics.median(times), "s": times,
                   "peak_mib": max(r[ph]["peak_mib"] for r in runs)}
        segments = [r[ph]["segments_mib"] for r in runs if "segments_mib" in r[ph]]
        if segments:
            out[ph]["segments_mib"] = {k: max(s[k] for s in segments) for k in segments[0]}
    return out


def _print(label: str, rows: dict, phases: list[str], base: int) -> None:
    print(f"\n{label}; ratios against chunk {base}")
    print(f"  {'phase':<11}{'chunk':>7}{'tok/s':>9}{'speed':>8}{'peak MiB':>10}{'memory':>8}")
    for ph in phases:
        b = rows[base][ph]
        for chunk, row in rows.items():
            r = row[ph]
            print(f"  {ph:<11}{chunk:>7}{r['tokens_per_s']:>9.1f}{r['tokens_per_s'] / b['tokens_per_s']:>7.2f}x"
                  f"{r['peak_mib']:>10.0f}{b['peak_mib'] / max(r['peak_mib'], 1e-9):>7.2f}x")
            for name, mib in r.get("segments_mib", {}).items():
                print(f"    {name:<16}{mib:>24.0f}{b['segments_mib'][name] / max(mib, 1e-9):>7.2f}x")


def head_only(args) -> dict:
    """The logprob function alone (``--head-only TOKENS``): hidden states (TOKENS, H) and the head
    (V, H) of ``--size`` in fp32, forward (no grad) and forward + backward (``--entropy``: the entropy
    too, carrying a gradient as an entropy bonus does), per chunk size, the sizes alternated
    ``--rounds`` times in this process."""
    import time

    from vcppo.algos.logprobs import token_logprobs
    from vcppo.models.factory import SIZES

    torch.set_num_threads(args.threads)
    resident_is_live()
    size = SIZES[args.size]
    hidden_size, vocab = size.hidden_size, size.vocab_size or 128
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(args.head_only, hidden_size, generator=g)
    weight = torch.randn(vocab, hidden_size, generator=g) * 0.02
    targets = torch.randint(0, vocab, (args.head_only,), generator=g)

    def forward(chunk):
        with torch.no_grad():
            token_logprobs(hidden, weight, targets, chunk_size=chunk, with_entropy=args.entropy)

    def backward(chunk):
        h, w = hidden.detach().requires_grad_(True), weight.detach().requires_grad_(True)  # views, no copies
        logp, ent = token_logprobs(h, w, targets, chunk_size=chunk, with_entropy=args.entropy)
        (logp.sum() + (ent.sum() if ent is not None else 0.0)).backward()

    chunks = [int(c) for c in args.chunks.split(",")]
    runs = {c: {"forward": [], "train_step": [], "forward_mib": 0.0, "train_step_mib": 0.0} for c in chunks}
    for _ in range(args.rounds):
        for c in chunks:
            for phase, fn in (("forward", forward), ("train_step", backward)):
                with PeakRSS() as mem:
                    t0 = time.perf_counter()
                    fn(c)
                    runs[c][phase].append(time.perf_counter() - t0)
                runs[c][phase + "_mib"] = max(runs[c][phase + "_mib"], mem.mib)
    rows = {c: {ph: {"tokens_per_s": args.head_only / statistics.median(r[ph]), "s": r[ph],
                     "peak_mib": r[ph + "_mib"]} for ph in ("forward", "train_step")} for c, r in runs.items()}
    _print(f"head only: {args.head_only} positions x {vocab} vocab x {hidden_size} hidden", rows,
           ["forward", "train_step"], chunks[0])
    return {"config": vars(args), "head_only": {str(c): r for c, r in rows.items()}}


def main(argv=None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parse(argv)
    if args.head_only:
        results = head_only(args)
        write_json(args.json, results)
        return results
    if args.worker:
        model_dir, shape, chunk, out = args.worker.split("|")
        with open(out, "w") as f:
            json.dump(run_one(model_dir, shape, int(chunk), args), f)
        return {}
    shapes = args.shapes.split(",")
    for s in shapes:
        parse_shape(s)
    chunks = [int(c) for c in args.chunks.split(",")]
    phases = args.phases.split(",")
    results = {"config": {k: v for k, v in vars(args).items() if k not in ("worker", "json")}, "shapes": {}}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model
        if model_dir is None:
            from vcppo.models.factory import make_model
            model_dir = os.path.join(tmp, args.size)
            longest = max(sum(parse_shape(s)[1:]) for s in shapes)
            make_model(args.size, None, model_dir, max_position_embeddings=max(longest + 64, 4096))
        for shape in shapes:
            runs = {c: [] for c in chunks}
            for _ in range(args.rounds):  # A B A B
                for c in chunks:
                    runs[c].append(_spawn(model_dir, shape, c, argv, args.threads))
            rows = {c: merge(r, phases) for c, r in runs.items()}
            _print(f"{shape} (sequences x (prompt + response))", rows, phases, chunks[0])
            results["shapes"][shape] = {str(c): row for c, row in rows.items()}
    write_json(args.json, results)
    return results


if __name__ == "__main__":
    main()
