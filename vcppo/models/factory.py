"""Named model sizes on the Qwen2 architecture, built from a config (no hub downloads).

``make_model`` writes a Hugging Face checkpoint dir (fp32 safetensors + config +
generation_config + tokenizer) that loads with ``AutoModelForCausalLM.from_pretrained`` /
``AutoTokenizer.from_pretrained`` and with vLLM (Qwen2 arch; head_dim 32 or 64; the KV heads
divide the attention heads), with tied embeddings (the default) or untied ones (``tied=False``,
``vcppo model make --untied``: the LM head a weight of its own, as in the larger Qwen2.5 models).
The rest of vcppo only ever loads models by path, so a real Qwen2.5 checkpoint dir can be used in
place of these.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class ModelSize:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = True
    vocab_size: int | None = None  # None: the tokenizer's, padded to a multiple of 64

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


# Parameter counts are with the 104-token char vocabulary (embeddings are negligible there);
# `vcppo model make` prints the exact count.
SIZES: dict[str, ModelSize] = {
    # ~0.5M: unit / integration tests.
    "tiny": ModelSize(hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=512),
    # ~1.9M: the CPU demo. Measured on the 2-core CPU machine: this size learns the default
    # addition task from scratch to 100% greedy val accuracy in ~600 SFT steps (6 min, batch 32),
    # while a 9.6M model (hidden 384, 6 layers) ran 3 s/step and was still at 0% after 100 steps;
    # on 2 CPU cores the step budget, not capacity, decides.
    "small": ModelSize(hidden_size=192, num_hidden_layers=4, num_attention_heads=6,
                       num_key_value_heads=2, intermediate_size=512),
    # ~24M: the "larger model" of the CPU benchmarks (`vcppo bench train`), where the trainer's
    # own compute, not per-call overhead, decides; head_dim 64.
    "medium": ModelSize(hidden_size=512, num_hidden_layers=8, num_attention_heads=8,
                        num_key_value_heads=2, intermediate_size=1536),
    # ~180M: GPU runs.
    "base": ModelSize(hidden_size=1024, num_hidden_layers=16, num_attention_heads=16,
                      num_key_value_heads=4, intermediate_size=2816),
}


def _published(name: str) -> ModelSize:
    """A real model's published shape (vcppo.models.shapes' table of config.json values), vocabulary included:
    the embedding keeps every row of it, whatever the tokenizer uses, as the real checkpoint does."""
    from vcppo.models.shapes import BUILTIN_SHAPES

    s = BUILTIN_SHAPES[name]
    return ModelSize(hidden_size=s.hidden_size, num_hidden_layers=s.num_layers, num_attention_heads=s.num_heads,
                     num_key_value_heads=s.num_kv_heads, intermediate_size=s.intermediate_size,
                     tie_word_embeddings=s.tie_word_embeddings, vocab_size=s.vocab_size)


# ~494M, Qwen2.5-0.5B's shape (151,936-token vocabulary, 14 heads over 2 KV heads, tied): the
# real-size run on the CPU machine (docs/scaling.md, "A real-size shape on this CPU").
SIZES["qwen2.5-0.5b-shape"] = _published("qwen2.5-0.5b")


def model_config(size: str, tokenizer, max_position_embeddings: int | None = None, tied: bool | None = None,
                 layers: int | None = None):
    """A ``Qwen2Config`` for a named size, with vocab and special ids from ``tokenizer``.

    ``tied``: share the input embedding with the LM head (the sizes' default, as in Qwen2.5-0.5B to
    3B) or give the head a weight of its own (False: as in Qwen2.5-7B and larger); None keeps the
    size's setting. ``layers``: that many decoder layers of the size's shape (None: the size's)."""
    from transformers import Qwen2Config

    if size not in SIZES:
        raise ValueError(f"unknown model size {size!r}; available: {', '.join(SIZES)}")
    s = SIZES[size]
    fields = asdict(s)
    published_vocab = fields.pop("vocab_size")
    if max_position_embeddings is not None:
        fields["max_position_embeddings"] = int(max_position_embeddings)
    if tied is not None:
        fields["tie_word_embeddings"] = bool(tied)
    if layers is not None:
        fields["num_hidden_layers"] = int(layers)
    vocab_size = len(tokenizer)
    vocab_size = (vocab_size + 63) // 64 * 64  # pad to a multiple of 64 (kernel-friendly)
    if published_vocab is not None:
        if published_vocab < len(tokenizer):
            raise ValueError(f"size {size!r} has {published_vocab} vocabulary rows, the tokenizer {len(tokenizer)}")
        vocab_size = published_vocab
    return Qwen2Config(
        vocab_size=vocab_size,
        head_dim=s.head_dim,
        hidden_act="silu",
        rms_norm_eps=1e-6,
        initializer_range=0.02,
        use_cache=True,
        use_sliding_window=False,
        attention_dropout=0.0,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        dtype="float32",
        **fields,
    )


def count_params(model) -> int:
    """Unique parameters (a tied lm_head is counted once, an untied one on its own)."""
    return sum(p.numel() for p in model.parameters())


def make_model(size: str, tokenizer_dir: str | os.PathLike | None, out_dir: str | os.PathLike,
               seed: int = 0, max_position_embeddings: int | None = None, tied: bool | None = None,
               layers: int | None = None):
    """Build a randomly initialised Qwen2ForCausalLM of ``size``; save it with its tokenizer.

    ``tokenizer_dir``: a saved tokenizer to use; None builds vcppo's char-level tokenizer.
    ``tied``, ``layers``: see :func:`model_config` (``tied`` False: an ``lm_head.weight`` of its own in
    the checkpoint, initialised independently of the embedding).
    Writes fp32 weights, config, generation_config (stops on ``<|im_end|>`` and ``<eos>``) and
    the tokenizer into ``out_dir``. Returns the model (eval mode, on CPU).
    """
    import torch
    from transformers import AutoTokenizer, GenerationConfig, Qwen2ForCausalLM

    from vcppo.models.tokenizer import EOS, build_tokenizer

    tokenizer = build_tokenizer() if tokenizer_dir is None else AutoTokenizer.from_pretrained(str(tokenizer_dir))
    config = model_config(size, tokenizer, max_position_embeddings, tied, layers)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(torch.float32).eval()
    eos_ids = [tokenizer.eos_token_id]
    extra = tokenizer.convert_tokens_to_ids(EOS)
    if isinstance(extra, int) and extra != tokenizer.unk_token_id and extra not in eos_ids:
        eos_ids.append(extra)
    model.generation_config = GenerationConfig(
        eos_token_id=eos_ids, pad_token_id=tokenizer.pad_token_id, do_sample=True,
        temperature=1.0, top_p=1.0, top_k=0)
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    return model
