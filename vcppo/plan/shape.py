"""Model shapes, parameter counts and GPU datasheet figures for `vcppo plan`.

A shape is read from a Hugging Face ``config.json`` (the policy directory) or taken from the
built-in Qwen2.5 shapes, so a plan needs no checkpoint on disk. Parameter counts follow the
Qwen2 / Llama decoder layout of transformers exactly (tests/commands/test_plan.py compares them
with ``sum(p.numel())`` of a real model).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from vcppo.schema import ConfigError


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


GiB = 2 ** 30


@dataclass(frozen=True)
class Hardware:
    """One accelerator: memory, dense matmul peak per dtype, memory bandwidth and the bandwidth of its
    links to the other GPUs of its node and of other nodes (datasheets).

    ``memory_bytes`` is what the device reports as its total (vLLM's ``gpu_memory_utilization`` is a
    share of it); ``reserve_bytes`` is left out of what the planner fills (CUDA context, NCCL
    buffers, allocator fragmentation: a rough allowance, not a measured figure)."""
    name: str
    memory_bytes: int
    flops_bf16: float       # dense FLOP/s, tensor cores
    flops_fp32: float       # FLOP/s without tensor cores (torch's default fp32 matmul)
    bandwidth: float        # bytes/s of HBM (or DRAM)
    reserve_bytes: int
    is_cpu: bool = False
    node_link: float = 450e9      # bytes/s one GPU sends to the others of its node (NVLink, per direction)
    network_link: float = 50e9    # bytes/s one GPU sends to other nodes (its InfiniBand adapter, per direction)

    @property
    def usable_bytes(self) -> int:
        return self.memory_bytes - self.reserve_bytes

    def flops(self, dtype_bytes: int) -> float:
        return self.flops_fp32 if dtype_bytes >= 4 else self.flops_bf16


# NVIDIA datasheets (SXM parts): H100 80 GB: 989 TFLOP/s bf16 dense, 67 TFLOP/s fp32, 3.35 TB/s;
# H200 141 GB: same compute, 4.8 TB/s; A100 80 GB: 312 TFLOP/s bf16, 19.5 fp32, 2.0 TB/s. Totals
# are what nvidia-smi reports (81559 MiB, 143771 MiB, 81920 MiB). cpu24 is this project's 2-core
# CI machine treated as a 24 GiB "device": its figures are rough guesses of the right order
# (2 cores x AVX2 FMA, one DDR channel's worth of bandwidth), for the CPU demo scale only.
# Links, per GPU and per direction: NVLink 4 (H100 and H200 SXM) 900 GB/s bidirectional = 450 GB/s,
# NVLink 3 (A100 SXM) 600 GB/s = 300 GB/s (NVIDIA datasheets); across nodes one InfiniBand adapter
# per GPU as in a DGX: ConnectX-7 NDR 400 Gb/s = 50 GB/s (DGX H100 / H200), ConnectX-6 HDR 200 Gb/s =
# 25 GB/s (DGX A100). cpu24's ranks exchange through gloo in one host's memory: a guess of the
# same order as its DRAM figure, and it has no second node.
HARDWARE: dict[str, Hardware] = {
    "h100": Hardware("h100", 81559 * 2 ** 20, 989e12, 67e12, 3.35e12, int(1.5 * GiB), node_link=450e9,
                     network_link=50e9),
    "h200": Hardware("h200", 143771 * 2 ** 20, 989e12, 67e12, 4.8e12, int(1.5 * GiB), node_link=450e9,
                     network_link=50e9),
    "a100": Hardware("a100", 81920 * 2 ** 20, 312e12, 19.5e12, 2.0e12, int(1.5 * GiB), node_link=300e9,
                     network_link=25e9),
    "cpu24": Hardware("cpu24", 24 * GiB, 0.1e12, 0.1e12, 20e9, 4 * GiB, is_cpu=True, node_link=10e9,
                      network_link=10e9),
}


def dtype_bytes(dtype: str, hardware: Hardware) -> int:
    """Bytes per element of ``model.dtype``; 'auto' is bf16 on a GPU, fp32 on CPU (as the engines
    resolve it: vcppo.engines.engine_setup.resolve_dtype)."""
    if dtype == "auto":
        return 4 if hardware.is_cpu else 2
    return {"float32": 4, "bfloat16": 2, "float16": 2}[dtype]
