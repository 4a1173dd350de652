"""The reward model engine on one rank (real DeepSpeed): its score is the number the model itself
gives at the right position (an HF sequence classifier's pooled logit; a `vcppo rm` head where
`vcppo rm` trained it), packed or padded, and a reward model with its own tokenizer scores the
decoded text re-tokenized with it."""
import pytest
import torch

from vcppo.experience import Rollout, make_layout

pytestmark = [pytest.mark.integration]

TEXTS = [("12+7=", "19<eos>"), ("3*4=", "12"), ("100-1=", "99<eos>"), ("8/2=", "<eos>")]  # (prompt, response)


@pytest.fixture(scope="module", params=["own_pad", "pad_is_eos"])
def hf_rm_dir(tmp_path_factory, request):
    """A tiny Qwen2 sequence classifier (one label) with a BPE tokenizer of its own; its pad id is
    its own, or its eos id (then transformers pools the token before a final eos)."""
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    from vcppo.models.bpe_tokenizer import train_bpe_tokenizer

    out = tmp_path_factory.mktemp("hf_rm")
    corpus = ["12+7=19", "3*4=12", "100-1=99", "8/2=4", "the answer is 42"] * 20
    tok = train_bpe_tokenizer(corpus, out, vocab_size=300)
    cfg = Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, vocab_size=320, max_position_embeddings=256, num_labels=1,
                      pad_token_id=tok.eos_token_id if request.param == "pad_is_eos" else tok.pad_token_id,
                      eos_token_id=tok.eos_token_id, initializer_range=0.2)
    torch.manual_seed(1)
    Qwen2ForSequenceClassification(cfg).save_pretrained(str(out))
    return str(out)


@pytest.fixture(scope="module")
def vcppo_rm_dir(tmp_path_factory, tiny_model_dir):
    """A `vcppo rm`-format model on the tiny policy (same tokenizer), with a non-zero head."""
    from vcppo.models.value_model import ValueModel
    vm = ValueModel.from_policy(tiny_model_dir)
    torch.manual_seed(2)
    with torch.no_grad():
        vm.value_head.weight.normal_()
        vm.value_head.bias.fill_(0.3)
    out = tmp_path_factory.mktemp("vcppo_rm")
    vm.save_pretrained(str(out), tokenizer_src=tiny_model_dir)
    return str(out)


def _policy_batch(tokenizer) -> Rollout:
    prompts = [tokenizer(p)["input_ids"] for p, _ in TEXTS]
    responses = [tokenizer(r.replace("<eos>", ""))["input_ids"] + ([tokenizer.eos_token_id] if "<eos>" in r else [])
                 for _, r in TEXTS]
    return Rollout.unscored(make_layout(prompts, responses, pad_id=tokenizer.pad_token_id))


def _engine(info, path, packed):
    from vcppo.engines.reward_model import RewardModelEngine
    from vcppo.config.schema import EngineConfig
    return RewardModelEngine(path, EngineConfig(micro_batch_size=3, packed=packed, zero_stage=0), info)


@pytest.mark.parametrize("packed", [True, False])
def test_a_classifier_with_its_own_tokenizer_scores_the_text(info, hf_rm_dir, tiny_tokenizer, packed):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from vcppo.driver.step.reward_terms import Retokenizer, same_tokenizer

    rm_tok = AutoTokenizer.from_pretrained(hf_rm_dir)
    assert not same_tokenizer(tiny_tokenizer, rm_tok)
    retokenize = Retokenizer(tiny_tokenizer, rm_tok)
    batch = retokenize(_policy_batch(tiny_tokenizer))
    scores = _engine(info, hf_rm_dir, packed).score(batch)
    reference = AutoModelForSequenceClassification.from_pretrained(hf_rm_dir).eval()
    for i, (prompt, response) in enumerate(TEXTS):
        text = response.replace("<eos>", "")
        ids = rm_tok(prompt)["input_ids"] + rm_tok(text, add_special_tokens=False)["input_ids"]
        if "<eos>" in response:
            ids.append(rm_tok.eos_token_id)  # a finished response ends with the RM's own end token
        real = batch.input_ids[i][batch.attention_mask[i].bool()].tolist()
        assert real == ids and rm_tok.decode(ids, skip_special_tokens=True) == prompt + text
        with torch.no_grad():  # transformers pools the last token of an unpadded row
            expected = reference(input_ids=torch.tensor([ids])).logits[0, 0].item()
        assert scores[i].item() == pytest.approx(expected, abs=1e-5), (i, packed)


@pytest.mark.parametrize("packed", [True, False])
def test_a_vcppo_rm_is_read_where_vcppo_rm_trained_it(info, vcppo_rm_dir, tiny_tokenizer, packed):
    from vcppo.commands.rm import final_token_values
    from vcppo.models.value_model import ValueModel

    batch = _policy_batch(tiny_tokenizer)
    scores = _engine(info, vcppo_rm_dir, packed).score(batch)
    vm = ValueModel.from_pretrained(vcppo_rm_dir).eval()
    P, R = batch.prompt_len, batch.responses.shape[1]
    with torch.no_grad():
        values = vm(batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids)
    expected = final_token_values(values[:, P - 1:P + R - 1] * batch.policy_mask, batch.policy_mask)
    torch.testing.assert_close(scores, expected, atol=1e-5, rtol=1e-5)
    assert scores.abs().min() > 1e-3  # a real head: the comparison is not of zeros


@pytest.mark.parametrize("packed", [True, False])
def test_an_episode_is_scored_at_its_last_token_not_at_the_policy_masks_count(info, vcppo_rm_dir, tiny_tokenizer,
                                                                             packed):
    """An episode's policy mask has holes (observation tokens): the score is read where the whole
    response ends, as for the same tokens with every position masked in."""
    import dataclasses
    batch = _policy_batch(tiny_tokenizer)
    holes = batch.policy_mask.clone()
    holes[:3, 0] = 0.0  # the first response token of three rows read as an observation
    episode = dataclasses.replace(batch, policy_mask=holes)
    engine = _engine(info, vcppo_rm_dir, packed)
    torch.testing.assert_close(engine.score(episode), engine.score(batch), atol=1e-6, rtol=1e-6)
