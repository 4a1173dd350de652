"""RL with an error-aware oracle in place of the critic: what would a critic that knows give? (docs/results.md)

VC-PPO's value pretraining is meant to teach the critic *where* a trace goes wrong ("knowledge
injection", paper sec. 4.1); with lambda_actor < 1 the advantage then lands on the wrong step
instead of on every token of the response. Our critic learns only the mean on `add`, so this
script runs the real PPO step (vLLM rollout, DeepSpeed actor, Decoupled-GAE, the demo's actor
settings) with the critic's values replaced by

* ``--values oracle``: the batch's mean return until the token that completes the first wrong
  trace line (``vcppo.data.tasks.first_wrong_line``), ``reward.wrong_score`` from there on -- the
  values of a critic that checks the arithmetic and knows nothing else;
* ``--values mean``: the batch's mean return on every token -- the critic we actually get (EV 0),
  as the control of the same script.

Each step also reports how its update moved the summed logprob of the batch's own responses
(``shift/*``): correct ones, and wrong ones before / on / after their first wrong line.

Validation runs every ``trainer.val_every`` steps exactly as in ``vcppo train``; metrics go to
``runs/<trainer.run_name>/metrics.jsonl``. Example (in the directory where the demo ran):

    python scripts/oracle_critic_rl.py --values oracle artifacts/demo_config.yaml \\
        trainer.run_name=oracle-l95 algorithm.lambda_actor=0.95 actor.lr=1e-4 actor.warmup_steps=5 \\
        trainer.total_steps=20
"""
from __future__ import annotations

import argparse
import re
from pathlib import Path

import torch

USER_TURN = re.compile(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", re.S)


def error_span(tokenizer, prompt_ids: list[int], response_ids: list[int]) -> tuple[int, int] | None:
    """(first token of the first wrong trace line, first token whose state contains that whole
    line), or None when every trace line is right."""
    from vcppo.data.tasks import first_wrong_line_tokens

    text = tokenizer.decode(prompt_ids, skip_special_tokens=False)
    turn = USER_TURN.search(text)
    prompt = turn.group(1) if turn else tokenizer.decode(prompt_ids, skip_special_tokens=True)
    return first_wrong_line_tokens(prompt, [tokenizer.decode([t]) for t in response_ids])


def error_spans(batch, tokenizer) -> list[tuple[int, int] | None]:
    """:func:`error_span` of every sequence of the batch."""
    P, out = batch.prompt_len, []
    for b in range(batch.size):
        n = int(batch.policy_mask[b].sum())
        prompt = [t for t, a in zip(batch.input_ids[b, :P].tolist(), batch.attention_mask[b, :P].tolist()) if a]
        out.append(error_span(tokenizer, prompt, batch.responses[b, :n].tolist()))
    return out


def baseline_values(batch, spans: list, mode: str, wrong_score: float) -> torch.Tensor:
    """(B, R) values for GAE: the batch's mean return, and (oracle) the wrong score once an error
    is visible."""
    mask = batch.policy_mask
    values = torch.full_like(mask, float(batch.scores.mean())) * mask
    if mode == "oracle":
        for b, span in enumerate(spans):
            if span is not None:
                values[b, span[1]:int(mask[b].sum())] = wrong_score
    return values


def logprob_shift(batch, spans: list, new_logprobs: torch.Tensor) -> dict:
    """How one update moved the summed logprob of each sequence (mean per sequence), by segment:
    correct responses; wrong ones before their first wrong line, on it, and after it."""
    delta = (new_logprobs - batch.old_logprobs) * batch.policy_mask
    parts: dict[str, list[float]] = {}
    for b, span in enumerate(spans):
        if batch.scores[b] > 0:
            segments = {"correct": delta[b]}
        elif span is None:
            segments = {"wrong_without_trace_error": delta[b]}
        else:
            segments = {"before_error": delta[b, :span[0]], "error_line": delta[b, span[0]:span[1]],
                        "after_error": delta[b, span[1]:]}
        for name, d in segments.items():
            parts.setdefault(name, []).append(float(d.sum()))
    return {f"shift/{k}": sum(v) / len(v) for k, v in parts.items()}


def run(args: argparse.Namespace) -> None:
    from transformers import AutoTokenizer

    import dataclasses

    from vcppo.algos.stats import explained_variance
    from vcppo.config.load import load_command_config
    from vcppo.driver.step.update import estimate
    from vcppo.driver.context import RunContext
    from vcppo.driver.step.experience_maker import ExperienceMaker
    from vcppo.driver.step.metrics import log_validation
    from vcppo.driver.step.step_plan import Source, ppo_plan
    from vcppo.driver.step.update import update_actor
    from vcppo.experience import ActorBatch

    cfg = load_command_config([args.config, *args.overrides], "train", default_config=None)
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.tokenizer_path)
    ctx = RunContext.create(cfg, Path(cfg.trainer.output_root) / cfg.trainer.run_name)
    try:
        # the baseline replaces the critic; pi_old comes from a pass before the actor's update
        plan = dataclasses.replace(ppo_plan(cfg, ctx.dist.device), pi_old=Source.PASS, entropy=Source.NONE)
        maker = ExperienceMaker.for_run(ctx, plan)
        log_validation(ctx, step=0)
        for step in range(1, cfg.trainer.total_steps + 1):
            batch, _ = maker.make("ppo", step)
            spans = error_spans(batch, tokenizer)
            values = baseline_values(batch, spans, args.values, cfg.reward.wrong_score)
            adv = estimate(batch, batch.token_rewards, values, cfg.algorithm, cfg.algorithm.lambda_critic)
            old_logprobs, _ = ctx.actor.forward_logprobs(batch)
            actor_batch = ActorBatch(**vars(batch), advantages=adv.advantages, old_logprobs=old_logprobs)
            metrics = update_actor(ctx, plan, actor_batch, step).metrics
            metrics.update(logprob_shift(actor_batch, spans, ctx.actor.forward_logprobs(batch)[0]))
            ctx.sync_weights()
            metrics.update({"reward/accuracy": float((batch.scores > 0).float().mean()),
                            "oracle/wrong_with_trace_error": sum(span is not None for span, score in
                                                                 zip(spans, batch.scores.tolist()) if score <= 0)
                            / max(1, int((batch.scores <= 0).sum())),
                            "baseline/explained_variance": float(explained_variance(
                                values, adv.returns, batch.policy_mask))})
            print(f"step {step}: " + ", ".join(f"{k}={v:.3f}" for k, v in sorted(metrics.items())
                                               if k.startswith(("shift/", "reward/", "oracle/", "baseline/"))),
                  flush=True)
            ctx.log.log(metrics, step=step, phase="ppo")
            if step % cfg.trainer.val_every == 0 or step == cfg.trainer.total_steps:
                log_validation(ctx, step=step)
    finally:
        ctx.close(clean=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--values", choices=("oracle", "mean"), required=True)
    p.add_argument("config", help="a train config (e.g. artifacts/demo_config.yaml)")
    p.add_argument("overrides", nargs="*", help="key=value overrides")
    run(p.parse_args())


if __name__ == "__main__":
    main()
