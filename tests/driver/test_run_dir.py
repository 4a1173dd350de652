"""One live run per run directory (driver/durability/run_dir.py): a second process is refused with a clear
error before it writes anything, and a killed holder leaves no stale lock behind."""
import signal
import subprocess
import sys

import pytest

from tests.conftest import ENV
from tests.driver.test_train_e2e import base_overrides, train
from vcppo.driver.durability.run_dir import LOCK_FILE, release, try_lock_run_dir

HOLD = ("import sys, time; from pathlib import Path; from vcppo.driver.durability.run_dir import try_lock_run_dir; "
        "h, why = try_lock_run_dir(Path(sys.argv[1])); assert why is None, why; print('held', flush=True); "
        "time.sleep(600)")


def _holder(run_dir):
    """A live process holding ``run_dir``'s lock (like a running trainer's main rank)."""
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], env=ENV, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def test_a_held_run_dir_is_refused_and_a_killed_holder_leaves_no_stale_lock(tmp_path):
    run_dir = tmp_path / "vcppo-seed0"
    holder = _holder(run_dir)
    try:
        handle, why = try_lock_run_dir(run_dir)
        assert handle is None
        assert str(run_dir) in why and f"pid {holder.pid}" in why and "trainer.run_name" in why
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert (run_dir / LOCK_FILE).exists()  # the file stays; the lock died with its process
    handle, why = try_lock_run_dir(run_dir)
    assert why is None and handle is not None
    release(handle)
    handle, why = try_lock_run_dir(run_dir)  # released: free again
    assert why is None
    release(handle)


@pytest.mark.integration
def test_a_second_trainer_on_a_live_run_dir_exits_2_and_writes_nothing(tiny_artifacts, tmp_path):
    run_dir = tmp_path / "vcppo-seed0"
    holder = _holder(run_dir)
    try:
        res = train("vcppo", base_overrides(tiny_artifacts, tmp_path), cwd=tmp_path, timeout=300)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert res.returncode == 2, res.stderr[-3000:]
    assert "is in use by a live run" in res.stderr and "trainer.output_root" in res.stderr
    assert sorted(p.name for p in run_dir.iterdir()) == [LOCK_FILE]  # no config, metrics or checkpoint


@pytest.mark.integration
def test_a_start_up_failure_releases_the_lock_in_a_process_that_lives_on(tiny_artifacts, tmp_path, monkeypatch):
    """An in-process caller (a notebook, a test) whose run failed while starting keeps its traceback,
    and with it the frame that opened the lock: the next attempt must not find the directory taken."""
    from vcppo.config.load import load_config
    from vcppo.config.placement import Placement
    from vcppo.driver import context

    def engines_fail(*args, **kwargs):
        raise RuntimeError("the engines failed to start")

    monkeypatch.setattr(context, "build_engines", engines_fail)
    cfg = load_config("vcppo", base_overrides(tiny_artifacts, tmp_path) + ["logging.wandb=false"])
    run_dir = tmp_path / "vcppo-seed0"
    with pytest.raises(RuntimeError, match="engines failed") as failure:
        context.RunContext.create(cfg, run_dir, Placement.of(cfg))
    handle, why = try_lock_run_dir(run_dir)
    assert why is None, why
    release(handle)
    assert failure.value is not None  # the traceback (and its frames) lived through the check above
