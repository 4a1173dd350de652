"""Configs that cannot work are rejected at start, naming the key: replaced sections, sampling
temperature 0, Adam betas and seed out of range, a context the model cannot hold, an output
directory that cannot be written, a reward function that does not import."""
import json

import pytest

from vcppo.config.load import load_config
from vcppo.errors import ConfigError
from vcppo.preflight import check_host, check_paths


@pytest.mark.parametrize("override,named", [
    ("actor=null", "'actor' is a section"), ("actor=[]", "'actor' is a section"),
    ("critic=3", "'critic' is a section"),
    ("rollout.temperature=0", "'rollout.temperature' must be > 0"),
    ("rollout.temperature=-1", "'rollout.temperature' must be > 0"),
    ("actor.lr=1e999", "'actor.lr' must be finite"),
    ("actor.betas=[1.5,0.9]", r"'actor.betas' entries must be in \[0, 1\)"),
    ("critic.betas=[0.9,1.0]", r"'critic.betas' entries must be in \[0, 1\)"),
    ("actor.betas=[-0.1,0.9]", r"'actor.betas' entries must be in \[0, 1\)"),
    ("trainer.seed=-1", "'trainer.seed' must be >= 0"),
    ("trainer.seed=4294967296", "'trainer.seed' must be <= 4294967295"),
    ("rollout.max_response_tokens=0", "'rollout.max_response_tokens' must be >= 1"),
])
def test_configs_that_cannot_work_are_rejected(override, named):
    with pytest.raises(ConfigError, match=named):
        load_config("vcppo", [override])


def test_section_replaced_in_a_yaml_file_names_the_file(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("actor: []\n")
    with pytest.raises(ConfigError, match=f"'actor' is a section.*{path.name}"):
        load_config(str(path))


def test_values_at_the_edges_are_accepted():
    cfg = load_config("vcppo", ["rollout.temperature=0.01", "actor.betas=[0.0,0.999]", "trainer.seed=4294967295"])
    assert cfg.rollout.temperature == 0.01 and cfg.trainer.seed == 2**32 - 1


@pytest.mark.parametrize("value,expected", [("false", False), ("False", False), ("true", True), ("null", None)])
def test_three_way_switches_are_typed_true_false_or_null(value, expected):
    for key in ("data.use_chat_template", "rollout.sampler_logprobs"):
        cfg = load_config("vcppo", [f"{key}={value}"])
        section, name = key.split(".")
        assert getattr(getattr(cfg, section), name) is expected


def test_use_chat_template_false_in_yaml(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("data:\n  use_chat_template: false\n")
    assert load_config(str(path)).data.use_chat_template is False


def test_auto_is_null_on_the_command_line_and_in_saved_configs(tmp_path):
    """'auto' is how configs saved by earlier versions (and verl users) spell the switches' null."""
    assert load_config("vcppo", ["rollout.sampler_logprobs=auto"]).rollout.sampler_logprobs is None
    path = tmp_path / "saved.yaml"
    path.write_text("data:\n  use_chat_template: auto\nrollout:\n  sampler_logprobs: auto\n")
    cfg = load_config(str(path))
    assert cfg.data.use_chat_template is None and cfg.rollout.sampler_logprobs is None
    with pytest.raises(ConfigError, match=r"rollout\.sampler_logprobs.*'maybe'"):
        load_config("vcppo", ["rollout.sampler_logprobs=maybe"])


@pytest.fixture()
def train_paths(tmp_path):
    model = tmp_path / "policy"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 512}))
    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "1+1=", "answer": "2"}\n')
    return [f"model.policy_path={model}", f"data.train_files={data}", "data.val_files=null",
            f"trainer.output_root={tmp_path / 'runs'}"]


