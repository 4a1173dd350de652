"""The estimator and policy-loss presets load, and what a method cannot run with is a config error
before any engine starts, naming the key to change; `vcppo plan` plans no critic for the
critic-free estimators."""
import json

import pytest

from vcppo.commands.plan import main as plan_main
from vcppo.config import load_config
from vcppo.methods import ESTIMATORS, uses_critic
from vcppo.schema import ConfigError

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
        load_config(preset, [override, "model.critic_path=/x"])


def test_an_estimator_that_needs_a_critic_without_one():
    with pytest.raises(ConfigError, match="model.critic_path' is required"):
        load_config("base", ["model.critic_init=reward_model"])


def test_shared_critic_overrides_stay_valid_for_critic_free_presets():
    """A sweep's common overrides (a critic path, critic lr, value-pretraining steps) apply to every
    preset; only keys that make a critic be built are refused."""
    cfg = load_config("rloo", ["model.critic_path=chain/rm", "critic.lr=1e-4", "value_pretrain.steps=80"])
    assert not cfg.value_pretrain.enabled


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
