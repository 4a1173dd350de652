"""The estimator and policy-loss presets load, and what a method cannot run with is a config error
before any engine starts, naming the key to change; `vcppo plan` plans no critic for the
critic-free estimators."""
import json
import re

import pytest

from vcppo.commands.plan import main as plan_main
from omegaconf import OmegaConf

from vcppo.config.load import CRITIC_KEYS, load_config
from vcppo.methods import ESTIMATORS, uses_critic
from vcppo.config.schema import Config
from vcppo.errors import ConfigError

NEW_PRESETS = {  # preset: (estimator, policy loss, loss aggregation)
    "rloo": ("rloo", "ppo", "token-mean"),
    "reinforce_plus_plus": ("reinforce_plus_plus", "ppo", "token-mean"),
    "reinforce_plus_plus_baseline": ("reinforce_plus_plus_baseline", "ppo", "token-mean"),
    "drgrpo": ("grpo", "ppo", "seq-mean-token-sum-norm"),
    "gspo": ("grpo", "gspo", "seq-mean-token-mean"),
}


@pytest.mark.parametrize("name", NEW_PRESETS)
def test_the_method_presets(name):
    cfg = load_config(name)
    a = cfg.algorithm
    assert (a.advantage_estimator, a.policy_loss, a.loss_agg) == NEW_PRESETS[name] and cfg.preset == name
    assert not cfg.value_pretrain.enabled and not uses_critic(a.advantage_estimator)
    if name.startswith("reinforce"):  # token-level KL in the reward, global normalisation
        assert a.kl_coef > 0 and a.kl_in == "reward" and a.whiten_advantages and a.zero_mean_advantages
    if name == "drgrpo":
        assert not a.grpo_scale_by_std
    if name == "gspo":
        assert (a.eps_low, a.eps_high) == (3e-4, 4e-4)


def test_only_gae_reads_a_critic():
    assert [n for n, e in ESTIMATORS.items() if e.critic] == ["gae"]


@pytest.mark.parametrize("estimator", [n for n, e in ESTIMATORS.items() if e.groups])
def test_a_group_estimator_needs_groups(estimator):
    with pytest.raises(ConfigError, match=rf"rollout.n_samples_per_prompt.*>= 2.*{estimator}"):
        load_config("base", [f"algorithm.advantage_estimator={estimator}", "rollout.n_samples_per_prompt=1",
                             "algorithm.whiten_advantages=true"])


def test_reinforce_pp_runs_with_one_sample_per_prompt():
    cfg = load_config("reinforce_plus_plus", ["rollout.n_samples_per_prompt=1"])
    assert cfg.rollout.n_samples_per_prompt == 1


@pytest.mark.parametrize("preset, override, key", [
    ("rloo", "model.critic_init=reward_model", "model.critic_init"),
    ("grpo", "critic.confidence_features=true", "critic.confidence_features"),
    ("ppo", "algorithm.advantage_estimator=reinforce_plus_plus", "model.critic_init"),  # ppo's RM critic
])
def test_a_critic_configured_for_a_critic_free_estimator_names_the_key_to_drop(preset, override, key):
    with pytest.raises(ConfigError, match=rf"'{key}' configures a critic.*reads none.*drop {key}"):
        load_config(preset, [override])


def test_an_estimator_that_needs_a_critic_without_one():
    with pytest.raises(ConfigError, match="model.critic_path' is required"):
        load_config("base", ["model.critic_init=reward_model"])


@pytest.mark.parametrize("key", CRITIC_KEYS)
def test_every_key_only_a_critic_reads_is_refused_for_a_critic_free_method(key):
    """The keys come from the schema (``critic`` on a field or its section): a new critic key is covered."""
    default = OmegaConf.select(OmegaConf.structured(Config), key)  # set to its default: still set
    default = OmegaConf.to_container(default) if OmegaConf.is_config(default) else default
    value = {"model.critic_init": "reward_model", "placement.critic_ranks": 1}.get(key, json.dumps(default))
    for preset in ("grpo", "rloo"):
        with pytest.raises(ConfigError, match=rf"config key '{re.escape(key)}' configures a critic, but "
                                              rf"algorithm.advantage_estimator='{preset}' reads none"):
            load_config(preset, [f"{key}={value}"])
    if key != "placement.critic_ranks":  # (that one needs split placement)
        load_config("vcppo", [f"{key}={value}", "model.critic_path=rm"])


def test_the_critic_keys_are_the_critic_sections_and_the_marked_keys():
    assert {"critic.lr", "critic.lr_schedule", "value_pretrain.steps", "value_pretrain.enabled",
            "algorithm.lambda_critic", "model.critic_path", "model.critic_init"} <= set(CRITIC_KEYS)
    assert not {"actor.lr", "algorithm.lambda_actor", "model.policy_path"} & set(CRITIC_KEYS)


def test_a_presets_own_critic_settings_are_not_the_users(tmp_path):
    """base.yaml sets critic.lr for every preset; grpo extends it. A user's file that sets one is refused."""
    load_config("grpo")
    own = tmp_path / "mine.yaml"
    own.write_text("extends: grpo\ncritic:\n  lr: 1.0e-5\n")
    with pytest.raises(ConfigError, match=rf"config key 'critic.lr' configures a critic.*\({re.escape(str(own))}\)"):
        load_config(own)


@pytest.mark.parametrize("override", ["algorithm.whiten_advantages=false", "algorithm.zero_mean_advantages=false"])
def test_reinforce_pp_keeps_its_global_normalisation(override):
    with pytest.raises(ConfigError, match=rf"algorithm.{override.split('.')[1].split('=')[0]}' must be true"):
        load_config("reinforce_plus_plus_baseline", [override])


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
def test_gspo_refuses_an_aggregation_it_does_not_define(agg):
    with pytest.raises(ConfigError, match=rf"loss_agg' \('{agg}'\) is not defined for algorithm.policy_loss='gspo'"
                                          r".*seq-mean-token-mean"):
        load_config("gspo", [f"algorithm.loss_agg={agg}"])
    with pytest.raises(ConfigError, match="dual_clip_c"):
        load_config("gspo", ["algorithm.dual_clip_c=3"])


def test_gspo_composes_with_any_estimator():
    for est in ESTIMATORS:
        cfg = load_config("base", [f"algorithm.advantage_estimator={est}", "algorithm.policy_loss=gspo",
                                   "algorithm.loss_agg=seq-mean-token-mean"])
        assert cfg.algorithm.policy_loss == "gspo"


@pytest.mark.parametrize("name", ["rloo", "reinforce_plus_plus_baseline", "gspo"])
def test_plan_has_no_critic_for_a_critic_free_estimator(name, tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert plan_main([name, "--model-shape", "qwen2.5-7b", "--gpu", "h100", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    roles = {e["role"] for e in result["plan"]["engines"]}
    assert "critic" not in roles and "actor" in roles
    assert ("reference" in roles) == name.startswith("reinforce")  # its KL in the reward
    # the same config with GAE: a critic's memory and passes on top
    with_critic = tmp_path / "gae.json"
    assert plan_main([name, "algorithm.advantage_estimator=gae", "--model-shape", "qwen2.5-7b", "--gpu", "h100",
                      "--json", str(with_critic)]) == 0
    gae = json.loads(with_critic.read_text())["plan"]
    assert "critic" in {e["role"] for e in gae["engines"]}
    assert result["plan"]["time"]["training_s"] < gae["time"]["training_s"]
