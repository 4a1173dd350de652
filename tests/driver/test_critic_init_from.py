"""``critic.init_from``: the critic a run builds from it gives the source's values exactly (real DeepSpeed
critic, one rank), a run directory resolves to its final/critic, and a source of another shape or
tokenizer, or none at all, is one line naming the key before any engine starts."""
import json
import shutil

import pytest
import torch

from vcppo.config.critic_start import check_critic_start, resolve_init_from
from vcppo.config.load import load_config
from vcppo.errors import ConfigError
from vcppo.experience import Rollout, make_layout

pytestmark = [pytest.mark.integration]


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    from tests.engines.conftest import build_tiny_model
    return build_tiny_model(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def source(tmp_path_factory, tiny_model_dir):
    """A value model with a random head (values that differ by position), in a run's final/critic."""
    from vcppo.models.value_model import ValueModel
    run = tmp_path_factory.mktemp("run")
    model = ValueModel.from_policy(tiny_model_dir)
    with torch.no_grad():
        model.value_head.weight.copy_(torch.randn(model.value_head.weight.shape,
                                                  generator=torch.Generator().manual_seed(3)))
        for p in model.backbone.parameters():  # a backbone that is not the policy's
            p.add_(0.01)
    model.save_pretrained(str(run / "final" / "critic"), tokenizer_src=tiny_model_dir)
    return run


def cfg_for(tiny_model_dir, init_from, *extra):
    return load_config("sao", [f"model.policy_path={tiny_model_dir}", f"model.tokenizer_path={tiny_model_dir}",
                               f"critic.init_from={init_from}", "critic.zero_stage=0", *extra])


def test_a_warm_started_critics_first_values_are_the_sources(info, tiny_model_dir, source):
    from vcppo.driver.run_engines import build_critic
    from vcppo.models.value_model import ValueModel
    cfg = cfg_for(tiny_model_dir, source)
    log = type("Log", (), {"info": staticmethod(lambda *a: None)})()
    critic, from_cache = build_critic(cfg, info, log, resumed=None, resume_point=None)
    assert from_cache == source / "final" / "critic"  # value pretraining is skipped for it
    r = Rollout.unscored(make_layout([[5, 6], [7, 8, 9]], [[10, 11, 12], [13, 14]], pad_id=0))
    values = critic.forward_values(r)
    critic.close()
    ref = ValueModel.from_pretrained(str(source / "final" / "critic"))
    with torch.no_grad():
        out = ref(r.input_ids, attention_mask=r.attention_mask, position_ids=r.position_ids)
    P, R = r.prompt_len, r.responses.shape[1]
    expected = out[:, P - 1:P + R - 1] * r.policy_mask
    assert values.abs().max() > 1.0  # a policy-initialised critic's zero head would give 0 everywhere
    torch.testing.assert_close(values, expected, rtol=1e-5, atol=1e-5)  # the engine's batching: float rounding


def test_a_run_directory_resolves_to_its_final_critic(source, tmp_path):
    assert resolve_init_from(str(source)) == str(source / "final" / "critic")
    with pytest.raises(ConfigError, match=r"^config key 'critic.init_from': .* is neither a vcppo value-model"):
        resolve_init_from(str(tmp_path))


def test_a_source_of_another_shape_or_tokenizer_is_one_line(tiny_model_dir, source, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(source / "final" / "critic", other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 3}))
    with pytest.raises(ConfigError, match=r"^config key 'critic.init_from': .* num_hidden_layers 3, the policy .* 2:"):
        check_critic_start(cfg_for(tiny_model_dir, other))
    (other / "config.json").write_text(json.dumps(config))
    tok = json.loads((other / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    a, b = list(vocab)[10:12]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (other / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(ConfigError, match=r"^config key 'critic.init_from': .*'s tokenizer is not the run's"):
        check_critic_start(cfg_for(tiny_model_dir, other))
    check_critic_start(cfg_for(tiny_model_dir, source))  # the matching source passes


def test_a_freeze_spec_matching_nothing_is_refused_before_engines(tiny_model_dir):
    with pytest.raises(ConfigError, match=r"^config key 'critic.freeze': 'layers:7' asks for 7 layers, the model has 2"):
        check_critic_start(load_config("sao", [f"model.policy_path={tiny_model_dir}", "critic.freeze=[layers:7]"]))
    with pytest.raises(ConfigError, match="critic.init_from' and model.critic_init='checkpoint'"):
        load_config("sao", ["critic.init_from=x", "model.critic_init=checkpoint", "model.critic_path=x"])
