"""`vcppo train` names bad input and exits 2 before any engine starts, as a user runs it."""
import time

import pytest

from tests.conftest import vcppo

pytestmark = [pytest.mark.integration]


def _train(art, out, *extra, cwd):
    overrides = [f"model.policy_path={art / 'tiny'}", f"data.train_files={art / 'data/train.parquet'}",
                 "data.val_files=null", f"trainer.output_root={out}", "logging.progress_bar=false", *extra]
    start = time.perf_counter()
    res = vcppo("train", "vcppo", *overrides, cwd=cwd, check=False, timeout=300)
    return res, time.perf_counter() - start


@pytest.mark.parametrize("case", ["empty_jsonl", "null_answer", "unwritable_output", "reward_fn"])
def test_bad_input_is_named_before_engines_start(case, tiny_artifacts, tmp_path):
    extra, named = [], ""
    if case == "empty_jsonl":
        (tmp_path / "empty.jsonl").write_text("")
        extra, named = [f"data.train_files={tmp_path / 'empty.jsonl'}"], "empty.jsonl is empty: no rows"
    elif case == "null_answer":
        (tmp_path / "t.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2=", "answer": null}\n')
        extra, named = [f"data.train_files={tmp_path / 't.jsonl'}"], "null answer(s) in field 'answer' (row 2)"
    elif case == "unwritable_output":
        extra, named = ["trainer.output_root=/proc/vcppo_runs"], "config key 'trainer.output_root'"
    elif case == "reward_fn":
        extra, named = ["reward.function=no_such_module_xyz:f"], "config key 'reward.function'"
    res, seconds = _train(tiny_artifacts, tmp_path / "runs", *extra, cwd=tmp_path)
    out = res.stdout + res.stderr
    assert res.returncode == 2, out[-3000:]
    assert named in res.stderr, out[-3000:]
    assert "rollout engine:" not in out and "Traceback" not in res.stderr
