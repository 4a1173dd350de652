"""The transformers rollout engine (``rollout.engine=hf``) held against vLLM and the trainer on the
tiny model at fp32: greedy outputs token for token, stop ids and stop strings as vLLM's, the
trainer's logprobs of its samples equal to its own, seeded draws, weight sync (ZeRO-3 gathered,
LoRA merged and as an adapter). Its pure parts (truncation, batching by length, cutting a response,
the engine choice) are tested on plain tensors first."""
import pytest
import torch

from tests.engines.test_engines import LOGPROB_TOL, PROMPTS, _actor, _batch, _vllm_logprobs
from vcppo.algos.mismatch import mismatch_stats
from vcppo.engines import rollout_choice
from vcppo.engines.rollout_hf import cut_response, length_batches, text_to_stop, truncate
from vcppo.config.schema import RolloutConfig
from vcppo.errors import ConfigError

# prompts of several lengths: a batch left-pads the short ones
MIXED = [[5, 6, 7], [8, 9, 10, 11, 12, 13, 14, 15], [16], [17, 18, 19, 20]]


# --- pure parts ---------------------------------------------------------------------------------
def test_truncate_temperature_top_k_top_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.allclose(truncate(logits, 2.0, 0, 1.0), logits / 2)
    top2 = truncate(logits, 1.0, 2, 1.0)
    assert torch.isinf(top2[0, 2:]).all() and torch.equal(top2[0, :2], logits[0, :2])
    # top-p 0.7: 0.5 + 0.3 reach it; the 0.15 and 0.05 tokens go (the mass above each exceeds 0.7)
    p = truncate(logits, 1.0, 0, 0.7)
    assert torch.isfinite(p[0, :2]).all() and torch.isinf(p[0, 2:]).all()
    assert torch.isfinite(truncate(logits, 1.0, 0, 0.01)[0, 0])  # the most likely token always stays
    shuffled = logits[:, [2, 0, 3, 1]]  # order of the vocabulary does not matter
    assert torch.equal(torch.isinf(truncate(shuffled, 1.0, 0, 0.7)), torch.tensor([[True, False, True, False]]))


def test_length_batches_keep_short_prompts_off_the_long_ones():
    lengths = [3, 100, 4, 5, 3, 120]
    batches = length_batches(lengths, max_tokens=10, budget=60)
    assert sorted(i for b in batches for i in b) == list(range(6))
    assert batches == [[0, 4, 2, 3], [1], [5]]  # 4 x (5 + 10) = 60 fits; a long row never pads the short ones
    assert length_batches(lengths, 10, 10 ** 6) == [[0, 4, 2, 3, 1, 5]]
    assert length_batches([50], 10, 1) == [[0]]  # a row over the budget still gets a batch


def test_cut_response_at_a_stop_id_or_a_stop_string():
    assert cut_response([4, 5, 1, 0, 0], {1, 2}, 0) == ([4, 5, 1], True)
    assert cut_response([4, 5, 2, 1, 0], {1, 2}, 0) == ([4, 5, 2], True)  # the second stop id stops too
    assert cut_response([4, 5, 6], {1}, 0) == ([4, 5, 6], False)
    assert cut_response([4, 5, 6, 1], {1}, 2) == ([4, 5], True)
    assert text_to_stop("ab\ncd\nx", ["\n"]) == "ab\n" and text_to_stop("abc", ["z"]) == "abc"
    assert text_to_stop("a;b.c", [".", ";"]) == "a;"
    assert text_to_stop("ab\ufffd\ufffd", ["z"]) == "ab" and text_to_stop("ab\ufffd", None) == "ab\ufffd"


def test_auto_picks_vllm_where_it_imports_else_hf_and_says_why(monkeypatch):
    monkeypatch.setattr(rollout_choice, "vllm_import_error", lambda: None)
    assert rollout_choice.choose_engine("auto") == ("vllm", "rollout.engine=auto and vllm imports")
    monkeypatch.setattr(rollout_choice, "vllm_import_error", lambda: "ModuleNotFoundError: No module named 'vllm'")
    name, why = rollout_choice.choose_engine("auto")
    assert name == "hf" and "No module named 'vllm'" in why
    assert rollout_choice.choose_engine("hf") == ("hf", "rollout.engine=hf")
    with pytest.raises(ConfigError, match="rollout.engine=vllm, but vllm does not import here"):
        rollout_choice.choose_engine("vllm")


# --- the engine, against vLLM and the trainer ---------------------------------------------------
def _hf(info, path, **kw):
    from vcppo.engines.rollout_hf import HFRolloutEngine
    return HFRolloutEngine(path, RolloutConfig(**kw.pop("cfg", {})), info, seed=0, max_model_len=256, **kw)


