"""LoRA's pure parts on plain modules (no DeepSpeed, no vLLM): the streaming merge equals peft's
own merge, names map to the plain model's, and target checks name what cannot work."""
import pytest
import torch

from vcppo.engines import lora as L
from vcppo.engines.rollout import vllm_lora_rank
from vcppo.config.schema import LoRAConfig


@pytest.fixture(scope="module")
def adapted(tiny_model_dir):
    """A tiny causal LM with rank-4 adapters on its attention projections, B made non-zero."""
    from transformers import AutoModelForCausalLM
    model = L.add_adapters(AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                           LoRAConfig(rank=4, alpha=8.0, target_modules=["q_proj", "v_proj", "o_proj"]), "CAUSAL_LM")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.normal_(0, 0.1, generator=torch.Generator().manual_seed(len(name)))
    return model


def test_streamed_merge_equals_peft_merge(adapted):
    import copy
    scalings = L.adapter_scalings(adapted)
    assert len(scalings) == 6 and set(scalings.values()) == {2.0}  # 3 layers x 2 blocks, alpha / r
    named = [(n, p.detach().clone()) for n, p in adapted.named_parameters()]
    ours = dict(L.merge_adapters(reversed(named), scalings))  # any order, as buckets may bring them
    peft_merged = copy.deepcopy(adapted).merge_and_unload().state_dict()
    assert set(ours) == set(peft_merged) - {"lm_head.weight"}  # tied: the embedding stands for it
    for name, t in ours.items():
        torch.testing.assert_close(t, peft_merged[name], rtol=0, atol=1e-6)
    assert all(not torch.equal(ours[L.hf_name(n)], p) for n, p in named if n.endswith(".base_layer.weight"))


def test_an_incomplete_layer_is_an_error(adapted):
    scalings = L.adapter_scalings(adapted)
    named = [(n, p.detach()) for n, p in adapted.named_parameters() if ".lora_B." not in n]
    with pytest.raises(ValueError, match="incomplete"):
        list(L.merge_adapters(named, scalings))


def test_disabled_adapters_give_the_base_model(adapted, tiny_model_dir):
    from transformers import AutoModelForCausalLM
    ids = torch.tensor([[5, 6, 7, 8]])
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)(ids).logits
    with torch.no_grad():
        with L.adapters_disabled(adapted):
            off = adapted(input_ids=ids).logits
        on = adapted(input_ids=ids).logits
    torch.testing.assert_close(off, base)
    assert (on - base).abs().max() > 1e-3


def test_adapter_init_follows_the_process_seed(tiny_model_dir):
    """The same seed gives the same adapters, whatever was drawn from the RNG before."""
    from transformers import AutoModelForCausalLM

    def a_matrix(draws):
        torch.manual_seed(3)
        torch.rand(draws)
        m = L.add_adapters(AutoModelForCausalLM.from_pretrained(tiny_model_dir), LoRAConfig(rank=4))
        return next(p for n, p in m.named_parameters() if ".lora_A." in n).detach().clone()
    assert torch.equal(a_matrix(0), a_matrix(1000))


def test_hf_names():
    assert L.hf_name("base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight") == \
        "model.layers.0.self_attn.q_proj.weight"
    assert L.hf_name("backbone.base_model.model.layers.1.mlp.up_proj.base_layer.bias") == "backbone.layers.1.mlp.up_proj.bias"
    assert L.hf_name("value_head.weight") == "value_head.weight"


LINEAR = {"model.layers.0.self_attn.q_proj": (64, 64), "model.layers.0.self_attn.k_proj": (64, 32),
          "model.layers.0.mlp.up_proj": (64, 128), "lm_head": (64, 128)}
OTHERS = {"model.embed_tokens", "model.layers.0.self_attn", "model.norm"}


@pytest.mark.parametrize("lora, problem", [
    (LoRAConfig(rank=8), None),
    (LoRAConfig(rank=8, target_modules=["q_proj", "up_proj"]), None),
    (LoRAConfig(rank=64, target_modules=["q_proj", "up_proj"]), None),  # rank = the narrowest width
    (LoRAConfig(rank=33), "rank 33 exceeds the width of layer 'model.layers.0.self_attn.k_proj' (32"),
    (LoRAConfig(rank=8, target_modules=["qproj"]), "no layer is named 'qproj'; the model's linear layers: "
                                                   "['k_proj', 'q_proj', 'up_proj']"),
    (LoRAConfig(rank=8, target_modules=["embed_tokens"]), "'embed_tokens' is not a linear layer"),
    (LoRAConfig(rank=8, target_modules=["lm_head"]), "the LM head gets no adapter"),
    (LoRAConfig(rank=8, target_modules=[]), "target_modules is empty"),
])
def test_target_problems(lora, problem):
    got = L.target_problem(lora, LINEAR, OTHERS)
    assert got == problem if problem is None else problem in got


def test_vllm_lora_rank():
    assert [vllm_lora_rank(r) for r in (1, 2, 8, 9, 64, 300, 512)] == [1, 8, 8, 16, 64, 320, 512]
    with pytest.raises(ValueError, match="512"):
        vllm_lora_rank(513)
