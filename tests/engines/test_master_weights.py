"""A bf16 engine's fp32 masters start from the checkpoint's fp32 values (not the bf16 cast), on the real
DeepSpeed engine without ZeRO, with ZeRO-1 and with ZeRO-3, for the actor and a critic built from the policy."""
import pytest
import torch
from safetensors.torch import load_file

from tests.engines.token_loss import nll_loss
from vcppo.engines.master_weights import canonical_name
from vcppo.experience import make_layout


def test_canonical_names_match_the_module_and_its_checkpoint():
    assert canonical_name("module.model.layers.0.mlp.up_proj.weight") == "layers.0.mlp.up_proj.weight"
    assert canonical_name("backbone.layers.0.mlp.up_proj.weight") == "layers.0.mlp.up_proj.weight"
    assert canonical_name("base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight") == \
        "layers.0.self_attn.q_proj.weight"
    assert canonical_name("lm_head.weight") == "lm_head.weight"


def _masters(engine) -> dict[str, torch.Tensor]:
    """Each trainable parameter's full fp32 master, by canonical name."""
    from deepspeed.utils import safe_get_full_fp32_param
    opt = engine.engine.optimizer
    unfused = {id(p): m for low, high in zip(getattr(opt, "fp16_groups", []) or [], getattr(opt, "fp32_groups", []) or [])
               if isinstance(low, list) for p, m in zip(low, high)}
    out = {}
    for name, p in engine.module.named_parameters():
        if p.requires_grad:
            m = unfused.get(id(p))
            out[canonical_name(name)] = (m if m is not None else safe_get_full_fp32_param(p)).detach().float().cpu()
    return out


def _bf16_grid_share(source: dict[str, torch.Tensor]) -> float:
    """Share of the checkpoint's elements that bf16 holds exactly (the test needs them off the grid)."""
    on = sum(int((t == t.bfloat16().float()).sum()) for t in source.values())
    return on / sum(t.numel() for t in source.values())


@pytest.mark.integration
@pytest.mark.parametrize("stage", [0, 1, 3])
def test_bf16_actor_masters_are_the_fp32_checkpoint_and_the_module_their_rounding(info, tiny_model_dir, stage):
    from vcppo.engines.actor import ActorEngine
    from vcppo.config.schema import ActorConfig
    source = {canonical_name(k): v for k, v in load_file(f"{tiny_model_dir}/model.safetensors").items()}
    assert all(t.dtype == torch.float32 for t in source.values()) and _bf16_grid_share(source) < 0.01
    actor = ActorEngine(tiny_model_dir, ActorConfig(lr=1e-5, micro_batch_size=2, zero_stage=stage), info,
                        total_optimizer_steps=4, dtype="bfloat16")
    try:
        masters = _masters(actor)
        assert actor.masters_seeded == len(masters) == len(source)
        for name, m in masters.items():  # the checkpoint's values to the bit, not their bf16 cast
            assert torch.equal(m, source[name]), name
        batch = make_layout([[5, 6], [7, 8, 9]], [[10, 11, 12], [13, 14]], pad_id=0)
        for _ in range(2):
            actor.train_step(batch, nll_loss())
        masters = _masters(actor)
        weights = {canonical_name(k): v for k, v in actor.full_state_dict().items()}
        for name, m in masters.items():  # what the forward runs is the masters' rounding
            assert torch.equal(weights[name], m.bfloat16()), name
        moved = sum(int((masters[n] != source[n]).sum()) for n in masters) / sum(t.numel() for t in masters.values())
        assert moved > 0.9  # lr 1e-5 moves nearly every master; the bf16 weights hold most of them still
    finally:
        actor.close()


@pytest.mark.integration
def test_bf16_critic_from_the_policy_seeds_its_backbone_not_its_fresh_head(info, tiny_model_dir):
    from vcppo.engines.critic import CriticEngine
    from vcppo.config.schema import CriticConfig
    source = {canonical_name(k): v for k, v in load_file(f"{tiny_model_dir}/model.safetensors").items()}
    critic = CriticEngine("policy", tiny_model_dir, CriticConfig(lr=1e-5, micro_batch_size=2), info,
                          total_optimizer_steps=4, dtype="bfloat16")
    try:
        masters = _masters(critic)
        backbone = {n: m for n, m in masters.items() if n in source}
        assert critic.masters_seeded == len(backbone) > 0 and set(masters) - set(backbone) >= {"value_head.weight"}
        assert all(torch.equal(m, source[n]) for n, m in backbone.items())
    finally:
        critic.close()


@pytest.mark.integration
def test_an_fp32_engine_is_left_alone(info, tiny_model_dir):
    from vcppo.engines.actor import ActorEngine
    from vcppo.config.schema import ActorConfig
    actor = ActorEngine(tiny_model_dir, ActorConfig(lr=1e-5, micro_batch_size=2), info, total_optimizer_steps=4,
                        dtype="float32")
    try:
        assert actor.masters_seeded == 0
    finally:
        actor.close()


@pytest.mark.integration
def test_a_cached_critic_trains_on_from_its_fp32_masters(info, tiny_model_dir, tmp_path):
    """The value-pretraining cache is written from the masters; a run that starts from it seeds its
    masters with them (backbone and head), so reusing the cache continues exactly."""
    from vcppo.engines.critic import CriticEngine
    from vcppo.config.schema import CriticConfig
    from vcppo.experience import CriticBatch, Rollout
    from tests.engines.token_loss import value_mse_loss
    cfg = CriticConfig(lr=1e-4, micro_batch_size=2)
    first = CriticEngine("policy", tiny_model_dir, cfg, info, total_optimizer_steps=4, dtype="bfloat16")
    try:
        r = Rollout.unscored(make_layout([[5, 6, 7], [8]], [[10, 11], [12, 13, 14]], pad_id=0))
        batch = CriticBatch(**vars(r), returns=torch.tensor([[1.0, 1.0, 0.0], [-1.0, -1.0, -1.0]]))
        first.train_step(batch, value_mse_loss())
        trained = _masters(first)
        first.export(str(tmp_path / "cache"), masters=True)
    finally:
        first.close()
    second = CriticEngine("checkpoint", str(tmp_path / "cache"), cfg, info, total_optimizer_steps=4, dtype="bfloat16")
    try:
        again = _masters(second)
        assert second.masters_seeded == len(trained) and set(again) == set(trained)
        assert "value_head.weight" in again and all(torch.equal(again[n], trained[n]) for n in trained)
    finally:
        second.close()
