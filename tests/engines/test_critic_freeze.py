"""``critic.freeze`` on the real DeepSpeed critic (tiny Qwen2, one rank): frozen modules are bit-identical
after real optimizer steps while the rest moves, the optimizer holds states for the trainable parameters
only, with and without LoRA; a spec that matches nothing is one line naming the key."""
import pytest
import torch

from vcppo.config.schema import CriticConfig, LoRAConfig
from vcppo.errors import ConfigError
from vcppo.experience import CriticBatch, Rollout, make_layout

pytestmark = [pytest.mark.integration]


def _batch():
    r = Rollout.unscored(make_layout([[5, 6], [7, 8, 9]], [[10, 11, 12], [13, 14]], pad_id=0))
    return CriticBatch(**vars(r), old_values=torch.zeros(r.policy_mask.shape),
                       returns=torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, 0.0]]) * r.policy_mask)


def _two_steps(model_dir, info, **cfg_kw):
    """(critic, weights before, weights after two optimizer steps: the head is zero at the first)."""
    from vcppo.driver.step.update import ValueLoss
    from vcppo.engines.critic import CriticEngine
    cfg = CriticConfig(lr=1e-2, warmup_steps=0, lr_schedule="constant", grad_clip=0.0, value_clip=None,
                       zero_stage=0, **cfg_kw)
    critic = CriticEngine("policy", model_dir, cfg, info, total_optimizer_steps=4)
    before = {k: v.clone() for k, v in critic.full_state_dict().items()}
    for _ in range(2):
        critic.train_step(_batch(), ValueLoss(cfg, "token-mean"))
    return critic, before, critic.full_state_dict()


def _optimizer_params(critic) -> int:
    return sum(len(g["params"]) for g in critic.optimizer.param_groups)


def test_frozen_attention_and_embeddings_are_bit_identical_after_an_update(info, tiny_model_dir):
    critic, before, after = _two_steps(tiny_model_dir, info, freeze=["attention", "embeddings"])
    frozen = [k for k in before if ".self_attn." in k or "embed_tokens" in k]
    moving = [k for k in before if ".mlp." in k]
    assert frozen and moving
    assert all(torch.equal(before[k], after[k]) for k in frozen)
    assert all(not torch.equal(before[k], after[k]) for k in moving)
    trainable = [p for p in critic.module.parameters() if p.requires_grad]
    assert _optimizer_params(critic) == len(trainable) < len(list(critic.module.parameters()))
    critic.close()


def test_the_first_layers_freeze_whole(info, tiny_model_dir):
    critic, before, after = _two_steps(tiny_model_dir, info, freeze=["layers:1"])
    assert all(torch.equal(before[k], after[k]) for k in before if ".layers.0." in k)
    assert any(not torch.equal(before[k], after[k]) for k in before if ".layers.1." in k)
    critic.close()


def test_freeze_with_lora_leaves_the_frozen_modules_adapters_alone(info, tiny_model_dir):
    lora = LoRAConfig(rank=4, alpha=8.0, target_modules=["all-linear"])
    critic, _, _ = _two_steps(tiny_model_dir, info, freeze=["attention"], lora=lora)
    named = dict(critic.module.named_parameters())
    attention_adapters = [n for n in named if ".lora_" in n and ".self_attn." in n]
    mlp_adapters = [n for n in named if ".lora_" in n and ".mlp." in n]
    assert attention_adapters and mlp_adapters
    assert not any(named[n].requires_grad for n in attention_adapters)
    assert all(named[n].requires_grad for n in mlp_adapters)
    assert _optimizer_params(critic) == sum(p.requires_grad for p in named.values())
    critic.close()


def test_a_spec_matching_nothing_is_one_line_naming_the_key(info, tiny_model_dir):
    from vcppo.engines.critic import CriticEngine
    with pytest.raises(ConfigError, match=r"^config key 'critic.freeze': 'layers:5' asks for 5 layers, the model has 2$"):
        CriticEngine("policy", tiny_model_dir, CriticConfig(freeze=["layers:5"], zero_stage=0), info,
                     total_optimizer_steps=1)
