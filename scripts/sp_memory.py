"""Peak memory and time of the actor's train step on long sequences, with and without sequence
parallelism (actor.sequence_parallel_size), on CPU ranks started by a launcher.

Every rank holds one sequence of ``--tokens`` tokens (``--prompt`` of them prompt); a model of
Qwen2.5-0.5B's layer shape (hidden 896, 14 heads over 2 KV heads, MLP 4864, vocabulary 151,936,
tied head) with ``--layers`` layers, random weights, fp32, ZeRO-3. With SP the group runs the
union of its ranks' sequences one per pass, each rank a 1/SP slice of it: the same tokens per rank
per step as without SP, in SP times as many passes of 1/SP the size.

Memory is the process's resident set, sampled every 5 ms on a thread: ``peak_rss`` over the step,
and ``step_rss`` = that peak minus the resident set just before the step (what the step itself
adds: activations, gathered layers, gradients, the optimizer's lazily created states).

    deepspeed --num_gpus 2 scripts/sp_memory.py --sp 2 --out sp2.json     (or torchrun, or by hand)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

import torch


class PeakRSS:
    """The largest resident set seen while the ``with`` block runs (bytes)."""

    def __init__(self, every_s: float = 0.005):
        import psutil
        self.proc, self.every_s, self.peak = psutil.Process(), every_s, 0

    def __enter__(self):
        self.before = self.proc.memory_info().rss
        self.peak, self.running = self.before, True
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()
        return self

    def _watch(self):
        while self.running:
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(self.every_s)

    def __exit__(self, *exc):
        self.running = False
        self.thread.join()
        self.peak = max(self.peak, self.proc.memory_info().rss)


def build_model(path: str, layers: int) -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM
    cfg = Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=layers, num_attention_heads=14,
                      num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768, rope_theta=1e6,
                      tie_word_embeddings=True, initializer_range=0.02)
    torch.manual_seed(0)
    Qwen2ForCausalLM(cfg).save_pretrained(path)


class NLL:
    """Mean negative logprob over the global batch's response tokens (the engine's loss interface)."""
    needs_entropy = False

    @staticmethod
    def count_masks(minibatch):
        from vcppo.engines.loss_contract import response_counts
        return response_counts(minibatch)

    def __call__(self, outputs, micro, counts):
        from vcppo.engines.loss_contract import RESPONSE
        loss = -(outputs.logprobs * micro.response_mask).sum() / counts.tokens[RESPONSE]
        return loss, {}


def main(argv) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--local_rank", type=int, default=None)  # the deepspeed launcher's
    ap.add_argument("--sp", type=int, default=1)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--chunk", type=int, default=1024, help="actor.logprob_chunk_size")
    ap.add_argument("--checkpointing", action="store_true")
    ap.add_argument("--model", default="/tmp/vcppo_sp_memory_model")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    from vcppo.engines import collectives, dist
    from vcppo.engines.actor import ActorEngine
    from vcppo.experience import Rollout, make_layout
    from vcppo.schema import ActorConfig

    info = dist.init_distributed("cpu")
    if info.is_main and not os.path.isfile(os.path.join(args.model, "config.json")):
        build_model(args.model, args.layers)
    collectives.barrier()
    g = torch.Generator().manual_seed(info.rank)
    ids = torch.randint(0, 151936, (args.tokens,), generator=g).tolist()
    batch = Rollout.unscored(make_layout([ids[:args.prompt]], [ids[args.prompt:]], pad_id=0))
    cfg = ActorConfig(lr=1e-6, micro_batch_size=1, zero_stage=3, sequence_parallel_size=args.sp,
                      logprob_chunk_size=args.chunk, gradient_checkpointing=args.checkpointing)
    actor = ActorEngine(args.model, cfg, info, total_optimizer_steps=10)
    with PeakRSS() as mem:
        start = time.perf_counter()
        actor.train_step(batch, NLL())
        seconds = time.perf_counter() - start
    result = dict(sp=args.sp, layers=args.layers, tokens_per_rank=args.tokens, chunk=args.chunk,
                  checkpointing=args.checkpointing, ranks=info.world_size, step_s=seconds,
                  tokens_per_s_per_rank=args.tokens / seconds,
                  before_gib=mem.before / 2 ** 30, peak_rss_gib=mem.peak / 2 ** 30,
                  step_rss_gib=(mem.peak - mem.before) / 2 ** 30)
    per_rank = collectives.all_gather_object(result)
    if info.is_main:
        print(json.dumps(per_rank, indent=1))
        if args.out:
            with open(args.out, "w") as f:
                json.dump(per_rank, f, indent=1)
    collectives.barrier()
    dist.shutdown(wait_for_peers=True)
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    from vcppo.engines import dist
    dist.exit_process(code)
