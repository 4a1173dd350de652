"""What every config section is made of: the field helper with its doc line, range and resume class,
the resume classes themselves, and the engine / optimizer / LoRA / update settings
the training sections share (:mod:`vcppo.config.schema` declares the sections)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional


# What a change of a key on resume does (vcppo.config.provenance); every field names one:
RESUME_CLASSES = {
    "math": "changes what the run computes (the algorithm, the batch, the data, the rewards): refused on "
            "resume unless listed in trainer.resume_allow_changes",
    "numerics": "the same computation with other float rounding or another layout (micro-batching, packing, "
                "sharding, placement): accepted and recorded; the resumed run is no longer bit-exact",
    "free": "does not touch what is computed (logging, checkpoint cadence, validation, limits, run length): "
            "accepted and recorded",
    "fixed": "the checkpoint's tensors have another shape: it cannot be loaded, so the change is refused "
             "whatever trainer.resume_allow_changes says",
}


def _f(default: Any, doc: str, *, resume: str, choices: tuple | None = None, low: float | None = None,
       high: float | None = None, low_open: bool = False, critic: bool = False,
       critic_cache: bool = True) -> Any:
    """A schema field with its doc line, its valid range or choices, and ``resume``: what changing it
    on resume does (a key of :data:`RESUME_CLASSES`; required, so a new key must be classified).
    ``critic``: only a critic reads it (setting it for a method without one is an error); a section's
    metadata may say so for every key inside it.
    ``critic_cache``: False for a ``math`` key that value pretraining never reads (the PPO phase's
    algorithm and actor, the seed a sweep varies), so the pretrained critic does not depend on it. Every
    other ``math`` and ``fixed`` key is in the critic cache's key (:mod:`vcppo.config.provenance`), so a
    new key that changes what the run computes is in it unless it says otherwise; a section's metadata
    may set it for every key inside it."""
    if resume not in RESUME_CLASSES:
        raise ValueError(f"resume={resume!r} is not one of {list(RESUME_CLASSES)}")
    meta = {"doc": doc, "choices": choices, "low": low, "high": high, "low_open": low_open, "resume": resume,
            "critic": critic, "critic_cache": critic_cache}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class EngineConfig:
    """What every DeepSpeed engine needs, trained or frozen (the reference policy)."""
    micro_batch_size: int = _f(8, "Sequences per forward/backward per rank (gradient accumulation "
                               "makes up the mini-batch).", low=1, resume="numerics")
    zero_stage: Optional[int] = _f(None, "DeepSpeed ZeRO stage; null = auto: 3 with several ranks, 0 (no "
                                   "partitioning hooks, measured faster) on one rank, and on resume the "
                                   "stage the checkpoint was written with.", choices=(None, 0, 1, 2, 3),
                                   resume="numerics")
    offload_params: bool = _f(False, "ZeRO-3: keep parameters in CPU memory.", resume="numerics")
    gradient_checkpointing: bool = _f(False, "Recompute activations in backward (saves memory).", resume="numerics")
    packed: bool = _f(True, "Padding-free passes: a micro-batch's sequences concatenated into one row, "
                      "attention kept within each sequence; false: the padded (B, P+R) layout. Faster the "
                      "more padding a batch has (docs/performance.md, 'How fast is a packed pass').", resume="numerics")
    max_tokens_per_micro_batch: int = _f(0, "Form micro-batches by a budget of real (prompt + response) "
                                         "tokens instead of micro_batch_size sequences (use with packed, for "
                                         "long-tailed lengths); 0: off. A longer "
                                         "sequence gets a micro-batch of its own.", low=0, resume="numerics")
    logprob_chunk_size: int = _f(1024, "Actor and reference: response logprobs and entropies are computed from the "
                                 "last hidden states this many tokens at a time, so the (tokens x vocab) logits are "
                                 "never held whole; the backward recomputes each chunk. 0: the full-logits path "
                                 "(every response position's fp32 logits and log-softmax at once). No effect on "
                                 "the critic and reward model (no vocabulary).", low=0, resume="numerics")


@dataclass
class OptimConfig(EngineConfig):
    """A trained engine: AdamW + learning-rate schedule (actor, critic, SFT, reward model)."""
    lr: float = _f(1e-6, "Peak learning rate (at most 1: AdamW moves every weight by about lr per step).", low=0.0, high=1.0,
                   resume="math")
    weight_decay: float = _f(0.0, "AdamW weight decay.", low=0.0, resume="math")
    betas: List[float] = _f([0.9, 0.95], "AdamW betas.", resume="math")
    warmup_steps: int = _f(0, "Linear learning-rate warm-up, in optimizer steps.", low=0, resume="math")
    lr_schedule: str = _f("constant", "Schedule after warm-up.", choices=("constant", "cosine", "linear"),
                          resume="math")
    min_lr_ratio: float = _f(0.0, "Floor of cosine / linear decay, as a fraction of lr.", low=0.0, high=1.0,
                             resume="math")
    grad_clip: float = _f(1.0, "Global gradient-norm clip (0 disables).", low=0.0, resume="math")
    offload_optimizer: bool = _f(False, "ZeRO-3: keep optimizer states in CPU memory.", resume="numerics")


@dataclass
class LoRAConfig:
    """Low-rank adapters (Hu et al. 2021, via peft): the base weights stay frozen, W + (alpha / rank) B A
    is what the model computes, and only A, B (and a critic's heads) carry gradients and optimizer states."""
    rank: int = _f(0, "Adapter rank r; 0 = off (every weight trains).", low=0, resume="fixed")
    alpha: float = _f(32.0, "Scaling numerator: the adapter's update is scaled by alpha / rank.", low=0.0,
                      low_open=True, resume="math")
    dropout: float = _f(0.0, "Dropout on the adapters' input while training.", low=0.0, high=1.0, resume="math")
    target_modules: List[str] = _f(["all-linear"], "Linear layers that get adapters, by the last part of their "
                                   "name (e.g. [q_proj, v_proj]); [all-linear]: every linear layer but the LM head.",
                                   resume="fixed")


@dataclass
class UpdateConfig(OptimConfig):
    """An engine that PPO updates (actor, critic): epochs x mini-batches of optimizer steps."""
    ppo_mini_batches: int = _f(1, "Optimizer steps per PPO epoch (the step's batch is split into this many).", low=1,
                               resume="math")
    ppo_epochs: int = _f(1, "Passes over each step's batch.", low=1, resume="math")
    sequence_parallel_size: int = _f(1, "Ranks that run one set of sequences together, each a contiguous slice of "
                                     "every sequence's tokens (DeepSpeed Ulysses: attention exchanges heads for "
                                     "sequence); activations per rank / this. 1: off. Must divide the training "
                                     "ranks and the model's attention heads; runs packed rows; micro_batch_size "
                                     "and max_tokens_per_micro_batch then count per SP group "
                                     "(docs/launching.md).", low=1, resume="numerics")
    lora: LoRAConfig = field(default_factory=LoRAConfig, metadata={"doc": "LoRA adapters (off by default)."})
