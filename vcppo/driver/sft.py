"""`vcppo sft`: cold-start supervised fine-tuning of the policy on the task's reasoning traces.

The paper starts RL from a cold-start SFT model that already writes ``<think>...</think>``; this
is that step. It trains with the same DeepSpeed actor engine as RL (so ZeRO-3, micro-batching
and checkpoint export behave identically), evaluates greedy accuracy on the val split with vLLM
(weights synced from the trainer, as in RL), and saves an HF-format checkpoint.

The loss is the token-mean NLL of the response (trace + answer + end token); prompt tokens are
not trained on.
"""
from __future__ import annotations

import argparse
import json
import sys
import math
import time
from pathlib import Path

from vcppo.algos.losses import aggregate_loss
from vcppo.engines import dist as D


class ResponseNLL:
    """Token-mean NLL over the response tokens of the whole (global) batch."""
    needs_entropy = False

    def __init__(self, minibatch: dict):
        from vcppo.driver.common import global_sum
        self.tokens = global_sum(minibatch["response_mask"].sum())

    def __call__(self, outputs: dict, micro: dict):
        mask = micro["response_mask"]
        nll = aggregate_loss(-outputs["logprobs"], mask, "token-mean", global_token_count=self.tokens)
        return nll, {"sft/nll_token": (-(outputs["logprobs"] * mask).sum() / mask.sum().clamp(min=1)).detach()}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="vcppo sft", description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="initial HF model dir (e.g. from `vcppo model make`)")
    p.add_argument("--train", required=True, help="training rows with prompt / answer / solution")
    p.add_argument("--val", help="validation rows (greedy accuracy is reported)")
    p.add_argument("--out", required=True, help="output dir for the HF checkpoint + metrics")
    p.add_argument("--solution-field", default="solution")
    p.add_argument("--steps", type=int, default=600, help="optimizer steps (the LR schedule spans them)")
    p.add_argument("--max-minutes", type=float, default=0, help="stop training after this wall time (0: off)")
    p.add_argument("--batch-size", type=int, default=32, help="sequences per step, all ranks")
    p.add_argument("--micro-batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup-steps", type=int, default=30)
    p.add_argument("--eval-every", type=int, default=0, help="greedy val accuracy every N steps (0: end only)")
    p.add_argument("--target-accuracy", type=float, default=0.0,
                   help="stop once greedy val accuracy reaches this (checked every --eval-every steps). "
                        "A cold start for RL should leave room to improve; on the demo task accuracy jumps "
                        "from ~0 to ~90%% within ~100 steps, so a fixed step count is a knife edge")
    p.add_argument("--eval-prompts", type=int, default=200)
    p.add_argument("--max-new-tokens", type=int, default=384)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-wandb", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    from vcppo.driver.experience import missing_path
    error = missing_path(args, ("model", "train", "val"))
    if error:
        print(f"vcppo sft: {error}", file=sys.stderr)
        return 2
    run_sft(args)
    return 0


def run_sft(args: argparse.Namespace) -> dict:
    from transformers import AutoTokenizer

    from vcppo.config import ActorConfig, RolloutConfig
    from vcppo.data.dataset import load_prompts
    from vcppo.driver.common import seed_everything
    from vcppo.driver.evaluate import evaluate
    from vcppo.driver.experience import rank_slice, verifier_scorer
    from vcppo.engines.actor import ActorEngine
    from vcppo.engines.batch import make_batch
    from vcppo.engines.rollout import RolloutEngine
    from vcppo.rewards.verifier import RewardScorer
    from vcppo.tracking import MetricsLogger

    dist = D.init_distributed()
    seed_everything(args.seed)
    out = Path(args.out)
    tok = AutoTokenizer.from_pretrained(args.model)
    train = load_prompts(args.train, tok, max_prompt_tokens=None, shuffle_seed=args.seed)
    if args.solution_field not in train.dataset.column_names:
        raise ValueError(f"--solution-field {args.solution_field!r} is not a column of {args.train}; "
                         f"available: {train.dataset.column_names}")
    val_rows = []
    if args.val:
        val = load_prompts(args.val, tok, max_prompt_tokens=None, shuffle_seed=None, limit=args.eval_prompts)
        val_rows = val.rows()
    stream = train.stream(seed=args.seed)
    log = MetricsLogger(out, vars(args), enabled=dist.is_main, use_wandb=not args.no_wandb,
                        run_name=f"sft-{out.name}")
    cfg = ActorConfig(lr=args.lr, warmup_steps=args.warmup_steps, lr_schedule="cosine", min_lr_ratio=0.1,
                      micro_batch_size=args.micro_batch_size, betas=[0.9, 0.98], weight_decay=0.01)
    actor = ActorEngine(args.model, cfg, dist, total_optimizer_steps=args.steps, dtype="auto")
    max_len = max(len(r) for r in train.dataset["prompt_ids"]) + args.max_new_tokens
    rollout = RolloutEngine(args.model, RolloutConfig(max_response_tokens=args.max_new_tokens), dist,
                            seed=args.seed, max_model_len=max_len) if val_rows else None
    scorer = verifier_scorer(RewardScorer())
    eos = tok.eos_token_id

    def eval_now(step: int) -> dict:
        rollout.sync_weights(actor.named_parameters_gathered())
        m = evaluate(rollout, val_rows, scorer, dist=dist, max_tokens=args.max_new_tokens, n_samples=0, ks=[],
                     seed=args.seed)
        log.log(m, step=step, phase="sft_val")
        log.info(f"step {step}: val greedy accuracy {m['val/pass@1_greedy']:.3f} "
                 f"(mean length {m['val/response_length_greedy']:.0f} tokens)")
        return m

    start, step, metrics, evaluated_at = time.time(), 0, {}, -1
    log.start_phase("sft", total=args.steps)
    for step in range(1, args.steps + 1):
        rows = stream.next_batch(args.batch_size)
        _, mine = rank_slice(rows, dist.rank, dist.world_size)
        responses = [tok.encode(r[args.solution_field], add_special_tokens=False) + [eos] for r in mine]
        batch = make_batch([r["prompt_ids"] for r in mine], responses, pad_id=tok.pad_token_id,
                           device=dist.device)
        t0 = time.perf_counter()
        m = actor.train_step(batch, ResponseNLL(batch), args.micro_batch_size)
        m["time/step_s"] = time.perf_counter() - t0
        log.log(m, step=step, phase="sft")
        if args.eval_every and step % args.eval_every == 0 and val_rows and step < args.steps:
            metrics, evaluated_at = eval_now(step), step
            if args.target_accuracy and metrics["val/pass@1_greedy"] >= args.target_accuracy:
                log.info(f"stopping at step {step}: val accuracy reached --target-accuracy {args.target_accuracy}")
                break
        if args.max_minutes and (time.time() - start) / 60 > args.max_minutes:
            log.info(f"stopping at step {step}: --max-minutes {args.max_minutes} reached")
            break
    train_minutes = (time.time() - start) / 60
    if val_rows and evaluated_at != step:
        metrics = eval_now(step)
    actor.export_hf(str(out))
    summary = {"steps": step, "train_minutes": round(train_minutes, 2),
               "final_nll_token": m.get("sft/nll_token", math.nan), **metrics}
    if dist.is_main:
        (out / "sft_summary.json").write_text(json.dumps(summary, indent=1))
        log.info(f"SFT done: {json.dumps(summary)}")
    log.close()
    if rollout is not None:
        rollout.close()
    actor.close()
    D.shutdown()
    return summary
