"""`vcppo bench grpo-trl`: TRL's GRPOTrainer on a vcppo run's own model, data, reward and sample budget.

    vcppo bench grpo-trl CONFIG [section.key=value ...] [--save-at 10,20] [--eval] [--out DIR] [--json PATH]

CONFIG and the overrides are what ``vcppo train`` would take (a ``grpo`` or ``drgrpo`` run); the bench reads
its settings from them and hands TRL the same ones, so the two sides differ only in the trainer:

  * the model ``model.policy_path`` in ``model.dtype``, the prompts of ``data.train_files`` through the
    tokenizer's own chat template, the reward ``reward.functions_by_source`` (or ``reward.function``) gives;
  * ``trainer.prompts_per_step`` x ``rollout.n_samples_per_prompt`` samples a step at
    ``rollout.temperature``, at most ``rollout.max_response_tokens`` each, for ``trainer.total_steps`` steps;
  * ``actor.ppo_mini_batches`` optimizer steps a batch (TRL's ``steps_per_generation``), AdamW at
    ``actor.lr`` / ``betas`` / ``weight_decay`` with ``grad_clip``, the clip ``eps_low`` / ``eps_high``,
    ``algorithm.kl_coef`` as TRL's ``beta``;
  * GRPO's std-scaled group advantage with a token mean over each mini-batch (TRL's ``bnpo``, vcppo's
    ``token-mean``), or Dr. GRPO's unscaled one with the token sum over ``max_response_tokens`` (TRL's
    ``dr_grpo``, vcppo's ``seq-mean-token-sum-norm``).

TRL samples with HF ``generate`` in the training process (its vLLM path needs a GPU); vcppo samples
with vLLM. ``--save-at`` writes the policy at those steps and ``--eval`` scores each with ``vcppo eval``
on the config's ``eval`` section, as a vcppo run's policy is scored. Needs TRL (``pip install -e .[trl]``).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from vcppo.algos import estimators
from vcppo.algos.losses import policy_loss as clipped_surrogate
from vcppo.config.load import load_config
from vcppo.config.schema import Config
from vcppo.engines.engine_setup import resolve_dtype
from vcppo.methods import estimator_fn, policy_loss_fn

LOSS_OF_AGG = {"token-mean": "bnpo", "seq-mean-token-sum-norm": "dr_grpo"}


def trl_settings(cfg: Config, out_dir: str) -> dict:
    """GRPOConfig's keyword arguments for the run ``cfg`` describes; one line naming the key vcppo has
    and TRL's GRPOTrainer does not (a critic, another estimator or loss) otherwise."""
    alg, actor, n = cfg.algorithm, cfg.actor, cfg.rollout.n_samples_per_prompt
    if estimator_fn(alg.advantage_estimator) is not estimators.grpo:  # TRL's GRPOTrainer computes this one
        raise ValueError(f"algorithm.advantage_estimator={alg.advantage_estimator}: the TRL bench runs GRPO only "
                         "(a grpo or drgrpo config)")
    if policy_loss_fn(alg.policy_loss) is not clipped_surrogate:  # and the clipped surrogate per token
        raise ValueError(f"algorithm.policy_loss={alg.policy_loss}: TRL's GRPO loss is the clipped surrogate "
                         "per token, vcppo's default policy loss")
    if alg.loss_agg not in LOSS_OF_AGG:
        raise ValueError(f"algorithm.loss_agg={alg.loss_agg}: TRL has {sorted(LOSS_OF_AGG)} as bnpo / dr_grpo")
    samples = cfg.trainer.prompts_per_step * n
    if samples % actor.ppo_mini_batches:
        raise ValueError(f"actor.ppo_mini_batches={actor.ppo_mini_batches} does not divide {samples} samples a step")
    # vcppo trains bf16 with fp32 master weights in the optimizer; TRL's equivalent is fp32 weights (as run
    # loads them) under bf16 autocast: pure bf16 weights would round most lr-sized updates away
    bf16 = resolve_dtype(cfg.model.dtype, torch.device("cpu")) == torch.bfloat16
    return dict(
        output_dir=out_dir, use_cpu=True, bf16=bf16, seed=cfg.trainer.seed, data_seed=cfg.trainer.seed,
        per_device_train_batch_size=samples // actor.ppo_mini_batches, gradient_accumulation_steps=1,
        steps_per_generation=actor.ppo_mini_batches, num_generations=n, num_iterations=1,
        max_steps=cfg.trainer.total_steps * actor.ppo_mini_batches,
        max_completion_length=cfg.rollout.max_response_tokens, temperature=cfg.rollout.temperature,
        top_p=1.0, top_k=0, learning_rate=actor.lr, lr_scheduler_type="constant", warmup_steps=0,
        adam_beta1=actor.betas[0], adam_beta2=actor.betas[1], adam_epsilon=1e-8, weight_decay=actor.weight_decay,
        max_grad_norm=actor.grad_clip, epsilon=alg.eps_low, epsilon_high=alg.eps_high, beta=alg.kl_coef,
        loss_type=LOSS_OF_AGG[alg.loss_agg], scale_rewards="group" if alg.grpo_scale_by_std else "none",
        logging_steps=actor.ppo_mini_batches, save_strategy="no", report_to=[], disable_tqdm=True,
    )


def reward_func(cfg: Config):
    """TRL's reward-function signature around the run's own scorer (routing by ``data_source`` included):
    completions are chat messages, each row's reward info travels as JSON text."""
    from vcppo.driver.context import make_scorer
    from vcppo.rewards.routing import GroundTruth

    scorer = make_scorer(cfg)

    def rewards(prompts, completions, ground_truth, reward_info, **_):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        truths = [GroundTruth(t, json.loads(i)) for t, i in zip(ground_truth, reward_info)]
        return scorer(texts, truths)[0]

    rewards.__name__ = "vcppo_reward"
    return rewards, scorer


