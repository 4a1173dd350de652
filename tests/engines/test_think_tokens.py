"""<think> / </think> as added tokens (one id each) and as plain BPE text (several tokens), through
the real rollout engine: a tiny model that has learnt two task responses is sampled
by vLLM CPU, and the verifier, stop handling, response masks and EOS placement are checked in both
cases. (The plain-text case also runs end to end, SFT -> PPO -> eval, in
tests/driver/test_bpe_e2e.py.)"""
from dataclasses import dataclass

import pytest
import torch

from vcppo.rewards.verifier import THINK_CLOSE, RewardScorer, score

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MAX_TOKENS = 64


@dataclass
class Policy:
    mode: str           # "added" | "text"
    tok: object
    rows: list          # the learnt task rows
    prompts: list       # their prompt ids (chat template)
    responses: list     # the learnt response ids: the solution, then <|im_end|>
    rollout: object


def _memorise(model_dir, prompts, responses, steps=600):
    """Train the random model until the responses are its greedy choice at every position, with a
    mean NLL under 0.005 (a few seconds: two short sequences, a 0.5M-parameter model)."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    seqs = [(torch.tensor([p + r]), len(p), torch.tensor(r)) for p, r in zip(prompts, responses)]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # matrices this small: one thread is ~5x faster than two contending
    try:
        _fit(model, opt, seqs, steps)
    finally:
        torch.set_num_threads(threads)
    model.save_pretrained(model_dir)  # the tokenizer and generation config stay as make_model wrote them


def _fit(model, opt, seqs, steps):
    for step in range(steps):
        opt.zero_grad()
        learnt = True
        for ids, P, r in seqs:
            logits = model(ids).logits[0, P - 1:-1]
            loss = torch.nn.functional.cross_entropy(logits, r)
            loss.backward()
            # confidently: sampled at temperature 1 a whole ~37-token response has p ~ exp(-37 * 0.005)
            learnt &= bool((logits.argmax(-1) == r).all()) and float(loss) < 0.005
        if learnt:
            break
        opt.step()
    assert learnt, "the tiny model did not learn the two responses"


@pytest.fixture(scope="module", params=["added", "text"])
def policy(request, info, tmp_path_factory):
    from transformers import AutoTokenizer

    from vcppo.data import tasks
    from vcppo.data.dataset import encode_prompt
    from vcppo.engines.rollout import RolloutEngine
    from vcppo.models.bpe_tokenizer import task_corpus, train_bpe_tokenizer
    from vcppo.models.factory import make_model
    from vcppo.config.schema import RolloutConfig
    root = tmp_path_factory.mktemp(f"think_{request.param}")
    corpus = tasks.generate("add", "train", 200, difficulty=2, seed=0)
    train_bpe_tokenizer(task_corpus(corpus), root / "tok", vocab_size=300,
                        think_as_added_tokens=request.param == "added")
    make_model("tiny", root / "tok", root / "model", seed=0)
    tok = AutoTokenizer.from_pretrained(root / "model")  # as the engines load it
    rows = tasks.generate("add", "test", 2, difficulty=2, seed=5)
    prompts = [encode_prompt(tok, r["prompt"]) for r in rows]
    responses = [tok.encode(r["solution"], add_special_tokens=False) + [tok.eos_token_id] for r in rows]
    _memorise(str(root / "model"), prompts, responses)
    rollout = RolloutEngine(str(root / "model"), RolloutConfig(gpu_memory_utilization=0.02), info, seed=0,
                            max_model_len=256)
    yield Policy(request.param, tok, rows, prompts, responses, rollout)
    rollout.close()


def _close_tag_span(tok, ids):
    """(first, last+1) positions of the tokens that make up the last </think> in ``ids``."""
    end = next(m for m in range(len(ids) + 1) if THINK_CLOSE in tok.decode(ids[:m]))
    start = max(j for j in range(end) if THINK_CLOSE in tok.decode(ids[j:end]))
    return start, end


def test_close_tag_is_one_token_or_several(policy):
    tok = policy.tok
    close = tok.encode(THINK_CLOSE, add_special_tokens=False)
    assert (len(close) == 1) is (policy.mode == "added")
    assert len(tok.encode("<think>", add_special_tokens=False)) == 1 if policy.mode == "added" else 2 <= len(close)
    for r in policy.responses:
        start, end = _close_tag_span(tok, r)
        assert end - start == (1 if policy.mode == "added" else len(close))
        if policy.mode == "added":
            assert r[start] == tok.convert_tokens_to_ids(THINK_CLOSE)
    # vLLM tokenises as transformers does
    text = policy.rows[0]["solution"]
    assert policy.rollout.tokenizer.encode(text, add_special_tokens=False) == tok.encode(text, add_special_tokens=False)


def test_greedy_response_ends_at_eos_and_is_verified(policy):
    out = policy.rollout.generate(policy.prompts, n=1, temperature=0.0, top_p=1.0, max_tokens=MAX_TOKENS)
    for s, row, expected in zip(out, policy.rows, policy.responses):
        assert s.response_ids == expected and s.finish_reason == "stop"
        assert s.response_ids[-1] == policy.tok.eos_token_id  # EOS generated once, last, and kept
        assert s.text == row["solution"] + policy.tok.eos_token  # decoded with the special tokens
        assert score(s.text, row["answer"]) == 1.0
        assert score(s.text, str(int(row["answer"]) + 1)) == -1.0


def test_stop_string_at_the_close_tag(policy):
    """rollout.stop=["</think>"]: the response stops right after the tag (kept in text and ids),
    whether the tag is one token or several; nothing after it is read, so it scores wrong."""
    out = policy.rollout.generate(policy.prompts, n=1, temperature=0.0, top_p=1.0, max_tokens=MAX_TOKENS,
                                  stop=[THINK_CLOSE])
    for s, row, expected in zip(out, policy.rows, policy.responses):
        _, end = _close_tag_span(policy.tok, expected)
        assert s.finish_reason == "stop" and s.response_ids == expected[:end]
        assert s.text == row["solution"][:row["solution"].index(THINK_CLOSE) + len(THINK_CLOSE)]
        assert policy.tok.eos_token_id not in s.response_ids
        assert score(s.text, row["answer"], finish_reason=s.finish_reason) == -1.0


def test_cut_inside_the_thought_scores_wrong(policy):
    """max_tokens ends the response just before (added) or inside (text) the close tag."""
    start, end = _close_tag_span(policy.tok, policy.responses[0])
    cut = end - 1  # added: the tokens before the tag; text: all but the tag's last token
    out = policy.rollout.generate(policy.prompts[:1], n=1, temperature=0.0, top_p=1.0, max_tokens=cut)
    s = out[0]
    assert s.finish_reason == "length" and s.response_ids == policy.responses[0][:cut]
    assert THINK_CLOSE not in s.text
    assert score(s.text, policy.rows[0]["answer"], finish_reason=s.finish_reason) == -1.0
    assert score(s.text + "</think>\\boxed{" + policy.rows[0]["answer"] + "}", policy.rows[0]["answer"],
                 finish_reason="length") == -1.0  # a length cut never scores right


@pytest.mark.parametrize("stop", [None, [THINK_CLOSE]])
def test_experience_masks_and_the_reward_at_the_last_token(policy, stop):
    """Sampled (temperature 1) through collect_rollout: the response mask covers exactly the
    generated tokens, EOS (when generated) is the last one, the outcome reward sits on the last
    token and nowhere else, and padding follows."""
    from vcppo.driver.step.sampler import collect_rollout
    from vcppo.config.schema import RolloutConfig
    rows = [{"prompt_ids": p, "answer": r["answer"]} for p, r in zip(policy.prompts, policy.rows)]
    sampling = RolloutConfig(n_samples_per_prompt=4, temperature=1.0, max_response_tokens=MAX_TOKENS, stop=stop or [])
    pad = policy.tok.pad_token_id
    batch = collect_rollout(rows, 0, rollout=policy.rollout, scorer=RewardScorer(num_workers=0), pad_id=pad,
                               device=torch.device("cpu"), sampling=sampling, seed=0)
    lengths = batch.policy_mask.sum(dim=1).long()
    for i in range(batch.responses.shape[0]):
        n = int(lengths[i])
        ids = batch.responses[i, :n].tolist()
        assert torch.all(batch.policy_mask[i, :n] == 1) and torch.all(batch.policy_mask[i, n:] == 0)
        assert torch.all(batch.responses[i, n:] == pad)
        assert batch.token_rewards[i, n - 1] == batch.scores[i] and batch.token_rewards[i].abs().sum() == batch.scores[i].abs()
        eos_at = [j for j, t in enumerate(ids) if t == policy.tok.eos_token_id]
        assert eos_at in ([], [n - 1])  # EOS at most once, as the last token
        if batch.truncated[i] == 1:
            assert n == MAX_TOKENS and not eos_at and batch.scores[i] == -1.0
        elif not eos_at:  # stopped without EOS: only at the stop string, which ends the response
            assert stop and policy.tok.decode(ids).rstrip().endswith(THINK_CLOSE)
        assert (batch.scores[i] == 1.0) == (batch.correct[i] == 1.0)
    if stop:  # nothing after the close tag: no answer
        assert torch.all(batch.scores == -1.0) and (batch.truncated == 0).any()
    else:  # the learnt responses dominate: most samples are right, each scored at its EOS
        assert batch.correct.mean() >= 0.5


def test_text_decoded_afterwards_equals_vllms_incremental_text(policy):
    """BPE (the close tag one token or several): the text decoded once after sampling (no stop
    strings) is vLLM's incremental text of the same samples (a never-matching stop string turns that
    on), and sampling without logprobs draws the same tokens."""
    kw = dict(n=4, temperature=1.0, top_p=1.0, max_tokens=MAX_TOKENS, seed=11)
    vllm_text = policy.rollout.generate(policy.prompts, stop=["\u00a7never\u00a7"], **kw)
    fast = policy.rollout.generate(policy.prompts, logprobs=False, **kw)
    assert [x.response_ids for x in fast] == [x.response_ids for x in vllm_text]
    assert [x.text for x in fast] == [x.text for x in vllm_text]
    assert any(THINK_CLOSE in x.text for x in fast) and all(x.logprobs == [] for x in fast)
