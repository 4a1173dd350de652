"""Damaged run-directory records (driver/durability/run_records.py, vcppo/records.py): named, skipped,
set aside or rebuilt; never a traceback on resume."""
import json
import logging

from vcppo.config.load import load_config, to_dict
from vcppo.config.provenance import HISTORY_FILE, read_history, record_segment
from vcppo.driver.durability.run_records import check_run_records
from vcppo.tracking import read_metrics


def _checkpoint(run_dir, step, **overrides):
    point = run_dir / "checkpoints" / f"step_{step:06d}"
    point.mkdir(parents=True)
    (point / "manifest.json").write_text("{}")
    (point / "state.json").write_text(json.dumps({"phase": "ppo", "step": step}))
    cfg = to_dict(load_config("vcppo", [f"{k}={v}" for k, v in overrides.items()]))
    (point / "run_config.json").write_text(json.dumps({"config": cfg}))


def _segment(run_dir):
    record_segment(run_dir, phase="start", step=0, global_step=0, resumed_from=None, changes=[], argv=["x"])


def test_a_non_utf8_history_line_is_named_and_skipped(tmp_path):
    _segment(tmp_path)
    with open(tmp_path / HISTORY_FILE, "ab") as f:
        f.write(b'{"segment": 2, "x": "\xff"}\n')
    said = []
    check_run_records(tmp_path, said.append)
    assert len(said) == 1 and f"{HISTORY_FILE} line 2 is not a JSON record" in said[0]
    _segment(tmp_path)  # the next segment is recorded after the good ones
    assert [r["segment"] for r in read_history(tmp_path)] == [1, 2]


def test_a_directory_in_place_of_the_history_is_set_aside_and_the_history_rebuilt(tmp_path):
    _checkpoint(tmp_path, 1)
    _checkpoint(tmp_path, 2)
    _checkpoint(tmp_path, 3, **{"actor.lr": 3e-6})
    (tmp_path / HISTORY_FILE).mkdir()
    said = []
    check_run_records(tmp_path, said.append)
    assert any("is not a readable file: moved aside" in s for s in said)
    assert any("is missing: rebuilt from the checkpoints' run_config.json (2 segment(s)" in s for s in said)
    assert len([p for p in tmp_path.iterdir() if p.name.startswith(HISTORY_FILE + ".damaged-")]) == 1
    first, second = read_history(tmp_path)
    assert first["rebuilt"] and first["began_by"].endswith("step_000001")
    assert second["began_by"].endswith("step_000003") and second["changes"]["actor.lr"]["new"] == 3e-6


def test_a_deleted_history_is_said_and_rebuilt(tmp_path):
    _checkpoint(tmp_path, 2)
    said = []
    check_run_records(tmp_path, said.append)
    assert len(said) == 1 and "is missing: rebuilt" in said[0]
    assert len(read_history(tmp_path)) == 1


def test_a_fresh_directory_says_nothing(tmp_path):
    said = []
    check_run_records(tmp_path, said.append)
    assert said == [] and not (tmp_path / HISTORY_FILE).exists()


def test_a_bad_metrics_line_is_named_and_skipped(tmp_path, caplog):
    (tmp_path / "metrics.jsonl").write_bytes(b'{"phase": "ppo", "step": 1}\n\xff\xfe\n{"phase": "ppo", "st\n'
                                             b'{"phase": "ppo", "step": 2}\n')
    with caplog.at_level(logging.WARNING):
        assert [r["step"] for r in read_metrics(tmp_path, "ppo")] == [1, 2]
    assert "metrics.jsonl line 2 is not a JSON record" in caplog.text and "line 3" in caplog.text


def test_a_directory_in_place_of_metrics_is_set_aside(tmp_path):
    (tmp_path / "metrics.jsonl").mkdir()
    said = []
    check_run_records(tmp_path, said.append)
    assert len(said) == 1 and "metrics.jsonl is not a readable file" in said[0]
    assert not (tmp_path / "metrics.jsonl").exists()


def test_records_past_the_checkpoint_or_without_one_are_cut_with_their_samples(tmp_path):
    from vcppo.driver.durability.run_records import rewind_metrics
    from vcppo.driver.state import RunState

    lines = [json.dumps({"phase": p, "step": s}) + "\n" for p, s in (("value_pretrain", 1), ("value_pretrain", 2))]
    (tmp_path / "metrics.jsonl").write_text("".join(lines))
    (tmp_path / "samples.jsonl").write_text("".join(lines))
    # resumed from the checkpoint after step 1: step 2 is replayed
    assert rewind_metrics(tmp_path, RunState(phase="value_pretrain", metrics_bytes=len(lines[0]))) == \
        {("value_pretrain", 2)}
    assert (tmp_path / "metrics.jsonl").read_text() == lines[0] == (tmp_path / "samples.jsonl").read_text()
    # no checkpoint sealed: the run starts over and replays every step
    assert rewind_metrics(tmp_path, None) == {("value_pretrain", 1)}
    assert (tmp_path / "metrics.jsonl").read_text() == "" == (tmp_path / "samples.jsonl").read_text()
    # a checkpoint older than the byte count records nothing to cut back to
    (tmp_path / "metrics.jsonl").write_text(lines[0])
    assert rewind_metrics(tmp_path, RunState(phase="ppo")) == set() and (tmp_path / "metrics.jsonl").read_text()
