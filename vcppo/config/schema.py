"""The config schema of every vcppo command: one dataclass per section, one doc line per field.

Each field carries ``metadata["doc"]`` (docs/config.md is generated from it), where it has one its
valid range or choices, checked by :func:`vcppo.config.rules.validate`, and ``metadata["resume"]``: what a
change of it does when a run resumes (:data:`RESUME_CLASSES`, enforced by
:mod:`vcppo.config.provenance`). A section's metadata may set ``resume`` for every key inside it (the
sections that `vcppo train` does not read). Loading, merging and
type coercion are OmegaConf's (:mod:`vcppo.config.load`); this module only declares (the shared
settings and the field helper in :mod:`vcppo.config.schema_base`, the other commands' sections in
:mod:`vcppo.config.schema_commands`).

A default written as ``"${section.key}"`` is an OmegaConf interpolation: it follows that key
unless set (e.g. SFT saves to ``model.policy_path``, the policy RL starts from).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from vcppo.config.placement import PLACEMENTS
from vcppo.methods import ESTIMATORS, POLICY_LOSSES
# RESUME_CLASSES and the shared settings are the schema's public names too
from vcppo.config.schema_base import (RESUME_CLASSES, EngineConfig, LoRAConfig, OptimConfig,  # noqa: F401
                                      UpdateConfig, _f)
from vcppo.config.schema_commands import DemoConfig, EvalConfig, RMConfig, SFTConfig


@dataclass
class ModelConfig:
    policy_path: str = _f("", "The initial policy (the SFT / cold-start model): a local HF directory, or a hub "
                          "id org/name[@revision] resolved through the Hugging Face cache.", resume="math")
    tokenizer_path: Optional[str] = _f(None, "Tokenizer directory or hub id; defaults to policy_path.", resume="math")
    critic_init: str = _f("policy", "Critic initialisation: 'policy' (backbone of the policy + fresh "
                          "value head), 'reward_model' (an RM incl. its head; the paper's PPO "
                          "baseline), or 'checkpoint' (a pretrained critic).",
                          choices=("policy", "reward_model", "checkpoint"), resume="math", critic=True)
    critic_path: Optional[str] = _f(None, "Directory (or hub id) of the RM or critic checkpoint when "
                                    "critic_init is 'reward_model' or 'checkpoint'.", resume="math", critic=True)
    dtype: str = _f("auto", "Training dtype: 'auto' = bf16 on CUDA, fp32 on CPU.",
                    choices=("auto", "float32", "bfloat16", "float16"), resume="math")


@dataclass
class DataConfig:
    train_files: str = _f("", "Training prompts: a .parquet / .jsonl file or a datasets save_to_disk dir.",
                          resume="math")
    val_files: Optional[str] = _f(None, "Validation prompts (same formats); validation is off if unset.", resume="free")
    prompt_field: str = _f("prompt", "Column holding the prompt: text, or a list of chat messages "
                           "{role, content} (verl's format; needs the chat template).", resume="math")
    answer_field: str = _f("answer", "Column holding the ground-truth answer, or a dotted path into nested "
                           "fields (verl: reward_model.ground_truth).", resume="math")
    reward_info_fields: Optional[List[str]] = _f(None, "Columns passed to the reward function as keyword "
                                                 "arguments; null = data_source and extra_info where the "
                                                 "file has them.", resume="math")
    max_prompt_tokens: int = _f(256, "Prompts longer than this (in tokens) are dropped, and counted.", low=1,
                                resume="math")
    use_chat_template: Optional[bool] = _f(None, "Wrap prompts with the tokenizer's chat template: true / "
                                           "false; null (or auto) = when the tokenizer has one.", resume="math")


@dataclass
class RolloutConfig:
    engine: str = _f("auto", "The sampler: 'vllm', 'hf' (transformers' generate, for machines where vLLM "
                     "cannot be installed; docs/launching.md) or 'auto' (vLLM where it imports, else hf; "
                     "the log says which and why).", choices=("auto", "vllm", "hf"), resume="numerics")
    hf_batch_tokens: int = _f(262144, "hf engine: padded (prompt + max response) tokens one generate batch holds "
                              "at most; rows are batched by prompt length under it.", low=1, resume="numerics")
    n_samples_per_prompt: int = _f(4, "Responses sampled per prompt (GRPO/VAPO group size).", low=1, resume="math")
    temperature: float = _f(1.0, "Sampling temperature of training and pass@k samples (> 0: the trainer "
                            "divides logits by it; greedy evaluation needs no setting).", low=0.0,
                            low_open=True, resume="math")
    top_p: float = _f(1.0, "Nucleus sampling top-p. Below 1 the sampler's logprobs are the truncated "
                      "distribution's, so nothing may read them (TIS, pi_old from the sampler, confidence "
                      "features, staleness, mismatch/* metrics): a config error says which key does.",
                      low=0.0, high=1.0, low_open=True, resume="math")
    max_response_tokens: int = _f(512, "Maximum generated tokens per response (the context budget).", low=1,
                                  resume="math")
    stop: List[str] = _f([], "Extra stop strings (the tokenizer's EOS always stops).", resume="math")
    gpu_memory_utilization: Optional[float] = _f(None, "vLLM memory share; on CPU the most host RAM its "
                                                 "KV cache takes per rank, which holds what one call "
                                                 "sends (a step's or a validation's sequences) when "
                                                 "that is less. null = 0.4 on CUDA (colocated with "
                                                 "training), 0.05 on CPU.",
                                                 low=0.0, high=1.0, low_open=True, resume="numerics")
    tensor_parallel_size: int = _f(1, "vLLM tensor parallel size (GPU only).", low=1, resume="numerics")
    enforce_eager: bool = _f(True, "Run vLLM eagerly: no CUDA graphs on GPU, no torch.compile of the model on CPU (faster start-up, slower decode; docs/performance.md).",
                             resume="numerics")
    free_memory_during_training: bool = _f(True, "GPU: put vLLM to sleep while actor/critic train.", resume="free")
    lora_sync: str = _f("merged", "With actor.lora: how vLLM gets the actor after an update: 'merged' (base + "
                        "B A merged into full weights, loaded like a full update) or 'adapter' (vLLM's own LoRA: "
                        "only the adapters are sent; smaller transfer, slower decode; colocated placement only).",
                        choices=("merged", "adapter"), resume="numerics")
    env: Optional[str] = _f(None, "Environment of multi-turn episodes (docs/multiturn.md): a built-in name "
                            "(guess, tools) or 'module:Class'; null: one response per sample.", resume="math")
    env_args: Dict[str, Any] = _f({}, "Keyword arguments of the env; a row's extra_info.env_args (or verl's "
                                  "interaction_kwargs / tools_kwargs) adds to them.", resume="math")
    max_turns: int = _f(8, "Most model turns of an episode (rollout.env); past it the episode is truncated.", low=1,
                        resume="math")
    turn_max_tokens: Optional[int] = _f(None, "Most tokens of one model turn (null: what the episode's budget "
                                        "leaves, max_response_tokens for the whole episode).", low=1, resume="math")
    env_timeout_s: float = _f(10.0, "Wall-clock limit of one env turn in its worker process; past it the episode "
                              "ends as a counted failure (env/failures) and the worker is replaced.", low=0.0,
                              low_open=True, resume="free")
    sampler_logprobs: Optional[bool] = _f(None, "Return vLLM's logprob of each sampled token: true = always "
                                          "(mismatch/* metrics in fp32 too); false = never; null (or auto) = when the "
                                          "run uses them (algorithm.rollout_is_cap, "
                                          "algorithm.old_logprobs_from_sampler, critic.confidence_features) "
                                          "or samples in bf16 / fp16, where the mismatch/* metrics earn their "
                                          "cost (docs/performance.md).", resume="free")


@dataclass
class ActorConfig(UpdateConfig):
    """The policy's update (the policy loss itself is configured in ``algorithm``)."""


