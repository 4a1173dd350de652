"""A resume point against this run's config, before any engine starts (driver/durability/run_dir.py):
the changed keys by class, the ZeRO layout, the models' shapes, from the checkpoint's own record."""
import json

import pytest

from vcppo.config.load import load_config, save_config
from vcppo.driver.durability.run_dir import RUN_CONFIG, check_resume, recorded_run_config, write_run_config
from vcppo.engines.engine_setup import CHECKPOINT_TAG
from vcppo.errors import ConfigError


def _policy(root, hidden=64, layers=2):
    d = root / "policy"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps({"model_type": "qwen2", "hidden_size": hidden,
                                               "num_hidden_layers": layers, "vocab_size": 100}))
    return d


def _cfg(tmp_path, *overrides):
    return load_config("vcppo", [f"model.policy_path={tmp_path / 'policy'}", f"trainer.output_root={tmp_path}",
                                 *overrides])


def _checkpoint(tmp_path, cfg, engines=("actor", "critic"), stage=None):
    point = tmp_path / "vcppo-seed0" / "checkpoints" / "step_000002"
    for role in engines:
        ds = point / role / CHECKPOINT_TAG
        ds.mkdir(parents=True)
        name = "zero_pp_rank_0_mp_rank_00_model_states.pt" if stage == 3 else "mp_rank_00_model_states.pt"
        (ds / name).write_bytes(b"")
    write_run_config(cfg, point)
    return point


def test_an_unchanged_config_resumes(tmp_path):
    _policy(tmp_path)
    cfg = _cfg(tmp_path)
    assert check_resume(cfg, _checkpoint(tmp_path, cfg)) == []
    assert check_resume(cfg, None) == []


def test_a_changed_lambda_is_refused_unless_allowed(tmp_path):
    _policy(tmp_path)
    point = _checkpoint(tmp_path, _cfg(tmp_path))
    with pytest.raises(ConfigError, match=r"algorithm.lambda_actor 0.95 -> 0.5"):
        check_resume(_cfg(tmp_path, "algorithm.lambda_actor=0.5"), point)
    allowed = _cfg(tmp_path, "algorithm.lambda_actor=0.5", "trainer.resume_allow_changes=[algorithm.lambda_actor]",
                   "trainer.total_steps=7")
    changes = {c.key: (c.old, c.new, c.klass) for c in check_resume(allowed, point)}
    assert changes["algorithm.lambda_actor"] == (0.95, 0.5, "math")
    assert changes["trainer.total_steps"][2] == "free"


@pytest.mark.parametrize("override,key", [("actor.lora.rank=8", "actor.lora.rank"),
                                          ("critic.lora.target_modules=[q_proj]", "critic.lora.target_modules")])
def test_a_lora_shape_change_is_one_line_naming_the_key(tmp_path, override, key):
    _policy(tmp_path)
    point = _checkpoint(tmp_path, _cfg(tmp_path, "actor.lora.rank=4", "critic.lora.rank=4"))
    with pytest.raises(ConfigError) as e:
        check_resume(_cfg(tmp_path, "actor.lora.rank=4", "critic.lora.rank=4", override), point)
    assert str(e.value).startswith(f"config key '{key}'") and "\n" not in str(e.value)
    assert "cannot be loaded" in str(e.value)


def test_lora_rank_to_zero_is_refused_too(tmp_path):
    _policy(tmp_path)
    point = _checkpoint(tmp_path, _cfg(tmp_path, "actor.lora.rank=4"))
    with pytest.raises(ConfigError, match=r"'actor.lora.rank': 4 in checkpoint .*, 0 now.*actor.lora.rank=4"):
        check_resume(_cfg(tmp_path), point)


def test_an_actor_the_checkpoint_does_not_hold_changes_only_the_math(tmp_path):
    """Value pretraining saves no actor: its LoRA shape may change, as a math change."""
    _policy(tmp_path)
    point = _checkpoint(tmp_path, _cfg(tmp_path), engines=("critic",))
    with pytest.raises(ConfigError, match="would change what the run computes: actor.lora.rank 0 -> 4"):
        check_resume(_cfg(tmp_path, "actor.lora.rank=4"), point)


def test_a_zero_stage_the_checkpoint_cannot_load_is_named(tmp_path):
    _policy(tmp_path)
    cfg = _cfg(tmp_path)
    point = _checkpoint(tmp_path, cfg, stage=3)
    with pytest.raises(ConfigError, match=r"config key 'actor.zero_stage': .* ZeRO-3, which does not load at ZeRO-0"):
        check_resume(_cfg(tmp_path, "actor.zero_stage=0"), point)
    check_resume(_cfg(tmp_path, "actor.zero_stage=3"), point)
    check_resume(_cfg(tmp_path, "actor.zero_stage=0"), point, same_ranks=False)  # reshard checks that case


def test_a_model_of_another_shape_is_named(tmp_path):
    _policy(tmp_path)
    point = _checkpoint(tmp_path, _cfg(tmp_path))
    _policy(tmp_path, hidden=128)  # the same path now holds another model
    with pytest.raises(ConfigError, match=r"config key 'model.policy_path': .*hidden_size 64 there, 128 in"):
        check_resume(_cfg(tmp_path), point)


def test_a_checkpoint_without_its_record_is_compared_with_the_run_dirs_config(tmp_path):
    _policy(tmp_path)
    cfg = _cfg(tmp_path)
    point = _checkpoint(tmp_path, cfg)
    (point / RUN_CONFIG).unlink()
    assert recorded_run_config(point) == (None, {})
    save_config(cfg, point.parent.parent)
    old, shapes = recorded_run_config(point)
    assert old["algorithm"]["lambda_actor"] == 0.95 and shapes == {}
    with pytest.raises(ConfigError, match="algorithm.lambda_actor"):
        check_resume(_cfg(tmp_path, "algorithm.lambda_actor=0.5"), point)
