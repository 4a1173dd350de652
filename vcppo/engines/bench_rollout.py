"""Rollout + training-step micro-benchmark on one rank.

Measures, on the same model and batch: vLLM rollout tokens/s vs HF ``generate``; the weight
sync time (actor -> vLLM); and one training step split into forward logprobs, forward values,
actor step and critic step.

    python -m vcppo.engines.bench_rollout --model <hf dir> [--prompts 64 --n 4 --max-tokens 128]
    python -m vcppo.engines.bench_rollout            # builds a tiny random Qwen2 in a temp dir
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time


def _tiny_model(out_dir: str) -> str:
    try:  # the project's factory when present
        from vcppo.models.factory import make_model
        make_model("tiny", None, out_dir)
        return out_dir
    except Exception:  # noqa: BLE001 - fall back to the test fixture's builder
        sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "engines"))
        from conftest import build_tiny_model  # type: ignore
        return build_tiny_model(out_dir)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="HF model dir (default: build a tiny random Qwen2)")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--micro-batch-size", type=int, default=16)
    ap.add_argument("--device", default="auto")
    args = ap.parse_args(argv)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

    import torch

    from vcppo.config import ActorConfig, CriticConfig, RolloutConfig
    from vcppo.engines import dist
    from vcppo.engines.actor import ActorEngine
    from vcppo.engines.batch import make_batch
    from vcppo.engines.critic import CriticEngine
    from vcppo.engines.rollout import RolloutEngine

    info = dist.init_distributed(args.device)
    model = args.model or _tiny_model(tempfile.mkdtemp(prefix="vcppo_bench_"))
    from transformers import AutoConfig
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
    # ignore_eos-like behaviour is not needed: random tiny models rarely stop; count real tokens
    rollout.generate(prompts[:2], n=1, temperature=1.0, top_p=1.0, max_tokens=4)  # warm-up
    t = time.perf_counter()
    samples = rollout.generate(prompts, n=args.n, temperature=1.0, top_p=1.0, max_tokens=args.max_tokens, seed=1)
    dt = time.perf_counter() - t
    ntok = sum(len(s.response_ids) for s in samples)
    res.update(vllm_tokens=ntok, vllm_s=dt, vllm_tok_per_s=ntok / dt)

    from transformers import AutoModelForCausalLM
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).to(info.device).eval()
    ids = torch.tensor(prompts, device=info.device).repeat_interleave(args.n, 0)
    t = time.perf_counter()
    with torch.no_grad():
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, max_new_tokens=args.max_tokens,
                          min_new_tokens=args.max_tokens, top_k=0, top_p=1.0, temperature=1.0,
                          pad_token_id=hf.config.pad_token_id or 0)
    dt = time.perf_counter() - t
    hf_tok = int((out.shape[1] - ids.shape[1]) * out.shape[0])
    res.update(hf_tokens=hf_tok, hf_s=dt, hf_tok_per_s=hf_tok / dt)
    del hf

    mbs = args.micro_batch_size
    actor = ActorEngine(model, ActorConfig(lr=1e-6, micro_batch_size=mbs), info, total_optimizer_steps=10)
    critic = CriticEngine("policy", model, CriticConfig(lr=1e-6, micro_batch_size=mbs), info, 10)
    batch = make_batch([s.prompt_ids for s in samples], [s.response_ids for s in samples],
                       pad_id=0, device=info.device)
    n_tok = float(batch["response_mask"].sum())
    batch["returns"] = torch.zeros_like(batch["response_mask"])

    def timed(key, fn):
        t0 = time.perf_counter()
        r = fn()
        res[key] = time.perf_counter() - t0
        return r

    old_lp, _ = timed("fwd_logprobs_s", lambda: actor.forward_logprobs(batch, mbs))
    timed("fwd_values_s", lambda: critic.forward_values(batch, mbs))
    batch["old_logprobs"] = old_lp

    def pg(outputs, micro):
        ratio = torch.exp(outputs["logprobs"] - micro["old_logprobs"])
        return -(ratio * micro["response_mask"]).sum() / n_tok, {}

    def vl(outputs, micro):
        return 0.5 * (((outputs["values"] - micro["returns"]) ** 2) * micro["response_mask"]).sum() / n_tok, {}

    timed("actor_step_s", lambda: actor.train_step(batch, pg, mbs))
    timed("critic_step_s", lambda: critic.train_step(batch, vl, mbs))
    res["sync_s"] = rollout.sync_weights(actor.named_parameters_gathered())
    res["train_tokens"] = n_tok
    dist.shutdown()
    if info.is_main:
        print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in res.items()}, indent=1))
    return res


if __name__ == "__main__":
    main(sys.argv[1:])