@dataclass
class CriticConfig(UpdateConfig):
    lr: float = _f(2e-6, "Peak learning rate (paper: critic 2e-6 vs actor 1e-6; at most 1).", low=0.0, high=1.0,
                   resume="math")
    value_clip: Optional[float] = _f(0.5, "Clip range of the value loss around old values (null: off).", low=0.0,
                                     resume="math")
    confidence_features: bool = _f(False, "The value head also reads the policy's confidence in the tokens "
                                   "written so far (the sampler's logprobs: the previous token's, the "
                                   "lowest so far, how many below 1/2; vcppo.algos.confidence) through a "
                                   "zero-initialised linear layer. A policy backbone's last hidden state "
                                   "does not say whether an earlier step was wrong; the policy's own "
                                   "surprise does (docs/results.md).", resume="fixed")
    confidence_lr_scale: float = _f(100.0, "Learning rate of the confidence head as a multiple of lr: four "
                                    "weights on O(1) features, which Adam moves by ~lr a step.", low=0.0,
                                    low_open=True, resume="math")
    head_lr_scale: float = _f(1.0, "Learning rate of the scalar value head as a multiple of lr. Adam moves "
                              "each weight by at most ~lr a step, so a zero head at a backbone's lr needs "
                              "hundreds of steps to read what the features already hold "
                              "(docs/results.md).", low=0.0,
                              low_open=True, resume="math")
    freeze: List[str] = _f([], "Critic modules that do not train: any of 'attention' (SAO's frozen-attention "
                           "critic), 'mlp', 'embeddings', 'layers:N' (the first N decoder layers); the value head "
                           "always trains. Frozen parameters get no gradient and no optimizer state (LoRA "
                           "adapters inside them too); a spec that matches nothing is refused.", resume="fixed",
                           critic=True)
    init_from: Optional[str] = _f(None, "Warm-start the critic from a value model written before: a vcppo "
                                  "value-model directory (a run's final/critic, a critic-cache entry, `vcppo rm` "
                                  "output, `vcppo model export STEP --critic` output) or a run directory (its "
                                  "final/critic); a training checkpoint (checkpoints/step_N) is refused, naming that "
                                  "export. Replaces value pretraining (no "
                                  "value_pretrain steps run, the critic cache is neither read nor written); "
                                  "the run records the source. Its shape and tokenizer must match the policy's.",
                                  resume="math", critic=True)


