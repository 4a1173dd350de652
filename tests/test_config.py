import pytest
import yaml

from vcppo.config import (ConfigError, all_keys, check_paths, load_config, parse_overrides,
                          save_config, schema_markdown)

PRESETS = ["vcppo", "ppo", "vcppo_no_dgae", "grpo", "vapo"]


@pytest.mark.parametrize("name", PRESETS)
def test_presets_load_and_differ_where_the_paper_says(name):
    cfg = load_config(name)
    assert cfg.preset == name
    if name == "vcppo":
        assert (cfg.algorithm.lambda_actor, cfg.algorithm.lambda_critic) == (0.95, 1.0)
        assert cfg.value_pretrain.enabled and cfg.model.critic_init == "policy"
    if name == "ppo":
        assert cfg.algorithm.lambda_actor == cfg.algorithm.lambda_critic == 0.95
        assert not cfg.value_pretrain.enabled and cfg.model.critic_init == "reward_model"
    if name == "vcppo_no_dgae":
        assert cfg.algorithm.lambda_critic == 0.95 and cfg.value_pretrain.enabled
    if name == "grpo":
        assert cfg.algorithm.advantage_estimator == "grpo" and not cfg.value_pretrain.enabled
    if name == "vapo":
        a = cfg.algorithm
        assert a.length_adaptive_lambda and (a.eps_low, a.eps_high) == (0.2, 0.28)
        assert a.positive_lm_coef == 0.1 and a.loss_agg == "token-mean"


def test_overrides_apply_with_types():
    cfg = load_config("vcppo", ["actor.lr=3e-6", "rollout.n_samples_per_prompt=8",
                                "algorithm.dual_clip_c=3", "rollout.stop=['\\n\\n']",
                                "logging.wandb=false"])
    assert cfg.actor.lr == 3e-6 and isinstance(cfg.actor.lr, float)
    assert cfg.rollout.n_samples_per_prompt == 8
    assert cfg.algorithm.dual_clip_c == 3.0
    assert cfg.logging.wandb is False


@pytest.mark.parametrize("override,named,suggested", [
    ("algorithm.lamda_actor=0.9", "algorithm.lamda_actor", "algorithm.lambda_actor"),
    ("actor.learning_rate=1e-6", "actor.learning_rate", None),
    ("critc.lr=1e-6", "critc.lr", "critic.lr"),
])
def test_typo_is_an_error_naming_the_key(override, named, suggested):
    with pytest.raises(ConfigError) as e:
        load_config("vcppo", [override])
    assert named in str(e.value)
    if suggested:
        assert suggested in str(e.value)


def test_typo_in_yaml_file_names_the_file(tmp_path):
    p = tmp_path / "mine.yaml"
    p.write_text(yaml.safe_dump({"extends": "x", "trainer": {"total_step": 3}}))
    (tmp_path / "x").write_text("{}")
    with pytest.raises(ConfigError) as e:
        load_config(str(p))
    assert "trainer.total_step" in str(e.value) and "mine.yaml" in str(e.value)
    assert "trainer.total_steps" in str(e.value)


@pytest.mark.parametrize("override,field", [
    ("algorithm.lambda_actor=1.5", "algorithm.lambda_actor"),
    ("algorithm.lambda_critic=-0.1", "algorithm.lambda_critic"),
    ("actor.lr=-1e-6", "actor.lr"),
    ("rollout.top_p=0", "rollout.top_p"),
    ("algorithm.loss_agg=mean", "algorithm.loss_agg"),
    ("rollout.n_samples_per_prompt=2.5", "rollout.n_samples_per_prompt"),
    ("algorithm.dual_clip_c=1", "algorithm.dual_clip_c"),
    ("trainer.val_k=[1,8]", "trainer.val_k"),
    ("logging.wandb=maybe", "logging.wandb"),
])
def test_out_of_range_values_name_the_field(override, field):
    with pytest.raises(ConfigError) as e:
        load_config("vcppo", [override])
    assert field in str(e.value)


def test_malformed_override_and_unknown_preset():
    with pytest.raises(ConfigError, match="key=value"):
        parse_overrides(["actor.lr"])
    with pytest.raises(ConfigError, match="vcpo.*did you mean 'vcppo'"):
        load_config("vcpo")


def test_grpo_rejects_single_sample_groups():
    with pytest.raises(ConfigError, match="n_samples_per_prompt"):
        load_config("grpo", ["rollout.n_samples_per_prompt=1"])


def test_check_paths_names_the_missing_path(tmp_path):
    cfg = load_config("vcppo", [f"model.policy_path={tmp_path}", "data.train_files=/nope/train.parquet"])
    with pytest.raises(ConfigError, match="data.train_files.*/nope/train.parquet"):
        check_paths(cfg)


def test_resolved_config_round_trips(tmp_path):
    cfg = load_config("vapo", ["trainer.seed=7"])
    path = save_config(cfg, tmp_path)
    again = load_config(str(path))
    assert again == cfg


def test_every_field_has_a_doc_line():
    md = schema_markdown()
    for key in all_keys():
        if "." in key:
            assert f"`{key}`" in md
    assert "| |" not in md
