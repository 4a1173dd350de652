"""The locally trained byte-level BPE tokenizer: Qwen2.5-style chat template and special
tokens, <|im_end|> as EOS, and </think> spanning several tokens — decoding, EOS placement in the
response mask, and the verifier stay right when it does."""
import pytest
import torch

from vcppo.data import tasks
from vcppo.data.dataset import encode_prompt
from vcppo.experience import make_layout
from vcppo.models.bpe_tokenizer import QWEN25_CHAT_TEMPLATE, task_corpus, train_bpe_tokenizer
from vcppo.rewards.verifier import score


@pytest.fixture(scope="module")
def rows():
    return tasks.generate("add", "train", 300, difficulty=4, seed=0)


@pytest.fixture(scope="module")
def bpe(rows, tmp_path_factory):
    out = tmp_path_factory.mktemp("bpe")
    train_bpe_tokenizer(task_corpus(rows), out, vocab_size=400)
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(out))  # as every command loads it


def pieces(tok, text):
    return [tok.decode([i]) for i in tok.encode(text, add_special_tokens=False)]


def test_special_tokens_and_chat_template(bpe):
    assert bpe.eos_token == "<|im_end|>" and bpe.pad_token == "<|endoftext|>" and bpe.chat_template == QWEN25_CHAT_TEMPLATE
    assert bpe.padding_side == "left"
    for special in ("<|im_end|>", "<|im_start|>", "<|endoftext|>"):
        assert len(bpe.encode(special, add_special_tokens=False)) == 1
    text = bpe.decode(encode_prompt(bpe, "12+34=?"))
    assert text == ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                    "<|im_start|>user\n12+34=?<|im_end|>\n<|im_start|>assistant\n")
    own_system = bpe.apply_chat_template([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "q"}],
                                         add_generation_prompt=True, tokenize=False)
    assert own_system.startswith("<|im_start|>system\nBe brief.<|im_end|>\n") and "helpful" not in own_system


def test_think_tags_are_plain_multi_token_text_and_round_trip(bpe, rows):
    assert pieces(bpe, "</think>") == ["</", "think", ">"]
    assert len(pieces(bpe, "<think>")) >= 2
    merged = 0
    for r in rows[:50]:
        ids = bpe.encode(r["solution"], add_special_tokens=False)
        assert bpe.decode(ids) == r["solution"]  # byte-level: exact round trip
        merged += len(ids) < len(r["solution"])
    assert merged == 50  # merges were learnt: fewer tokens than characters


def test_think_as_added_tokens(rows):
    tok = train_bpe_tokenizer(task_corpus(rows), vocab_size=400, think_as_added_tokens=True)
    assert pieces(tok, "x</think>\\boxed{5}")[:2] == ["x", "</think>"]
    assert len(tok.encode("<think>", add_special_tokens=False)) == 1


def test_policy_mask_and_eos_with_a_multi_token_close_tag(bpe, rows):
    r = rows[0]
    prompt = encode_prompt(bpe, r["prompt"])
    full = bpe.encode(r["solution"], add_special_tokens=False) + [bpe.eos_token_id]
    cut = bpe.encode(r["solution"].split("</think>")[0] + "</", add_special_tokens=False)  # mid-tag
    batch = make_layout([prompt, prompt], [full, cut], pad_id=bpe.pad_token_id)
    lengths = [int(n) for n in batch.policy_mask.sum(dim=1).tolist()]
    assert lengths == [len(full), len(cut)]
    # EOS is the last real response token (where the outcome reward goes), padding after it is masked
    assert batch.responses[0, lengths[0] - 1].item() == bpe.eos_token_id
    assert torch.all(batch.responses[1, lengths[1]:] == bpe.pad_token_id)


def test_verifier_on_decoded_bpe_responses(bpe, rows):
    r = rows[1]
    ids = bpe.encode(r["solution"], add_special_tokens=False) + [bpe.eos_token_id]
    # vLLM decodes with skip_special_tokens=False: the text ends in <|im_end|>
    assert score(bpe.decode(ids), r["answer"]) == 1.0
    closed_at = next(m for m in range(len(ids) + 1) if "</think>" in bpe.decode(ids[:m]))
    opened_at = max(j for j in range(closed_at) if "</think>" in bpe.decode(ids[j:closed_at]))
    assert closed_at - opened_at >= 2  # in context too, the close tag spans several tokens
    for m in range(opened_at + 1, closed_at):  # stopped inside the close tag: no answer part
        assert score(bpe.decode(ids[:m]), r["answer"]) == -1.0
    # a token of the tag missing: not a close tag, so nothing after it is read
    assert score(bpe.decode(ids[:opened_at] + ids[opened_at + 1:]), r["answer"]) == -1.0