def test_context_longer_than_the_model_is_rejected_before_engines_start(train_paths):
    check_paths(load_config("vcppo", train_paths + ["data.max_prompt_tokens=256", "rollout.max_response_tokens=256"]))
    cfg = load_config("vcppo", train_paths + ["data.max_prompt_tokens=256", "rollout.max_response_tokens=257"])
    with pytest.raises(ConfigError, match=r"'rollout.max_response_tokens' \(513\) exceed.*512 tokens"):
        check_paths(cfg)
    cfg = load_config("vcppo", train_paths + ["rollout.max_response_tokens=100000000"])
    with pytest.raises(ConfigError, match="max_position_embeddings"):
        check_paths(cfg)


def test_unwritable_output_root_is_named(train_paths, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    cfg = load_config("vcppo", train_paths + [f"trainer.output_root={blocker}/runs"])
    with pytest.raises(ConfigError, match="'trainer.output_root'.*a_file is not a directory"):
        check_paths(cfg)
    cfg = load_config("vcppo", train_paths + ["trainer.output_root=/proc/vcppo_runs"])  # even root cannot
    with pytest.raises(ConfigError, match="'trainer.output_root': cannot write into /proc"):
        check_paths(cfg)
    assert not (tmp_path / "runs").exists()  # the probe creates nothing


def test_unwritable_sft_output_is_named(tmp_path):
    cfg = load_config("base", [f"sft.init_model={tmp_path}", f"data.train_files={tmp_path}",
                               "data.val_files=null", "sft.output_dir=/proc/vcppo_sft"])
    with pytest.raises(ConfigError, match="'sft.output_dir'"):
        check_paths(cfg, "sft")


@pytest.mark.parametrize("function,named", [
    ("no_such_module_xyz:f", "no_such_module_xyz"),
    ("vcppo.rewards.verifier:no_such_fn", "no_such_fn"),
    ("vcppo.rewards.verifier:MAX_MATH_VERIFY_CHARS", "not callable"),
    ("nocolon", "module:function"),
])
def test_reward_function_that_does_not_load_is_named(train_paths, function, named):
    cfg = load_config("vcppo", train_paths + [f"reward.function={function}"])
    with pytest.raises(ConfigError, match=f"'reward.function'.*{named}"):
        check_paths(cfg)


def test_reward_function_that_loads_passes(train_paths):
    check_paths(load_config("vcppo", train_paths + ["reward.function=vcppo.rewards.verifier:score"]))


def test_a_sandbox_that_cannot_start_stops_the_run_before_engines(monkeypatch):
    """The python tool and the code reward need the sandbox: without it, one line naming the key."""
    import vcppo.sandbox.bwrap as bwrap
    monkeypatch.setattr(bwrap, "_bwrap", lambda: "/nonexistent/bwrap")
    bwrap.sandbox_problem.cache_clear()
    try:
        with pytest.raises(ConfigError, match=r"config key 'rollout.env_args': tools env: the python tool cannot "
                                              r"sandbox model code here: cannot start /nonexistent/bwrap.*"
                                              r"allow_unsandboxed_python=true"):
            check_host(load_config("vcppo", ["rollout.env=tools", "rollout.env_args.tools=[calculator,python]"]))
        with pytest.raises(ConfigError, match=r"config key 'reward.functions_by_source.apps': the code reward runs "
                                              r"programs in a sandbox, which cannot start here"):
            check_host(load_config("vcppo", ["reward.functions_by_source.apps=vcppo.rewards.code:score"]))
        check_host(load_config("vcppo", ["rollout.env=tools", "rollout.env_args.tools=[calculator,python]",
                                         "rollout.env_args.allow_unsandboxed_python=true"]))  # on purpose
        check_host(load_config("vcppo", ["rollout.env=tools"]))  # the calculator alone needs no sandbox
    finally:
        bwrap.sandbox_problem.cache_clear()
    with pytest.raises(ConfigError, match=r"'rollout.env_args': tools env: unknown argument 'python_timeout'"):
        check_host(load_config("vcppo", ["rollout.env=tools", "rollout.env_args.python_timeout=3"]))
    with pytest.raises(ConfigError, match=r"'rollout.env_args': cannot import module 'no_such_module'"):
        check_host(load_config("vcppo", ["rollout.env=tools", "rollout.env_args.answer_reward=no_such_module:score"]))
