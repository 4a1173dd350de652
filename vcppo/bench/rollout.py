"""`vcppo bench rollout`: rollout + training-step micro-benchmark on one rank.

Measures, on the same model and prompts, real (uneven) lengths stopping at EOS: tokens/s of our
``RolloutEngine.generate`` (batched sampling, reseeded per call; without and with the sampled
tokens' logprobs), of the same vLLM engine with
per-request seeds (the old scheme), of HF ``generate`` in one batch (and, with ``--compiled``, of
a second engine with ``rollout.enforce_eager=false``, which vLLM compiles), alternated over
``--rounds`` (ABAB: the machine is shared), with the ratio to HF; then the weight sync time
(actor -> vLLM) and one training step split into forward logprobs, forward values, actor step and
critic step (``--train-step``).

    vcppo bench rollout [--sizes small,medium] [--prompts 64 --n 4 --max-tokens 128 --rounds 3] [--compiled]
    vcppo bench rollout --model <hf dir> [--train-step] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path


def _factory_model(size: str) -> str:
    """A factory Qwen2 with vcppo's char tokenizer (= `vcppo model make --size SIZE`), random weights:
    near-uniform next tokens, so EOS ends ~63% of 128-token responses early (uneven lengths)."""
    from vcppo.models.factory import make_model

    out_dir = tempfile.mkdtemp(prefix=f"vcppo_bench_{size}_")
    make_model(size, None, out_dir)
    return out_dir


def _parse(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="vcppo bench rollout", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="HF model dir (default: factory models of --sizes)")
    ap.add_argument("--sizes", default="small,medium", help="factory sizes to build when --model is not given")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds per engine (ABAB)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed full rounds of each engine first")
    ap.add_argument("--train-step", action="store_true", help="also time weight sync and a training step")
    ap.add_argument("--compiled", action="store_true",
                    help="also time a second engine with rollout.enforce_eager=false (vLLM compiles the model)")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--micro-batch-size", type=int, default=16)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--json", default=None, help="write the figures to this file (rank 0)")
    return ap.parse_args(argv)


def _engine_rollout(rollout, prompts: list, args, logprobs: bool = False) -> tuple[int, float, list]:
    """(response tokens, seconds, samples) of one ``RolloutEngine.generate`` call; without logprobs
    by default, as a training step in fp32 asks (``rollout.sampler_logprobs`` null, auto)."""
    t = time.perf_counter()
    samples = rollout.generate(prompts, n=args.n, temperature=1.0, top_p=1.0, max_tokens=args.max_tokens, seed=1,
                               logprobs=logprobs)
    return sum(len(s.response_ids) for s in samples), time.perf_counter() - t, samples


def _seeded_rollout(rollout, prompts: list, args) -> tuple[int, float]:
    """The old scheme, for comparison: the same vLLM engine, one seed per request (vLLM then draws
    each request's sampling noise row by row) and a logprob dict per token."""
    from vllm import SamplingParams

    params = [SamplingParams(n=args.n, temperature=1.0, top_p=1.0, max_tokens=args.max_tokens, seed=1000 + i,
                             logprobs=0, skip_special_tokens=False, spaces_between_special_tokens=False)
              for i in range(len(prompts))]
    t = time.perf_counter()
    outs = rollout.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    ntok = 0
    for o in outs:
        for c in o.outputs:
            ids = list(c.token_ids)
            _ = [float(d[tok].logprob) for tok, d in zip(ids, c.logprobs)]
            ntok += len(ids)
    return ntok, time.perf_counter() - t


def stop_token_ids(model) -> list[int]:
    """The ids that end a response: the generation config's EOS list (Qwen's: <|im_end|> and
    <|endoftext|>), which vLLM stops on, else the model config's EOS."""
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is None:
        eos = model.config.eos_token_id
    return [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]


def _hf_rollout(hf, prompts: list, args) -> tuple[int, float]:
    """HF ``generate``, one batch, sampling until every row has hit a stop token or the cap; the
    tokens counted are those up to and including each row's first stop token (what vLLM returns).
    Both sides stop on the same ids (:func:`stop_token_ids`): counting HF's rows past a stop id
    vLLM ends on would credit HF with ~20% more tokens for the same work (measured)."""
    import torch

    ids = torch.tensor(prompts, device=hf.device).repeat_interleave(args.n, 0)
    stops = stop_token_ids(hf)
    t = time.perf_counter()
    with torch.no_grad():
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, max_new_tokens=args.max_tokens,
                          top_k=0, top_p=1.0, temperature=1.0, eos_token_id=stops,
                          pad_token_id=hf.config.pad_token_id or 0)
    dt = time.perf_counter() - t
    is_stop = torch.isin(out[:, ids.shape[1]:], torch.tensor(stops, device=out.device)).int()
    return int(((is_stop.cumsum(1) - is_stop) == 0).sum()), dt


