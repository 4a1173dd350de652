"""`vcppo bench lora`: how vLLM gets a LoRA actor, merged weights vs its own LoRA, on one rank.

    vcppo bench lora [--sizes small,medium] [--rank 16] [--prompts 64 --n 4 --max-tokens 128]
                     [--syncs 3] [--rounds 3] [--json PATH]

Per model (a factory Qwen2 with random weights, as ``vcppo bench rollout`` builds): a LoRA actor
(adapters of ``--rank`` on every linear layer, one optimizer step so B is non-zero) and two vLLM
engines on the same model: one that loads merged full weights (``rollout.lora_sync=merged``) and one
built with vLLM's LoRA that loads the adapters (``rollout.lora_sync=adapter``). Figures:
  * sync     -- seconds per sync (median of ``--syncs``): gather + merge + load of the full weights,
                vs gather + write + load of the adapters; and the bytes each moves;
  * decode   -- response tokens / s of one ``generate`` call of each engine on the same prompts,
                alternated over ``--rounds`` (ABAB: the machine is shared); vLLM's LoRA adds the
                adapters' matmuls to every decode step;
  * exact    -- the largest |vLLM logprob - actor logprob| over the sampled tokens, per engine.
Ratios are adapter / merged, measured in the same run.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from vcppo.bench.rollout import _factory_model


def _parse(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="vcppo bench lora", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="small,medium", help="factory model sizes")
    ap.add_argument("--rank", type=int, default=16, help="adapter rank (on every linear layer)")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--syncs", type=int, default=3, help="timed syncs per mode")
    ap.add_argument("--rounds", type=int, default=3, help="alternating decode rounds per engine (ABAB)")
    ap.add_argument("--json", default=None)
    return ap.parse_args(argv)


def _adapted_actor(model: str, rank: int, prompts: list, info):
    """A LoRA actor after one step on a batch of its prompts (B non-zero: the adapters matter)."""
    import torch

    from vcppo.driver.step.update import PolicyLoss
    from vcppo.engines.actor import ActorEngine
    from vcppo.experience import ActorBatch, Rollout, make_layout
    from vcppo.config.schema import ActorConfig, AlgorithmConfig, LoRAConfig

    actor = ActorEngine(model, ActorConfig(lr=1e-2, micro_batch_size=16, lora=LoRAConfig(rank=rank)), info,
                        total_optimizer_steps=2)
    r = Rollout.unscored(make_layout(prompts[:16], [p[:8] for p in prompts[:16]], pad_id=0))
    advantages = torch.randn(r.policy_mask.shape, generator=torch.Generator().manual_seed(0))
    batch = ActorBatch(**vars(r), advantages=advantages, old_logprobs=actor.forward_logprobs(r)[0])
    actor.train_step(batch, PolicyLoss(AlgorithmConfig()))
    return actor


def _max_logprob_gap(actor, samples) -> float:
    from vcppo.engines.rollout import sampled_logprobs_layout
    from vcppo.experience import make_layout
    batch = make_layout([s.prompt_ids for s in samples], [s.response_ids for s in samples], pad_id=0)
    ours, _ = actor.forward_logprobs(batch)
    return float((ours - sampled_logprobs_layout(samples, ours.shape[1])).abs().max())


def _bench_model(model: str, args, info) -> dict:
    import torch

    from vcppo.engines.rollout import RolloutEngine
    from vcppo.config.schema import RolloutConfig

    g = torch.Generator().manual_seed(0)
    prompts = [[int(x) for x in torch.randint(5, 80, (args.prompt_len,), generator=g)] for _ in range(args.prompts)]
    max_len = args.prompt_len + args.max_tokens + 8
    engines = {mode: RolloutEngine(model, RolloutConfig(gpu_memory_utilization=0.05), info, seed=0,
                                   max_model_len=max_len, lora_rank=args.rank if mode == "adapter" else 0)
               for mode in ("merged", "adapter")}
    actor = _adapted_actor(model, args.rank, prompts, info)
    sync = {"merged": lambda: engines["merged"].sync_weights(actor.named_parameters_gathered()),
            "adapter": lambda: engines["adapter"].sync_adapter(lambda d: actor.export_adapter(d, every_rank=True))}
    res: dict = {"rank": args.rank, "prompts": args.prompts, "n": args.n, "max_tokens": args.max_tokens,
                 "params": sum(p.numel() for p in actor.module.parameters() if not p.requires_grad),
                 "adapter_params": sum(p.numel() for p in actor.module.parameters() if p.requires_grad)}
    for mode, fn in sync.items():
        fn()  # warm-up (and the first load of vLLM's LoRA)
        times = []
        for _ in range(args.syncs):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        res[f"{mode}_sync_s"] = statistics.median(times)
    res["merged_sync_bytes"] = 4 * sum(t.numel() for _, t in actor.named_parameters_gathered())
    res["adapter_sync_bytes"] = 4 * res["adapter_params"]
    speeds = {mode: [] for mode in engines}
    for engine in engines.values():  # untimed: each engine's first call warms it up
        engine.generate(prompts[:4], n=1, temperature=1.0, top_p=1.0, max_tokens=8, seed=0)
    for _ in range(args.rounds):
        for mode, engine in engines.items():
            t = time.perf_counter()
            samples = engine.generate(prompts, n=args.n, temperature=1.0, top_p=1.0, max_tokens=args.max_tokens,
                                      seed=1, logprobs=True)
            speeds[mode].append(sum(len(s.response_ids) for s in samples) / (time.perf_counter() - t))
            res[f"{mode}_max_logprob_gap"] = _max_logprob_gap(actor, samples)
    for mode in engines:
        res[f"{mode}_decode_tok_per_s"] = statistics.median(speeds[mode])
    res["adapter_over_merged_sync"] = res["adapter_sync_s"] / res["merged_sync_s"]
    res["adapter_over_merged_decode"] = res["adapter_decode_tok_per_s"] / res["merged_decode_tok_per_s"]
    # vLLM engines stay open until the process ends: shutting one down mid-process leaves DeepSpeed's
    # cached process groups dangling for the next model's engines
    return res


def main(argv=None) -> dict:
    args = _parse(argv)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from vcppo.runtime import dist

    info = dist.init_distributed("cpu")
    out = {}
    for size in args.sizes.split(","):
        out[size] = r = _bench_model(_factory_model(size), args, info)
        print(f"{size}: {r['params'] / 1e6:.1f}M params, rank {args.rank} adapters {r['adapter_params'] / 1e6:.2f}M | "
              f"sync merged {r['merged_sync_s'] * 1e3:.0f} ms ({r['merged_sync_bytes'] / 2 ** 20:.1f} MiB), "
              f"adapter {r['adapter_sync_s'] * 1e3:.0f} ms ({r['adapter_sync_bytes'] / 2 ** 20:.2f} MiB), "
              f"ratio {r['adapter_over_merged_sync']:.2f} | decode merged {r['merged_decode_tok_per_s']:.0f} tok/s, "
              f"adapter {r['adapter_decode_tok_per_s']:.0f} tok/s, ratio {r['adapter_over_merged_decode']:.2f} | "
              f"max |logprob gap| merged {r['merged_max_logprob_gap']:.1e}, adapter {r['adapter_max_logprob_gap']:.1e}",
              flush=True)
    dist.shutdown()
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
