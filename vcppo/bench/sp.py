"""`vcppo bench sp`: the actor's train step on one long sequence per rank, with and without sequence
parallelism (``actor.sequence_parallel_size``): peak memory per rank and tokens/s.

    vcppo bench sp [--sizes 1,2] [--layers 24] [--tokens 8192] [--prompt 256] [--chunk 1024]
                   [--dtype float32] [--lora 0] [--checkpointing] [--threads 2] [--json PATH]

Each SP size in ``--sizes`` runs as its own launch of that many CPU ranks (torchrun, gloo), one SP
group, ``--threads`` OpenMP threads shared among its ranks (so every size uses the same cores). Every
rank holds one sequence of ``--tokens`` tokens (``--prompt`` of them prompt); with SP the group runs
the union of its ranks' sequences one per pass, each rank a 1/SP slice of it: the same tokens per
rank per step as without SP, in SP times as many passes of 1/SP the size. The model: the
``qwen2.5-0.5b-shape`` size (:mod:`vcppo.models.factory`: hidden 896, 14 heads over 2 KV heads, MLP
4864, vocabulary 151,936, tied head) with ``--layers`` layers, random weights, ZeRO-3. The loss is
:class:`~vcppo.engines.loss_contract.ResponseNLL`.

Memory is each rank's resident set, made to track the live tensors (:func:`resident_is_live`) and
sampled every 2 ms: ``peak_rss`` over the step, and ``step_rss`` = that peak minus the resident set
just before the step: what the step adds (activations, gathered layers, the gradients it creates,
transient buffers). One step on a short sequence runs first, so the optimizer's lazily created
states are in the level before. ``segments`` splits ``step_rss`` into the forward, the backward and
the optimizer step (:func:`~vcppo.bench.train.train_segments`). Ratios are against the first size.

``--lora R`` trains rank-R adapters on every linear layer (the weights, the LM head and the embedding
frozen): the activations are full fine-tuning's (plus the adapters' small ones), without the weight
gradients and AdamW states, so a long sequence's activations fit a small host.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

from vcppo.bench import write_json


def _parse(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="vcppo bench sp", description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1,2", help="SP sizes, one launch of that many ranks each; the first is the baseline")
    ap.add_argument("--layers", type=int, default=24, help="decoder layers of the 0.5B-shaped model")
    ap.add_argument("--tokens", type=int, default=8192, help="tokens of each rank's sequence")
    ap.add_argument("--prompt", type=int, default=256, help="of which prompt")
    ap.add_argument("--chunk", type=int, default=1024, help="actor.logprob_chunk_size")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--lora", type=int, default=0, metavar="R", help="LoRA rank (0: full fine-tuning)")
    ap.add_argument("--checkpointing", action="store_true", help="gradient checkpointing")
    ap.add_argument("--threads", type=int, default=2, help="OpenMP threads per launch, split among its ranks")
    ap.add_argument("--model", default=None, help="model dir (built there when absent; default: a temporary one)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # "SP|MODEL_DIR|OUT_JSON"
    return ap.parse_args(argv)


def run_rank(sp: int, model_dir: str, args) -> list[dict] | None:
    """One rank's step (the --worker side, under torchrun); rank 0 returns every rank's figures."""
    from vcppo.bench.train import PeakRSS, resident_is_live, train_segments
    from vcppo.runtime import collectives, dist
    from vcppo.engines.actor import ActorEngine
    from vcppo.engines.loss_contract import ResponseNLL
    from vcppo.experience import Rollout, make_layout
    from vcppo.config.schema import ActorConfig, LoRAConfig

    resident_is_live()
    info = dist.init_distributed("cpu")
    cfg = ActorConfig(lr=1e-6, micro_batch_size=1, zero_stage=3, sequence_parallel_size=sp,
                      logprob_chunk_size=args.chunk, gradient_checkpointing=args.checkpointing,
                      lora=LoRAConfig(rank=args.lora))
    actor = ActorEngine(model_dir, cfg, info, total_optimizer_steps=10, dtype=args.dtype)
    vocab = actor.module.config.vocab_size
    ids = torch.randint(0, vocab, (args.tokens,), generator=torch.Generator().manual_seed(info.rank)).tolist()
    batch = Rollout.unscored(make_layout([ids[:args.prompt]], [ids[args.prompt:]], pad_id=0))
    warm_up = Rollout.unscored(make_layout([ids[:8]], [ids[8:8 + 8 * sp]], pad_id=0))
    actor.train_step(warm_up, ResponseNLL())  # the optimizer's states, created on the first step, stay outside
    with PeakRSS() as mem:
        restore = train_segments(actor, mem)
        start = time.perf_counter()
        actor.train_step(batch, ResponseNLL())
        seconds = time.perf_counter() - start
        restore()
    mine = dict(rank=info.rank, step_s=seconds, tokens_per_s=args.tokens / seconds, before_gib=mem.base / 2 ** 30,
                peak_rss_gib=mem.peak / 2 ** 30, step_rss_gib=(mem.peak - mem.base) / 2 ** 30,
                segments_gib={k: v / 1024 for k, v in mem.segments.items()})
    per_rank = collectives.all_gather_object(mine)
    dist.shutdown(wait_for_peers=True)
    return per_rank if info.is_main else None


def launch(sp: int, model_dir: str, argv: list[str], threads: int) -> list[dict]:
    """``sp`` ranks under torchrun, ``threads // sp`` OpenMP threads each; every rank's figures."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={sp}",
           "-m", "vcppo.bench.sp", *argv, "--worker", f"{sp}|{model_dir}|{out}"]
    subprocess.run(cmd, check=True, env=dict(os.environ, OMP_NUM_THREADS=str(max(1, threads // sp))))
    with open(out) as f:
        return json.load(f)


def summary(sp: int, ranks: list[dict], tokens: int) -> dict:
    """One launch: the worst rank's memory, the slowest rank's step, the host's tokens/s."""
    step_s = max(r["step_s"] for r in ranks)
    return {"sp": sp, "ranks": ranks, "peak_rss_gib": max(r["peak_rss_gib"] for r in ranks),
            "step_rss_gib": max(r["step_rss_gib"] for r in ranks), "step_s": step_s,
            "tokens_per_s_per_rank": tokens / step_s, "host_tokens_per_s": sp * tokens / step_s,
            "segments_gib": {k: max(r["segments_gib"][k] for r in ranks) for k in ranks[0]["segments_gib"]}}


def _print(rows: list[dict], args) -> None:
    print(f"\nthe 0.5B shape with {args.layers} layers, 1 x {args.tokens} tokens per rank, {args.dtype}, "
          f"{'LoRA r=' + str(args.lora) if args.lora else 'full fine-tuning'}, chunk {args.chunk}"
          f"{', checkpointing' if args.checkpointing else ''}; ratios against SP {rows[0]['sp']}")
    print(f"  {'SP':>3}{'peak GiB/rank':>15}{'ratio':>8}{'step adds':>11}{'ratio':>8}{'fwd':>7}{'bwd':>7}"
          f"{'step s':>8}{'host tok/s':>12}{'ratio':>8}")
    b = rows[0]
    for r in rows:
        seg = r["segments_gib"]
        print(f"  {r['sp']:>3}{r['peak_rss_gib']:>15.2f}{r['peak_rss_gib'] / b['peak_rss_gib']:>7.2f}x"
              f"{r['step_rss_gib']:>11.2f}{r['step_rss_gib'] / b['step_rss_gib']:>7.2f}x{seg['forward']:>7.2f}"
              f"{seg['backward']:>7.2f}{r['step_s']:>8.1f}{r['host_tokens_per_s']:>12.1f}"
              f"{r['host_tokens_per_s'] / b['host_tokens_per_s']:>7.2f}x")


def main(argv=None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parse(argv)
    if args.worker:
        sp, model_dir, out = args.worker.split("|")
        per_rank = run_rank(int(sp), model_dir, args)
        if per_rank is not None:
            with open(out, "w") as f:
                json.dump(per_rank, f)
        return {}
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model or os.path.join(tmp, "model")
        if not os.path.isfile(os.path.join(model_dir, "config.json")):
            from vcppo.models.factory import make_model
            make_model("qwen2.5-0.5b-shape", None, model_dir, layers=args.layers,
                       max_position_embeddings=max(args.tokens + 64, 4096))
        rows = [summary(sp, launch(sp, model_dir, argv, args.threads), args.tokens) for sp in sizes]
    _print(rows, args)
    results = {"config": {k: v for k, v in vars(args).items() if k not in ("worker", "json")}, "sizes": rows}
    write_json(args.json, results)
    return results


if __name__ == "__main__":
    if "--worker" in sys.argv:
        main()
        from vcppo.runtime import dist
        dist.exit_process(0)
    main()