@dataclass
class AlgorithmConfig:
    advantage_estimator: str = _f("gae", "'gae' (PPO family, needs a critic); without a critic: 'grpo' "
                                  "(group-normalised outcome rewards; Dr. GRPO with grpo_scale_by_std=false), "
                                  "'rloo' (leave-one-out group baseline), 'reinforce_plus_plus' (token-level "
                                  "returns, normalised over the global batch), 'reinforce_plus_plus_baseline' (the "
                                  "same after subtracting the group's mean outcome). vcppo/methods.py names each "
                                  "one's paper.", choices=tuple(ESTIMATORS), resume="math", critic_cache=False)
    gamma: float = _f(1.0, "Discount factor.", low=0.0, high=1.0, resume="math")
    lambda_actor: float = _f(0.95, "GAE lambda of the actor's advantages (Decoupled-GAE, paper sec. 4.2).",
                             low=0.0, high=1.0, resume="math", critic_cache=False)
    lambda_critic: float = _f(1.0, "GAE lambda of the critic's targets; 1.0 = Monte-Carlo returns, no "
                              "reward decay (Decoupled-GAE).", low=0.0, high=1.0, resume="math", critic=True,
                              critic_cache=False)  # value pretraining's is value_pretrain.lambda_critic
    length_adaptive_lambda: bool = _f(False, "VAPO: lambda_actor = 1 - 1/(alpha * length) per sequence.",
                                      resume="math", critic_cache=False)
    length_adaptive_alpha: float = _f(0.05, "alpha of the length-adaptive lambda (VAPO: 0.05).", low=0.0,
                                      low_open=True, resume="math", critic_cache=False)
    whiten_advantages: bool = _f(True, "Normalise the actor's advantages over the batch (std 1).",
                                 resume="math", critic_cache=False)
    zero_mean_advantages: bool = _f(True, "When whitening, also subtract the mean (False only divides by the std, so "
                                       "the mean's sign is kept).", resume="math", critic_cache=False)
    eps_low: float = _f(0.2, "PPO ratio clip below 1 (1 - eps_low).", low=0.0, resume="math", critic_cache=False)
    eps_high: float = _f(0.2, "PPO ratio clip above 1 (1 + eps_high); >eps_low is clip-higher (VAPO/DAPO).",
                         low=0.0, resume="math", critic_cache=False)
    dual_clip_c: Optional[float] = _f(None, "Dual-clip constant c > 1 for negative advantages (null: off).",
                                      low=1.0, low_open=True, resume="math", critic_cache=False)
    loss_agg: str = _f("token-mean", "Loss aggregation over tokens / sequences; seq-mean-token-sum-norm divides "
                       "each sequence's token sum by rollout.max_response_tokens (Dr. GRPO: no length bias).",
                       choices=("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"),
                       resume="math")
    policy_loss: str = _f("ppo", "'ppo': the clipped surrogate per token; 'gspo': GSPO's length-normalised "
                          "sequence ratio, clipped per sequence (eps_low / eps_high; the paper: 3e-4 / 4e-4; "
                          "loss_agg seq-mean-token-mean); 'dis': SAO's direct double-sided importance sampling, "
                          "the ratio against the sampler's own logprobs (no old-logprob pass), tokens whose ratio "
                          "leaves [1 - eps_low, 1 + eps_high] masked out (SAO: eps_low 0.8, eps_high 3.0, i.e. "
                          "[0.2, 4.0]). Each composes with any advantage_estimator.",
                          choices=tuple(POLICY_LOSSES), resume="math", critic_cache=False)
    kl_coef: float = _f(0.0, "KL coefficient vs the reference policy (paper: 0); >0 loads a reference "
                        "engine. With kl_target set, the adaptive controller's starting value.", low=0.0,
                        resume="math", critic_cache=False)
    kl_in: str = _f("reward", "Where the KL goes: 'reward' (a per-token penalty subtracted from the reward, "
                    "PPO-RLHF; verl use_kl_in_reward) or 'loss' (a term of the actor's loss on its current "
                    "logprobs, GRPO's way; verl use_kl_loss).", choices=("reward", "loss"),
                    resume="math", critic_cache=False)
    kl_estimator: str = _f("k3", "Per-token KL estimator: k1 (log-ratio), k2 (half its square), k3 (Schulman's "
                           "unbiased, >= 0) or low_var_kl (k3 clamped, verl's name); in the loss k2's "
                           "gradient is that of KL(pi || pi_ref) (vcppo/algos/kl.py).",
                           choices=("k1", "k2", "k3", "low_var_kl"), resume="math", critic_cache=False)
    kl_target: Optional[float] = _f(None, "Adaptive KL controller (Ziegler et al. 2019, as verl / OpenRLHF): "
                                    "the coefficient moves toward the value that holds the per-sample KL at "
                                    "this target; null: a fixed kl_coef.", low=0.0, low_open=True,
                                    resume="math", critic_cache=False)
    kl_horizon: float = _f(10000.0, "Adaptive KL controller: samples over which the coefficient may change "
                           "by a factor of about e^0.2 (verl / OpenRLHF: 10000).", low=0.0, low_open=True,
                           resume="math", critic_cache=False)
    entropy_coef: float = _f(0.0, "Entropy bonus coefficient.", low=0.0, resume="math", critic_cache=False)
    positive_lm_coef: float = _f(0.0, "VAPO positive-example LM loss weight (VAPO: 0.1).", low=0.0,
                                 resume="math", critic_cache=False)
    grpo_scale_by_std: bool = _f(True, "GRPO: divide group-centred rewards by the group std.",
                                 resume="math", critic_cache=False)
    rollout_is_cap: Optional[float] = _f(None, "Truncated importance sampling for the sampler/trainer "
                                         "mismatch: the policy-gradient loss of each token is weighted by "
                                         "min(pi_old / pi_vLLM, cap); cap >= 1 (verl: 2); null: off.",
                                         low=1.0, resume="math", critic_cache=False)
    mask_truncated: bool = _f(False, "DAPO overlong filtering: responses cut off at "
                              "rollout.max_response_tokens are left out of the policy loss.",
                              resume="math", critic_cache=False)
    old_logprobs_from_sampler: bool = _f(False, "Take pi_old (the ratio's denominator, and the policy side "
                                         "of the KL penalty) from the rollout engine's logprobs instead "
                                         "of an actor forward pass: one pass less per step. Trust it only "
                                         "where sampler and trainer agree (mismatch/ metrics of a run "
                                         "without it); TIS is then inert.", resume="math", critic_cache=False)


