"""`trainer.resume=never` in a directory that holds a run starts over: the old records and
checkpoints move aside, and the next plain rerun resumes from the new run, not the old one (with a
damaged line in its config history, which is named and skipped)."""
import json

import pytest

from tests.driver.test_train_e2e import base_overrides, train
from vcppo.config.provenance import HISTORY_FILE, read_history
from vcppo.driver.durability.checkpoint import checkpoint_root, list_complete

pytestmark = [pytest.mark.integration]


def _ppo_steps(run_dir):
    return [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()
            if json.loads(x)["phase"] == "ppo"]


@pytest.mark.slow
def test_resume_never_starts_over_and_the_next_rerun_continues_the_new_run(tiny_artifacts, tmp_path):
    over = base_overrides(tiny_artifacts, tmp_path, **{"value_pretrain.enabled": False, "trainer.save_every": 1,
                                                       "trainer.keep_last": 5, "data.val_files": "null",
                                                       "logging.log_samples": 2})
    run = tmp_path / "vcppo-seed0"
    res = train("vcppo", over, cwd=tmp_path)  # the old run: 2 steps, checkpoints 1 and 2
    assert res.returncode == 0, res.stderr[-4000:]
    old_metrics = (run / "metrics.jsonl").read_text()

    res = train("vcppo", over + ["trainer.resume=never", "trainer.total_steps=1"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-4000:]
    (aside,) = [p for p in run.iterdir() if p.name.startswith("previous_")]
    lines = [x for x in res.stderr.splitlines() if "trainer.resume=never: starting over" in x]
    assert len(lines) == 1 and str(aside) in lines[0]
    assert _ppo_steps(run) == [1]  # the new run's record only, not appended after the old ones
    assert [p.name for p in list_complete(checkpoint_root(run))] == ["step_000001"]
    assert (aside / "metrics.jsonl").read_text() == old_metrics  # nothing deleted
    samples = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]  # logging.log_samples
    assert [(r["phase"], r["step"]) for r in samples] == [("ppo", 1)] * 2 and all(r["response"] for r in samples)
    assert [p.name for p in list_complete(checkpoint_root(aside))] == ["step_000001", "step_000002"]

    with open(run / HISTORY_FILE, "ab") as f:  # and one non-UTF-8 byte in the history: named, not fatal
        f.write(b'{"segment": 9, "command": "\xff"}\n')
    res = train("vcppo", over, cwd=tmp_path)  # a plain rerun: the new run's step 1, not the old step 2
    assert res.returncode == 0, res.stderr[-4000:]
    assert f"resuming from {run / 'checkpoints' / 'step_000001'}" in res.stderr
    assert f"{run / HISTORY_FILE} line 2 is not a JSON record" in res.stderr and "Traceback" not in res.stderr
    assert _ppo_steps(run) == [1, 2]
    assert [r["segment"] for r in read_history(run)] == [1, 2]
