"""Rollout / actor / critic / reference engines on one rank (in this process, world size 1).

The vLLM engine and the process group are built once per module (start-up is the slow part).
"""
import os
import time
from dataclasses import dataclass

import pytest
import torch

from tests.engines.token_loss import nll_loss, value_mse_loss
from vcppo.experience import CriticBatch, Rollout, make_layout

pytestmark = [pytest.mark.integration]

LOGPROB_TOL = 1e-4  # fp32 CPU: vLLM sampler vs trainer recomputation measured ~5e-6 here (NOTES: 5e-7)


@pytest.fixture(scope="module")
def rollout(info, tiny_model_dir):
    from vcppo.engines.rollout import RolloutEngine
    from vcppo.config.schema import RolloutConfig
    r = RolloutEngine(tiny_model_dir, RolloutConfig(gpu_memory_utilization=0.02), info, seed=0, max_model_len=256)
    yield r
    r.close()


@pytest.fixture(scope="module")
def compiled_rollout(info, tiny_model_dir):
    """The same engine with ``rollout.enforce_eager=false``: vLLM compiles the model (on CPU,
    torch.compile / inductor), and a weight sync must still reach the compiled graph."""
    from vcppo.engines.rollout import RolloutEngine
    from vcppo.config.schema import RolloutConfig
    r = RolloutEngine(tiny_model_dir, RolloutConfig(gpu_memory_utilization=0.02, enforce_eager=False), info,
                      seed=0, max_model_len=256)
    yield r
    r.close()


def _actor(info, path, temperature=1.0, **kw):
    from vcppo.engines.actor import ActorEngine
    from vcppo.config.schema import ActorConfig
    cfg = ActorConfig(**{"lr": 1e-3, "micro_batch_size": 4, "grad_clip": 0.0, **kw})
    return ActorEngine(path, cfg, info, total_optimizer_steps=10, temperature=temperature)


def _batch(samples):
    return make_layout([s.prompt_ids for s in samples], [s.response_ids for s in samples], pad_id=0)


def _vllm_logprobs(samples, like):
    out = torch.zeros_like(like)
    for i, s in enumerate(samples):
        out[i, :len(s.logprobs)] = torch.tensor(s.logprobs)
    return out


PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12], [13]]


def test_rollout_fields_reproducibility_and_logprobs(info, rollout, tiny_model_dir, tiny_tokenizer):
    s = rollout.generate(PROMPTS, n=3, temperature=1.0, top_p=1.0, max_tokens=12, seed=1)
    assert len(s) == 9 and [x.prompt_index for x in s] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    for x in s:
        assert x.prompt_ids == PROMPTS[x.prompt_index]
        assert 1 <= len(x.response_ids) <= 12 and len(x.logprobs) == len(x.response_ids)
        assert x.finish_reason in ("stop", "length")
        assert (x.finish_reason == "length") == (len(x.response_ids) == 12 and x.response_ids[-1] != 1)
        assert all(lp <= 0 for lp in x.logprobs)
    again = rollout.generate(PROMPTS, n=3, temperature=1.0, top_p=1.0, max_tokens=12, seed=1)
    assert [x.response_ids for x in again] == [x.response_ids for x in s]
    other = rollout.generate(PROMPTS, n=3, temperature=1.0, top_p=1.0, max_tokens=12, seed=2)
    assert [x.response_ids for x in other] != [x.response_ids for x in s]

    actor = _actor(info, tiny_model_dir)
    b = _batch(s)
    lp, ent = actor.forward_logprobs(b, with_entropy=True)
    assert lp.shape == b.responses.shape and ent.shape == lp.shape
    assert (lp[b.policy_mask == 0] == 0).all() and (ent[b.policy_mask == 0] == 0).all()
    assert (lp - _vllm_logprobs(s, lp)).abs().max() < LOGPROB_TOL
    # at temperature T vLLM reports processed logprobs = log_softmax(logits / T)
    st = rollout.generate(PROMPTS, n=2, temperature=0.7, top_p=1.0, max_tokens=8, seed=1)
    lpt, _ = _actor(info, tiny_model_dir, temperature=0.7).forward_logprobs(_batch(st))
    assert (lpt - _vllm_logprobs(st, lpt)).abs().max() < LOGPROB_TOL
    # greedy is deterministic and ignores the seed; text keeps special tokens
    g1 = rollout.generate(PROMPTS[:1], n=2, temperature=0.0, top_p=1.0, max_tokens=8, seed=5)
    g2 = rollout.generate(PROMPTS[:1], n=1, temperature=0.0, top_p=1.0, max_tokens=8, seed=9)
    assert g1[0].response_ids == g1[1].response_ids == g2[0].response_ids
    assert g1[0].text == tiny_tokenizer.decode(g1[0].response_ids, skip_special_tokens=False)


