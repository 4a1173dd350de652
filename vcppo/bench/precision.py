"""`vcppo bench precision`: how far the same AdamW steps move the policy, by the trainer's precision.

    vcppo bench precision [--model DIR | --size small] [--data FILE [--answer-field F]] [--prompts 16] [--n 4]
                          [--max-tokens 96] [--lr 5e-6] [--epochs 3] [--json PATH]

One batch of ``--prompts`` x ``--n`` responses, sampled at temperature 1 by the fp32 model, gets fixed
advantages (a seeded N(0, 1) per response, on every token). Each trainer then takes ``--epochs`` x 4
AdamW steps (lr ``--lr``, betas 0.9 / 0.95, grad clip 1.0) of PPO's clipped surrogate over the same
shuffled mini-batches, starting from the same weights:

    fp32           the DeepSpeed actor in float32
    bf16           the DeepSpeed actor in bfloat16, its fp32 masters from the checkpoint's fp32 values
    bf16-ckpt      the same, from a copy of the checkpoint stored in bfloat16 (masters on the bf16 grid:
                   what a bf16 checkpoint gives, and what every bf16 run got before the masters were seeded)
    autocast       plain torch: fp32 weights, torch.autocast(bfloat16) forward (TRL's bf16 mode)

After each epoch the trained weights are scored in fp32 on the batch: dJ = mean over tokens of
A * (log pi_new - log pi_start), the surrogate's gain to first order. A trainer
whose bf16 weights cannot follow its masters shows a dJ far below fp32's. ``--model`` is an HF
directory (its prompts from ``--data``, else random token ids); without it a random Qwen2 of ``--size``.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import tempfile

import torch

VARIANTS = ("fp32", "bf16", "bf16-ckpt", "autocast")
MINI_BATCHES = 4


def _parse(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="vcppo bench precision", description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="HF model dir (default: a random model of --size)")
    ap.add_argument("--size", default="small", help="factory size when --model is not given")
    ap.add_argument("--data", default=None, help="prompts from this file instead of random token ids")
    ap.add_argument("--answer-field", default="answer", help="the answer column of --data (verl's files: "
                    "reward_model.ground_truth); only read to load the prompts")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--n", type=int, default=4, help="responses per prompt")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--lr", type=float, default=5e-6)
    ap.add_argument("--epochs", type=int, default=3, help=f"passes of {MINI_BATCHES} AdamW steps over the batch")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--json", default=None, help="write the figures to this file")
    return ap.parse_args(argv)


def _batch(args, model):
    """(Layout of the sampled batch, (B,) advantages)."""
    from transformers import AutoTokenizer

    from vcppo.experience import make_layout
    tok = AutoTokenizer.from_pretrained(args.model)
    g = torch.Generator().manual_seed(0)
    if args.data:
        from vcppo.data.dataset import load_prompts
        rows = load_prompts(args.data, tok, answer_field=args.answer_field, max_prompt_tokens=None, shuffle_seed=None,
                            limit=args.prompts).rows()
        prompts = [list(r["prompt_ids"]) for r in rows]
    else:
        prompts = [torch.randint(5, min(model.config.vocab_size, 80), (24,), generator=g).tolist()
                   for _ in range(args.prompts)]
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])
    torch.manual_seed(0)
    prompt_ids, responses = [], []
    for ids in prompts:
        out = model.generate(torch.tensor([ids] * args.n), attention_mask=torch.ones(args.n, len(ids), dtype=torch.long),
                             do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=args.max_tokens,
                             pad_token_id=next(iter(eos)))
        for r in out[:, len(ids):].tolist():
            end = next((i for i, t in enumerate(r) if t in eos), None)
            prompt_ids.append(ids)
            responses.append(r if end is None else r[:end + 1])
    batch = make_layout(prompt_ids, responses, pad_id=next(iter(eos)))
    return batch, torch.randn(batch.size, generator=g)


def _logprobs(model, batch, autocast: bool = False) -> torch.Tensor:
    """(B, R) fp32 logprobs of the batch's responses from a plain HF model's full logits."""
    from vcppo.engines.actor import response_logprobs
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    with ctx:
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                       position_ids=batch.position_ids).logits
    return response_logprobs(logits[:, batch.prompt_len - 1:-1], batch.responses)[0]


def _surrogate(logprobs, old, adv, mask) -> torch.Tensor:
    """PPO's clipped surrogate (clip 0.2), token mean: the loss every trainer here steps on."""
    from vcppo.algos.losses import policy_loss
    return policy_loss(logprobs, old, adv[:, None] * mask, mask)[0]


