"""trainer.resume=never moves the previous run aside (driver/durability/run_dir.py)."""
from vcppo.driver.durability.checkpoint import find_resume_point
from vcppo.driver.durability.run_dir import LOCK_FILE
from vcppo.driver.durability.run_dir import set_aside


def _old_run(run_dir):
    (run_dir / "checkpoints" / "step_000002").mkdir(parents=True)
    (run_dir / "checkpoints" / "step_000002" / "state.json").write_text("{}")
    (run_dir / "metrics.jsonl").write_text('{"phase": "ppo", "step": 1}\n')
    (run_dir / "config.yaml").write_text("preset: vcppo\n")
    (run_dir / LOCK_FILE).write_text("pid 1\n")


def test_the_previous_run_moves_into_one_dated_folder_and_nothing_is_lost(tmp_path):
    _old_run(tmp_path)
    said = []
    aside = set_aside(tmp_path, said.append)
    assert aside.parent == tmp_path and aside.name.startswith("previous_")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([LOCK_FILE, aside.name])  # the live lock stays
    assert (aside / "metrics.jsonl").read_text() == '{"phase": "ppo", "step": 1}\n'
    assert (aside / "checkpoints" / "step_000002" / "state.json").exists()
    assert len(said) == 1 and str(aside) in said[0] and "\n" not in said[0]
    assert find_resume_point(tmp_path, "auto") is None


def test_a_second_start_over_leaves_the_first_folder_in_place(tmp_path):
    _old_run(tmp_path)
    first = set_aside(tmp_path, lambda _: None)
    _old_run(tmp_path)
    second = set_aside(tmp_path, lambda _: None)
    assert first != second and first.is_dir() and (second / "config.yaml").exists()
    assert not (second / first.name).exists()


def test_an_empty_run_dir_moves_nothing(tmp_path):
    (tmp_path / LOCK_FILE).write_text("")
    said = []
    assert set_aside(tmp_path, said.append) is None and said == []
