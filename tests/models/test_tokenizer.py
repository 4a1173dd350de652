"""Char-level tokenizer: round trip, single-token think tags, chat template, Auto loading."""
import pytest

from vcppo.data.tasks import count_tokens, generate
from vcppo.models.tokenizer import build_tokenizer


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tok")
    build_tokenizer(d)
    return d


@pytest.fixture(scope="module")
def tok(tok_dir):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(tok_dir))


def test_round_trip_task_text_one_token_per_char(tok):
    for row in generate("add", "train", 20, seed=3):
        for text in (row["prompt"], row["solution"]):
            ids = tok.encode(text, add_special_tokens=False)
            assert tok.decode(ids) == text
            assert len(ids) == count_tokens(text)  # one per char, one per think tag


def test_whitespace_and_non_ascii_round_trip(tok):
    text = "a  b\n\n\tc \u2212 5 é"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


def test_think_tags_are_single_tokens_and_survive_skip_special(tok):
    ids = tok.encode("<think>12</think>", add_special_tokens=False)
    assert len(ids) == 4
    assert tok.convert_ids_to_tokens(ids)[0] == "<think>"
    assert tok.convert_ids_to_tokens(ids)[-1] == "</think>"
    # think tags are content, not special: they must survive decode(skip_special_tokens=True)
    text = "<think>1+2</think>\\boxed{3}" + tok.eos_token
    assert tok.decode(tok.encode(text, add_special_tokens=False), skip_special_tokens=True) == text[:-len(tok.eos_token)]


def test_special_tokens(tok):
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<pad>"
    assert tok.pad_token_id != tok.eos_token_id
    for t in ("<pad>", "<eos>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"):
        assert len(tok.encode(t, add_special_tokens=False)) == 1, t


def test_chat_template(tok):
    text = tok.apply_chat_template([{"role": "user", "content": "12+34=?"}], add_generation_prompt=True,
                                   tokenize=False)
    assert text == "<|im_start|>user\n12+34=?<|im_end|>\n<|im_start|>assistant\n"
    ids = tok.encode(text, add_special_tokens=False)
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>")
    assert tok.decode(ids) == text
