"""Hub ids as model paths (vcppo.models.hub): parsing, offline resolution from a real cache layout,
the one-line errors, the per-node resolution, and what a run records."""
import json
import time

import pytest

from tests.hub_cache import add_model, add_snapshot, offline_hub
from vcppo.models import hub
from vcppo.errors import ConfigError


@pytest.fixture
def hf_home(tmp_path, monkeypatch):
    return offline_hub(tmp_path, monkeypatch)


@pytest.mark.parametrize("value,expected", [
    ("Qwen/Qwen2.5-0.5B-Instruct", hub.HubId("Qwen/Qwen2.5-0.5B-Instruct")),
    ("org/name@v1.0", hub.HubId("org/name", "v1.0")),
    ("org/name@refs/pr/3", hub.HubId("org/name", "refs/pr/3")),
    ("name", None), ("a/b/c", None), ("./a/b", None), ("/abs/path", None), ("", None),
])
def test_parse_id(value, expected):
    assert hub.parse_id(value) == expected


def test_an_existing_directory_is_a_path_not_an_id(tmp_path, monkeypatch):
    (tmp_path / "org" / "name").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert hub.parse_id("org/name") is None
    assert hub.resolve("org/name", "model.policy_path") == "org/name"


def test_resolves_main_a_tag_and_a_commit_offline(hf_home):
    old = add_snapshot(hf_home, "org/tiny", {"config.json": "{}"}, commit="a" * 40, refs=("v1",))
    new = add_snapshot(hf_home, "org/tiny", {"config.json": '{"x": 1}'}, commit="b" * 40, refs=("main",))
    assert hub.resolve("org/tiny", "model.policy_path") == str(new)
    assert hub.resolve("org/tiny@v1", "model.policy_path") == str(old)
    assert hub.resolve(f"org/tiny@{'a' * 40}", "model.policy_path") == str(old)
    assert json.loads((new / "config.json").read_text()) == {"x": 1}  # the symlinked blob reads through
    assert hub.snapshot_source(str(new)) == f"org/tiny@{'b' * 40}"
    assert hub.snapshot_source("/some/dir") is None


def test_not_cached_while_offline_is_one_line_naming_the_key_and_the_fix(hf_home):
    with pytest.raises(ConfigError) as e:
        hub.resolve("org/missing@v2", "model.critic_path")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("config key 'model.critic_path': org/missing@v2 is not a local path")
    assert "hf download org/missing --revision v2" in msg and "HF_HUB_OFFLINE" in msg


@pytest.mark.parametrize("error,words", [
    ("RepositoryNotFoundError", "no model org/x on the Hugging Face Hub"),
    ("GatedRepoError", "is gated: accept its terms"),
    ("RevisionNotFoundError", "has no revision 'nope'"),
])
def test_online_errors_name_the_key(hf_home, monkeypatch, error, words):
    import httpx
    import huggingface_hub
    import huggingface_hub.errors as errors

    response = httpx.Response(404, request=httpx.Request("GET", "https://huggingface.co/api/models/org/x"))

    def refuse(*args, **kwargs):
        raise getattr(errors, error)("refused", response=response)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", refuse)
    with pytest.raises(ConfigError, match=f"^config key 'reward.model_path': .*{words}"):
        hub.resolve("org/x@nope", "reward.model_path")


def test_a_second_local_rank_takes_local_rank_0s_answer(hf_home, monkeypatch, tmp_path):
    hub_id = hub.HubId("org/tiny")
    answer = hub._answer_file(hub_id, "model")
    answer.parent.mkdir(parents=True)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(hub, "WAIT_S", 1.0)
    answer.write_text(json.dumps({"path": str(tmp_path), "time": time.time() - 3600}))  # an earlier launch's
    with pytest.raises(ConfigError, match="local rank 1 waited 1 s for local rank 0 to resolve org/tiny"):
        hub.resolve_once(hub_id, "config key 'model.policy_path'")
    answer.write_text(json.dumps({"path": str(tmp_path), "time": time.time()}))
    assert hub.resolve_once(hub_id, "config key 'model.policy_path'") == str(tmp_path)


def test_local_rank_0_writes_the_answer_the_others_read(hf_home, monkeypatch):
    snapshot = add_snapshot(hf_home, "org/tiny", {"config.json": "{}"})
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert hub.resolve_once(hub.HubId("org/tiny"), "x") == str(snapshot)
    assert json.loads(hub._answer_file(hub.HubId("org/tiny"), "model").read_text())["path"] == str(snapshot)


def test_train_config_resolves_its_model_keys_and_the_run_records_them(hf_home, tiny_artifacts):
    from vcppo.preflight import load_command_config

    policy = add_model(hf_home, "org/policy", tiny_artifacts / "tiny")
    critic = add_model(hf_home, "org/critic", tiny_artifacts / "rm")
    cfg = load_command_config(["ppo", "model.policy_path=org/policy", "model.critic_path=org/critic",
                               f"data.train_files={tiny_artifacts / 'data' / 'train.parquet'}",
                               f"data.val_files={tiny_artifacts / 'data' / 'val.parquet'}",
                               f"trainer.output_root={hf_home / 'runs'}"], "train")
    assert (cfg.model.policy_path, cfg.model.tokenizer_path, cfg.model.critic_path) == \
        (str(policy), str(policy), str(critic))
    assert hub.model_sources(cfg) == {"model.policy_path": f"org/policy@{policy.name}",
                                      "model.tokenizer_path": f"org/policy@{policy.name}",
                                      "model.critic_path": f"org/critic@{critic.name}"}


def test_a_critic_path_no_critic_reads_is_not_resolved(hf_home, tiny_artifacts):
    from vcppo.preflight import load_command_config

    add_model(hf_home, "org/policy", tiny_artifacts / "tiny")
    # a user's critic key for a critic-free method is refused for what it is (one line naming it),
    # never looked up in the hub (an id that is not cached would otherwise be the error)
    with pytest.raises(ConfigError, match="'model.critic_path' configures a critic") as err:
        load_command_config(["grpo", "model.policy_path=org/policy", "model.critic_path=org/not-cached",
                             f"data.train_files={tiny_artifacts / 'data' / 'train.parquet'}", "data.val_files=null",
                             f"trainer.output_root={hf_home / 'runs'}"], "train")
    assert "not cached" not in str(err.value) and "hub" not in str(err.value)


def test_under_srun_the_node_s_first_task_resolves(hf_home, monkeypatch):
    """srun sets SLURM_LOCALID / SLURM_NTASKS before any launcher variable exists."""
    monkeypatch.setenv("SLURM_NTASKS", "4")
    monkeypatch.setenv("SLURM_LOCALID", "1")
    assert hub._local_rank() == (1, 4)
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert hub._local_rank() == (0, 2)  # a launcher's own variables win
