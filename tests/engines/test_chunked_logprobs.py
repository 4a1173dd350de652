"""The actor with the chunked logprob path (``logprob_chunk_size`` > 0) against the full-logits path
(0): logprobs, entropies, the loss, the gradient and the weights after a real optimizer step, for a
tied and an untied head, packed and padded, at temperature != 1, under ZeRO-0 and ZeRO-3, with LoRA."""
import pytest
import torch

from tests.engines.test_engines import WEIGHT_TOL, _actor, _uneven_batch
from tests.engines.token_loss import TokenLoss

pytestmark = [pytest.mark.integration]

CHUNK = 5  # a few chunks per micro-batch of the uneven batch (4 sequences, up to 12 response tokens each)


def _policy_loss_with_entropy_bonus() -> TokenLoss:
    """A loss whose gradient runs through both outputs: -logp * weight - 0.05 * entropy."""
    loss = TokenLoss(lambda out, micro: -out.logprobs * (1.0 + micro.returns) - 0.05 * out.entropy)
    loss.needs_entropy = True
    return loss


@pytest.fixture(scope="module")
def untied_model_dir(tmp_path_factory, tiny_model_dir):
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32, tie_word_embeddings=False)
    torch.manual_seed(1)
    m.lm_head.weight.data = torch.randn_like(m.lm_head.weight) * 0.2  # a head of its own
    out = tmp_path_factory.mktemp("untied")
    m.save_pretrained(str(out))
    from transformers import AutoTokenizer
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(str(out))
    return str(out)


def _run(info, path, chunk, **kw):
    b = _uneven_batch()
    actor = _actor(info, path, logprob_chunk_size=chunk, **kw)
    assert (actor.head is None) == (chunk == 0)
    lp, ent = actor.forward_logprobs(b, with_entropy=True)
    m = actor.train_step(b, _policy_loss_with_entropy_bonus())
    lp_after, _ = actor.forward_logprobs(b)
    return dict(lp=lp, ent=ent, loss=m["loss_sum"], gn=m["grad_norm"], lp_after=lp_after,
                w=actor.full_state_dict(), mask=b.policy_mask)


def _assert_same(got, want):
    for key in ("lp", "ent"):  # the same weights: fp32 rounding apart (~1 ulp)
        torch.testing.assert_close(got[key], want[key], rtol=1e-6, atol=1e-6, msg=key)
        assert (got[key][want["mask"] == 0] == 0).all()
    # after the step the weights differ within WEIGHT_TOL (Adam's first step amplifies 1e-7 gradient
    # differences where a gradient is near zero), so the logprobs after it do too
    torch.testing.assert_close(got["lp_after"], want["lp_after"], rtol=1e-4, atol=2e-5)
    assert got["loss"] == pytest.approx(want["loss"], rel=1e-6)
    assert got["gn"] == pytest.approx(want["gn"], rel=1e-5)
    for k in want["w"]:
        torch.testing.assert_close(got["w"][k], want["w"][k], **WEIGHT_TOL)


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("tying", ["tied", "untied"])
def test_chunked_actor_equals_full_logits(info, request, packed, tying):
    path = request.getfixturevalue("tiny_model_dir" if tying == "tied" else "untied_model_dir")
    kw = dict(packed=packed, temperature=0.7, micro_batch_size=4)
    _assert_same(_run(info, path, CHUNK, **kw), _run(info, path, 0, **kw))


def test_chunked_actor_under_zero3_and_lora(info, tiny_model_dir):
    """ZeRO-3 gathers the head's weight for the forward and again for the backward (the chunks are
    recomputed there); LoRA's adapters below the head get the same gradients."""
    from vcppo.config.schema import LoRAConfig
    kw = dict(zero_stage=3, temperature=1.3, micro_batch_size=2)
    _assert_same(_run(info, tiny_model_dir, CHUNK, **kw), _run(info, tiny_model_dir, 0, **kw))
    lora = dict(kw, zero_stage=0, lora=LoRAConfig(rank=4, alpha=8.0), lr=1e-2)
    _assert_same(_run(info, tiny_model_dir, CHUNK, **lora), _run(info, tiny_model_dir, 0, **lora))


def _adapted(actor):
    """The actor with every LoRA B matrix set to the same seeded random values (peft starts them at
    zero, where an adapter changes nothing and a path that skipped it would go unnoticed)."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in sorted(actor.module.named_parameters()):
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return actor


def test_head_the_chunked_path_cannot_replace_keeps_full_logits(info, tiny_model_dir):
    """LoRA on the LM head itself: its output is more than x W^T, so the engine keeps the full path:
    with the adapters non-zero, its logprobs are those of ``logprob_chunk_size=0``'s full logits (x W^T
    alone, the base head's, would differ)."""
    from vcppo.config.schema import LoRAConfig
    lora = LoRAConfig(rank=2, alpha=4.0, target_modules=["lm_head", "q_proj"])
    b = _uneven_batch()
    actor = _adapted(_actor(info, tiny_model_dir, logprob_chunk_size=CHUNK, lora=lora, temperature=0.7))
    assert actor.head is None
    lp, ent = actor.forward_logprobs(b, with_entropy=True)
    full = _adapted(_actor(info, tiny_model_dir, logprob_chunk_size=0, lora=lora, temperature=0.7))
    want_lp, want_ent = full.forward_logprobs(b, with_entropy=True)
    torch.testing.assert_close(lp, want_lp, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ent, want_ent, rtol=1e-6, atol=1e-6)
    base, _ = _actor(info, tiny_model_dir, logprob_chunk_size=0, temperature=0.7).forward_logprobs(b)
    assert (lp - base).abs()[b.policy_mask.bool()].max() > 1e-3  # the adapters do change the logprobs