@dataclass
class RewardConfig:
    function: Optional[str] = _f(None, "Custom reward function 'module:function' (fn(response_text, "
                                 "ground_truth, **info) -> float); null = the built-in verifier.", resume="math")
    functions_by_source: Dict[str, str] = _f({}, "Reward function per data_source ({source: 'module:function'}); "
                                             "rows of other sources use reward.function.", resume="math")
    verl_parity: bool = _f(False, "Score verl's math data_sources as verl's default_compute_score does "
                           "(vcppo.rewards.verl_parity): openai/gsm8k by the last '#### N' (1/0), "
                           "lighteval/MATH, DigitalLearningGmbH/MATH-lighteval, HuggingFaceH4/MATH-500 by the "
                           "last \\boxed{} (1/0), math_dapo, math, aime* by the last 'Answer:' line (+1/-1); "
                           "the think part is not stripped and correct_score/wrong_score do not apply. "
                           "Entries of functions_by_source win. false (the default): our verifier scores them.",
                           resume="math")
    model_path: Optional[str] = _f(None, "A reward model that scores each response at its last token: a "
                                   "`vcppo rm` directory, or an HF sequence-classification checkpoint (or hub id) with one "
                                   "label. Runs on the training ranks (reward_model section).", resume="math")
    combine: Optional[str] = _f(None, "How the reward model meets the rule: 'rule' (the model's scores only "
                                "logged), 'model', 'weighted_sum' (rule_weight * rule + model_weight * model), "
                                "'model_without_rule' (the model for rows whose data_source has no entry in "
                                "functions_by_source); null = 'model' with a model_path, else 'rule'.",
                                choices=(None, "rule", "model", "weighted_sum", "model_without_rule"), resume="math")
    rule_weight: float = _f(1.0, "combine=weighted_sum: weight of the rule's reward.", resume="math")
    model_weight: float = _f(1.0, "combine=weighted_sum: weight of the reward model's score.", resume="math")
    normalize_model_scores: bool = _f(False, "Standardise the reward model's scores by the running mean and "
                                      "std of every score the run has seen (checkpointed, logged; a run that "
                                      "reuses a cached critic starts them at its first PPO step).", resume="math")
    correct_score: float = _f(1.0, "Reward of a correct final answer (paper: +1).", resume="math")
    wrong_score: float = _f(-1.0, "Reward of a wrong / missing / truncated answer (paper: -1).", resume="math")
    num_workers: Optional[int] = _f(None, "Reward worker processes per rank (a stuck sample can be "
                                    "killed); null = the cores the trainer leaves idle on the node, "
                                    "at least 1; 0 = score serially in the trainer (breakpoint() works).",
                                    low=0, resume="free")
    timeout_s: float = _f(5.0, "Wall-clock limit per sample in the worker processes; past it the sample "
                          "scores wrong_score, counts in reward/num_timeouts, and its worker is replaced.",
                          low=0.0, low_open=True, resume="free")
    overlong_buffer_tokens: int = _f(0, "DAPO soft overlong punishment: a response that runs into the last "
                                     "N tokens before rollout.max_response_tokens loses up to "
                                     "overlong_penalty, linearly in its length; 0: off.", low=0, resume="math")
    overlong_penalty: float = _f(1.0, "The soft overlong punishment at max_response_tokens (DAPO: 1).", low=0.0,
                                 resume="math")


