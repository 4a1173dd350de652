"""The TRL side of `vcppo bench step`: TRL's PPOTrainer on the same model, tokenizer, prompts and
batch, in its own process (``python -m vcppo.bench.trl_step ... --worker trl,WORKDIR,MB,OUT``).

TRL's PPOTrainer lives in ``trl.experimental.ppo`` up to TRL 1.12.0; the 1.13.0 and 1.16.0 wheels
have no ``ppo`` module, so the `trl` extra pins 1.12.0.

What TRL's step computes (its own loop, ``PPOTrainer.train``), against vcppo's:
  * rollout: HF ``generate`` of the 64 queries in ``local_rollout_forward_batch_size`` chunks
    (TRL's default 64 at every setting: one batch), sampling logprobs from the generation's logits
    (so TRL makes no separate old-logprob pass);
  * a reference forward, a value-model forward and a reward-model forward per chunk;
  * GAE (a Python loop over positions), whitening;
  * one joint update: policy + value model forwards, loss = pg + vf_coef * vf, one backward, AdamW
    over both models, ``per_device_train_batch_size`` = the micro-batch, gradient accumulation to 64.
The reward model: TRL needs a model; ours is a rule verifier. TRL gets a sequence-classification
model of the same size (the policy's backbone + a fresh 1-output head), whose forward time is
reported as its own phase so it can be set aside. Each prompt is repeated ``--n`` times (TRL has
no n-samples-per-prompt); TRL's dataloader shuffles the 6 x 64 rows, so a step holds 64 of them.
Phases are timed by wrapping TRL's module-level ``batch_generation`` / ``forward`` / ``get_reward``.
"""
from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

COMPUTES = ("TRL 1.12 PPOTrainer: HF generate (logprobs from its logits), reference fwd, value fwd, "
            "reward-model fwd (same-size seq-classification model), joint policy+value update")