def _trainer(variant: str, args, source: str, info):
    """(logprobs(micro) with grad, step(loss), fp32 state dict) of one trainer."""
    from transformers import AutoModelForCausalLM
    if variant == "autocast":
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)

        def step(loss):
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
        return (lambda micro: _logprobs(model, micro, autocast=True)), step, model.state_dict
    from vcppo.config.schema import ActorConfig
    from vcppo.engines.actor import ActorEngine
    actor = ActorEngine(source, ActorConfig(lr=args.lr, betas=[0.9, 0.95], micro_batch_size=10 ** 6, grad_clip=1.0),
                        info, total_optimizer_steps=args.epochs * MINI_BATCHES,
                        dtype="float32" if variant == "fp32" else "bfloat16")

    def step(loss):
        actor.engine.set_gradient_accumulation_boundary(True)
        actor.engine.backward(loss, scale_wrt_gas=False)
        actor.engine.step()
    return (lambda micro: actor._forward_outputs(micro, False).logprobs), step, actor.full_state_dict


def run_variant(variant: str, args, batch, adv, start, reference, info, bf16_copy: str) -> list[dict]:
    """Per epoch: dJ of ``variant``'s weights, scored in fp32 by ``reference``."""
    forward, step, weights = _trainer(variant, args, bf16_copy if variant == "bf16-ckpt" else args.model, info)
    mask = batch.policy_mask
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        old = forward(batch)
    out = []
    for epoch in range(args.epochs):
        for idx in torch.randperm(batch.size, generator=g).chunk(MINI_BATCHES):
            micro = batch.select(idx.tolist())
            step(_surrogate(forward(micro), old[idx], adv[idx], micro.policy_mask))
        reference.load_state_dict({k: v.float() for k, v in weights().items()}, strict=False)
        with torch.no_grad():
            new = _logprobs(reference, batch)
        n = mask.sum()
        out.append({"adamw_steps": (epoch + 1) * MINI_BATCHES,
                    "dJ": float(((new - start) * adv[:, None] * mask).sum() / n)})
    return out


def measure(args) -> dict:
    from transformers import AutoModelForCausalLM

    from vcppo.runtime import dist
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    batch, adv = _batch(args, model)
    with torch.no_grad():
        start = _logprobs(model, batch)
    info = dist.init_distributed("cpu")
    results = {"model": args.model, "samples": batch.size, "tokens": int(batch.policy_mask.sum()), "lr": args.lr,
               "variants": {}}
    with tempfile.TemporaryDirectory() as tmp:
        model.to(torch.bfloat16).save_pretrained(tmp)  # the bf16 checkpoint copy (tokenizer from --model)
        from transformers import AutoTokenizer
        AutoTokenizer.from_pretrained(args.model).save_pretrained(tmp)
        reference = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
        for variant in args.variants.split(","):
            results["variants"][variant] = run_variant(variant, args, batch, adv, start, reference, info, tmp)
            rows = results["variants"][variant]
            per_epoch = ", ".join(f"{r['dJ']:+.5f}" for r in rows)
            print(f"{variant:>10}: dJ after {rows[-1]['adamw_steps']} AdamW steps {rows[-1]['dJ']:+.5f}  "
                  f"(per epoch: {per_epoch})", flush=True)
    fp32 = results["variants"].get("fp32")
    if fp32:  # each trainer's dJ as a share of fp32's, per epoch
        results["dJ_over_fp32"] = {v: [r["dJ"] / f["dJ"] if f["dJ"] else float("nan") for r, f in zip(rows, fp32)]
                                   for v, rows in results["variants"].items()}
    return results


def main(argv=None) -> int:
    args = _parse(argv)
    unknown = set(args.variants.split(",")) - set(VARIANTS)
    if unknown:
        raise SystemExit(f"vcppo bench precision: unknown --variants {sorted(unknown)}; choose from {list(VARIANTS)}")
    with tempfile.TemporaryDirectory() as tmp:
        if args.model is None:
            from vcppo.models.factory import make_model
            args.model = os.path.join(tmp, "model")
            make_model(args.size, None, args.model)
        results = measure(args)
    from vcppo.bench import write_json
    write_json(args.json, results)
    return 0