NEVER = ["\u00a7never\u00a7"]  # a stop string the models cannot write: only switches vLLM's detokenizer on


def test_no_logprobs_and_no_incremental_text_leave_the_samples_unchanged(rollout, tiny_tokenizer):
    """Without stop strings vLLM does not detokenize step by step (the text is decoded once
    afterwards) and ``logprobs=False`` skips its per-token logprob output. Neither changes what is
    sampled: against vLLM's own incremental text (a stop string that never matches turns it on) and
    logprobs, the same seed gives the same tokens, texts, finish reasons."""
    prompts = [tiny_tokenizer.encode(t, add_special_tokens=False) for t in ("12+34=", "What is 7+8?", "<think>")]
    kw = dict(n=4, temperature=1.0, top_p=1.0, max_tokens=40, seed=3)
    vllm_text = rollout.generate(prompts, stop=NEVER, **kw)
    fast = rollout.generate(prompts, logprobs=False, **kw)
    assert [x.response_ids for x in fast] == [x.response_ids for x in vllm_text]
    assert [x.text for x in fast] == [x.text for x in vllm_text]
    assert [x.finish_reason for x in fast] == [x.finish_reason for x in vllm_text]
    assert all(x.logprobs == [] for x in fast) and all(len(x.logprobs) == len(x.response_ids) for x in vllm_text)
    stopped = [x for x in fast if x.finish_reason == "stop"]
    assert stopped and all(x.text.endswith(tiny_tokenizer.decode(x.response_ids[-1:])) for x in stopped)
    assert all(x.text.endswith(("<|im_end|>", "<eos>")) for x in stopped)  # the special stop token is kept


# --- tied and untied LM heads: ZeRO-3 load, HF export, weight sync -------------------------


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory):
    """A Qwen2.5-style BPE tokenizer (chat template, <|im_end|> EOS), trained on task text."""
    from vcppo.data import tasks
    from vcppo.models.bpe_tokenizer import task_corpus, train_bpe_tokenizer
    out = tmp_path_factory.mktemp("bpe")
    train_bpe_tokenizer(task_corpus(tasks.generate("add", "train", 100, difficulty=2, seed=0)), out, vocab_size=300)
    return str(out)


@dataclass
class Exported:
    src: str          # `vcppo model make` dir the actor started from
    export: str       # ActorEngine.export_hf of the actor after one step
    state: dict       # the trainer's weights after the step (full_state_dict)
    batch: object     # the step's batch (chat-template prompts + task solutions)
    logprobs: object  # the trainer's logprobs of `batch` after the step


def _head(state):
    """The trainer's LM head: its own tensor when untied, the input embedding when tied."""
    return state.get("lm_head.weight", state["model.embed_tokens.weight"])


def _train_and_export(info, root, bpe_dir, tied) -> Exported:
    """`vcppo model make [--untied]` -> a ZeRO-3 actor (the head loaded from the checkpoint, or tied
    to the embedding) -> one optimizer step -> export_hf."""
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    from vcppo.data import tasks
    from vcppo.data.dataset import encode_prompt
    from vcppo.models.factory import make_model
    src, export = str(root / "src"), str(root / "export")
    make_model("tiny", bpe_dir, src, seed=0, tied=tied)
    saved = load_file(os.path.join(src, "model.safetensors"))
    actor = _actor(info, src, lr=2e-2, micro_batch_size=2, zero_stage=3)
    before = actor.full_state_dict()
    if tied:  # the gathered parameters hold the shared tensor once; the module's head is the embedding
        assert "lm_head.weight" not in saved and "lm_head.weight" not in before
        assert actor.module.lm_head.weight is actor.module.model.embed_tokens.weight
    else:  # ZeRO-3's partitioned load put the checkpoint's own head in place, not a fresh one
        assert torch.equal(before["lm_head.weight"], saved["lm_head.weight"])
        assert not torch.equal(before["lm_head.weight"], before["model.embed_tokens.weight"])
    tok = AutoTokenizer.from_pretrained(src)
    rows = tasks.generate("add", "test", 3, difficulty=2, seed=1)
    batch = make_layout([encode_prompt(tok, r["prompt"]) for r in rows],
                        [tok.encode(r["solution"][:40], add_special_tokens=False) for r in rows],
                        pad_id=tok.pad_token_id)
    actor.train_step(batch, nll_loss())
    state = actor.full_state_dict()
    assert not torch.equal(_head(state), _head(before))  # the step moved the head too
    actor.export_hf(export)
    logprobs, _ = actor.forward_logprobs(batch)
    actor.close()
    return Exported(src, export, state, batch, logprobs)