@pytest.fixture(scope="module")
def two_stop_model(tmp_path_factory):
    """The factory's tiny model: its generation config stops on two ids, as Qwen's does."""
    from vcppo.models.factory import make_model
    out = tmp_path_factory.mktemp("tiny_two_stops")
    model = make_model("tiny", None, out)
    assert len(model.generation_config.eos_token_id) == 2
    return str(out)


@pytest.fixture(scope="module")
def vllm_and_hf(info, two_stop_model):
    from vcppo.engines.rollout import RolloutEngine
    vllm = RolloutEngine(two_stop_model, RolloutConfig(gpu_memory_utilization=0.02), info, seed=0, max_model_len=256,
                         logprobs_mode="raw")
    hf = _hf(info, two_stop_model, logprobs_mode="raw")
    yield vllm, hf
    vllm.close()


@pytest.mark.integration
def test_greedy_outputs_equal_vllms_token_for_token(vllm_and_hf, two_stop_model):
    vllm, hf = vllm_and_hf
    from vcppo.models.tokenizer import EOS
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(two_stop_model)
    prompts = [tok.encode(t) for t in ("12+34=", "7+8=", "1+2+3+4+5=", "99+1=")] + MIXED
    for stop in (None, ["3", "+"]):
        want = vllm.generate(prompts, n=2, temperature=0.0, top_p=1.0, max_tokens=24, stop=stop)
        got = hf.generate(prompts, n=2, temperature=0.0, top_p=1.0, max_tokens=24, stop=stop)
        assert [s.response_ids for s in got] == [s.response_ids for s in want]
        assert [(s.finish_reason, s.text, s.prompt_index) for s in got] == \
            [(s.finish_reason, s.text, s.prompt_index) for s in want]
        lp, want_lp = (torch.tensor([x for s in ss for x in s.logprobs]) for ss in (got, want))
        assert (lp - want_lp).abs().max() < LOGPROB_TOL  # raw logprobs: vLLM's raw_logprobs mode
    ends = {s.response_ids[-1] for s in got if s.finish_reason == "stop" and not s.text.endswith(("3", "+"))}
    assert ends <= set(hf.stop_ids)
    # both of the generation config's ids stop it, as they stop vLLM
    assert set(hf.stop_ids) == {tok.eos_token_id, tok.convert_tokens_to_ids(EOS)} and len(hf.stop_ids) == 2
    # batched by length: a budget of one row per batch gives the same greedy outputs
    one_by_one = _hf(hf.dist, two_stop_model, cfg={"hf_batch_tokens": 1})
    alone = one_by_one.generate(prompts, n=1, temperature=0.0, top_p=1.0, max_tokens=24)
    assert [s.response_ids for s in alone] == [s.response_ids for s in want[::2]]


@pytest.fixture(scope="module")
def hf(info, tiny_model_dir):
    return _hf(info, tiny_model_dir)


@pytest.mark.integration
@pytest.mark.parametrize("temperature,top_k", [(1.0, 0), (0.7, 0)])
def test_the_trainers_logprobs_of_hf_samples_equal_the_engines(info, hf, tiny_model_dir, temperature, top_k):
    s = hf.generate(MIXED, n=3, temperature=temperature, top_p=1.0, max_tokens=16, seed=1, top_k=top_k)
    assert [x.prompt_index for x in s] == [i for i in range(len(MIXED)) for _ in range(3)]
    assert all(len(x.logprobs) == len(x.response_ids) >= 1 for x in s)
    assert all(x.prompt_ids == MIXED[x.prompt_index] for x in s)
    b = _batch(s)
    lp, _ = _actor(info, tiny_model_dir, temperature=temperature).forward_logprobs(b)
    stats = mismatch_stats(lp, _vllm_logprobs(s, lp), b.policy_mask)
    assert stats["logprob_abs_max"] < LOGPROB_TOL and abs(float(stats["kl_k3"])) < 1e-8


@pytest.mark.integration
def test_processed_logprobs_are_the_truncated_distributions(hf, tiny_model_dir):
    """top-k: the logprobs are of the renormalised top-k distribution (vLLM's processed mode), and
    every sampled token is in the top k."""
    from transformers import AutoModelForCausalLM
    s = hf.generate(MIXED[:2], n=4, temperature=0.8, top_p=1.0, max_tokens=10, seed=3, top_k=3)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    for x in s:
        ids = torch.tensor([x.prompt_ids + x.response_ids])
        with torch.no_grad():
            logits = model(ids).logits[0, len(x.prompt_ids) - 1:-1].float()
        want = torch.log_softmax(truncate(logits, 0.8, 3, 1.0), -1).gather(-1, torch.tensor(x.response_ids)[:, None])[:, 0]
        assert torch.allclose(torch.tensor(x.logprobs), want, atol=LOGPROB_TOL)
        assert torch.isfinite(want).all()  # in the top 3


