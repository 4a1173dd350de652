"""LoRA on the real engines (one rank): only adapters train, what leaves the engine is the merged
model (export, vLLM), the reference is the actor with its adapters off, and vLLM samples from the
updated actor exactly, with merged weights and with its own LoRA."""
import pytest
import torch

from tests.engines.test_engines import LOGPROB_TOL, PROMPTS, _batch, _vllm_logprobs
from tests.engines.token_loss import nll_loss, value_mse_loss
from vcppo.experience import CriticBatch, Rollout
from vcppo.config.schema import ActorConfig, CriticConfig, LoRAConfig, RolloutConfig

pytestmark = [pytest.mark.integration]

LORA = LoRAConfig(rank=4, alpha=8.0)


def _lora_actor(info, path, zero_stage=0, **lora):
    from vcppo.engines.actor import ActorEngine
    cfg = ActorConfig(lr=1e-2, micro_batch_size=4, grad_clip=0.0, zero_stage=zero_stage,
                      lora=LoRAConfig(**{"rank": 4, "alpha": 8.0, **lora}))
    return ActorEngine(path, cfg, info, total_optimizer_steps=10)


def _hf_logprobs(model, batch):
    """Response logprobs of a transformers causal LM on a padded batch."""
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                       position_ids=batch.position_ids).logits.float()
    P, R = batch.prompt_len, batch.responses.shape[1]
    logp = torch.log_softmax(logits[:, P - 1:P + R - 1], -1).gather(-1, batch.responses.unsqueeze(-1)).squeeze(-1)
    return logp * batch.policy_mask


def _rollout(info, path, lora_rank=0):
    from vcppo.engines.rollout import RolloutEngine
    return RolloutEngine(path, RolloutConfig(gpu_memory_utilization=0.02), info, seed=0, max_model_len=256,
                         lora_rank=lora_rank)


@pytest.fixture(scope="module")
def rollouts(info, tiny_model_dir):
    """A vLLM engine per sync mode: merged weights, and vLLM's own LoRA (built for rank 4)."""
    engines = {"merged": _rollout(info, tiny_model_dir), "adapter": _rollout(info, tiny_model_dir, lora_rank=4)}
    yield engines
    for r in engines.values():
        r.close()


@pytest.fixture(scope="module")
def samples(rollouts):
    return rollouts["merged"].generate(PROMPTS, n=3, temperature=1.0, top_p=1.0, max_tokens=12, seed=1)


@pytest.fixture(scope="module")
def trained(info, tiny_model_dir, samples):
    """A LoRA actor after three NLL steps on the samples (its adapters moved away from zero)."""
    actor = _lora_actor(info, tiny_model_dir)
    batch = _batch(samples)
    before, _ = actor.forward_logprobs(batch)
    for _ in range(3):
        actor.train_step(batch, nll_loss())
    return actor, batch, before


def test_only_adapters_train_and_base_weights_stay(info, tiny_model_dir, trained):
    from transformers import AutoModelForCausalLM
    actor, batch, before = trained
    names = [n for n, p in actor.module.named_parameters() if p.requires_grad]
    assert names and all(".lora_A." in n or ".lora_B." in n for n in names)
    assert len(names) == 2 * 7 * 2  # A and B of the 7 linear layers of each of the 2 blocks
    after, _ = actor.forward_logprobs(batch)
    assert (after - before).abs().max() > 1e-3  # the adapters changed the policy
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    raw = dict(actor._gathered(list(actor.module.named_parameters()), 2 ** 28, to_cpu=True))
    for name, t in raw.items():
        if ".base_layer." in name:
            assert torch.equal(t, base[name.replace("base_model.model.", "").replace(".base_layer", "")])
    # the merged view differs from the base exactly in the adapted layers
    merged = actor.full_state_dict()
    assert set(merged) == {n for n in base if n != "lm_head.weight"}
    moved = {n for n in merged if not torch.equal(merged[n], base[n])}
    assert moved and all(n.endswith("proj.weight") for n in moved)


