"""`vcppo rm`: an outcome reward model, trained only at the final token — the convention the
VC-PPO paper criticises (sec. 3.1). The plain-PPO baseline initialises its critic from it.

Data: the SFT policy samples responses to training prompts (vLLM); the rule verifier labels each
(+1 correct / -1 wrong). Model: the policy's backbone + a scalar head (the critic's ValueModel
format, so the result loads directly as a critic). Loss: squared error between the head's output
at the last response token and the label; no other position is trained, which is exactly why
such a critic scores early tokens badly. Held-out accuracy = sign agreement on unseen prompts.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from vcppo.engines import dist as D


class FinalTokenMSE:
    """0.5 * w * (V(last token) - label)^2, mean over the global batch's sequences.

    ``w`` balances the classes (``micro["weight"]``): with a 10-20% correct rate an unweighted
    regression settles on predicting "wrong" for everything (measured: balanced accuracy 0.5).
    """
    needs_entropy = False

    def __init__(self, minibatch: dict):
        from vcppo.driver.common import global_sum
        self.seqs = global_sum(minibatch["response_mask"].shape[0])

    def __call__(self, outputs: dict, micro: dict):
        last = final_token_values(outputs["values"], micro["response_mask"])
        err = last - micro["label"]
        loss = 0.5 * (micro["weight"] * err ** 2).sum() / self.seqs
        return loss, {"rm/mse": (err ** 2).mean().detach(),
                      "rm/train_accuracy": ((last > 0).float() == (micro["label"] > 0).float()).float().mean()}


def final_token_values(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, R) per-token values -> (B,) value at each row's last valid response token."""
    last = (mask.sum(1).long() - 1).clamp(min=0)
    return values.gather(1, last[:, None]).squeeze(1)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="vcppo rm", description=__doc__.split("\n")[0])
    p.add_argument("--policy", required=True, help="SFT policy dir (samples + backbone init)")
    p.add_argument("--train", required=True, help="prompt rows (prompt / answer)")
    p.add_argument("--out", required=True)
    p.add_argument("--prompts", type=int, default=512, help="prompts to sample from")
    p.add_argument("--samples-per-prompt", type=int, default=4)
    p.add_argument("--heldout-frac", type=float, default=0.2, help="share of prompts held out for accuracy")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--micro-batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--max-new-tokens", type=int, default=384)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-wandb", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    from vcppo.driver.experience import missing_path
    error = missing_path(args, ("policy", "train"))
    if error:
        print(f"vcppo rm: {error}", file=sys.stderr)
        return 2
    train_rm(args)
    return 0


def train_rm(args: argparse.Namespace) -> dict:
    from transformers import AutoTokenizer

    from vcppo.config import CriticConfig, RolloutConfig
    from vcppo.data.dataset import load_prompts
    from vcppo.driver.common import gather_cat, seed_everything
    from vcppo.driver.experience import collect_experience, rank_slice, verifier_scorer
    from vcppo.engines.batch import slice_batch
    from vcppo.engines.critic import CriticEngine
    from vcppo.engines.rollout import RolloutEngine
    from vcppo.rewards.verifier import RewardScorer
    from vcppo.tracking import MetricsLogger

    dist = D.init_distributed()
    seed_everything(args.seed)
    out = Path(args.out)
    log = MetricsLogger(out, vars(args), enabled=dist.is_main, use_wandb=not args.no_wandb,
                        run_name=f"rm-{out.name}")
    tok = AutoTokenizer.from_pretrained(args.policy)
    rows = load_prompts(args.train, tok, max_prompt_tokens=None, shuffle_seed=args.seed, limit=args.prompts)
    rows = rows.rows()
    n_held = max(1, int(len(rows) * args.heldout_frac))
    splits = {"train": rows[n_held:], "heldout": rows[:n_held]}  # held out by prompt, not by sample

    t0 = time.time()
    max_prompt = max(len(r["prompt_ids"]) for r in rows)
    rollout = RolloutEngine(args.policy, RolloutConfig(max_response_tokens=args.max_new_tokens), dist,
                            seed=args.seed, max_model_len=max_prompt + args.max_new_tokens)
    scorer = verifier_scorer(RewardScorer())
    data = {}
    for name, split_rows in splits.items():
        offset, mine = rank_slice(split_rows, dist.rank, dist.world_size)
        batch = collect_experience(mine, first_index=offset, rollout=rollout, scorer=scorer,
                                   pad_id=tok.pad_token_id, device=dist.device, n=args.samples_per_prompt,
                                   temperature=args.temperature, top_p=1.0, max_tokens=args.max_new_tokens,
                                   stop=None, seed=args.seed * 1000 + dist.rank + (7 if name == "heldout" else 0))
        batch["label"] = torch.where(batch["correct"] > 0, 1.0, -1.0)
        data[name] = batch
    rollout.close()
    sample_minutes = (time.time() - t0) / 60
    pos = gather_cat(data["train"]["label"])
    log.info(f"sampled {len(pos)} training responses ({(pos > 0).float().mean():.1%} correct) "
             f"in {sample_minutes:.1f} min")

    train = data["train"]
    B = train["input_ids"].shape[0]
    # Class weights from the global positive rate: each class carries half of the loss.
    pos_rate = float((pos > 0).float().mean().clamp(1e-3, 1 - 1e-3))
    train["weight"] = torch.where(train["label"] > 0, 0.5 / pos_rate, 0.5 / (1 - pos_rate))
    steps_per_epoch = max(1, B // max(1, args.batch_size // dist.world_size))
    critic = CriticEngine("policy", args.policy,
                          CriticConfig(lr=args.lr, warmup_steps=10, lr_schedule="cosine",
                                       micro_batch_size=args.micro_batch_size, value_clip=None),
                          dist, total_optimizer_steps=steps_per_epoch * args.epochs)
    log.start_phase("rm", total=steps_per_epoch * args.epochs)
    step = 0
    for epoch in range(args.epochs):
        order = torch.randperm(B, generator=torch.Generator().manual_seed(args.seed + epoch))
        for idx in order.chunk(steps_per_epoch):
            mb = slice_batch(train, idx)
            step += 1
            log.log(critic.train_step(mb, FinalTokenMSE(mb), args.micro_batch_size), step=step, phase="rm")

    held = data["heldout"]
    with torch.no_grad():
        pred = final_token_values(critic.forward_values(held), held["response_mask"])
    pred, label = gather_cat(pred), gather_cat(held["label"])
    correct_pred = (pred > 0) == (label > 0)
    summary = {
        "heldout_samples": int(len(label)),
        "heldout_positive_frac": float((label > 0).float().mean()),
        "heldout_accuracy": float(correct_pred.float().mean()),
        # Balanced accuracy: the mean of per-class accuracies, honest when labels are imbalanced.
        "heldout_balanced_accuracy": float(0.5 * (correct_pred[label > 0].float().mean().nan_to_num(0)
                                                  + correct_pred[label < 0].float().mean().nan_to_num(0))),
        "train_samples": int(len(pos)),
        "train_positive_frac": float((pos > 0).float().mean()),
        "sample_minutes": round(sample_minutes, 2),
        "total_minutes": round((time.time() - t0) / 60, 2),
    }
    critic.export(str(out))
    if dist.is_main:
        (out / "rm_summary.json").write_text(json.dumps(summary, indent=1))
        log.info(f"reward model done: {json.dumps(summary)}")
    log.close()
    D.shutdown()
    return summary