def _compare(rollout, model: str, prompts: list, args, device, res: dict, compiled=None) -> list:
    """ABAB rounds of engine / per-request seeds / HF (/ the compiled engine) after ``--warmup``
    untimed rounds of each (vLLM's CPU GEMMs build a oneDNN primitive per new batch size: a cold
    first round of decode batches 64 -> 1 measured ~30% slower than the next); sums of tokens
    over sums of seconds."""
    import torch
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).to(device).eval()
    for _ in range(args.warmup):
        for engine in (rollout, compiled) if compiled is not None else (rollout,):
            _engine_rollout(engine, prompts, args)
        _seeded_rollout(rollout, prompts, args)
        _hf_rollout(hf, prompts, args)
    keys = ("engine", "logprobs", "seeded", "hf") + (("compiled",) if compiled is not None else ())
    tot = {k: [0, 0.0] for k in keys}
    samples = []
    for r in range(args.rounds):
        ntok, dt, samples = _engine_rollout(rollout, prompts, args)
        timings = [("engine", (ntok, dt)), ("logprobs", _engine_rollout(rollout, prompts, args, logprobs=True)[:2]),
                   ("seeded", _seeded_rollout(rollout, prompts, args)),
                   ("hf", _hf_rollout(hf, prompts, args))]
        if compiled is not None:
            timings.append(("compiled", _engine_rollout(compiled, prompts, args)[:2]))
        for key, (ntok, dt) in timings:
            tot[key][0] += ntok
            tot[key][1] += dt
            print(f"  round {r} {key:7s} {ntok:6d} tokens {dt:7.2f} s {ntok / dt:8.0f} tok/s", flush=True)
    for key, (ntok, dt) in tot.items():
        res[f"{key}_tok_per_s"] = ntok / dt
        res[f"{key}_tokens"], res[f"{key}_s"] = ntok, dt
    res["engine_over_hf"] = res["engine_tok_per_s"] / res["hf_tok_per_s"]
    res["seeded_over_hf"] = res["seeded_tok_per_s"] / res["hf_tok_per_s"]
    res["logprobs_over_hf"] = res["logprobs_tok_per_s"] / res["hf_tok_per_s"]
    if compiled is not None:
        res["compiled_over_hf"] = res["compiled_tok_per_s"] / res["hf_tok_per_s"]
    del hf
    return samples


