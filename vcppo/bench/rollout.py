"""`vcppo bench rollout`: rollout + training-step micro-benchmark on one rank.

Measures, on the same model and batch: vLLM rollout tokens/s vs HF ``generate``; the weight
sync time (actor -> vLLM); and one training step split into forward logprobs, forward values,
actor step and critic step.

    vcppo bench rollout --model <hf dir> [--prompts 64 --n 4 --max-tokens 128] [--json PATH]
    vcppo bench rollout            # builds the factory's `tiny` random Qwen2 in a temp dir
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path


def _tiny_model(out_dir: str) -> str:
    """The factory's `tiny` Qwen2 with vcppo's char tokenizer (= `vcppo model make --size tiny`)."""
    from vcppo.models.factory import make_model

    make_model("tiny", None, out_dir)
    return out_dir


def _parse(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="vcppo bench rollout", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="HF model dir (default: build a tiny random Qwen2)")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--micro-batch-size", type=int, default=16)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--json", default=None, help="write the figures to this file (rank 0)")
    return ap.parse_args(argv)


def _bench_vllm(rollout, prompts: list, args, res: dict) -> list:
    rollout.generate(prompts[:2], n=1, temperature=1.0, top_p=1.0, max_tokens=4)  # warm-up
    t = time.perf_counter()
    samples = rollout.generate(prompts, n=args.n, temperature=1.0, top_p=1.0, max_tokens=args.max_tokens, seed=1)
    dt = time.perf_counter() - t
    ntok = sum(len(s.response_ids) for s in samples)
    res.update(vllm_tokens=ntok, vllm_s=dt, vllm_tok_per_s=ntok / dt)
    return samples


def _bench_hf_generate(model: str, prompts: list, args, device, res: dict) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).to(device).eval()
    ids = torch.tensor(prompts, device=device).repeat_interleave(args.n, 0)
    t = time.perf_counter()
    with torch.no_grad():
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, max_new_tokens=args.max_tokens,
                          min_new_tokens=args.max_tokens, top_k=0, top_p=1.0, temperature=1.0,
                          pad_token_id=hf.config.pad_token_id or 0)
    dt = time.perf_counter() - t
    hf_tok = int((out.shape[1] - ids.shape[1]) * out.shape[0])
    res.update(hf_tokens=hf_tok, hf_s=dt, hf_tok_per_s=hf_tok / dt)


def _bench_train_step(model: str, samples: list, args, info, res: dict):
    """Forward logprobs / values and one actor / critic step with the PPO losses; the actor."""
    import torch

    from vcppo.driver.update import PolicyLoss, ValueLoss
    from vcppo.engines.actor import ActorEngine
    from vcppo.engines.critic import CriticEngine
    from vcppo.experience import make_experience
    from vcppo.schema import ActorConfig, AlgorithmConfig, CriticConfig

    mbs = args.micro_batch_size
    actor = ActorEngine(model, ActorConfig(lr=1e-6, micro_batch_size=mbs), info, total_optimizer_steps=10)
    critic = CriticEngine("policy", model, CriticConfig(lr=1e-6, micro_batch_size=mbs), info, 10)
    batch = make_experience([s.prompt_ids for s in samples], [s.response_ids for s in samples],
                            pad_id=0, device=info.device)

    def timed(key, fn):
        t0 = time.perf_counter()
        r = fn()
        res[key] = time.perf_counter() - t0
        return r

    batch.old_logprobs, _ = timed("fwd_logprobs_s", lambda: actor.forward_logprobs(batch))
    batch.old_values = timed("fwd_values_s", lambda: critic.forward_values(batch))
    batch.advantages = torch.randn(batch.response_mask.shape, generator=torch.Generator().manual_seed(0)) \
        .to(batch.response_mask.device) * batch.response_mask
    batch.returns = torch.zeros_like(batch.response_mask)
    timed("actor_step_s", lambda: actor.train_step(batch, PolicyLoss(AlgorithmConfig())))
    timed("critic_step_s", lambda: critic.train_step(batch, ValueLoss(CriticConfig(), "token-mean")))
    res["train_tokens"] = float(batch.response_mask.sum())
    return actor


def main(argv=None) -> dict:
    args = _parse(argv)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import torch
    from transformers import AutoConfig

    from vcppo.engines import dist
    from vcppo.engines.rollout import RolloutEngine
    from vcppo.schema import RolloutConfig

    info = dist.init_distributed(args.device)
    model = args.model or _tiny_model(tempfile.mkdtemp(prefix="vcppo_bench_"))
    vocab = AutoConfig.from_pretrained(model).vocab_size
    g = torch.Generator().manual_seed(0)
    prompts = [[int(x) for x in torch.randint(5, min(vocab, 80), (args.prompt_len,), generator=g)]
               for _ in range(args.prompts)]
    res: dict = {"model": model, "prompts": args.prompts, "n": args.n, "max_tokens": args.max_tokens,
                 "torch_threads_before_vllm": torch.get_num_threads()}
    t = time.perf_counter()
    rollout = RolloutEngine(model, RolloutConfig(gpu_memory_utilization=0.05), info, seed=0,
                            max_model_len=args.prompt_len + args.max_tokens + 8)
    res["vllm_startup_s"] = time.perf_counter() - t
    res["torch_threads_after_vllm"] = torch.get_num_threads()
    samples = _bench_vllm(rollout, prompts, args, res)
    _bench_hf_generate(model, prompts, args, info.device, res)
    actor = _bench_train_step(model, samples, args, info, res)
    res["sync_s"] = rollout.sync_weights(actor.named_parameters_gathered())
    dist.shutdown()
    if info.is_main:
        print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in res.items()}, indent=1))
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(res, indent=2) + "\n")
            print(f"wrote {args.json}")
    return res


if __name__ == "__main__":
    main(sys.argv[1:])
