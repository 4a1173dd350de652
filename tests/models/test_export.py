"""The HF export of a policy, tied and untied LM heads, without the engines (the
DeepSpeed + vLLM path is tests/engines/test_engines.py::test_export_loads_in_transformers_and_vllm):
the exported dir loads with AutoModelForCausalLM / AutoTokenizer with the given weights, keeps the
source's tokenizer files, chat template and generation config byte for byte, and exporting it again
gives identical files."""
import os

import pytest
import torch

from vcppo.data import tasks
from vcppo.models.bpe_tokenizer import task_corpus, train_bpe_tokenizer
from vcppo.models.export import TOKENIZER_FILES, save_causal_lm
from vcppo.models.factory import make_model


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("bpe")
    train_bpe_tokenizer(task_corpus(tasks.generate("add", "train", 100, difficulty=2, seed=0)), out,
                        vocab_size=300, think_as_added_tokens=True)
    return str(out)


def _trained_state(model, seed=0):
    """The parameters as the engines gather them (a tied head once, as the embedding), moved."""
    g = torch.Generator().manual_seed(seed)
    return {k: (v.detach() + 0.05 * torch.randn(v.shape, generator=g)).contiguous()
            for k, v in model.named_parameters()}


def _files(d):
    return {n: open(os.path.join(d, n), "rb").read() for n in sorted(os.listdir(d))}


@pytest.mark.parametrize("tied", [True, False])
def test_export_round_trip(tmp_path, bpe_dir, tied):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    src = tmp_path / "src"
    model = make_model("tiny", bpe_dir, src, seed=1, tied=tied)
    state = _trained_state(model)
    assert ("lm_head.weight" in state) is not tied
    save_causal_lm(state, str(src), str(tmp_path / "out"), torch.float32)

    out = AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"), dtype=torch.float32)
    assert out.config.tie_word_embeddings is tied
    sd = out.state_dict()
    for k, v in state.items():
        assert torch.equal(sd[k], v), k
    head = out.lm_head.weight
    assert torch.equal(head, state["model.embed_tokens.weight" if tied else "lm_head.weight"])
    assert (head.data_ptr() == out.model.embed_tokens.weight.data_ptr()) is tied
    # the tokenizer files, chat template and generation config of the source, byte for byte
    src_files, out_files = _files(src), _files(tmp_path / "out")
    for name in TOKENIZER_FILES:
        assert out_files.get(name) == src_files.get(name), name
    tok, src_tok = AutoTokenizer.from_pretrained(str(tmp_path / "out")), AutoTokenizer.from_pretrained(str(src))
    assert tok.chat_template == src_tok.chat_template and tok.eos_token == "<|im_end|>"
    text = "<think>\n1+2=3\n</think>\n\\boxed{3}"
    assert tok.encode(text) == src_tok.encode(text) and len(tok.encode("</think>")) == 1
    assert out.generation_config.eos_token_id == model.generation_config.eos_token_id
    # same logits as a model holding the state
    model.load_state_dict(state, strict=False)
    ids = torch.tensor([tok.encode(text)])
    with torch.no_grad():
        torch.testing.assert_close(out(ids).logits, model(ids).logits, rtol=0, atol=0)
    # round trip: exporting the export again writes the same files
    save_causal_lm(dict(out.named_parameters()), str(tmp_path / "out"), str(tmp_path / "again"), torch.float32)
    assert _files(tmp_path / "again") == out_files


def test_export_refuses_an_untied_state_without_its_head_and_unknown_tensors(tmp_path, bpe_dir):
    model = make_model("tiny", bpe_dir, tmp_path / "src", seed=1, tied=False)
    state = _trained_state(model)
    no_head = {k: v for k, v in state.items() if k != "lm_head.weight"}
    with pytest.raises(RuntimeError, match="lm_head.weight.*untied"):
        save_causal_lm(no_head, str(tmp_path / "src"), str(tmp_path / "a"), torch.float32)
    with pytest.raises(RuntimeError, match="unexpected.*value_head"):
        save_causal_lm({**state, "value_head.weight": torch.zeros(1, 128)}, str(tmp_path / "src"),
                       str(tmp_path / "b"), torch.float32)
