import re

import pytest
import yaml

from vcppo.config.load import (CONFIG_DIR, all_keys, load_config, parse_overrides, save_config,
                          schema_markdown)
from vcppo.errors import ConfigError
from vcppo.preflight import check_host, check_paths, load_command_config

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
    ("algorithm.rollout_is_cap=0.5", "algorithm.rollout_is_cap"),
    ("trainer.dynamic_sampling_max_tries=0", "trainer.dynamic_sampling_max_tries"),
    ("reward.overlong_buffer_tokens=600", "reward.overlong_buffer_tokens"),  # > max_response_tokens (512)
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
    with pytest.raises(ConfigError, match="n_samples_per_prompt.*dynamic_sampling"):
        load_config("vcppo", ["rollout.n_samples_per_prompt=1", "trainer.dynamic_sampling=true"])
    assert load_config("vcppo", ["algorithm.rollout_is_cap=1"]).algorithm.rollout_is_cap == 1.0


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


def test_scientific_notation_in_yaml_is_a_float(tmp_path):
    p = tmp_path / "mine.yaml"
    p.write_text(f"extends: {CONFIG_DIR / 'vcppo.yaml'}\nactor:\n  lr: 1e-6\ncritic:\n  lr: 2E-6\n")
    cfg = load_config(str(p))
    assert cfg.actor.lr == 1e-6 and cfg.critic.lr == 2e-6 and isinstance(cfg.actor.lr, float)
    assert cfg.preset == "mine" and cfg.algorithm.lambda_critic == 1.0  # the parent's keys came along


def test_interpolation_in_files_and_overrides(tmp_path):
    cfg = load_config("vcppo", ["critic.lr=${actor.lr}", "actor.lr=3e-5", "model.policy_path=/ckpt/sft"])
    assert cfg.critic.lr == 3e-5
    # schema defaults interpolate too: SFT writes the policy RL starts from, the RM samples from it
    assert cfg.sft.output_dir == cfg.rm.policy_path == cfg.eval.model_path == "/ckpt/sft"
    with pytest.raises(ConfigError, match="nope"):
        load_config("vcppo", ["critic.lr=${nope.lr}"])


def test_demo_preset_derives_every_path_from_its_workdir():
    cfg = load_config("demo", ["demo.workdir=/w", "demo.model_size=tiny"])
    assert (cfg.sft.init_model, cfg.sft.output_dir, cfg.model.policy_path) == ("/w/init-tiny", "/w/sft", "/w/sft")
    assert (cfg.rm.policy_path, cfg.rm.output_dir, cfg.model.critic_path) == ("/w/sft", "/w/rm", "/w/rm")
    assert cfg.data.train_files == "/w/data/train.parquet" and cfg.eval.data_files == "/w/data/test.parquet"
    assert cfg.algorithm.lambda_actor == 0.99 and cfg.value_pretrain.enabled  # a vcppo run


@pytest.mark.parametrize("override,field", [
    ("actor.lr=1e999", "actor.lr"),
    ("actor.lr=nan", "actor.lr"),
    ("actor.lr=1e30", "actor.lr"),  # finite, but one AdamW step moves every weight by ~1e30
    ("critic.lr=2", "critic.lr"),
    ("sft.target_accuracy=1.5", "sft.target_accuracy"),
    ("rm.heldout_frac=0", "rm.heldout_frac"),
    ("eval.k=[1,16]", "eval.k"),
    ("sft.betas=[0.9]", "sft.betas"),
    ("reference.zero_stage=4", "reference.zero_stage"),
])
def test_non_finite_and_command_section_values_name_the_field(override, field):
    with pytest.raises(ConfigError) as e:
        load_config("vcppo", [override])
    assert field in str(e.value)


def test_every_command_reads_config_then_overrides():
    from vcppo.config.load import split_command_line
    assert split_command_line(["vapo", "a.b=1"], None) == ("vapo", ["a.b=1"])
    assert split_command_line(["a.b=1"], "base") == ("base", ["a.b=1"])
    cfg = load_command_config(["sft.steps=7"], "demo")  # demo checks no path
    assert cfg.preset == "base" and cfg.sft.steps == 7
    with pytest.raises(ConfigError, match="CONFIG"):
        load_command_config(["actor.lr=1"], "train", default_config=None)


@pytest.mark.parametrize("command,key", [("sft", "sft.init_model"), ("rm", "rm.policy_path"),
                                         ("eval", "eval.data_files")])
def test_check_paths_per_command_names_the_key(command, key, tmp_path):
    cfg = load_config("base", [f"sft.init_model={tmp_path}/none", f"rm.policy_path={tmp_path}/none",
                               f"model.critic_path={tmp_path}/rm", f"eval.model_path={tmp_path}",
                               f"eval.data_files={tmp_path}/none.parquet", f"data.train_files={tmp_path}"])
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        check_paths(cfg, command)