@dataclass
class ValuePretrainConfig:
    enabled: bool = _f(True, "Run value pretraining (policy frozen, critic regressed on Monte-Carlo "
                       "returns) before PPO (VC-PPO sec. 4.1).", resume="math")
    steps: int = _f(100, "Maximum value-pretraining steps (paper: ~100 best, 150 over-fits).", low=0, resume="math")
    lambda_critic: float = _f(1.0, "GAE lambda of the pretraining targets (1.0 = Monte-Carlo).", low=0.0,
                              high=1.0, resume="math")
    early_stop: bool = _f(True, "Stop early once explained variance and value loss have settled.", resume="math")
    min_steps: int = _f(10, "Never stop before this many steps.", low=0, resume="math")
    window: int = _f(10, "Settling rule: compare means of the last two windows of this many steps.", low=1,
                     resume="math")
    ev_tolerance: float = _f(0.02, "Settled when explained variance changed by less than this ...", low=0.0,
                             resume="math")
    loss_tolerance: float = _f(0.05, "... and value loss changed by less than this fraction.", low=0.0, resume="math")
    cache_dir: Optional[str] = _f(None, "Where reusable critic checkpoints live, keyed by a hash of every key "
                                  "the pretrained critic depends on (marked 'critic cache' in docs/config.md; "
                                  "default: <output_root>/critic_cache).", resume="free")
    reuse: bool = _f(True, "Reuse a matching pretrained critic instead of training it again.", resume="free")


