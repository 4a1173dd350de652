"""Model factory: parameter counts per size, saved dir loads through the Auto classes."""
import pytest
import torch

from vcppo.models.factory import SIZES, count_params, make_model, model_config
from vcppo.models.tokenizer import build_tokenizer


@pytest.mark.parametrize("size,lo,hi", [("tiny", 2e5, 2e6), ("small", 1e6, 5e6), ("base", 1e8, 3e8)])
def test_param_counts_in_range(size, lo, hi):
    from transformers import Qwen2ForCausalLM
    cfg = model_config(size, build_tokenizer())
    if size == "base":  # do not allocate 180M params in a unit test: count analytically
        with torch.device("meta"):
            model = Qwen2ForCausalLM(cfg)
    else:
        model = Qwen2ForCausalLM(cfg)
    assert lo <= count_params(model) <= hi


@pytest.mark.parametrize("size", sorted(SIZES))
def test_vllm_shape_constraints(size):
    s = SIZES[size]
    assert s.hidden_size % s.num_attention_heads == 0
    assert s.head_dim % 16 == 0 and s.head_dim in (32, 64, 128)
    assert s.num_attention_heads % s.num_key_value_heads == 0


def test_make_model_loads_with_auto_classes(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = make_model("tiny", None, tmp_path / "m", seed=1)
    loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "m"))
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "m"))
    assert loaded.config.model_type == "qwen2" and loaded.dtype == torch.float32
    assert loaded.config.vocab_size >= len(tok)
    assert loaded.config.max_position_embeddings >= 2048
    assert tok.eos_token_id in loaded.generation_config.eos_token_id
    # the tokenizer picked by AutoTokenizer for a qwen2 dir must still be char-level
    text = "<think>\n1+2+0=3 d3 c0\n</think>\n\\boxed{3}"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    assert len(tok.encode(" \n", add_special_tokens=False)) == 2
    ids = torch.tensor([tok.encode(text, add_special_tokens=False)])
    with torch.no_grad():
        a = model(input_ids=ids).logits
        b = loaded(input_ids=ids).logits
    assert torch.allclose(a, b)
    # same seed -> same weights
    m2 = make_model("tiny", str(tmp_path / "m"), tmp_path / "m2", seed=1)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), m2.parameters()))


def test_unknown_size():
    with pytest.raises(ValueError, match="tiny"):
        model_config("huge", build_tokenizer())


@pytest.mark.parametrize("tied", [True, False])
def test_tied_and_untied_checkpoints(tmp_path, tied):
    """`tied=False` (`vcppo model make --untied`) writes an LM head of its own, as the larger
    Qwen2.5 checkpoints have; the default shares the input embedding."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM
    make_model("tiny", None, tmp_path / "m", seed=3, tied=None if tied else False)
    saved = load_file(str(tmp_path / "m" / "model.safetensors"))
    loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "m"))
    assert loaded.config.tie_word_embeddings is tied
    head, emb = loaded.lm_head.weight, loaded.model.embed_tokens.weight
    if tied:
        assert "lm_head.weight" not in saved and head.data_ptr() == emb.data_ptr()
    else:
        assert torch.equal(saved["lm_head.weight"], head) and head.data_ptr() != emb.data_ptr()
        assert not torch.equal(head, emb) and head.std() > 0
    assert model_config("tiny", build_tokenizer(), tied=False).tie_word_embeddings is False
    assert model_config("tiny", build_tokenizer()).tie_word_embeddings is True


def test_the_real_size_shape_is_qwen25_05b_whatever_the_tokenizer():
    """`--size qwen2.5-0.5b-shape`: the published config's every dimension, the 151,936-row
    vocabulary kept beyond the char tokenizer's ~100 tokens; 494,032,768 parameters, as Qwen2.5-0.5B."""
    from transformers import Qwen2ForCausalLM

    from vcppo.models.shapes import BUILTIN_SHAPES
    cfg = model_config("qwen2.5-0.5b-shape", build_tokenizer())
    real = BUILTIN_SHAPES["qwen2.5-0.5b"]
    assert (cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads,
            cfg.intermediate_size, cfg.tie_word_embeddings) == (151936, 896, 24, 14, 2, 4864, True)
    with torch.device("meta"):
        model = Qwen2ForCausalLM(cfg)
    assert count_params(model) == real.params == 494_032_768