@pytest.fixture(scope="module")
def exports(info, tmp_path_factory, bpe_dir):
    """tying ("tied" / "untied") -> :class:`Exported`, built once per module."""
    cache = {}

    def get(tying):
        if tying not in cache:
            cache[tying] = _train_and_export(info, tmp_path_factory.mktemp(tying), bpe_dir, tying == "tied")
        return cache[tying]
    return get


def _export_rollout(info, exports, tying):
    from vcppo.engines.rollout import RolloutEngine
    from vcppo.config.schema import RolloutConfig
    return RolloutEngine(exports(tying).export, RolloutConfig(gpu_memory_utilization=0.02), info, seed=0,
                         max_model_len=256)


# vLLM engines on the exports live as long as the module: closing one in process drops process
# groups that DeepSpeed's ZeRO-3 has cached, and a later ZeRO-3 engine fails ("Group ... is not
# registered").
@pytest.fixture(scope="module")
def untied_rollout(info, exports):
    """vLLM on the untied export (shared by the export and the weight-sync tests)."""
    r = _export_rollout(info, exports, "untied")
    yield r
    r.close()


@pytest.fixture(scope="module")
def tied_export_rollout(info, exports):
    r = _export_rollout(info, exports, "tied")
    yield r
    r.close()


def _vllm_lm_head(rollout):
    def peek(worker):
        return worker.model_runner.get_model().lm_head.weight.detach().to("cpu", torch.float32).clone()
    return rollout.llm.collective_rpc(peek)[0]


GREEDY_MARGIN = 1e-3  # positions whose top-2 trainer logits are closer than this may legitimately differ


def _assert_greedy_matches(hf, samples):
    """vLLM's greedy tokens are transformers' argmax at every position (teacher-forced on vLLM's
    sequence) where the choice is clear; with the wrong head they would not be."""
    clear_total = 0
    for s in samples:
        with torch.no_grad():
            logits = hf(torch.tensor([s.prompt_ids + s.response_ids])).logits[0].float()
        P, R = len(s.prompt_ids), len(s.response_ids)
        top = logits[P - 1:P - 1 + R].topk(2, dim=-1)
        clear = (top.values[:, 0] - top.values[:, 1]) > GREEDY_MARGIN
        assert torch.equal(top.indices[clear, 0], torch.tensor(s.response_ids)[clear])
        clear_total += int(clear.sum())
    assert clear_total >= sum(len(s.response_ids) for s in samples) // 2


def _files(d):
    return {n: open(os.path.join(d, n), "rb").read() for n in sorted(os.listdir(d))}


