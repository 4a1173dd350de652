"""`vcppo rm [CONFIG] [key=value ...]`: an outcome reward model, trained only at the final token — the convention the
VC-PPO paper criticises (sec. 3.1). The plain-PPO baseline initialises its critic from it.

Data: the SFT policy samples responses to training prompts (vLLM); the rule verifier labels each
(+1 correct / -1 wrong). Model: the policy's backbone + a scalar head (the critic's ValueModel
format, so the result loads directly as a critic). Loss: squared error between the head's output
at the last response token and the label; no other position is trained, which is exactly why
such a critic scores early tokens badly. Held-out accuracy = sign agreement on unseen prompts.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from vcppo.preflight import load_command_config
from vcppo.driver.context import load_prompt_set, make_logger, make_scorer, pad_token_id, seed_everything
from vcppo.driver.step.sampler import collect_rollout, rollout_share
from vcppo.runtime import dist as D
from vcppo.engines.critic import CriticEngine
from vcppo.engines.loss_contract import RESPONSE, GlobalCounts, ModelOutputs, response_counts
from vcppo.runtime.dist import DistInfo
from vcppo.runtime.collectives import gather_cat
from vcppo.engines.rollout_choice import make_rollout_engine
from vcppo.experience import Rollout
from vcppo.config.schema import Config


def labels_of(batch: Rollout) -> torch.Tensor:
    """(B,) +1 for a verified-correct response, -1 otherwise."""
    return torch.where(batch.correct > 0, 1.0, -1.0)


class FinalTokenMSE:
    """0.5 * w * (V(last token) - label)^2, mean over the global batch's sequences.

    ``w`` balances the classes: with a 10-20% correct rate an unweighted regression settles on
    predicting "wrong" for everything (measured: balanced accuracy 0.5). ``positive_rate`` is the
    global share of correct responses; each class then carries half of the loss.
    """
    needs_entropy = False

    def __init__(self, positive_rate: float):
        self.positive_rate = positive_rate

    count_masks = staticmethod(response_counts)

    def __call__(self, outputs: ModelOutputs, micro: Rollout, counts: GlobalCounts):
        label = labels_of(micro)
        weight = torch.where(label > 0, 0.5 / self.positive_rate, 0.5 / (1 - self.positive_rate))
        last = final_token_values(outputs.values, micro.policy_mask)
        err = last - label
        loss = 0.5 * (weight * err ** 2).sum() / counts.sequences[RESPONSE]
        return loss, {"rm/mse": (err ** 2).mean().detach(),
                      "rm/train_accuracy": ((last > 0).float() == (label > 0).float()).float().mean()}


def final_token_values(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, R) per-token values -> (B,) value at each row's last valid response token."""
    last = (mask.sum(1).long() - 1).clamp(min=0)
    return values.gather(1, last[:, None]).squeeze(1)


def main(argv: list[str]) -> int:
    train_rm(load_command_config(argv, "rm"))
    return 0


def sample_splits(cfg: Config, dist: DistInfo) -> dict[str, Rollout]:
    """Responses of the policy to the training prompts, scored: this rank's share of a "train" and
    a "heldout" split (held out by prompt, not by sample)."""
    from transformers import AutoTokenizer

    r, seed = cfg.rm, cfg.trainer.seed
    tok = AutoTokenizer.from_pretrained(r.policy_path)
    rows = load_prompt_set(cfg, cfg.data.train_files, tok, max_prompt_tokens=None, shuffle_seed=seed,
                           limit=r.prompts).rows()
    n_held = max(1, int(len(rows) * r.heldout_frac))
    max_prompt = max(len(row["prompt_ids"]) for row in rows)
    rollout = make_rollout_engine(r.policy_path, cfg.rollout, dist, seed=seed,
                                  max_model_len=max_prompt + cfg.rollout.max_response_tokens)
    scorer = make_scorer(cfg)
    data = {}
    for name, split_rows in (("train", rows[n_held:]), ("heldout", rows[:n_held])):
        sampled, kept = rollout_share(len(split_rows), dist, cfg.rollout.tensor_parallel_size)
        data[name] = collect_rollout(split_rows[sampled.start:sampled.stop], first_index=sampled.start,
                                        keep=kept, rollout=rollout, scorer=scorer, pad_id=pad_token_id(tok),
                                        device=dist.device, sampling=cfg.rollout, n=r.samples_per_prompt,
                                        seed=seed * 1000 + rollout.replica + (7 if name == "heldout" else 0))
    rollout.close()
    return data


def heldout_summary(pred: torch.Tensor, label: torch.Tensor) -> dict:
    correct_pred = (pred > 0) == (label > 0)
    return {
        "heldout_samples": int(len(label)),
        "heldout_positive_frac": float((label > 0).float().mean()),
        "heldout_accuracy": float(correct_pred.float().mean()),
        # Balanced accuracy: the mean of per-class accuracies, honest when labels are imbalanced.
        "heldout_balanced_accuracy": float(0.5 * (correct_pred[label > 0].float().mean().nan_to_num(0)
                                                  + correct_pred[label < 0].float().mean().nan_to_num(0))),
    }


def train_rm(cfg: Config) -> dict:
    r, seed = cfg.rm, cfg.trainer.seed
    dist = D.init_distributed(cfg.trainer.device, **D.timeouts(cfg.trainer))
    seed_everything(seed)
    out = Path(r.output_dir)
    log = make_logger(cfg, out, dist, run_name=f"rm-{out.name}")
    t0 = time.time()
    data = sample_splits(cfg, dist)
    sample_minutes = (time.time() - t0) / 60
    pos = gather_cat(labels_of(data["train"]))
    log.info(f"sampled {len(pos)} training responses ({(pos > 0).float().mean():.1%} correct) "
             f"in {sample_minutes:.1f} min")

    train = data["train"]
    positive_rate = float((pos > 0).float().mean().clamp(1e-3, 1 - 1e-3))
    steps_per_epoch = max(1, train.size // max(1, r.batch_size // dist.world_size))
    critic = CriticEngine("policy", r.policy_path, r, dist, total_optimizer_steps=steps_per_epoch * r.epochs,
                          dtype=cfg.model.dtype)
    log.start_phase("rm", total=steps_per_epoch * r.epochs)
    step = 0
    for epoch in range(r.epochs):
        order = torch.randperm(train.size, generator=torch.Generator().manual_seed(seed + epoch))
        for idx in order.chunk(steps_per_epoch):
            step += 1
            log.log(critic.train_step(train.select(idx), FinalTokenMSE(positive_rate)), step=step, phase="rm")

    held = data["heldout"]
    with torch.no_grad():
        pred = final_token_values(critic.forward_values(held), held.policy_mask)
    summary = {**heldout_summary(gather_cat(pred), gather_cat(labels_of(held))),
               "train_samples": int(len(pos)), "train_positive_frac": float((pos > 0).float().mean()),
               "sample_minutes": round(sample_minutes, 2), "total_minutes": round((time.time() - t0) / 60, 2)}
    critic.export(str(out))
    if dist.is_main:
        (out / "rm_summary.json").write_text(json.dumps(summary, indent=1))
        log.info(f"reward model done: {json.dumps(summary)}")
    log.close()
    D.shutdown(wait_for_peers=True)
    return summary