@dataclass
class TrainerConfig:
    total_steps: int = _f(100, "PPO steps (each = one rollout batch).", low=0, resume="free")
    prompts_per_step: int = _f(16, "Prompts per step over all ranks (x n_samples_per_prompt responses).", low=1,
                               resume="math")
    balance_batch: bool = _f(True, "Several ranks: redistribute whole prompt groups after sampling so every "
                             "rank trains on about the same number of real tokens.", resume="numerics")
    seed: int = _f(0, "Seed of data order, sampling and initialisation (numpy accepts [0, 2**32)).",
                   low=0, high=2**32 - 1, resume="math", critic_cache=False)  # a sweep's seeds share one critic
    output_root: str = _f("runs", "Directory under which run directories are created.", resume="free")
    run_name: Optional[str] = _f(None, "Run directory name (default: <preset>-seed<seed>, so re-running a command resumes its run).",
                                 resume="free")
    save_every: int = _f(0, "Checkpoint every N steps (0: only at the end).", low=0, resume="free")
    keep_last: int = _f(2, "Keep the last K checkpoints.", low=1, resume="free")
    resume: str = _f("auto", "'auto' continues from the run's last complete checkpoint, 'never' "
                     "starts over (the previous run's files move into previous_<date>-<time>/ inside the run "
                     "dir), or a checkpoint path.", resume="free")
    val_every: int = _f(0, "Validate every N steps (0: only at the start and end).", low=0, resume="free")
    val_max_prompts: int = _f(128, "Validation prompts used (from the start of the val split).", low=1, resume="free")
    val_n_samples: int = _f(4, "Samples per validation prompt for pass@k.", low=1, resume="free")
    val_k: List[int] = _f([1, 4], "k values of the unbiased pass@k estimator (<= val_n_samples).", resume="free")
    device: str = _f("auto", "'auto' (cuda if available), 'cuda' or 'cpu'.", choices=("auto", "cuda", "cpu"),
                     resume="numerics")
    deterministic: bool = _f(False, "Deterministic torch algorithms (CPU runs are deterministic anyway).",
                             resume="numerics")
    dynamic_sampling: bool = _f(False, "DAPO dynamic sampling: drop prompts whose samples all got the same "
                                "reward and sample more prompts until the step's batch is full.", resume="math",
                                critic_cache=False)  # the PPO phase only
    dynamic_sampling_max_tries: int = _f(4, "Sampling rounds per step at most, the first included; a batch "
                                         "still short after them is filled up with dropped groups.", low=1,
                                         resume="math", critic_cache=False)
    max_nonfinite_steps: int = _f(3, "Abort (exit 2, the last good checkpoint kept) after this many steps in a "
                                  "row with an optimizer step skipped for a non-finite loss, gradient norm or "
                                  "advantages.", low=1, resume="free")
    max_staleness: int = _f(0, "Actor updates a batch's sampling weights may lag the weights that train on it "
                            "(placement.mode=split). 0: synchronous, exactly the colocated run; >= 1: rollouts "
                            "run ahead while the models train, pi_old and V_old are recomputed at train time "
                            "and the sampler enters through the truncated IS weight (algorithm.rollout_is_cap).",
                            low=0, high=2, resume="math")
    collective_timeout_s: float = _f(1800.0, "Longest a rank waits in one collective for its peers before it "
                                     "fails (a hung or dead rank; NCCL's watchdog then ends the job). gloo "
                                     "fails at once when a peer's connection closes.", low=0.0, low_open=True,
                                     resume="free")
    rendezvous_timeout_s: float = _f(600.0, "Longest a rank waits at start-up for every rank of the job to meet at "
                                     "MASTER_ADDR:MASTER_PORT (nodes started by hand may start minutes apart); "
                                     "past it the rank exits 2 with one line naming both and what it found there.",
                                     low=0.0, low_open=True, resume="free")
    max_failed_reward_steps: int = _f(3, "Abort (exit 2) after this many steps in a row in which the reward "
                                      "function failed (raised, timed out, NaN) on every sample of every rank.",
                                      low=1, resume="free")
    resume_allow_changes: List[str] = _f([], "Keys whose change on resume is accepted although it changes what the "
                                         "run computes (e.g. [algorithm.lambda_actor]); each accepted change is "
                                         "recorded in <run dir>/config_history.jsonl. Without it such a resume is "
                                         "refused, naming each changed key (docs/robustness.md).", resume="free")
    abort_on_divergence: bool = _f(False, "Stop the run (exit 2) at the first step whose metrics leave their sane "
                                   "range (vcppo.driver.durability.guards: entropy collapse, value loss or gradient "
                                   "norm blow-up, KL, non-finite values), before that step's checkpoint, so the "
                                   "last checkpoint is one from before it. false: warn and go on.", resume="free")