@pytest.mark.parametrize("tying", ["tied", "untied"])
def test_export_loads_in_transformers_and_vllm(info, request, exports, tying, tmp_path):
    """The exported policy (ZeRO-3 actor, one step) loads in transformers with the trainer's exact
    weights and logprobs, keeps the tokenizer files and chat template byte for byte, loads in vLLM
    with the trainer's logprobs (LOGPROB_TOL) and greedy choices, and exports again identically."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vcppo.models.export import TOKENIZER_FILES
    e = exports(tying)
    hf = AutoModelForCausalLM.from_pretrained(e.export, dtype=torch.float32)
    assert hf.config.tie_word_embeddings is (tying == "tied")
    sd = hf.state_dict()
    for k, v in e.state.items():
        assert torch.equal(sd[k], v), k
    assert torch.equal(hf.lm_head.weight, _head(e.state))
    b = e.batch
    logits = hf(b.input_ids, attention_mask=b.attention_mask, position_ids=b.position_ids).logits
    ref = torch.log_softmax(logits[:, b.prompt_len - 1:-1], -1).gather(-1, b.responses[..., None])[..., 0]
    torch.testing.assert_close(e.logprobs, ref * b.policy_mask, rtol=0, atol=1e-5)
    src_files, out_files = _files(e.src), _files(e.export)
    for name in TOKENIZER_FILES:  # tokenizer, chat template, generation config (EOS list)
        assert out_files.get(name) == src_files.get(name), name
    tok = AutoTokenizer.from_pretrained(e.export)
    assert tok.chat_template == AutoTokenizer.from_pretrained(e.src).chat_template and tok.eos_token == "<|im_end|>"
    # round trip: the export, loaded by a ZeRO-3 actor and exported again, is the same files
    _actor(info, e.export, zero_stage=3).export_hf(str(tmp_path / "again"))
    assert _files(tmp_path / "again") == out_files

    prompts = [list(map(int, b.input_ids[i, :b.prompt_len][b.attention_mask[i, :b.prompt_len].bool()]))
               for i in range(b.size)]
    rollout = request.getfixturevalue("tied_export_rollout" if tying == "tied" else "untied_rollout")
    assert torch.equal(_vllm_lm_head(rollout)[:hf.config.vocab_size], _head(e.state))
    s = rollout.generate(prompts, n=2, temperature=1.0, top_p=1.0, max_tokens=10, seed=3)
    lp, _ = _actor(info, e.export).forward_logprobs(_batch(s))
    assert (lp - _vllm_logprobs(s, lp)).abs().max() < LOGPROB_TOL
    _assert_greedy_matches(hf, rollout.generate(prompts, n=1, temperature=0.0, top_p=1.0, max_tokens=10))


def _policy(request, tying):
    """(vLLM engine, model dir) of the weight-sync test: the char-level tied model of conftest (in
    an eager or a compiled engine), or the untied BPE export (its engine shared with the export test)."""
    if tying.startswith("tied"):
        engine = "compiled_rollout" if tying == "tied-compiled" else "rollout"
        return request.getfixturevalue(engine), request.getfixturevalue("tiny_model_dir")
    return request.getfixturevalue("untied_rollout"), request.getfixturevalue("exports")("untied").export


@pytest.mark.parametrize("tying", ["tied", "untied", "tied-compiled"])
def test_train_step_then_sync_weights_updates_vllm(info, request, tying):
    """A ZeRO-3 step, synced into vLLM: tied, the LM head is re-tied to the new embedding; untied,
    lm_head.weight is sent and loaded. vLLM's head is the trainer's, its logprobs and greedy choices
    are the trainer's (a stale head fails all three)."""
    rollout, tiny_model_dir = _policy(request, tying)
    actor = _actor(info, tiny_model_dir, lr=2e-2, micro_batch_size=2, zero_stage=3)
    head_before = _vllm_lm_head(rollout)
    s = rollout.generate(PROMPTS, n=2, temperature=1.0, top_p=1.0, max_tokens=10, seed=4)
    b = _batch(s)
    old, _ = actor.forward_logprobs(b)
    m = actor.train_step(b, nll_loss())
    assert {"loss_sum", "grad_norm", "lr"} <= set(m) and m["lr"] == pytest.approx(2e-2)
    new, _ = actor.forward_logprobs(b)
    mask = b.policy_mask.bool()
    assert ((new - old).abs()[mask] > 1e-4).all()  # every position moved
    t0 = time.perf_counter()
    secs = rollout.sync_weights(actor.named_parameters_gathered(bucket_bytes=4096))
    assert 0 < secs <= time.perf_counter() - t0  # the seconds the sync took, timed inside the call
    s2 = rollout.generate(PROMPTS, n=2, temperature=1.0, top_p=1.0, max_tokens=10, seed=4)
    b2 = _batch(s2)
    new2, _ = actor.forward_logprobs(b2)
    v2 = _vllm_logprobs(s2, new2)
    assert (new2 - v2).abs().max() < LOGPROB_TOL
    state = actor.full_state_dict()
    head = _vllm_lm_head(rollout)[:_head(state).shape[0]]
    assert torch.equal(head, _head(state)) and not torch.equal(head, head_before[:head.shape[0]])
    from transformers import AutoConfig, AutoModelForCausalLM
    hf = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tiny_model_dir), dtype=torch.float32)
    hf.load_state_dict(state, strict=False)
    _assert_greedy_matches(hf.eval(), rollout.generate(PROMPTS, n=1, temperature=0.0, top_p=1.0, max_tokens=10))
    # and the vLLM logprobs of the same tokens are NOT the old model's (every position)
    old_actor = _actor(info, tiny_model_dir)
    old2, _ = old_actor.forward_logprobs(b2)
    assert ((old2 - v2).abs()[b2.policy_mask.bool()] > 1e-4).all()
    # a state dict that lacks a real layer must fail loudly, not keep that layer's old weights
    # (only the rotary caches and the tied LM head may go without a tensor, see _check_unloaded_layers)
    partial = [(k, v) for k, v in old_actor.named_parameters_gathered() if k != "model.norm.weight"]
    with pytest.raises(RuntimeError, match="RMSNorm"):
        rollout.sync_weights(partial)
    if tying == "untied":  # an untied head left out of the sync would stay stale: refused the same way
        no_head = [(k, v) for k, v in old_actor.named_parameters_gathered() if k != "lm_head.weight"]
        with pytest.raises(RuntimeError, match="LMHead"):
            rollout.sync_weights(no_head)
    # put the original weights back so later tests see the initial model
    rollout.sync_weights(old_actor.named_parameters_gathered())