@pytest.mark.integration
def test_seeded_draws_repeat_on_a_fresh_engine_and_leave_the_process_rng(info, hf, tiny_model_dir):
    torch.manual_seed(123)
    before = torch.get_rng_state()
    a = hf.generate(MIXED, n=2, temperature=1.0, top_p=1.0, max_tokens=12, seed=4)
    assert torch.equal(torch.get_rng_state(), before)
    b = _hf(info, tiny_model_dir).generate(MIXED, n=2, temperature=1.0, top_p=1.0, max_tokens=12, seed=4)
    c = hf.generate(MIXED, n=2, temperature=1.0, top_p=1.0, max_tokens=12, seed=5)
    assert [x.response_ids for x in a] == [x.response_ids for x in b] != [x.response_ids for x in c]
    assert hf.sleep() is False and hf.wake_up() is None  # no-ops


@pytest.mark.integration
def test_weight_sync_from_a_zero3_actor_and_lora_merged_or_adapter(info, tiny_model_dir):
    """After an update under ZeRO-3 and a sync, the engine's logprobs equal the actor's; the LoRA
    actor's merged weights and its adapter give the same samples."""
    from tests.engines.test_lora import _lora_actor
    from tests.engines.token_loss import nll_loss
    engine = _hf(info, tiny_model_dir)
    actor = _actor(info, tiny_model_dir, zero_stage=3, lr=1e-2)
    batch = _batch(engine.generate(PROMPTS, n=2, temperature=1.0, top_p=1.0, max_tokens=12, seed=1))
    for _ in range(2):
        actor.train_step(batch, nll_loss())
    stale = engine.generate(PROMPTS, n=2, temperature=1.0, top_p=1.0, max_tokens=12, seed=2)
    engine.sync_weights(actor.named_parameters_gathered())
    fresh = engine.generate(PROMPTS, n=2, temperature=1.0, top_p=1.0, max_tokens=12, seed=2)
    for samples, far in ((fresh, False), (stale, True)):
        lp, _ = actor.forward_logprobs(_batch(samples))
        gap = (lp - _vllm_logprobs(samples, lp)).abs().max()
        assert (gap > 1e-2) if far else (gap < LOGPROB_TOL)
    with pytest.raises(RuntimeError, match="no tensor for"):
        engine.sync_weights([("model.norm.weight", torch.ones(64))])
    with pytest.raises(RuntimeError, match="no parameter 'nope'"):
        engine.sync_weights([("nope", torch.ones(1))])

    lora = _lora_actor(info, tiny_model_dir)
    for _ in range(3):
        lora.train_step(batch, nll_loss())
    merged, adapter = _hf(info, tiny_model_dir), _hf(info, tiny_model_dir, lora_rank=4)
    merged.sync_weights(lora.named_parameters_gathered())
    assert adapter.uses_adapters and not merged.uses_adapters
    for _ in range(2):  # a second sync loads the new tensors into the same adapter
        adapter.sync_adapter(lambda d: lora.export_adapter(d, every_rank=True))
    got = [e.generate(PROMPTS, n=2, temperature=1.0, top_p=1.0, max_tokens=12, seed=3) for e in (merged, adapter)]
    assert [x.response_ids for x in got[0]] == [x.response_ids for x in got[1]]
    lp, _ = lora.forward_logprobs(_batch(got[1]))
    assert (lp - _vllm_logprobs(got[1], lp)).abs().max() < LOGPROB_TOL


def test_a_budget_per_prompt_cuts_each_response_at_its_own(hf):
    """An episode's turns each ask for what their context leaves (one budget per prompt)."""
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    out = hf.generate(prompts, n=2, temperature=1.0, top_p=1.0, max_tokens=[3, 9, 1], seed=4, logprobs=True,
                      reset_cache=False)
    limits = [3, 3, 9, 9, 1, 1]
    assert [s.prompt_index for s in out] == [0, 0, 1, 1, 2, 2]
    assert all(len(s.response_ids) <= lim and len(s.logprobs) == len(s.response_ids) for s, lim in zip(out, limits))
    assert all(s.finish_reason == "length" for s, lim in zip(out, limits) if len(s.response_ids) == lim
               and s.response_ids[-1] not in hf.stop_ids)