@pytest.mark.parametrize("overrides, device, wanted", [
    ([], "cpu", False),                                             # fp32 CPU: nothing reads them
    ([], "cuda", True),                                             # model.dtype auto = bf16 on CUDA
    (["model.dtype=bfloat16"], "cpu", True),                        # low precision: mismatch/* matter
    (["model.dtype=float32"], "cuda", False),
    (["algorithm.rollout_is_cap=2"], "cpu", True),                  # TIS weights
    (["algorithm.old_logprobs_from_sampler=true"], "cpu", True),    # pi_old from the sampler
    (["critic.confidence_features=true"], "cpu", True),             # the critic's confidence head
    (["rollout.sampler_logprobs=true"], "cpu", True),
    (["rollout.sampler_logprobs=false"], "cuda", False),
    (["rollout.top_p=0.9", "model.dtype=bfloat16"], "cuda", False),  # nucleus logprobs: metrics would be biased
])
def test_sampler_logprobs_are_asked_for_only_when_used(overrides, device, wanted):
    import torch

    from vcppo.driver.step.step_plan import wants_sampler_logprobs
    assert wants_sampler_logprobs(load_config("vcppo", overrides), torch.device(device)) is wanted


@pytest.mark.parametrize("user", ["algorithm.rollout_is_cap=2", "algorithm.old_logprobs_from_sampler=true",
                                  "critic.confidence_features=true"])
def test_sampler_logprobs_off_while_a_key_needs_them_names_both_keys(user):
    with pytest.raises(ConfigError) as e:
        load_config("vcppo", ["rollout.sampler_logprobs=false", user])
    assert "rollout.sampler_logprobs" in str(e.value) and user.split("=")[0] in str(e.value)


@pytest.mark.parametrize("reader", ["algorithm.rollout_is_cap=2", "algorithm.old_logprobs_from_sampler=true",
                                    "critic.confidence_features=true", "rollout.sampler_logprobs=true"])
def test_top_p_below_one_with_a_reader_of_the_sampler_logprobs_names_both_keys(reader):
    with pytest.raises(ConfigError) as e:
        load_config("vcppo", ["rollout.top_p=0.9", reader])
    assert "'rollout.top_p'" in str(e.value) and reader.split("=")[0] in str(e.value)


@pytest.mark.parametrize("overrides, key", [
    (["trainer.max_staleness=1"], "trainer.max_staleness"),  # colocated ranks are never stale
    (["placement.mode=split", "trainer.max_staleness=1"], "algorithm.rollout_is_cap"),
    (["placement.mode=split", "trainer.max_staleness=1", "algorithm.rollout_is_cap=2",
      "algorithm.old_logprobs_from_sampler=true"], "algorithm.old_logprobs_from_sampler"),
    (["placement.mode=split", "trainer.max_staleness=1", "algorithm.rollout_is_cap=2",
      "rollout.sampler_logprobs=false"], "rollout.sampler_logprobs"),
    (["placement.mode=split", "rollout.tensor_parallel_size=2"], "rollout.tensor_parallel_size"),
    (["placement.mode=spilt"], "placement.mode"),
    (["placement.critic_ranks=1"], "placement.critic_ranks"),  # colocated ranks hold the critic
    (["placement.mode=split", "placement.critic_ranks=1", "algorithm.advantage_estimator=grpo"],
     "placement.critic_ranks"),  # no critic to place
])
def test_split_placement_settings_that_cannot_work_name_their_key(overrides, key):
    with pytest.raises(ConfigError, match=re.escape(f"'{key}'")):
        load_config("vcppo", overrides)


def test_split_placement_with_staleness_and_a_cap_loads():
    cfg = load_config("vcppo", ["placement.mode=split", "trainer.max_staleness=1", "algorithm.rollout_is_cap=2"])
    assert cfg.placement.rollout_ranks == 1 and cfg.trainer.max_staleness == 1


def test_episode_settings_are_checked_before_any_engine():
    cfg = load_config("vcppo", ["rollout.env=guess", "rollout.env_args={n: 8, max_turns: 3}"])
    assert cfg.rollout.env == "guess" and dict(cfg.rollout.env_args) == {"n": 8, "max_turns": 3}
    for overrides, key in ((["rollout.env=no_such_env"], "rollout.env"),
                           (["rollout.env=tests.envs.hostile:Missing"], "rollout.env"),
                           (["rollout.env=guess", "reward.model_path=rm"], "reward.model_path"),
                           (["rollout.env=guess", "critic.confidence_features=true"], "critic.confidence_features"),
                           (["rollout.env=guess", "rollout.tensor_parallel_size=2"], "rollout.tensor_parallel_size")):
        with pytest.raises(ConfigError, match=f"config key '{re.escape(key)}'"):
            check_host(load_config("vcppo", overrides))  # the env class: the pre-flight's; the rest: the config's
    with pytest.raises(ConfigError, match="config key 'rollout.env'"):  # what every command's config goes through
        load_command_config(["vcppo", "rollout.env=no_such_env"], "demo")


def test_the_config_reference_is_the_schema():
    """docs/config.md is `make docs`' output: a key added to the schema without regenerating it fails here."""
    from pathlib import Path
    from vcppo.config.load import schema_markdown
    doc = (Path(__file__).resolve().parents[1] / "docs" / "config.md").read_text()
    assert doc == schema_markdown() + "\n", "docs/config.md is stale: run `make docs`"