@pytest.mark.parametrize("packed", [False, True])
def test_grad_accumulation_and_global_normalisation(info, tiny_model_dir, packed):
    """micro-batch 1 == micro-batch B, and the step's gradient is d(sum of loss_fn)/dθ, with the
    global token count supplied by the engine; padded and packed passes."""
    from transformers import AutoModelForCausalLM
    g = torch.Generator().manual_seed(0)
    prompts = [[int(x) for x in torch.randint(5, 80, (n,), generator=g)] for n in (3, 1, 4, 2)]
    resps = [[int(x) for x in torch.randint(5, 80, (n,), generator=g)] for n in (5, 2, 3, 6)]
    b = make_layout(prompts, resps, pad_id=0)
    # reference gradient norm with plain autograd on unpadded sequences
    ref = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    total = 0
    for p, r in zip(prompts, resps):
        logits = ref(torch.tensor([p + r])).logits[0, len(p) - 1:-1]
        total = total - torch.log_softmax(logits, -1).gather(-1, torch.tensor(r)[:, None]).sum()
    (total / b.policy_mask.sum()).backward()
    ref_norm = torch.sqrt(sum((q.grad ** 2).sum() for q in ref.parameters())).item()

    a1 = _actor(info, tiny_model_dir, micro_batch_size=4, packed=packed)
    m1 = a1.train_step(b, nll_loss())
    a2 = _actor(info, tiny_model_dir, micro_batch_size=1, packed=packed)
    m2 = a2.train_step(b, nll_loss())
    assert m1["grad_norm"] == pytest.approx(ref_norm, rel=1e-4)
    assert m2["grad_norm"] == pytest.approx(ref_norm, rel=1e-4)
    w1, w2 = a1.full_state_dict(), a2.full_state_dict()
    # packed: one 4-sequence row vs four 1-sequence rows sum in other orders (4.4e-6 seen on one
    # near-zero-gradient element, which Adam scales up), hence PACKED_TOL
    tol = PACKED_TOL if packed else dict(rtol=1e-5, atol=1e-6)
    for k in w1:
        torch.testing.assert_close(w2[k], w1[k], **tol)


def test_actor_checkpoint_round_trip_and_hf_export(info, tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM
    b = make_layout([[5, 6], [7, 8, 9]], [[10, 11, 12], [13, 14]], pad_id=0)
    a = _actor(info, tiny_model_dir, warmup_steps=4, lr_schedule="cosine", micro_batch_size=2)
    a.train_step(b, nll_loss())
    a.save_checkpoint(str(tmp_path / "ckpt"))
    m_cont = a.train_step(b, nll_loss())
    w_cont = a.full_state_dict()
    fresh = _actor(info, tiny_model_dir, warmup_steps=4, lr_schedule="cosine", micro_batch_size=2)
    fresh.load_checkpoint(str(tmp_path / "ckpt"))
    assert fresh.global_steps == 1
    m_res = fresh.train_step(b, nll_loss())
    assert m_res["lr"] == m_cont["lr"] == pytest.approx(1e-3 * 2 / 4)
    w_res = fresh.full_state_dict()
    for k in w_cont:
        assert torch.equal(w_res[k], w_cont[k]), k  # exact: optimizer moments + schedule restored

    fresh.export_hf(str(tmp_path / "hf"))
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), dtype=torch.float32)
    sd = hf.state_dict()
    for k, v in w_res.items():
        assert torch.equal(sd[k], v), k
    assert os.path.exists(tmp_path / "hf" / "tokenizer.json")
    lp, _ = fresh.forward_logprobs(b)
    logits = hf(b.input_ids, attention_mask=b.attention_mask, position_ids=b.position_ids).logits
    P = b.prompt_len
    ref = torch.log_softmax(logits[:, P - 1:-1], -1).gather(-1, b.responses[..., None])[..., 0]
    torch.testing.assert_close(lp, ref * b.policy_mask, rtol=0, atol=1e-5)


