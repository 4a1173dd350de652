"""`vcppo sft [CONFIG] sft.init_model=DIR [key=value ...]`: cold-start supervised fine-tuning of the
policy on the task's reasoning traces (``data.train_files``, ``data.val_files``).

The paper starts RL from a cold-start SFT model that already writes ``<think>...</think>``; this
is that step. It trains with the same DeepSpeed actor engine as RL (so ZeRO-3, micro-batching
and checkpoint export behave identically), evaluates greedy accuracy on the val split with vLLM
(weights synced from the trainer, as in RL), and saves an HF-format checkpoint to
``sft.output_dir`` (by default ``model.policy_path``, where RL starts).

The loss is the token-mean NLL of the response (trace + answer + end token); prompt tokens are
not trained on.
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

from vcppo.preflight import load_command_config
from vcppo.driver.context import load_prompt_set, make_logger, make_scorer, pad_token_id, seed_everything
from vcppo.driver.step.sampler import make_sampler, rank_slice
from vcppo.driver.step.validation import evaluate
from vcppo.runtime import dist as D
from vcppo.engines.actor import ActorEngine
from vcppo.engines.loss_contract import ResponseNLL
from vcppo.engines.rollout_choice import make_rollout_engine
from vcppo.experience import make_layout
from vcppo.config.schema import Config


NLL_METRIC = "sft/nll_token"


def main(argv: list[str]) -> int:
    run_sft(load_command_config(argv, "sft"))
    return 0


def _load_data(cfg: Config, tokenizer) -> tuple:
    """(training PromptSet, validation rows); prompts are not length-filtered for SFT."""
    train = load_prompt_set(cfg, cfg.data.train_files, tokenizer, max_prompt_tokens=None,
                            shuffle_seed=cfg.trainer.seed)
    if cfg.sft.solution_field not in train.dataset.column_names:
        raise ValueError(f"config key 'sft.solution_field': {cfg.sft.solution_field!r} is not a column of "
                         f"{cfg.data.train_files}; available: {train.dataset.column_names}")
    val_rows = []
    if cfg.data.val_files:
        val_rows = load_prompt_set(cfg, cfg.data.val_files, tokenizer, max_prompt_tokens=None, shuffle_seed=None,
                                   limit=cfg.sft.eval_prompts).rows()
    return train, val_rows


def target_shortfall(summary: dict, target_accuracy: float) -> str | None:
    """Why an SFT run that was asked to reach ``target_accuracy`` is not a cold start RL can use, or
    None. A checkpoint left below the target by the schedule or the time cap can sit on a plateau
    where one skill of the task (on `add`: reading one digit of the prompt) is missing entirely;
    RL's 1-bit rewards then only reinforce lucky guesses and do not improve it (docs/results.md,
    "How robust is the demo")."""
    accuracy = summary.get("val/pass@1_greedy")
    if not target_accuracy or accuracy is None or accuracy >= target_accuracy:
        return None
    why = f" (by sft.{summary['stopped_by']})" if "stopped_by" in summary else ""
    return (f"SFT stopped at step {summary.get('steps', '?')}{why} with greedy val accuracy "
            f"{accuracy:.3f}, below sft.target_accuracy {target_accuracy}. RL from a checkpoint that has not "
            f"learned the task may not improve on it; give SFT more sft.steps or sft.max_minutes.")


def _write_summary(summary: dict, out: Path, target_accuracy: float, log) -> None:
    short = target_shortfall(summary, target_accuracy)
    if short:
        log.info(f"WARNING: {short}")
    (out / "sft_summary.json").write_text(json.dumps(summary, indent=1))
    log.info(f"SFT done: {json.dumps(summary)}")


def _validation_sampler(cfg: Config, dist, max_len: int, scorer, log):
    """The rollout engine that validates the SFT policy, and its sampler (episodes with ``rollout.env``)."""
    rollout = make_rollout_engine(cfg.sft.init_model, cfg.rollout, dist, cfg.trainer.seed, max_len, log=log.info)
    return rollout, make_sampler(cfg, rollout, scorer, max_model_len=max_len)


def run_sft(cfg: Config) -> dict:
    from transformers import AutoTokenizer

    s, seed = cfg.sft, cfg.trainer.seed
    dist = D.init_distributed(cfg.trainer.device, **D.timeouts(cfg.trainer))
    seed_everything(seed)
    out = Path(s.output_dir)
    tok = AutoTokenizer.from_pretrained(s.init_model)
    train, val_rows = _load_data(cfg, tok)
    stream = train.stream(seed=seed)
    log = make_logger(cfg, out, dist, run_name=f"sft-{out.name}")
    actor = ActorEngine(s.init_model, s, dist, total_optimizer_steps=s.steps, dtype=cfg.model.dtype)
    max_len = max(len(r) for r in train.dataset["prompt_ids"]) + cfg.rollout.max_response_tokens
    scorer = make_scorer(cfg)
    rollout, sampler = _validation_sampler(cfg, dist, max_len, scorer, log) if val_rows else (None, None)

    def eval_now(step: int) -> dict:
        rollout.sync_weights(actor.named_parameters_gathered())
        m = evaluate(sampler, val_rows, dist=dist, sampling=cfg.rollout, n_samples=0, ks=[], seed=seed)
        log.log(m, step=step, phase="sft_val")
        log.info(f"step {step}: val greedy accuracy {m['val/pass@1_greedy']:.3f} "
                 f"(mean length {m['val/response_length_greedy']:.0f} tokens)")
        return m

    start, metrics, evaluated_at, stopped_by = time.time(), {}, -1, "steps"
    log.start_phase("sft", total=s.steps)
    for step in range(1, s.steps + 1):
        _, mine = rank_slice(stream.next_batch(s.batch_size), dist.rank, dist.world_size)
        responses = [tok.encode(r[s.solution_field], add_special_tokens=False) + [tok.eos_token_id] for r in mine]
        batch = make_layout([r["prompt_ids"] for r in mine], responses, pad_id=pad_token_id(tok), device=dist.device)
        t0 = time.perf_counter()
        m = actor.train_step(batch, ResponseNLL(NLL_METRIC))
        m["time/step_s"] = time.perf_counter() - t0
        log.log(m, step=step, phase="sft")
        if s.save_every and step % s.save_every == 0 and step < s.steps:
            actor.export_hf(str(out / f"step_{step}"))
        if s.eval_every and step % s.eval_every == 0 and step >= s.eval_after and val_rows and step < s.steps:
            metrics, evaluated_at = eval_now(step), step
            if s.target_accuracy and metrics["val/pass@1_greedy"] >= s.target_accuracy:
                stopped_by = "target_accuracy"
        if s.max_minutes and (time.time() - start) / 60 > s.max_minutes and stopped_by == "steps":
            stopped_by = "max_minutes"
        if stopped_by != "steps":
            log.info(f"stopping at step {step}: sft.{stopped_by} {getattr(s, stopped_by)} reached")
            break
    train_minutes = (time.time() - start) / 60
    if val_rows and evaluated_at != step:
        metrics = eval_now(step)
    actor.export_hf(str(out))
    summary = {"steps": step, "train_minutes": round(train_minutes, 2), "stopped_by": stopped_by,
               "final_nll_token": m.get(NLL_METRIC, math.nan), **metrics}
    if dist.is_main:
        _write_summary(summary, out, s.target_accuracy, log)
    log.close()
    if rollout is not None:
        rollout.close(final=True)
    actor.close()
    D.shutdown(wait_for_peers=True)
    return summary
