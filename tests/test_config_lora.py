"""LoRA settings that cannot work are config errors before any engine starts, naming the key."""
import pytest

from tests.engines.conftest import build_tiny_model
from vcppo.config.load import load_config
from vcppo.errors import ConfigError
from vcppo.preflight import check_paths


@pytest.mark.parametrize("overrides, message", [
    (["rollout.lora_sync=adapter"], "'rollout.lora_sync' is 'adapter' but actor.lora.rank is 0"),
    (["rollout.lora_sync=adapter", "actor.lora.rank=1024"], "'actor.lora.rank' (1024) exceeds vLLM's largest"),
    (["rollout.lora_sync=adapter", "actor.lora.rank=8", "placement.mode=split"], "must be 'merged' with placement"),
    (["actor.lora.alpha=0"], "'actor.lora.alpha' must be > 0"),
    (["critic.lora.dropout=1.5"], "'critic.lora.dropout' must be <= 1"),
    (["actor.lora.rnak=8"], "did you mean 'actor.lora.rank'"),
])
def test_settings_that_cannot_work(overrides, message):
    with pytest.raises(ConfigError) as e:
        load_config("vcppo", overrides)
    assert message in str(e.value)


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora_cfg")
    model = build_tiny_model(root / "tiny")  # hidden 64, one KV head: k_proj / v_proj are 64 -> 32
    (root / "train.parquet").write_bytes(b"")
    return [f"model.policy_path={model}", f"data.train_files={root / 'train.parquet'}",
            f"trainer.output_root={root / 'runs'}", "data.val_files=null", "model.critic_path=null"]


@pytest.mark.parametrize("overrides, message", [
    (["actor.lora.rank=8", "actor.lora.target_modules=[q_proj,qkv]"],
     "config key 'actor.lora': no layer is named 'qkv'"),
    (["critic.lora.rank=33"], "config key 'critic.lora': rank 33 exceeds the width of layer 'layers.0.self_attn.k_proj'"),
    (["actor.lora.rank=8", "actor.lora.target_modules=[embed_tokens]"], "'embed_tokens' is not a linear layer"),
])
def test_targets_are_checked_against_the_model(paths, overrides, message):
    with pytest.raises(ConfigError) as e:
        check_paths(load_config("vcppo", paths + overrides))
    assert message in str(e.value)


def test_adapters_that_fit_pass(paths):
    check_paths(load_config("vcppo", paths + ["actor.lora.rank=32", "critic.lora.rank=16",
                                              "critic.lora.target_modules=[q_proj,v_proj]"]))
    # GRPO has no critic: a critic LoRA setting is refused as such, not checked against any model
    with pytest.raises(ConfigError, match="config key 'critic.lora.rank' configures a critic"):
        load_config("grpo", [p for p in paths if not p.startswith("model.critic_path")] + ["critic.lora.rank=999"])
