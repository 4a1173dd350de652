"""`vcppo bench train`: padded vs packed (padding-free) training passes on a long-tailed batch.

    vcppo bench train [--models small,medium] [--batch 8] [--min-len 32] [--max-len 2048]
                      [--micro-batch 4] [--budget 4096] [--repeats 2] [--threads 2] [--lora-ranks 8,64]
                      [--json PATH]

The batch: ``--batch`` sequences with prompts of 16-48 tokens and long-tailed response lengths
(``min + (max - min) * u**3``, u uniform: most responses short, a few near ``--max-len``), the
shape of a long-CoT step, so most of the padded (B, P + R) layout is padding (printed).

Per model and layout, in a fresh process each (so peak memory is that layout's own), through the
real :class:`~vcppo.engines.actor.ActorEngine` (DeepSpeed, one rank, fp32):
  * forward     — ``forward_logprobs`` of the whole batch (old logprobs / reference pass)
  * train step  — one ``train_step`` with the PPO policy loss (forward + backward + AdamW)
  * padded      — ``micro_batch_size = --micro-batch`` rows per pass, every row L = P + R wide
  * packed      — sequences concatenated without pads under a ``--budget``-token micro-batch budget
Padded and packed processes alternate ``--rounds`` times (A B A B), so drift in the load of a
shared machine hits both layouts alike.
``--lora-ranks 8,64`` compares LoRA instead (packed layout throughout): full fine-tuning against
adapters of each rank on every linear layer (``actor.lora``), in alternating processes as above;
the train step's memory is then mostly what LoRA saves (gradients and AdamW states of the frozen
weights).
Figures: real tokens / s (median of every timed call after one warm-up per process) and peak resident memory
above the process's memory before the phase (RSS sampled every 2 ms; freed memory is returned to
the OS between phases), and the packed / padded ratios of both.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import torch


def _parse(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="vcppo bench train", description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="small,medium", help="model sizes (vcppo.models.factory.SIZES)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--min-len", type=int, default=32)
    ap.add_argument("--max-len", type=int, default=2048)
    ap.add_argument("--micro-batch", type=int, default=4, help="padded: sequences per micro-batch")
    ap.add_argument("--budget", type=int, default=4096, help="packed: real tokens per micro-batch")
    ap.add_argument("--repeats", type=int, default=2, help="timed calls per phase and process")
    ap.add_argument("--rounds", type=int, default=2, help="padded/packed processes alternated this many times")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lora-ranks", default="", help="compare full fine-tuning with LoRA of these ranks (packed)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # "MODEL_DIR,LAYOUT,OUT_JSON"
    return ap.parse_args(argv)


def long_tailed_batch(n: int, min_len: int, max_len: int, seed: int, vocab: int = 90):
    """An :class:`~vcppo.experience.ActorBatch` of ``n`` sequences with long-tailed response
    lengths, rollout and PPO fields filled as a real step would (old logprobs are set by the caller)."""
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(n, generator=g)
    lengths = (min_len + (max_len - min_len) * u ** 3).long().tolist()
    prompt_lengths = torch.randint(16, 49, (n,), generator=g).tolist()
    return batch_of_lengths(prompt_lengths, lengths, g, vocab)


def batch_of_lengths(prompt_lengths: list[int], response_lengths: list[int], seed_or_generator, vocab: int = 90):
    """An :class:`~vcppo.experience.ActorBatch` of random token ids with these prompt and response
    lengths: advantages (normal at response tokens) and ``correct`` (coin flips) filled as a real
    step's (old logprobs are set by the caller). Also `vcppo plan --measure`'s timed batch."""
    from vcppo.experience import ActorBatch, Rollout, make_layout
    g = seed_or_generator
    if not isinstance(g, torch.Generator):
        g = torch.Generator().manual_seed(int(seed_or_generator))
    prompts = [torch.randint(5, vocab, (int(k),), generator=g).tolist() for k in prompt_lengths]
    responses = [torch.randint(5, vocab, (int(k),), generator=g).tolist() for k in response_lengths]
    b = Rollout.unscored(make_layout(prompts, responses, pad_id=0))
    advantages = torch.randn(b.policy_mask.shape, generator=g) * b.policy_mask
    correct = (torch.rand(len(prompts), generator=g) > 0.5).float()
    return ActorBatch(**{**vars(b), "correct": correct}, advantages=advantages)


class PeakRSS:
    """Peak resident memory above the level at entry, sampled every 2 ms in a thread. ``mark(name)``
    ends a segment: ``segments[name]`` is the highest peak above the entry level (MiB) of the
    segments ended under that name."""

    def __init__(self):
        import psutil
        self.proc = psutil.Process()
        self.segments: dict[str, float] = {}

    def __enter__(self):
        _release_freed_memory()
        self.base = self.peak = self.segment_peak = self.proc.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._stop.is_set():
            rss = self.proc.memory_info().rss
            self.peak, self.segment_peak = max(self.peak, rss), max(self.segment_peak, rss)
            time.sleep(0.002)

    def mark(self, name: str) -> None:
        rss = self.proc.memory_info().rss
        self.peak = max(self.peak, rss)
        peak = (max(self.segment_peak, rss) - self.base) / 2 ** 20
        self.segments[name] = max(self.segments.get(name, peak), peak)
        self.segment_peak = rss

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.proc.memory_info().rss)
        self.mib = (self.peak - self.base) / 2 ** 20


def train_segments(actor, mem):
    """Mark a train step's segments on ``mem`` (:class:`PeakRSS`): ``forward`` (up to each backward),
    ``backward`` (the backward, the gradients it creates included, up to the optimizer step) and
    ``optimizer`` (the step: the gradients and AdamW's temporaries). Returns the un-marker."""
    engine = actor.engine
    backward, step = engine.backward, engine.step

    def marked_backward(*args, **kwargs):
        mem.mark("forward")
        out = backward(*args, **kwargs)
        mem.mark("backward")
        return out

    def marked_step(*args, **kwargs):
        mem.mark("backward")
        out = step(*args, **kwargs)
        mem.mark("optimizer")
        return out

    engine.backward, engine.step = marked_backward, marked_step

    def restore():
        engine.backward, engine.step = backward, step
    return restore


def _release_freed_memory():
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:  # not glibc: the figures then include retained memory
        pass


def resident_is_live() -> None:
    """Make the resident set track the live tensors: glibc then maps every block of 128 KiB or more
    on its own and returns it when freed (its default raises that threshold as blocks are freed, up
    to 32 MiB, so freed activations stay resident and a peak over-counts). For memory figures; it
    costs page faults, paid alike by whatever is compared in one run."""
    try:
        ctypes.CDLL("libc.so.6").mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD
    except OSError:
        pass


def timed(fn, repeats: int) -> list[float]:
    """Seconds of ``repeats`` calls of ``fn`` after one untimed warm-up call."""
    fn()  # warm-up
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def run_layout(model_dir: str, layout: str, args) -> dict:
    """One layout's figures, in this process (the --worker side)."""
    from vcppo.algos import losses  # noqa: F401  (import cost outside the timed region)
    from vcppo.driver.step.update import PolicyLoss
    from vcppo.runtime import dist
    from vcppo.engines.actor import ActorEngine
    from vcppo.config.schema import ActorConfig, AlgorithmConfig, LoRAConfig

    torch.set_num_threads(args.threads)
    info = dist.init_distributed("cpu")
    packed = layout != "padded"  # "padded", "packed", or "lora<rank>" (packed)
    lora = LoRAConfig(rank=int(layout[4:])) if layout.startswith("lora") else LoRAConfig()
    cfg = ActorConfig(lr=1e-6, micro_batch_size=args.micro_batch, packed=packed,
                      max_tokens_per_micro_batch=args.budget if packed else 0, lora=lora)
    actor = ActorEngine(model_dir, cfg, info, total_optimizer_steps=10 * (args.repeats + 1))
    batch = long_tailed_batch(args.batch, args.min_len, args.max_len, args.seed)
    real = float(batch.attention_mask.sum())
    res = {"layout": layout, "real_tokens": real, "padded_tokens": float(batch.attention_mask.numel()),
           "micro_batches": len(actor.micro_batch_rows(batch)),
           "trainable_params": sum(p.numel() for p in actor.module.parameters() if p.requires_grad)}
    with PeakRSS() as mem:
        times = timed(lambda: actor.forward_logprobs(batch), args.repeats)
    res["forward"] = {"tokens_per_s": real / statistics.median(times), "s": times, "peak_mib": mem.mib}
    batch.old_logprobs, _ = actor.forward_logprobs(batch)
    loss = PolicyLoss(AlgorithmConfig())
    with PeakRSS() as mem:
        times = timed(lambda: actor.train_step(batch, loss), args.repeats)
    res["train_step"] = {"tokens_per_s": real / statistics.median(times), "s": times, "peak_mib": mem.mib}
    dist.shutdown()
    return res


def spawn_worker(module: str, argv: list[str], fields: list[str], sep: str, threads: int) -> dict:
    """Run ``python -m module *argv --worker FIELDS+OUT`` in a fresh process (its own peak memory) with
    ``threads`` OpenMP threads; the JSON it wrote to OUT (the last field, joined by ``sep``)."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    cmd = [sys.executable, "-m", module, *argv, "--worker", sep.join([*fields, out])]
    subprocess.run(cmd, check=True, env=env)
    with open(out) as f:
        return json.load(f)


def _spawn(model_dir: str, layout: str, argv: list[str]) -> dict:
    return spawn_worker("vcppo.bench.train", argv, [model_dir, layout], ",", _parse(argv).threads)


def main(argv=None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parse(argv)
    if args.worker:
        model_dir, layout, out = args.worker.split(",")
        with open(out, "w") as f:
            json.dump(run_layout(model_dir, layout, args), f)
        return {}
    from vcppo.models.factory import count_params, make_model
    results = {"config": {k: v for k, v in vars(args).items() if k not in ("worker", "json")}, "models": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.models.split(","):
            model_dir = os.path.join(tmp, size)
            n_params = count_params(make_model(size, None, model_dir, max_position_embeddings=args.max_len + 64))
            lora_ranks = [int(r) for r in args.lora_ranks.split(",") if r.strip()]
            variants = ["packed"] + [f"lora{r}" for r in lora_ranks] if lora_ranks else ["padded", "packed"]
            runs = {v: [] for v in variants}
            for _ in range(args.rounds):  # A B A B: drift in machine load hits every variant alike
                for v in runs:
                    runs[v].append(_spawn(model_dir, v, argv))
            row = {"params": n_params, **{v: _merge_rounds(r) for v, r in runs.items()}}
            if lora_ranks:
                for v in variants[1:]:
                    row[v + "_vs_full"] = _ratios(row["packed"], row[v])
                _print_lora(size, row, variants)
            else:
                row.update(_ratios(row["padded"], row["packed"]))
                _print_row(size, row)
            results["models"][size] = row
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return results


def _ratios(base: dict, other: dict) -> dict:
    """``other`` against ``base``: tokens/s speed-up and peak-memory ratio per phase."""
    out = {}
    for phase in ("forward", "train_step"):
        out[phase + "_speedup"] = other[phase]["tokens_per_s"] / base[phase]["tokens_per_s"]
        out[phase + "_memory_ratio"] = other[phase]["peak_mib"] / max(base[phase]["peak_mib"], 1e-9)
    return out


def _print_lora(size: str, row: dict, variants: list[str]) -> None:
    print(f"\n{size}: {row['params'] / 1e6:.1f}M params | {row['packed']['real_tokens']:.0f} real tokens, packed")
    print(f"  {'variant':<9}{'trainable':>11}{'phase':>12}{'tok/s':>9}{'vs full':>9}{'MiB':>8}{'vs full':>9}")
    for v in variants:
        for phase in ("forward", "train_step"):
            r, ratio = row[v][phase], row.get(v + "_vs_full", {})
            speed = f"{ratio[phase + '_speedup']:.2f}x" if ratio else "1"
            mem = f"{ratio[phase + '_memory_ratio']:.2f}" if ratio else "1"
            print(f"  {v:<9}{row[v]['trainable_params'] / 1e6:>10.2f}M{phase:>12}{r['tokens_per_s']:>9.0f}"
                  f"{speed:>9}{r['peak_mib']:>8.0f}{mem:>9}")


def _merge_rounds(rounds: list[dict]) -> dict:
    """One layout's figures over its processes: median time of every timed call, highest peak."""
    out = dict(rounds[0])
    for phase in ("forward", "train_step"):
        times = [t for r in rounds for t in r[phase]["s"]]
        out[phase] = {"tokens_per_s": out["real_tokens"] / statistics.median(times), "s": times,
                      "peak_mib": max(r[phase]["peak_mib"] for r in rounds)}
    return out


def _print_row(size: str, row: dict) -> None:
    pad = row["padded"]
    print(f"\n{size}: {row['params'] / 1e6:.1f}M params | {pad['real_tokens']:.0f} real tokens in a "
          f"{pad['padded_tokens']:.0f}-token padded layout ({1 - pad['real_tokens'] / pad['padded_tokens']:.0%} "
          f"padding) | micro-batches padded {pad['micro_batches']}, packed {row['packed']['micro_batches']}")
    print(f"  {'phase':<11}{'padded tok/s':>14}{'packed tok/s':>14}{'speedup':>9}"
          f"{'padded MiB':>12}{'packed MiB':>12}{'mem ratio':>11}")
    for phase in ("forward", "train_step"):
        a, b = row["padded"][phase], row["packed"][phase]
        print(f"  {phase:<11}{a['tokens_per_s']:>14.0f}{b['tokens_per_s']:>14.0f}{row[phase + '_speedup']:>8.2f}x"
              f"{a['peak_mib']:>12.0f}{b['peak_mib']:>12.0f}{row[phase + '_memory_ratio']:>11.2f}")


if __name__ == "__main__":
    main()
