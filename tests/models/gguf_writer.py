"""Test helper: a transformers Llama / Qwen2 model and its byte-level BPE tokenizer written as a GGUF
file with the ``gguf`` package's writer, laid out as llama.cpp lays out the files it converts:

- llama.cpp's tensor names (``token_embd``, ``blk.N.attn_q``, ..., ``output_norm``; ``output`` only
  when the LM head is untied), 1-D tensors (norms, biases) always f32;
- Llama's q/k rows in llama.cpp's rotary order (:func:`rope_rows_to_gguf`), which a loader must undo;
- the tokenizer as ``tokenizer.ggml.*`` metadata: model ``gpt2`` (byte-level BPE), the Qwen2 split
  (``pre`` = ``qwen2``), the tokens in id order with their types (special ones CONTROL), the merges,
  bos / eos / pad ids, and the chat template.

Nothing here reads a GGUF: the import under test does.
"""
from __future__ import annotations

import json

import numpy as np
import torch

TOKEN_NORMAL, TOKEN_CONTROL = 1, 3  # llama.cpp's token types

TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
       "lm_head.weight": "output.weight"}
PER_LAYER = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down"}


def gguf_tensor_name(hf_name: str) -> str:
    """``model.layers.3.self_attn.q_proj.weight`` -> ``blk.3.attn_q.weight``."""
    if hf_name in TOP:
        return TOP[hf_name]
    _, _, layer, rest = hf_name.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{PER_LAYER[module]}.{kind}"


def rope_rows_to_gguf(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(n_heads * d, ...) q or k projection rows, transformers' order -> llama.cpp's.

    transformers rotates the pair (i, i + d/2) of each head (``rotate_half``); llama.cpp rotates
    (2i, 2i + 1). So within each head, llama.cpp's row 2i is transformers' row i and its row 2i + 1
    is transformers' row i + d/2."""
    d = weight.shape[0] // n_heads
    order = torch.arange(d).view(2, d // 2).t().reshape(-1)  # 0, d/2, 1, d/2 + 1, ...
    return weight.reshape(n_heads, d, *weight.shape[1:])[:, order].reshape(weight.shape)


def _rope_theta(cfg) -> float:
    params = getattr(cfg, "rope_parameters", None) or {}
    return float(params.get("rope_theta", getattr(cfg, "rope_theta", 10000.0)))


def _write_config(w, cfg) -> None:
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(_rope_theta(cfg))
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)


def _write_tokenizer(w, tok) -> None:
    vocab = tok.backend_tokenizer.get_vocab(with_added_tokens=True)
    tokens = sorted(vocab, key=vocab.get)
    assert [vocab[t] for t in tokens] == list(range(len(tokens))), "token ids must be 0..V-1"
    special = set(tok.all_special_tokens)
    merges = json.loads(tok.backend_tokenizer.to_str())["model"]["merges"]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([TOKEN_CONTROL if t in special else TOKEN_NORMAL for t in tokens])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    w.add_bos_token_id(tok.convert_tokens_to_ids("<|im_start|>"))
    w.add_eos_token_id(tok.eos_token_id)
    w.add_pad_token_id(tok.pad_token_id)
    w.add_chat_template(tok.chat_template)


def write_gguf(model, tok, path, f16: bool = False, permute_rope: bool = True) -> str:
    """Write ``model`` (LlamaForCausalLM or Qwen2ForCausalLM) and ``tok`` to ``path``; 2-D tensors
    in f16 when ``f16``, else f32. ``permute_rope=False`` writes Llama's q/k rows unpermuted (a file
    a loader would read wrongly: the tests' proof that the permutation matters)."""
    import gguf

    cfg = model.config
    arch = {"llama": "llama", "qwen2": "qwen2"}[cfg.model_type]
    w = gguf.GGUFWriter(str(path), arch)
    _write_config(w, cfg)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if f16 else gguf.LlamaFileType.ALL_F32)
    _write_tokenizer(w, tok)
    heads = {"q_proj": cfg.num_attention_heads, "k_proj": cfg.num_key_value_heads}
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        t = tensor.detach().to(torch.float32)
        proj = name.split(".")[-2]
        if arch == "llama" and permute_rope and proj in heads and name.endswith(".weight"):
            t = rope_rows_to_gguf(t, heads[proj])
        array = t.numpy()
        w.add_tensor(gguf_tensor_name(name), array.astype(np.float16) if f16 and array.ndim == 2 else array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)