def test_reference_engine_matches_initial_policy(info, tiny_model_dir):
    from vcppo.engines.reference import ReferenceEngine
    from vcppo.config.schema import EngineConfig
    b = make_layout([[5, 6], [7]], [[10, 11, 12], [13, 14]], pad_id=0)
    ref = ReferenceEngine(tiny_model_dir, EngineConfig(micro_batch_size=1), info)
    assert ref.optimizer is None
    with pytest.raises(RuntimeError, match="frozen"):
        ref.train_step(b, nll_loss())
    lp, _ = ref.forward_logprobs(b)
    lp2, _ = _actor(info, tiny_model_dir).forward_logprobs(b)
    # other micro-batches (1 row against the actor's) pad differently: fp32 rounding of the logprob's
    # size (3e-7 relative seen on the Intel Xeon host), never a different model
    torch.testing.assert_close(lp, lp2, rtol=1e-6, atol=1e-6)


def _critic(info, init, path, **kw):
    from vcppo.engines.critic import CriticEngine
    from vcppo.config.schema import CriticConfig
    cfg = CriticConfig(**{"lr": 1e-2, "micro_batch_size": 2, "grad_clip": 0.0, **kw})
    return CriticEngine(init, path, cfg, info, total_optimizer_steps=10)


def test_critic_learns_a_visible_outcome_and_never_peeks_ahead(info, tiny_model_dir):
    """The critic can learn per-prefix values when there is something to learn: the return is +1
    iff the first response token is 10, so every state after that token can predict it (explained
    variance -> 1) while the state before it cannot (V(s_0) reads the column before token 0;
    a critic that saw token 0 there would explain it too)."""
    from vcppo.algos.stats import explained_variance
    from vcppo.engines.critic import CriticEngine
    from vcppo.config.schema import CriticConfig

    g = torch.Generator().manual_seed(0)

    def batch(n):
        first = torch.randint(0, 2, (n,), generator=g) + 10
        rest = torch.randint(20, 40, (n, 5), generator=g)
        prompts = torch.randint(20, 40, (n, 3), generator=g)
        r = Rollout.unscored(make_layout(prompts.tolist(), torch.cat([first[:, None], rest], 1).tolist(), pad_id=0))
        return CriticBatch(**vars(r), returns=torch.where(first == 10, 1.0, -1.0)[:, None].expand(n, 6).clone())

    train, heldout = batch(64), batch(64)
    critic = CriticEngine("policy", tiny_model_dir, CriticConfig(lr=3e-3, micro_batch_size=64, grad_clip=1.0),
                          info, total_optimizer_steps=60)
    for _ in range(60):
        critic.train_step(train, value_mse_loss())
    v = critic.forward_values(heldout)
    mask = heldout.policy_mask
    after, before = mask.clone(), mask.clone()
    after[:, 0], before[:, 1:] = 0, 0
    ev_after = explained_variance(v, heldout.returns, after).item()
    ev_before = explained_variance(v, heldout.returns, before).item()
    assert ev_after > 0.8, ev_after
    assert ev_before < 0.2, ev_before