def _bench_train_step(model: str, samples: list, args, info, res: dict):
    """Forward logprobs / values and one actor / critic step with the PPO losses; the actor."""
    import torch

    from vcppo.driver.step.update import PolicyLoss, ValueLoss
    from vcppo.engines.actor import ActorEngine
    from vcppo.engines.critic import CriticEngine
    from vcppo.experience import ActorBatch, CriticBatch, Rollout, make_layout
    from vcppo.config.schema import ActorConfig, AlgorithmConfig, CriticConfig

    mbs = args.micro_batch_size
    actor = ActorEngine(model, ActorConfig(lr=1e-6, micro_batch_size=mbs), info, total_optimizer_steps=10)
    critic = CriticEngine("policy", model, CriticConfig(lr=1e-6, micro_batch_size=mbs), info, 10)
    batch = Rollout.unscored(make_layout([s.prompt_ids for s in samples], [s.response_ids for s in samples],
                                         pad_id=0, device=info.device))

    def timed(key, fn):
        t0 = time.perf_counter()
        r = fn()
        res[key] = time.perf_counter() - t0
        return r

    old_logprobs, _ = timed("fwd_logprobs_s", lambda: actor.forward_logprobs(batch))
    old_values = timed("fwd_values_s", lambda: critic.forward_values(batch))
    advantages = torch.randn(batch.policy_mask.shape, generator=torch.Generator().manual_seed(0)) \
        .to(batch.policy_mask.device) * batch.policy_mask
    actor_batch = ActorBatch(**vars(batch), advantages=advantages, old_logprobs=old_logprobs)
    critic_batch = CriticBatch(**vars(batch), returns=torch.zeros_like(batch.policy_mask), old_values=old_values)
    timed("actor_step_s", lambda: actor.train_step(actor_batch, PolicyLoss(AlgorithmConfig())))
    timed("critic_step_s", lambda: critic.train_step(critic_batch, ValueLoss(CriticConfig(), "token-mean")))
    res["train_tokens"] = float(batch.policy_mask.sum())
    return actor


def _bench_model(model: str, args, info) -> dict:
    import torch
    from transformers import AutoConfig

    from vcppo.engines.rollout import RolloutEngine
    from vcppo.config.schema import RolloutConfig

    vocab = AutoConfig.from_pretrained(model).vocab_size
    g = torch.Generator().manual_seed(0)
    prompts = [[int(x) for x in torch.randint(5, min(vocab, 80), (args.prompt_len,), generator=g)]
               for _ in range(args.prompts)]
    res: dict = {"model": model, "prompts": args.prompts, "n": args.n, "max_tokens": args.max_tokens,
                 "torch_threads": torch.get_num_threads()}
    t = time.perf_counter()
    rollout = RolloutEngine(model, RolloutConfig(gpu_memory_utilization=0.05), info, seed=0,
                            max_model_len=args.prompt_len + args.max_tokens + 8)
    res["vllm_startup_s"] = time.perf_counter() - t
    compiled = None
    if args.compiled:
        t = time.perf_counter()
        compiled = RolloutEngine(model, RolloutConfig(gpu_memory_utilization=0.05, enforce_eager=False), info,
                                 seed=0, max_model_len=args.prompt_len + args.max_tokens + 8)
        res["compiled_startup_s"] = time.perf_counter() - t
    samples = _compare(rollout, model, prompts, args, info.device, res, compiled)
    if compiled is not None:
        compiled.close()
    if args.train_step:
        actor = _bench_train_step(model, samples, args, info, res)
        res["sync_s"] = rollout.sync_weights(actor.named_parameters_gathered())
    rollout.close()
    return res


def main(argv=None) -> dict:
    args = _parse(argv)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from vcppo.runtime import dist

    info = dist.init_distributed(args.device)
    models = [("model", args.model)] if args.model else [(s, _factory_model(s)) for s in args.sizes.split(",")]
    out = {}
    for name, path in models:
        print(f"{name} ({path}): {args.prompts} prompts x {args.n} samples, up to {args.max_tokens} tokens", flush=True)
        out[name] = res = _bench_model(path, args, info)
        if info.is_main:
            print(f"{name}: engine {res['engine_tok_per_s']:.0f} tok/s ({res['logprobs_tok_per_s']:.0f} with "
                  f"logprobs), per-request seeds "
                  f"{res['seeded_tok_per_s']:.0f}, HF generate {res['hf_tok_per_s']:.0f}; "
                  f"engine / HF = {res['engine_over_hf']:.2f}, seeded / HF = {res['seeded_over_hf']:.2f}"
                  + (f"; compiled {res['compiled_tok_per_s']:.0f} tok/s, compiled / HF = {res['compiled_over_hf']:.2f}"
                     f" (start-up {res['compiled_startup_s']:.0f} s)" if args.compiled else ""), flush=True)
    dist.shutdown()
    if info.is_main:
        print(json.dumps({n: {k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()}
                          for n, r in out.items()}, indent=1))
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
            print(f"wrote {args.json}")
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
