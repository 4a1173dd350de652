"""`vcppo report` on run directories with a known metrics.jsonl: the page, its table and one PNG per
plot the records allow. Fast: matplotlib only, no engine (the demo's end-to-end test also writes a
report from a real run)."""
import json

from vcppo.commands.report import main
from vcppo.report import run_summary


def _write_run(run, n_pre=3, n_ppo=5):
    run.mkdir(parents=True)
    records = [{"phase": "value_pretrain", "step": s, "critic/value_loss": 1.0 / s,
                "critic/explained_variance": 0.1 * s, "adv/position_profile": [0.2, 0.1, None],
                "adv/position_edges": [0, 10, 20, 30]} for s in range(1, n_pre + 1)]
    records += [{"phase": "ppo", "step": s, "response/length_mean": 100.0 + s, "reward/accuracy": 0.1 * s,
                 "reward/mean": -1 + 0.2 * s, "critic/explained_variance": 0.05 * s,
                 "adv/position_corr": -0.5 + 0.1 * s} for s in range(1, n_ppo + 1)]
    records += [{"phase": "val", "step": s, "val/pass@1_greedy": 0.3 + 0.1 * (s // 5)} for s in (0, 5)]
    for i, r in enumerate(records):
        r["time"] = 1000.0 + 60 * i  # a record a minute
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_report_of_one_run_writes_its_plots_and_table(tmp_path, capsys):
    run = tmp_path / "vcppo-seed0"
    _write_run(run)
    assert main([str(run), "--title", "unit"]) == 0
    out = run / "report"
    page = (out / "report.md").read_text()
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert {"response_length.png", "accuracy.png", "validation.png", "value_pretraining.png",
            "advantage_profile.png", "validation_wallclock.png"} <= set(pngs)
    assert all((out / p).stat().st_size > 1000 for p in pngs)  # real images, not empty files
    assert page.startswith("# unit") and all(f"({p})" in page for p in pngs)
    assert "vcppo-seed0" in page
    s = run_summary(run)
    assert (s["ppo_steps"], s["pretrain_steps"]) == (5, 3)
    assert s["length_start"] == 101.0 and s["length_end"] == 105.0  # first / last fifth of 5 steps
    assert s["start_pass@1_greedy"] == 0.3 and s["final_pass@1_greedy"] == 0.4


def test_report_of_a_directory_without_metrics_is_one_line_exit_2(tmp_path, capsys):
    assert main([str(tmp_path)]) == 2
    assert "has no metrics.jsonl" in capsys.readouterr().out


def test_the_wallclock_starts_when_the_first_step_or_validation_began():
    from vcppo.report import _began
    assert _began({"time": 10.0, "time/step_s": 2.5}) == 7.5  # a step's record is written as it ends
    assert _began({"time": 10.0, "time/val_s": 4.0}) == 6.0   # so is a validation's
    assert _began({"time": 10.0}) == 10.0                     # records from before time/val_s was logged


def test_a_multi_turn_run_gets_its_value_and_advantage_by_turn(tmp_path):
    run = tmp_path / "guess-seed0"
    _write_run(run)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    for r in records:
        if r["phase"] == "ppo":
            r["env/value_by_turn"] = [0.1 * r["step"], 0.5, None]
            r["env/adv_by_turn"] = [0.2, -0.1 * r["step"], None]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert main([str(run)]) == 0
    assert "by_turn.png" in (run / "report" / "report.md").read_text()
    summary = json.loads((run / "report" / "summary.json").read_text())[0]
    assert summary["value_by_turn_end"] == [0.5, 0.5, None] and summary["adv_by_turn_end"] == [0.2, -0.5, None]
    single = tmp_path / "single"
    _write_run(single)
    assert main([str(single)]) == 0 and not (single / "report" / "by_turn.png").exists()