def test_critic_train_export_and_reward_model_init(info, tiny_model_dir, tmp_path):
    from vcppo.engines.loss_contract import GlobalCounts, ModelOutputs
    from vcppo.models.value_model import ValueModel
    r = Rollout.unscored(make_layout([[5, 6, 7], [8]], [[10, 11], [12, 13, 14]], pad_id=0))
    b = CriticBatch(**vars(r), returns=torch.tensor([[1.0, 1.0, 0.0], [-1.0, -1.0, -1.0]]))
    vloss = value_mse_loss()
    counts = GlobalCounts.over_ranks(vloss.count_masks(b))
    assert counts.tokens == {"response": 5.0} and counts.sequences == {"response": 2.0}

    c = _critic(info, "policy", tiny_model_dir, micro_batch_size=1)
    v0 = c.forward_values(b)
    assert v0.shape == (2, 3) and (v0 == 0).all()  # zero-initialised head
    losses = []
    for _ in range(5):
        losses.append(vloss(ModelOutputs(values=c.forward_values(b)), b, counts)[0].item())
        c.train_step(b, vloss)
    assert losses[-1] < losses[0]
    v = c.forward_values(b)
    assert (v[b.policy_mask == 0] == 0).all()
    # values are read at the column BEFORE each response token (state before emitting it)
    vm_full = None
    c.export(str(tmp_path / "critic"))
    vm = ValueModel.from_pretrained(str(tmp_path / "critic"))
    vm_full = vm(b.input_ids, b.attention_mask, b.position_ids)
    P = b.prompt_len
    torch.testing.assert_close(vm_full[:, P - 1:-1] * b.policy_mask, v, rtol=0, atol=1e-6)
    sd_engine = c.full_state_dict()
    for k, t in vm.state_dict().items():
        assert torch.equal(t, sd_engine[k]), k
    c2 = _critic(info, "checkpoint", str(tmp_path / "critic"), micro_batch_size=1)
    assert torch.equal(c2.forward_values(b), v)

    # ValueModel save/load exact, and an RM-format dir loads as a critic keeping its head
    rm = ValueModel.from_policy(tiny_model_dir)
    torch.nn.init.normal_(rm.value_head.weight, std=0.5)
    torch.nn.init.constant_(rm.value_head.bias, 0.3)
    rm.save_pretrained(str(tmp_path / "rm"), tokenizer_src=tiny_model_dir)
    rm2 = ValueModel.from_pretrained(str(tmp_path / "rm"))
    for (k, t), (k2, t2) in zip(rm.state_dict().items(), rm2.state_dict().items()):
        assert k == k2 and torch.equal(t, t2), k
    with pytest.raises(ValueError, match="not a vcppo value"):
        ValueModel.from_pretrained(tiny_model_dir)
    crm = _critic(info, "reward_model", str(tmp_path / "rm"))
    expect = rm(b.input_ids, b.attention_mask, b.position_ids)[:, P - 1:-1] * b.policy_mask
    torch.testing.assert_close(crm.forward_values(b), expect.detach(), rtol=0, atol=1e-6)
    assert crm.full_state_dict()["value_head.bias"].item() == pytest.approx(0.3)


def _uneven_batch():
    """Ragged prompts; responses of length 1 up to the maximum R."""
    g = torch.Generator().manual_seed(3)
    prompt_lengths, response_lengths = (3, 1, 7, 2, 5, 4), (1, 9, 4, 12, 6, 12)
    r = Rollout.unscored(make_layout([torch.randint(5, 60, (n,), generator=g).tolist() for n in prompt_lengths],
                                     [torch.randint(5, 60, (n,), generator=g).tolist() for n in response_lengths],
                                     pad_id=0))
    return CriticBatch(**vars(r), returns=torch.randn(r.policy_mask.shape, generator=g) * r.policy_mask)


from vcppo.engines.packing import VARLEN_ATTENTION  # noqa: E402

PACKED_TOL = dict(rtol=1e-4, atol=2e-5)  # fp32: packed vs padded differ only by GEMM shapes (~5e-7 seen)
# Weights after ONE AdamW step (lr 1e-3): the first step moves each weight by lr * g / (|g| + eps),
# about +-lr whatever |g|, so where a gradient is near zero a 1e-7 float difference moves that
# weight by a share of lr (seen: 5.3e-5 on 1 of 8,192 embedding weights). A wrong gradient moves
# weights by up to 2 lr, so 0.1 lr still catches it.
WEIGHT_TOL = dict(rtol=1e-4, atol=1e-4)