def test_merged_and_adapter_exports_load_in_transformers(info, tiny_model_dir, trained, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    actor, batch, _ = trained
    ours, _ = actor.forward_logprobs(batch)
    actor.export_hf(str(tmp_path / "merged"))
    actor.export_adapter(str(tmp_path / "adapter"))
    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged"))
    assert (_hf_logprobs(merged, batch) - ours).abs().max() < 1e-5
    assert sorted(p.name for p in (tmp_path / "adapter").iterdir()) == [
        "README.md", "adapter_config.json", "adapter_model.safetensors"]
    peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), str(tmp_path / "adapter"))
    assert (_hf_logprobs(peft, batch) - ours).abs().max() < 1e-5
    # vLLM loads the merged export from disk (the adapter directory: test_vllm_samples_the_updated_actor_exactly)
    from_disk = _rollout(info, str(tmp_path / "merged"))  # left open: closed with the module's process group
    fresh = from_disk.generate(PROMPTS, n=2, temperature=1.0, top_p=1.0, max_tokens=12, seed=3)
    lp, _ = actor.forward_logprobs(_batch(fresh))
    assert (lp - _vllm_logprobs(fresh, lp)).abs().max() < LOGPROB_TOL


def test_reference_is_the_actor_without_adapters(info, tiny_model_dir, trained):
    """The KL term against the adapter-free actor equals the one against a separate reference engine."""
    from vcppo.algos.kl import kl_estimate
    from vcppo.engines.reference import AdapterFreeReference, ReferenceEngine
    from vcppo.config.schema import EngineConfig
    actor, batch, before = trained
    policy, _ = actor.forward_logprobs(batch)
    shared = AdapterFreeReference(actor).forward_logprobs(batch)[0]
    separate = ReferenceEngine(tiny_model_dir, EngineConfig(micro_batch_size=4), info).forward_logprobs(batch)[0]
    assert torch.equal(shared, before)  # B x A = 0 before the first step: the initial policy
    assert (shared - separate).abs().max() < 1e-6
    mask = batch.policy_mask
    for estimator in ("k1", "k2", "k3", "low_var_kl"):
        a, b = kl_estimate(policy, shared, estimator) * mask, kl_estimate(policy, separate, estimator) * mask
        assert a.abs().sum() > 0 and (a - b).abs().max() < 1e-5
    assert torch.equal(actor.forward_logprobs(batch)[0], policy)  # adapters are on again afterwards


@pytest.mark.parametrize("sync", ["merged", "adapter"])
def test_vllm_samples_the_updated_actor_exactly(info, rollouts, trained, sync):
    """After an update and a sync, vLLM's sampled-token logprobs equal the actor's (fp32)."""
    actor, batch, _ = trained
    rollout = rollouts[sync]
    stale = rollout.generate(PROMPTS, n=3, temperature=1.0, top_p=1.0, max_tokens=12, seed=2)
    if sync == "adapter":
        assert rollout.uses_adapters
        for _ in range(2):  # a second sync replaces the first adapter
            rollout.sync_adapter(lambda d: actor.export_adapter(d, every_rank=True))
        assert rollout.lora_request.lora_int_id == 2
    else:
        assert not rollout.uses_adapters
        rollout.sync_weights(actor.named_parameters_gathered())
    fresh = rollout.generate(PROMPTS, n=3, temperature=1.0, top_p=1.0, max_tokens=12, seed=2)
    lp, _ = actor.forward_logprobs(_batch(fresh))
    assert (lp - _vllm_logprobs(fresh, lp)).abs().max() < LOGPROB_TOL
    stale_lp, _ = actor.forward_logprobs(_batch(stale))
    assert (stale_lp - _vllm_logprobs(stale, stale_lp)).abs().max() > 1e-2  # the sync mattered


def test_lora_critic_trains_adapters_and_heads_and_exports_merged(info, tiny_model_dir, samples, tmp_path):
    from vcppo.engines.critic import CriticEngine
    from vcppo.models.value_model import ValueModel
    cfg = CriticConfig(lr=1e-2, micro_batch_size=4, grad_clip=0.0, zero_stage=0, lora=LORA)
    critic = CriticEngine("policy", tiny_model_dir, cfg, info, total_optimizer_steps=10)
    trainable = [n for n, p in critic.module.named_parameters() if p.requires_grad]
    assert "value_head.weight" in trainable
    assert all(n.startswith("value_head.") or ".lora_" in n for n in trainable)
    r = Rollout.unscored(_batch(samples))
    batch = CriticBatch(**vars(r), returns=r.policy_mask.float())
    for _ in range(3):
        critic.train_step(batch, value_mse_loss())
    values = critic.forward_values(batch)
    critic.export(str(tmp_path / "critic"))
    reloaded = ValueModel.from_pretrained(str(tmp_path / "critic"))
    assert not any("lora" in n or "base_layer" in n for n, _ in reloaded.named_parameters())
    again = CriticEngine("checkpoint", str(tmp_path / "critic"), CriticConfig(micro_batch_size=4), info,
                         total_optimizer_steps=1, train=False)
    assert (again.forward_values(batch) - values).abs().max() < 1e-5