@dataclass
class PlacementConfig:
    mode: str = _f("colocated", "'colocated': every rank runs vLLM and the models in turn; 'split': the last "
                   "placement.rollout_ranks ranks only sample (vLLM), the others only train (ZeRO-3 among "
                   "themselves; the critic on ranks of its own with placement.critic_ranks), and weights and "
                   "samples cross between them (docs/launching.md).",
                   choices=PLACEMENTS, resume="numerics")
    rollout_ranks: int = _f(1, "Split placement: how many ranks (the last ones) run vLLM only.", low=1,
                            resume="numerics")
    critic_ranks: int = _f(0, "Split placement: ranks that hold the critic only (after the actor's ranks, "
                           "as many as they), so the critic's values pass and update run while the actor "
                           "trains; 0: the critic trains on the actor's ranks.", low=0, resume="numerics",
                           critic=True)


@dataclass
class LoggingConfig:
    wandb: bool = _f(True, "Log to Weights & Biases.", resume="free")
    wandb_mode: str = _f("offline", "offline (default, sync later with `wandb sync`), online, disabled.",
                         choices=("offline", "online", "disabled"), resume="free")
    wandb_project: str = _f("vcppo", "W&B project.", resume="free")
    tensorboard: bool = _f(False, "Also write TensorBoard event files to <run dir>/tensorboard (tags "
                           "<phase>/<metric>; needs the tensorboard package).", resume="free")
    progress_bar: bool = _f(True, "Show a progress bar on rank 0.", resume="free")
    log_samples: int = _f(0, "Samples per step written as text to <run dir>/samples.jsonl (prompt, response, "
                          "reward, score, length, the advantages' mean / min / max) and, with wandb on, to a "
                          "table; `vcppo report` shows the last step's. 0: off.", low=0, resume="free")
    profile_buckets: int = _f(16, "Buckets of the advantage-vs-position profile.", low=1, resume="free")
    timeline: bool = _f(False, "Write every rank's busy intervals by phase (sampling, scoring, waiting, each "
                        "update) to <run dir>/timeline/rank<N>.jsonl; `vcppo bench split` draws them.", resume="free")


