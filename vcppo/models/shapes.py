"""Decoder-only model shapes and their parameter counts: read from a Hugging Face ``config.json`` or
taken from the published Qwen2.5 family, so no checkpoint is needed (`vcppo plan`, and `vcppo model
make --size qwen2.5-0.5b-shape`). The counts follow the Qwen2 / Llama decoder layout of transformers
exactly (tests/commands/test_plan.py compares them with ``sum(p.numel())`` of a real model)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from vcppo.errors import ConfigError


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer: embedding, ``num_layers`` x (attention + SwiGLU MLP), final
    RMSNorm, LM head (shared with the embedding when ``tie_word_embeddings``)."""
    name: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    head_dim: int
    tie_word_embeddings: bool
    attention_bias: bool = True  # Qwen2 has q/k/v biases; Llama does not

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def layer_params(self) -> int:
        """One decoder layer: q/k/v/o projections (+ q/k/v biases), gate/up/down, two RMSNorms."""
        h = self.hidden_size
        attention = h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h
        if self.attention_bias:
            attention += self.q_dim + 2 * self.kv_dim
        return attention + 3 * h * self.intermediate_size + 2 * h

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def backbone_params(self) -> int:
        """Embedding + layers + final norm: the critic's and reward model's trunk."""
        return self.embedding_params + self.num_layers * self.layer_params + self.hidden_size

    @property
    def params(self) -> int:
        """The causal LM (policy, reference): the backbone plus an untied LM head."""
        return self.backbone_params + (0 if self.tie_word_embeddings else self.embedding_params)

    @property
    def value_model_params(self) -> int:
        """The backbone plus a scalar head (weight + bias): the critic and the reward model."""
        return self.backbone_params + self.hidden_size + 1

    def linear_widths(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each linear layer of a decoder layer, by its (Qwen2 / Llama) name."""
        h, q, kv, i = self.hidden_size, self.q_dim, self.kv_dim, self.intermediate_size
        return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
                "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}

    def lora_params(self, rank: int, target_modules: list[str]) -> int:
        """Adapter parameters of rank ``rank`` on the targeted linear layers of every decoder layer:
        r x (in + out) per layer (A is r x in, B is out x r); [all-linear] targets all seven."""
        widths = self.linear_widths()
        names = list(widths) if list(target_modules) == ["all-linear"] else [t for t in target_modules if t in widths]
        return self.num_layers * sum(rank * sum(widths[n]) for n in names)

    @property
    def largest_module_params(self) -> int:
        """Parameters of the largest single module (what ZeRO-3 gathers whole): the embedding, or
        the widest MLP projection for a small vocabulary."""
        return max(self.embedding_params, self.hidden_size * self.intermediate_size,
                   self.hidden_size * self.q_dim + (self.q_dim if self.attention_bias else 0))


def _qwen25(name, hidden, layers, heads, kv_heads, intermediate, vocab, tied) -> ModelShape:
    return ModelShape(name, vocab, hidden, layers, heads, kv_heads, intermediate, hidden // heads, tied)


# The published config.json values of the Qwen2.5 family. The 0.5B-3B models tie the LM head to the
# embedding and have a 151936-token vocabulary; 7B and larger have their own head and 152064.
BUILTIN_SHAPES: dict[str, ModelShape] = {s.name: s for s in (
    _qwen25("qwen2.5-0.5b", 896, 24, 14, 2, 4864, 151936, True),
    _qwen25("qwen2.5-1.5b", 1536, 28, 12, 2, 8960, 151936, True),
    _qwen25("qwen2.5-3b", 2048, 36, 16, 2, 11008, 151936, True),
    _qwen25("qwen2.5-7b", 3584, 28, 28, 4, 18944, 152064, False),
    _qwen25("qwen2.5-14b", 5120, 48, 40, 8, 13824, 152064, False),
    _qwen25("qwen2.5-32b", 5120, 64, 40, 8, 27648, 152064, False),
    _qwen25("qwen2.5-72b", 8192, 80, 64, 8, 29568, 152064, False),
)}


def shape_from_hf_config(config: dict, name: str = "config.json") -> ModelShape:
    """A shape from the keys of a transformers ``config.json`` (Qwen2 / Llama-style decoders)."""
    heads = int(config["num_attention_heads"])
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    qwen2 = config.get("model_type", "qwen2") == "qwen2"
    return ModelShape(name=name, vocab_size=int(config["vocab_size"]), hidden_size=int(config["hidden_size"]),
                      num_layers=int(config["num_hidden_layers"]), num_heads=heads,
                      num_kv_heads=int(config.get("num_key_value_heads") or heads),
                      intermediate_size=int(config["intermediate_size"]), head_dim=int(head_dim),
                      tie_word_embeddings=bool(config.get("tie_word_embeddings", not qwen2)),
                      attention_bias=bool(config.get("attention_bias", qwen2)))


def read_shape(model_dir: str | Path, key: str) -> ModelShape | None:
    """The shape in ``model_dir/config.json``, or None when there is no such file. ``key``: the
    config key that named the directory, for the error when the file is unreadable."""
    path = Path(model_dir) / "config.json" if model_dir else None
    if path is None or not path.is_file():
        return None
    try:
        return shape_from_hf_config(json.loads(path.read_text()), name=str(model_dir))
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError(f"config key '{key}': cannot read a model shape from {path} ({e!r})") from None


def builtin_shape(name: str) -> ModelShape:
    if name not in BUILTIN_SHAPES:
        raise ConfigError(f"unknown --model-shape {name!r}; built in: {', '.join(BUILTIN_SHAPES)}")
    return BUILTIN_SHAPES[name]
