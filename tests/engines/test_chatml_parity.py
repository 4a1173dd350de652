"""The vLLM and hf rollout engines and the trainer on a tiny model with the real model's tokenizer
features: a Llama (tied embeddings, as SmolLM2) imported from a GGUF the test writes
(`vcppo model import`'s path), a byte-level BPE with <|im_start|> 1 / <|im_end|> 2 (EOS), and a ChatML
template that adds a default system prompt. It has learnt two answers that end on <|im_end|>, so
responses stop there; the other prompts go wherever the model takes them. Greedy tokens are equal, both stop
on <|im_end|>, the prompt / response boundary is token-exact, and the sampler/trainer logprob
mismatch at fp32 is below 1e-4. The same checks on the real model: tests/engines/test_real_parity.py."""
import pytest

from tests.engines.chatml_parity import (IM_END, chat_prompts, open_engines, check_boundary, check_eos, greedy_agreement,
                                         trainer, trainer_mismatch)
from tests.engines.test_engines import LOGPROB_TOL

pytestmark = [pytest.mark.integration]

LEARNT = {"What is 12 plus 7?": "12 plus 7 is 19. The final answer after \"####\" is 19.",
          "What is 3 plus 30?": "#### 33"}
OTHER = ["What is 21 plus 17?", "Name a colour."]
MAX_TOKENS = 40


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from transformers import AutoTokenizer

    from tests.engines.test_think_tokens import _memorise
    from tests.models.gguf_writer import write_gguf
    from tests.models.test_gguf_import import tiny_source
    from vcppo.models.bpe_tokenizer import DEFAULT_SYSTEM, train_bpe_tokenizer
    from vcppo.models.gguf_import import import_gguf
    root = tmp_path_factory.mktemp("chatml_llama")
    texts = [f"system\n{DEFAULT_SYSTEM}\nuser\nassistant\n", *LEARNT, *LEARNT.values(), *OTHER]
    texts += [f"What is {a} plus {b}? The final answer after \"####\" is {a + b}." for a in range(30) for b in (3, 17)]
    bpe = train_bpe_tokenizer(texts, vocab_size=300)
    import_gguf(write_gguf(tiny_source("llama", len(bpe)), bpe, root / "tiny.gguf"), str(root / "model"))
    tok = AutoTokenizer.from_pretrained(root / "model")
    _memorise(str(root / "model"), chat_prompts(tok, list(LEARNT)),
              [tok.encode(a, add_special_tokens=False) + [tok.eos_token_id] for a in LEARNT.values()])
    return str(root / "model")


@pytest.fixture(scope="module")
def tok(model_dir):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def engines(info, model_dir):
    vllm, hf = open_engines(model_dir, info, 256)
    yield vllm, hf
    vllm.close()


def test_the_tokenizer_is_the_real_ones_kind(tok):
    assert (tok.eos_token, tok.eos_token_id, tok.convert_tokens_to_ids("<|im_start|>")) == (IM_END, 2, 1)
    assert tok.decode(chat_prompts(tok, ["q"])[0]).startswith(
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nq")
    assert len(tok.encode("The final answer", add_special_tokens=False)) < len("The final answer")  # merges


def test_greedy_tokens_equal_and_both_stop_on_im_end(engines, tok):
    vllm, hf = engines
    prompts = chat_prompts(tok, list(LEARNT) + OTHER)
    want = vllm.generate(prompts, n=1, temperature=0.0, top_p=1.0, max_tokens=MAX_TOKENS)
    got = hf.generate(prompts, n=1, temperature=0.0, top_p=1.0, max_tokens=MAX_TOKENS)
    same, total, first = greedy_agreement(want, got)
    assert same == total and first == [-1] * len(prompts)
    assert [s.text for s in got] == [s.text for s in want]
    assert [s.finish_reason for s in got] == [s.finish_reason for s in want]
    assert sum(len(s.response_ids) for s in want[2:]) >= 8  # the unlearnt prompts get answers of their own
    for samples in (want, got):
        assert check_eos(tok, samples, MAX_TOKENS) >= 2
        assert [s.text for s in samples[:2]] == [a + IM_END for a in LEARNT.values()]
    assert hf.stop_ids == [2]


def test_the_prompt_response_boundary_is_token_exact(engines, tok):
    vllm, hf = engines
    prompts = chat_prompts(tok, list(LEARNT) + OTHER)
    for engine in (vllm, hf):
        samples = engine.generate(prompts, n=2, temperature=1.0, top_p=1.0, max_tokens=MAX_TOKENS, seed=3)
        check_boundary(tok, vllm, prompts, samples)


def test_sampler_trainer_mismatch_at_fp32(info, engines, tok, model_dir):
    vllm, hf = engines
    prompts = chat_prompts(tok, list(LEARNT) + OTHER)
    frozen = trainer(info, model_dir)
    for engine in (vllm, hf):
        samples = engine.generate(prompts, n=3, temperature=1.0, top_p=1.0, max_tokens=MAX_TOKENS, seed=1)
        assert any(s.finish_reason == "stop" for s in samples) and any(s.finish_reason == "length" for s in samples)
        assert trainer_mismatch(frozen, samples) < LOGPROB_TOL