@dataclass
class Config:
    preset: str = _f("custom", "Name of the preset this run came from (informational).", resume="free")
    model: ModelConfig = field(default_factory=ModelConfig, metadata={"doc": "Policy / critic / tokenizer paths."})
    data: DataConfig = field(default_factory=DataConfig, metadata={"doc": "Prompt datasets."})
    rollout: RolloutConfig = field(default_factory=RolloutConfig, metadata={"doc": "vLLM sampling."})
    actor: ActorConfig = field(default_factory=ActorConfig, metadata={"doc": "Policy optimisation.",
                                                                      "critic_cache": False})
    reference: EngineConfig = field(default_factory=EngineConfig, metadata={"doc": "Frozen reference policy "
                                                                             "(built when algorithm.kl_coef > 0)."})
    reward_model: EngineConfig = field(default_factory=EngineConfig, metadata={"doc": "Reward model engine "
                                                                               "(built when reward.model_path is set)."})
    critic: CriticConfig = field(default_factory=CriticConfig, metadata={"doc": "Value model optimisation.",
                                                                         "critic": True})
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig, metadata={"doc": "Advantages and losses."})
    reward: RewardConfig = field(default_factory=RewardConfig, metadata={"doc": "Verifier / reward function."})
    value_pretrain: ValuePretrainConfig = field(default_factory=ValuePretrainConfig,
                                                metadata={"doc": "Value pretraining phase.", "critic": True})
    trainer: TrainerConfig = field(default_factory=TrainerConfig, metadata={"doc": "Loop, checkpoints, eval."})
    placement: PlacementConfig = field(default_factory=PlacementConfig,
                                       metadata={"doc": "Which ranks sample and which train."})
    logging: LoggingConfig = field(default_factory=LoggingConfig, metadata={"doc": "wandb / JSONL / console."})
    sft: SFTConfig = field(default_factory=SFTConfig, metadata={"doc": "`vcppo sft`: cold-start SFT.",
                           "resume": "free"})  # not read by `vcppo train`
    rm: RMConfig = field(default_factory=RMConfig, metadata={"doc": "`vcppo rm`: outcome reward model.",
                         "resume": "free"})  # not read by `vcppo train`
    eval: EvalConfig = field(default_factory=EvalConfig, metadata={"doc": "`vcppo eval`: pass@k of a policy.",
                             "resume": "free"})  # not read by `vcppo train`
    demo: DemoConfig = field(default_factory=DemoConfig, metadata={"doc": "`vcppo demo`: the whole pipeline.",
                             "resume": "free"})  # not read by `vcppo train`


