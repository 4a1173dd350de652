"""Every record once in metrics.jsonl, whatever stopped a run before its first checkpoint was sealed: a
SIGKILL after value-pretraining step 1's record is written (tests/kill_at.py, point `seal`), and a disk
that fills at the first checkpoint (an injected ENOSPC, twice, then the space is back). The rerun finds
no checkpoint, starts over, and the records of the steps it replays are cut first."""
import collections
import json

import pytest

from tests.conftest import start_process, vcppo
from tests.driver.test_train_e2e import base_overrides
from vcppo.driver.durability.checkpoint import checkpoint_root, list_complete

pytestmark = [pytest.mark.integration]


def keys(run_dir):
    return [(r["phase"], r["step"]) for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())]


def duplicates(run_dir):
    return {k: n for k, n in collections.Counter(keys(run_dir)).items() if n > 1}


def overrides(art, out):
    return base_overrides(art, out, **{"trainer.total_steps": 1, "value_pretrain.steps": 2, "trainer.save_every": 1,
                                       "data.val_files": "null"})


def faulty_train(point: str, step: str, args, cwd):
    """`vcppo train vcppo ARGS` with the fault of tests/kill_at.py at ``point`` of ``step``; its exit code."""
    proc = start_process("0", point, step, "--", "train", "vcppo", *args, cwd=cwd, module="tests.kill_at")
    return proc.wait(timeout=600)


@pytest.mark.slow
def test_a_kill_before_the_first_checkpoint_is_sealed_leaves_no_duplicate(tiny_artifacts, tmp_path):
    args = overrides(tiny_artifacts, tmp_path)
    assert faulty_train("seal", "value_pretrain:1", args, tmp_path) != 0
    run_dir = tmp_path / "vcppo-seed0"
    assert (tmp_path / "killed_at").exists() and not list_complete(checkpoint_root(run_dir))
    assert ("value_pretrain", 1) in keys(run_dir)  # logged before the kill
    res = vcppo("train", "vcppo", *args, cwd=tmp_path, check=False)
    assert res.returncode == 0, res.stderr[-4000:]
    assert duplicates(run_dir) == {} and keys(run_dir) == [("value_pretrain", 1), ("value_pretrain", 2), ("ppo", 1)]
    assert "removed; the run records them again" in res.stderr


@pytest.mark.extended
def test_a_disk_full_at_the_first_checkpoint_then_reruns_leave_no_duplicate(tiny_artifacts, tmp_path):
    args = overrides(tiny_artifacts, tmp_path) + ["value_pretrain.steps=0", "value_pretrain.enabled=false"]
    for _ in range(2):  # the disk is still full on the first rerun
        assert faulty_train("full", "1", args, tmp_path) != 0
    run_dir = tmp_path / "vcppo-seed0"
    assert not list_complete(checkpoint_root(run_dir)) and ("ppo", 1) in keys(run_dir)
    res = vcppo("train", "vcppo", *args, cwd=tmp_path, check=False)
    assert res.returncode == 0, res.stderr[-4000:]
    assert duplicates(run_dir) == {} and keys(run_dir) == [("ppo", 1)]
