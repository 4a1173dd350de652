"""driver/durability/model_export.py without engines: what is a checkpoint, a stage-0 engine's states,
and the one-line refusals."""
import pytest
import torch

from vcppo.cli import main as cli_main
from vcppo.driver.durability.checkpoint import CheckpointError
from vcppo.driver.durability.model_export import engine_state, export_checkpoint, is_checkpoint


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