class PhaseClock:
    """Seconds per phase of the step in progress, and each finished step's figures."""

    def __init__(self):
        self.current: dict[str, float] = {}
        self.steps: list[dict] = []
        self.mark = time.perf_counter()

    def wrap(self, fn, name_of):
        def timed(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                name = name_of(*a)
                self.current[name] = self.current.get(name, 0.0) + time.perf_counter() - t
        return timed

    def end_step(self, response_tokens: float) -> None:
        now = time.perf_counter()
        wall = now - self.mark
        phases = dict(self.current)
        phases["update_and_rest"] = wall - sum(phases.values())
        self.steps.append({"step_s": wall, "phases": phases, "response_tokens": response_tokens})
        self.current, self.mark = {}, now


def _prompt_rows(args, workdir: Path, micro_batch: int, tokenizer) -> list[list[int]]:
    """The prompt ids vcppo's run draws: our loader and PromptStream, the same seed and batches."""
    from vcppo.bench.step import train_overrides
    from vcppo.preflight import load_command_config
    from vcppo.driver.context import load_prompt_set

    cfg = load_command_config(["vcppo", *train_overrides(args, workdir, micro_batch)], "train", default_config=None)
    stream = load_prompt_set(cfg, cfg.data.train_files, tokenizer, max_prompt_tokens=cfg.data.max_prompt_tokens,
                             shuffle_seed=cfg.trainer.seed).stream(seed=cfg.trainer.seed)
    rows = [r for _ in range(args.steps) for r in stream.next_batch(args.prompts)]
    return [list(r["prompt_ids"]) for r in rows for _ in range(args.n)]


def run_trl(args, workdir: Path, micro_batch: int) -> dict:
    import torch
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer, TrainerCallback
    from trl.experimental.ppo import PPOConfig, PPOTrainer
    from trl.experimental.ppo import ppo_trainer as trl_ppo

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model_dir = str(workdir / f"model-{args.size}")
    tok = AutoTokenizer.from_pretrained(model_dir)
    batch = args.prompts * args.n
    dataset = Dataset.from_dict({"input_ids": _prompt_rows(args, workdir, micro_batch, tok)})
    load = dict(dtype=torch.float32)
    policy, ref = (AutoModelForCausalLM.from_pretrained(model_dir, **load) for _ in range(2))
    value, reward = (AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=1, **load)
                     for _ in range(2))
    clock = PhaseClock()
    trainer_box: list = []

    def reward_or_values(model, *_):
        return "reward_model" if model is trainer_box[0].reward_model else "values"

    def ref_or_train(model, *_):
        return "reference" if model is trainer_box[0].ref_model else "train_forward"

    trl_ppo.batch_generation = clock.wrap(trl_ppo.batch_generation, lambda *a: "rollout")
    trl_ppo.get_reward = clock.wrap(trl_ppo.get_reward, reward_or_values)
    trl_ppo.forward = clock.wrap(trl_ppo.forward, ref_or_train)

    response_tokens: list[float] = []  # per rollout chunk
    truncate = trl_ppo.truncate_response

    def counting_truncate(stop_id, pad_id, responses):
        out = truncate(stop_id, pad_id, responses)
        response_tokens.append(float((out != pad_id).sum()))  # up to and including the first EOS
        return out

    class StepEnd(TrainerCallback):
        def on_train_begin(self, *a, **k):
            clock.mark, clock.current = time.perf_counter(), {}

        def on_step_end(self, *a, **k):
            clock.end_step(0.0)  # tokens filled in from the chunk counts below

    trl_ppo.truncate_response = counting_truncate
    with tempfile.TemporaryDirectory() as out_dir:
        cfg = _ppo_config(PPOConfig, args, out_dir, micro_batch, batch)
        trainer = PPOTrainer(args=cfg, processing_class=tok, model=policy, ref_model=ref, reward_model=reward,
                             value_model=value, train_dataset=dataset, callbacks=[StepEnd()])
        trainer_box.append(trainer)
        t0 = time.perf_counter()
        trainer.train()
    steps = clock.steps
    for s, n in zip(steps, _per_step_tokens(response_tokens, len(steps))):
        s["response_tokens"] = n
    return {"side": "trl", "trl_version": trl.__version__, "torch_threads": torch.get_num_threads(),
            "train_s": time.perf_counter() - t0, "steps": steps, "computes": COMPUTES}


def _ppo_config(ppo_config_cls, args, out_dir: str, micro_batch: int, batch: int):
    """TRL's PPOConfig for the bench's workload: 1 epoch, 1 mini-batch, fp32 (on the GPU where there is
    one, as vcppo's side), k1 KL."""
    import torch

    return ppo_config_cls(
        output_dir=out_dir, use_cpu=not torch.cuda.is_available(), bf16=False, fp16=False, gradient_checkpointing=False,
        per_device_train_batch_size=micro_batch, gradient_accumulation_steps=batch // micro_batch,
        num_mini_batches=1, num_ppo_epochs=1, local_rollout_forward_batch_size=batch,
        response_length=args.max_tokens, stop_token="eos", temperature=1.0,
        kl_coef=args.kl_coef, kl_estimator="k1", total_episodes=args.steps * batch,
        num_sample_generations=0, report_to="none", save_strategy="no", logging_steps=1,
        learning_rate=5e-5, seed=args.seed, dataloader_num_workers=0, disable_tqdm=True)


def _per_step_tokens(chunks: list[float], n_steps: int) -> list[float]:
    """Response tokens per step from the per-chunk counts (one chunk per step at our settings)."""
    per = max(1, len(chunks) // max(n_steps, 1))
    return [sum(chunks[i * per:(i + 1) * per]) for i in range(n_steps)]


def main(argv=None) -> dict:
    from vcppo.bench.step import _parse

    args = _parse(list(sys.argv[1:] if argv is None else argv))
    _side, workdir, mb, out = args.worker.split(",")
    result = run_trl(args, Path(workdir), int(mb))
    Path(out).write_text(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
