"""The keys that say which run a directory holds (driver/durability/run_lock.py identity_conflict)."""
from vcppo.config import load_config, save_config
from vcppo.driver.durability.run_lock import identity_conflict


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