def train_rows(cfg: Config, tokenizer):
    """The run's training prompts (its reader, field names and prompt-length filter) as TRL's dataset."""
    import datasets

    from vcppo.driver.context import load_prompt_set

    prompts = load_prompt_set(cfg, cfg.data.train_files, tokenizer, max_prompt_tokens=cfg.data.max_prompt_tokens,
                              shuffle_seed=cfg.trainer.seed)
    rows = [{"prompt": row["prompt"], "ground_truth": str(row["answer"]),
             "reward_info": json.dumps(row["answer"].reward_info, default=str)} for row in prompts.rows()]
    return datasets.Dataset.from_list(rows)


def _clock(per_step: int, save_at: set[int], out_dir: Path, tokenizer):
    """A TrainerCallback timing each RL step (``per_step`` optimizer steps) in wall seconds, keeping TRL's
    logs, and saving the policy, untimed, at the steps in ``save_at``."""
    from transformers import TrainerCallback

    class Clock(TrainerCallback):
        def __init__(self):
            self.step_s: list[float] = []
            self.logs: list[dict] = []
            self.saved: dict[int, str] = {}
            self._t = time.perf_counter()

        def on_step_end(self, args, state, control, model=None, **_):
            if state.global_step % per_step:
                return control
            self.step_s.append(time.perf_counter() - self._t)
            rl_step = state.global_step // per_step
            if rl_step in save_at:
                path = out_dir / f"step_{rl_step}"
                model.save_pretrained(path)
                tokenizer.save_pretrained(path)
                self.saved[rl_step] = str(path)
            self._t = time.perf_counter()
            return control

        def on_log(self, args, state, control, logs=None, **_):
            self.logs.append({"step": state.global_step / per_step, **(logs or {})})
            return control

    return Clock()


def run(cfg: Config, out_dir: Path, save_at: set[int]) -> dict:
    """Train with TRL's GRPOTrainer; the settings given, seconds per step, TRL's logs, the policies saved."""
    import importlib

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # TRL's vLLM path needs CUDA, and importing it pulls in vLLM's GPU weight-transfer code, which the CPU
    # build of vLLM lacks: TRL samples with HF generate here, so it is told vLLM is absent.
    importlib.import_module("trl.import_utils").is_vllm_available = lambda *_, **__: False
    from trl import GRPOConfig, GRPOTrainer

    settings = trl_settings(cfg, str(out_dir / "trl"))
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.policy_path)
    model = AutoModelForCausalLM.from_pretrained(cfg.model.policy_path, dtype=torch.float32)
    rewards, scorer = reward_func(cfg)
    clock = _clock(cfg.actor.ppo_mini_batches, save_at | {cfg.trainer.total_steps}, out_dir, tokenizer)
    trainer = GRPOTrainer(model=model, reward_funcs=rewards, args=GRPOConfig(**settings),
                          train_dataset=train_rows(cfg, tokenizer), processing_class=tokenizer, callbacks=[clock])
    t = time.perf_counter()
    try:
        trainer.train()
    finally:
        scorer.close()
    return {"settings": {k: v for k, v in settings.items() if k != "output_dir"}, "train_s": time.perf_counter() - t,
            "step_s": clock.step_s, "logs": clock.logs, "saved": clock.saved}


def evaluate(config: str, overrides: list[str], saved: dict[int, str]) -> dict[int, dict]:
    """``vcppo eval`` of each saved policy on the config's ``eval`` section."""
    out = {}
    for step, path in sorted(saved.items()):
        res_path = Path(path) / "eval.json"
        cmd = [sys.executable, "-m", "vcppo.cli", "eval", config, *overrides, f"eval.model_path={path}",
               f"eval.output_json={res_path}", f"eval.samples_jsonl={Path(path) / 'eval.samples.jsonl'}"]
        subprocess.run(cmd, check=True)
        out[step] = json.loads(res_path.read_text())
    return out


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="vcppo bench grpo-trl", description=__doc__.split("\n")[0])
    p.add_argument("config", help="the run's config (as `vcppo train` takes it)")
    p.add_argument("overrides", nargs="*", help="section.key=value")
    p.add_argument("--save-at", default="", help="steps whose policy is saved (the last always is), e.g. 10,20")
    p.add_argument("--eval", action="store_true", help="score each saved policy with `vcppo eval`")
    p.add_argument("--out", default="runs/bench_grpo_trl", help="where TRL's run and the policies go")
    p.add_argument("--json", default=None, help="write the figures here (default OUT/grpo_trl.json)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = _parse(list(sys.argv[1:] if argv is None else argv))
    cfg = load_config(args.config, args.overrides)
    try:
        import trl  # noqa: F401
    except ImportError:
        raise SystemExit("vcppo bench grpo-trl: TRL is not installed; pip install -e .[trl]")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_at = {int(s) for s in args.save_at.split(",") if s}
    result = {"config": args.config, "overrides": args.overrides, "trl": trl.__version__,
              **run(cfg, out_dir, save_at)}
    if args.eval:
        result["eval"] = evaluate(args.config, args.overrides, result["saved"])
    steps = result["step_s"]
    print(f"TRL GRPOTrainer: {len(steps)} steps, {result['train_s'] / 60:.1f} min, "
          f"median step {sorted(steps)[len(steps) // 2]:.1f} s")
    for step, ev in result.get("eval", {}).items():
        print(f"  step {step}: {json.dumps(ev)}")
    Path(args.json or out_dir / "grpo_trl.json").write_text(json.dumps(result, indent=1, default=str))
    return result


if __name__ == "__main__":
    main()
