"""`vcppo report` on run directories with a known metrics.jsonl: the page, its table and one PNG per
plot the records allow. Fast: matplotlib only, no engine (the demo's end-to-end test also writes a
report from a real run)."""
import json

import pytest

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


@pytest.fixture
def drawn(monkeypatch):
    """{file name: [(panel's y label, line's label, xs, ys), ...]}: what each saved figure plots."""
    from matplotlib.figure import Figure
    out, save = {}, Figure.savefig

    def savefig(fig, fname, *args, **kwargs):
        name = str(fname).rsplit("/", 1)[-1]
        out[name] = [(ax.get_ylabel(), line.get_label(), [float(x) for x in line.get_xdata()],
                      [float(y) for y in line.get_ydata()])
                     for ax in fig.axes for line in ax.lines if not line.get_label().startswith("_")]  # not the zero lines
        out[name + ":xticks"] = [list(ax.get_xticks()) for ax in fig.axes]
        return save(fig, fname, *args, **kwargs)
    monkeypatch.setattr(Figure, "savefig", savefig)
    return out


def test_report_of_one_run_writes_its_plots_and_table(tmp_path, capsys, drawn):
    run = tmp_path / "vcppo-seed0"
    _write_run(run)
    assert main([str(run), "--title", "unit"]) == 0
    steps = [1.0, 2.0, 3.0, 4.0, 5.0]
    # each plot draws the records' own figures, under its label
    assert drawn["response_length.png"] == [("mean response length (tokens)", "vcppo-seed0", steps,
                                             [101.0, 102.0, 103.0, 104.0, 105.0])]
    assert [(y, xs, ys) for y, _, xs, ys in drawn["accuracy.png"]] == [
        ("train accuracy", steps, [pytest.approx(0.1 * s) for s in steps]),
        ("mean reward", steps, [pytest.approx(-1 + 0.2 * s) for s in steps])]
    assert drawn["value_pretraining.png"][1][2:] == ([1.0, 2.0, 3.0], [pytest.approx(0.1), pytest.approx(0.2),
                                                                       pytest.approx(0.3)])
    assert drawn["critic_ppo.png"][0][3] == [pytest.approx(0.05 * s) for s in steps]
    assert drawn["validation.png"][0][2:] == ([0.0, 5.0], [0.3, pytest.approx(0.4)])
    # validations at records 8 and 9 (a record a minute), the first record at minute 0
    assert drawn["validation_wallclock.png"][0][2:] == ([8.0, 9.0], [0.3, pytest.approx(0.4)])
    start, end = drawn["advantage_profile.png"]  # the bucket midpoints; the empty bucket left out
    assert start[2:] == end[2:] == ([5.0, 15.0], [0.2, 0.1]) and "start (step 1)" in start[1]
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


def test_a_multi_turn_run_gets_its_value_and_advantage_by_turn(tmp_path, drawn):
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
    assert [(y, xs, ys) for y, _, xs, ys in drawn["by_turn.png"]] == [  # steps 1 and 5, turns 1-2, per panel
        ("mean value V_old", [1.0, 2.0], [pytest.approx(0.1), 0.5]), ("mean value V_old", [1.0, 2.0], [0.5, 0.5]),
        ("mean raw advantage", [1.0, 2.0], [0.2, -0.1]), ("mean raw advantage", [1.0, 2.0], [0.2, -0.5])]
    assert all(float(t).is_integer() for ticks in drawn["by_turn.png:xticks"] for t in ticks)  # whole turns
    summary = json.loads((run / "report" / "summary.json").read_text())[0]
    assert summary["value_by_turn_end"] == [0.5, 0.5, None] and summary["adv_by_turn_end"] == [0.2, -0.5, None]
    single = tmp_path / "single"
    _write_run(single)
    assert main([str(single)]) == 0 and not (single / "report" / "by_turn.png").exists()


def test_control_characters_of_logged_samples_reach_the_page_escaped(tmp_path):
    """A sample may hold anything the policy wrote: NUL, BEL, a terminal escape sequence, a lone
    surrogate. The page shows them as escapes: a terminal or viewer that prints report.md is not
    driven by a sample, and the page is valid UTF-8."""
    run = tmp_path / "runs" / "a"
    _write_run(run)
    sample = {"phase": "ppo", "step": 5, "prompt": "p\x00q", "response": "ring\x07 \x1b[2J\x1b]0;title\x07 \ud800 ok|",
              "reward": 1.0, "length": 3}
    (run / "samples.jsonl").write_text(json.dumps(sample) + "\n")
    assert main([str(run), "--out", str(tmp_path / "rep")]) == 0
    page = (tmp_path / "rep" / "report.md").read_bytes().decode("utf-8")
    assert not [c for c in page if ord(c) < 32 and c != "\n" or c == "\x7f"]
    assert "p\\x00q" in page and "ring\\x07 \\x1b[2J\\x1b]0;title\\x07 \\ud800 ok\\|" in page
