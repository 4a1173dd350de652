"""driver/durability/conversion.py without engines: what is a checkpoint, a stage-0 engine's states,
and the one-line refusals."""
import pytest
import torch

from vcppo.cli import main as cli_main
from vcppo.driver.durability.checkpoint import CheckpointError
from vcppo.driver.durability.conversion import engine_state, export_checkpoint, is_checkpoint


def test_a_stage0_engine_checkpoint_reads_as_its_module(tmp_path):
    (tmp_path / "ds").mkdir()
    torch.save({"module": {"w": torch.ones(2, dtype=torch.bfloat16)}}, tmp_path / "ds" / "mp_rank_00_model_states.pt")
    state = engine_state(tmp_path)
    assert list(state) == ["w"] and state["w"].dtype == torch.float32


def test_not_a_checkpoint_and_a_damaged_one_are_named(tmp_path, capsys):
    assert not is_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match="is not a run's checkpoint"):
        export_checkpoint(tmp_path, tmp_path / "out")
    point = tmp_path / "step_000001"
    (point / "actor" / "ds").mkdir(parents=True)
    (point / "state.json").write_text("{}")
    (point / "manifest.json").write_text('{"files": {"state.json": {"size": 99, "sha256": "0"}}}')
    assert is_checkpoint(point)
    assert cli_main(["model", "export", str(point), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vcppo model: ") and "is damaged" in err and len(err.strip().splitlines()) == 1


def _run_with_checkpoint(tmp_path, critic=None, **paths):
    """A run dir with a sealed checkpoint whose run_config names the models in ``paths`` (each made);
    ``critic``: its config section, and the checkpoint holds a critic."""
    import json

    from vcppo.driver.durability import checkpoint as ckpt

    config = {"model": {"policy_path": None, "tokenizer_path": None, "critic_path": None}, "reward": {"model_path": None},
              "data": {"train_files": None}, "actor": {}}
    for key, path in paths.items():
        path.mkdir(parents=True)
        (path / "config.json").write_text("{}")
        section, name = key.split(".")
        config[section][name] = str(path)
    run = tmp_path / "run"
    stage = ckpt.staging_dir(run, 1)
    (stage / "actor" / "ds").mkdir(parents=True)
    if critic is not None:
        config["critic"] = critic
        (stage / "critic" / "ds").mkdir(parents=True)
    (stage / "run_config.json").write_text(json.dumps({"config": config}))
    (run / "config.yaml").write_text("{}\n")
    return ckpt.commit(stage, {"step": 1, "phase": "ppo"}, keep_last=2)


def _listing(path):
    return sorted((str(p.relative_to(path)), p.stat().st_size, p.stat().st_mtime_ns) for p in path.rglob("*"))


@pytest.mark.parametrize("key", ["model.policy_path", "model.tokenizer_path", "model.critic_path", "reward.model_path"])
def test_export_refuses_an_input_model_as_out_before_writing(tmp_path, capsys, key):
    models = {k: tmp_path / k.replace(".", "_") for k in ("model.policy_path", "model.tokenizer_path",
                                                            "model.critic_path", "reward.model_path")}
    point = _run_with_checkpoint(tmp_path, **models)
    (tmp_path / "link").symlink_to(models[key])
    for out in (models[key], models[key] / "sub", tmp_path / "link"):
        before = _listing(models[key])
        assert cli_main(["model", "export", str(point), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert f" the run's {key} (" in err and len(err.strip().splitlines()) == 1, err
        assert _listing(models[key]) == before  # nothing written


def test_export_refuses_an_out_inside_a_runs_checkpoints(tmp_path, capsys):
    point = _run_with_checkpoint(tmp_path, **{"model.policy_path": tmp_path / "base"})
    other = tmp_path / "other" / "checkpoints"  # another run's
    (other / "step_000003").mkdir(parents=True)
    for out in (point.parent / "exported", point.parent / "step_000009", other / "mine"):
        assert cli_main(["model", "export", str(point), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert "inside the run's checkpoint directory" in err and len(err.strip().splitlines()) == 1, err
    for out in (point, point / "actor"):
        assert cli_main(["model", "export", str(point), "--out", str(out)]) == 2
        assert "inside the checkpoint it exports" in capsys.readouterr().err
    assert not (point.parent / "exported").exists() and not (other / "mine").exists()
    # elsewhere the refusals let it through (here to the missing engine states)
    assert cli_main(["model", "export", str(point), "--out", str(tmp_path / "fine")]) == 2
    assert "checkpoint directory" not in capsys.readouterr().err


def test_a_checkpoint_without_a_critic_or_with_a_lora_critic_is_one_line(tmp_path, capsys):
    point = _run_with_checkpoint(tmp_path / "a", **{"model.policy_path": tmp_path / "base"})
    assert cli_main(["model", "export", str(point), "--critic", "--out", str(tmp_path / "critic")]) == 2
    err = capsys.readouterr().err
    assert f"{point} holds no critic" in err and len(err.strip().splitlines()) == 1, err
    point = _run_with_checkpoint(tmp_path / "b", critic={"lora": {"rank": 4}}, **{"model.policy_path": tmp_path / "b0"})
    assert cli_main(["model", "export", str(point), "--critic", "--out", str(tmp_path / "critic")]) == 2
    err = capsys.readouterr().err
    assert "critic trained LoRA adapters" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "critic").exists()


def test_a_training_checkpoint_as_critic_init_from_names_the_export(tmp_path):
    from vcppo.config.critic_start import resolve_init_from
    from vcppo.errors import ConfigError
    point = tmp_path / "checkpoints" / "step_000004"
    (point / "critic" / "ds").mkdir(parents=True)
    (point / "state.json").write_text("{}")
    with pytest.raises(ConfigError, match=rf"^config key 'critic.init_from': {point} is a run's training checkpoint "
                                          rf".*`vcppo model export {point} --critic --out DIR` and pass DIR$"):
        resolve_init_from(str(point))
