"""The checks that the vLLM and hf rollout engines and the trainer agree on a model with a ChatML
chat template (a default system prompt, <|im_end|> as EOS, a byte-level BPE): shared by the tiny
model's test (tests/engines/test_chatml_parity.py, `make test`) and the real model's
(tests/engines/test_real_parity.py, `make test-real`).

- :func:`chat_prompts`: the prompts as the data pipeline encodes them (``encode_prompt``), which
  must be the chat template's ids with ``add_generation_prompt``;
- :func:`check_boundary`: the ids vLLM itself received are those, its tokenizer agrees, and
  prompt + response decode to the prompt's text followed by the response's;
- :func:`greedy_agreement`: vLLM's and the hf engine's greedy tokens position by position;
- :func:`check_eos`: a stopped response ends on <|im_end|>, once, as its last token;
- :func:`trainer_mismatch`: the sampled tokens' logprobs against the trainer's recomputed ones.
"""
from __future__ import annotations

import torch

from vcppo.data.dataset import encode_prompt
from vcppo.experience import make_layout

IM_END = "<|im_end|>"


def chat_prompts(tok, questions) -> list[list[int]]:
    """The pipeline's prompt ids for ``questions`` (one user turn each), checked against the template."""
    prompts = [encode_prompt(tok, q) for q in questions]
    for q, ids in zip(questions, prompts):
        want = tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                       tokenize=True, return_dict=False)
        assert ids == list(want), q
        text = tok.decode(ids)
        assert text.startswith("<|im_start|>system\n") and text.endswith(f"user\n{q}{IM_END}\n<|im_start|>assistant\n")
        assert ids[-len(tok.encode("<|im_start|>assistant\n", add_special_tokens=False)):] == \
            tok.encode("<|im_start|>assistant\n", add_special_tokens=False)
    return prompts


def check_boundary(tok, vllm_engine, prompts, samples) -> None:
    """Token-exact prompt / response boundary."""
    from vllm import SamplingParams
    seen = vllm_engine.llm.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(max_tokens=1),
                                    use_tqdm=False)
    assert [list(o.prompt_token_ids) for o in seen] == prompts  # nothing added (no BOS), nothing dropped
    for p in prompts:
        assert vllm_engine.tokenizer.encode(tok.decode(p), add_special_tokens=False) == p
    for s in samples:
        assert s.prompt_ids == prompts[s.prompt_index]
        assert s.text == tok.decode(s.response_ids, skip_special_tokens=False)
        assert tok.decode(s.prompt_ids + s.response_ids) == tok.decode(s.prompt_ids) + s.text


def greedy_agreement(a, b) -> tuple[int, int, list[int]]:
    """(tokens equal before the first difference, tokens compared, per-sample first difference or -1)."""
    same, total, first = 0, 0, []
    for x, y in zip(a, b):
        n = min(len(x.response_ids), len(y.response_ids))
        diff = next((i for i in range(n) if x.response_ids[i] != y.response_ids[i]),
                    -1 if len(x.response_ids) == len(y.response_ids) else n)
        first.append(diff)
        same += n if diff < 0 else diff
        total += max(len(x.response_ids), len(y.response_ids))
    return same, total, first


def check_eos(tok, samples, max_tokens: int) -> int:
    """Every response stopped on <|im_end|> (its last token, nowhere before) or ran to max_tokens
    without one; returns how many stopped."""
    eos = tok.convert_tokens_to_ids(IM_END)
    assert tok.eos_token_id == eos
    stopped = 0
    for s in samples:
        assert eos not in s.response_ids[:-1]
        if s.finish_reason == "stop":
            assert s.response_ids[-1] == eos and s.text.endswith(IM_END)
            stopped += 1
        else:
            assert len(s.response_ids) == max_tokens and s.response_ids[-1] != eos
    return stopped


def trainer_mismatch(trainer, samples) -> float:
    """max |sampler logprob - trainer logprob| over the response (model) tokens."""
    from vcppo.engines.rollout import sampled_logprobs_layout
    batch = make_layout([s.prompt_ids for s in samples], [s.response_ids for s in samples], pad_id=0)
    lp, _ = trainer.forward_logprobs(batch)
    sampled = sampled_logprobs_layout(samples, lp.shape[1])
    mask = batch.policy_mask.bool()
    assert int(mask.sum()) == sum(len(s.response_ids) for s in samples) and all(len(s.logprobs) for s in samples)
    return float((lp - sampled)[mask].abs().max())


def trainer(info, path):
    """The trainer's logprob pass (the actor's forward, frozen: no optimizer state), fp32."""
    from vcppo.config.schema import EngineConfig
    from vcppo.engines.reference import ReferenceEngine
    return ReferenceEngine(path, EngineConfig(micro_batch_size=4), info, dtype="float32")


def top2_gap(path, prompt_ids, response_ids) -> torch.Tensor:
    """The gap between the two largest logits before each response token (fp32 transformers), to
    tell a divergence at a near-tie from a real one."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + response_ids])).logits[0, len(prompt_ids) - 1:-1]
    top = logits.topk(2, dim=-1).values
    return top[:, 0] - top[:, 1]


def open_engines(model_dir, info, max_model_len: int):
    """vcppo's vLLM and hf rollout engines on ``model_dir`` (fp32, seed 0); close the first after use."""
    from vcppo.config.schema import RolloutConfig
    from vcppo.engines.rollout import RolloutEngine
    from vcppo.engines.rollout_hf import HFRolloutEngine
    vllm = RolloutEngine(model_dir, RolloutConfig(gpu_memory_utilization=0.02), info, seed=0,
                         max_model_len=max_model_len)
    return vllm, HFRolloutEngine(model_dir, RolloutConfig(), info, seed=0, max_model_len=max_model_len)