def test_packed_passes_equal_padded_ones(info, tiny_model_dir):
    """Logprobs, entropies, values, losses and gradients: the packed layout (one row, positions
    restarting per sequence, attention within each sequence) gives what the padded layout gives."""
    b = _uneven_batch()
    out = {}
    for packed in (False, True):
        actor = _actor(info, tiny_model_dir, micro_batch_size=4, packed=packed)
        critic = _critic(info, "policy", tiny_model_dir, micro_batch_size=4, packed=packed)
        if packed:  # per-sequence attention, not transformers' dense (T, T) block mask
            assert actor.attention == critic.attention == VARLEN_ATTENTION
        lp, ent = actor.forward_logprobs(b, with_entropy=True)
        am = actor.train_step(b, nll_loss())
        critic.train_step(b, value_mse_loss())          # the zero head learns first ...
        cm = critic.train_step(b, value_mse_loss())     # ... so the backbone gets gradients here
        out[packed] = dict(lp=lp, ent=ent, values=critic.forward_values(b), actor_loss=am["loss_sum"],
                           actor_gn=am["grad_norm"], critic_loss=cm["loss_sum"], critic_gn=cm["grad_norm"],
                           actor_w=actor.full_state_dict(), critic_w=critic.full_state_dict())
    padded, packed = out[False], out[True]
    for key in ("lp", "ent", "values"):
        torch.testing.assert_close(packed[key], padded[key], **PACKED_TOL)
        assert (packed[key][b.policy_mask == 0] == 0).all()
    for key in ("actor_loss", "actor_gn", "critic_loss", "critic_gn"):
        assert packed[key] == pytest.approx(padded[key], rel=1e-4), key
    for w in ("actor_w", "critic_w"):
        for k in padded[w]:
            torch.testing.assert_close(packed[w][k], padded[w][k], **WEIGHT_TOL)


def test_token_budget_micro_batches_give_the_gradient_of_one_big_batch(info, tiny_model_dir):
    b = _uneven_batch()
    whole = _actor(info, tiny_model_dir, micro_batch_size=b.size)
    budget = _actor(info, tiny_model_dir, max_tokens_per_micro_batch=14)
    rows = budget.micro_batch_rows(b)
    assert len(rows) > 2 and sorted(r for g in rows for r in g) == list(range(b.size))
    assert [3] in rows or [5] in rows  # 2 + 12 > 14 ... a sequence over the budget runs alone
    lp_whole, _ = whole.forward_logprobs(b)
    lp_budget, _ = budget.forward_logprobs(b)   # stitched back into the batch's row order
    torch.testing.assert_close(lp_budget, lp_whole, **PACKED_TOL)
    m_whole, m_budget = whole.train_step(b, nll_loss()), budget.train_step(b, nll_loss())
    assert m_budget["grad_norm"] == pytest.approx(m_whole["grad_norm"], rel=1e-4)
    w1, w2 = whole.full_state_dict(), budget.full_state_dict()
    for k in w1:
        torch.testing.assert_close(w2[k], w1[k], **PACKED_TOL)


def _step(rollout, seed, prompts=PROMPTS):
    return rollout.generate(prompts, n=3, temperature=1.0, top_p=1.0, max_tokens=12, seed=seed)


def _draws(samples):
    return [(x.prompt_index, x.response_ids, x.logprobs) for x in samples]


def test_resumed_engine_draws_the_same_samples(info, rollout, tiny_model_dir):
    """Exact resume of the rollout: a step's samples are a function of (seed, step seed, rollout
    group) only. Engine A samples steps 0, 1, 2 (with evaluation calls in between that leave state
    behind: prefix cache, generator); a fresh engine B with the same seed samples step 2 and draws
    what A drew, token for token. Requests carry no per-request seed (batched sampling)."""
    from vcppo.engines.rollout import RolloutEngine
    from vcppo.config.schema import RolloutConfig

    torch.manual_seed(123)
    expected_rand = torch.rand(3)
    torch.manual_seed(123)
    a = [_step(rollout, 100 + step) for step in range(2)]
    rollout.generate(PROMPTS[:2], n=1, temperature=0.0, top_p=1.0, max_tokens=6)  # greedy eval call
    _step(rollout, 7, prompts=[[20, 21], [22]])
    a.append(_step(rollout, 102))
    # the process's generator (shared with training) is left as it was
    assert torch.equal(torch.rand(3), expected_rand)
    assert _draws(_step(rollout, 102)) == _draws(a[2])  # same call twice
    assert _draws(a[0]) != _draws(a[1]) != _draws(a[2])
    assert len({len(x.response_ids) for x in a[2]}) > 1  # uneven lengths, some stop at EOS
    b = RolloutEngine(tiny_model_dir, RolloutConfig(gpu_memory_utilization=0.02), info, seed=0, max_model_len=256)
    try:
        assert _draws(_step(b, 102)) == _draws(a[2])
    finally:
        b.close()
