"""The keys that say which run a directory holds (driver/durability/run_dir.py identity_conflict)."""
from vcppo.config.load import load_config, save_config
from vcppo.driver.durability.run_dir import identity_conflict


def test_only_the_identity_keys_refuse_a_resume(tmp_path):
    save_config(load_config("vcppo", ["trainer.seed=0"]), tmp_path)
    assert identity_conflict(tmp_path, load_config("vcppo", ["trainer.seed=0"])) is None
    # a longer run, another lr, other logging: the same run, continued
    same = load_config("vcppo", ["trainer.seed=0", "trainer.total_steps=999", "actor.lr=3e-6", "logging.wandb=false"])
    assert identity_conflict(tmp_path, same) is None
    why = identity_conflict(tmp_path, load_config("vcppo", ["trainer.seed=1"]))
    assert "trainer.seed: 0 there, 1 now" in why and str(tmp_path) in why and "trainer.run_name" in why
    why = identity_conflict(tmp_path, load_config("grpo", ["trainer.seed=0"]))
    assert "preset: 'vcppo' there, 'grpo' now" in why and "algorithm.advantage_estimator" in why


def test_a_directory_without_a_saved_config_is_not_refused(tmp_path):
    assert identity_conflict(tmp_path, load_config("vcppo", [])) is None


def test_one_model_path_spelled_differently_is_the_same_run(tmp_path, monkeypatch):
    """A trailing slash, or a relative path for an absolute one, names the same model and data."""
    from vcppo.config.provenance import diff_configs
    from vcppo.config.load import to_dict
    (tmp_path / "models" / "sft").mkdir(parents=True)
    (tmp_path / "data.parquet").write_text("")
    monkeypatch.chdir(tmp_path)
    saved = load_config("vcppo", [f"model.policy_path={tmp_path}/models/sft",
                                  f"data.train_files={tmp_path}/data.parquet"])
    save_config(saved, tmp_path)
    for spelling in ("models/sft/", "./models/sft", f"{tmp_path}/models/../models/sft/"):
        now = load_config("vcppo", [f"model.policy_path={spelling}", "data.train_files=./data.parquet"])
        assert identity_conflict(tmp_path, now) is None, spelling
        assert [c.key for c in diff_configs(to_dict(saved), to_dict(now))] == [], spelling
    other = load_config("vcppo", ["model.policy_path=models/other", "data.train_files=data.parquet"])
    assert "model.policy_path" in identity_conflict(tmp_path, other)
    assert "start over in that directory (the other run is moved" in identity_conflict(tmp_path, other)


def test_a_damaged_saved_config_does_not_stop_the_resume(tmp_path, caplog):
    (tmp_path / "config.yaml").write_bytes(b"trainer:\n  seed: [\xff\n")
    assert identity_conflict(tmp_path, load_config("vcppo", [])) is None
    assert "config.yaml cannot be read" in caplog.text and "run_config.json" in caplog.text
