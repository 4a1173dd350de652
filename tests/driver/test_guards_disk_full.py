"""A full disk in words (driver/durability/guards.py): a checkpoint that cannot be written for space
is one line naming the directory and the bytes; the rerun removes the unfinished step_N.tmp with a line
and resumes from the earlier checkpoint; a config that cannot be saved is one line. On a small tmpfs
where the host lets the test mount one (root), so torch's own error is what is translated; otherwise
with an injected ENOSPC."""
import errno
import os
import subprocess
from types import SimpleNamespace

import pytest
import torch

from vcppo.config.load import load_config
from vcppo.config.provenance import record_segment
from vcppo.driver.context import record_config
from vcppo.driver.durability import checkpoint as ckpt
from vcppo.driver.state import RunState
from vcppo.driver.durability.guards import DiskFull
from vcppo.driver.durability.resume import save_checkpoint
from vcppo.driver.durability.run_records import prepare_run_dir


@pytest.fixture
def small_disk(tmp_path):
    """(a 3 MiB tmpfs, True), or (a plain directory, False) where mounting is not allowed."""
    disk = tmp_path / "disk"
    disk.mkdir()
    try:
        mounted = os.environ.get("VCPPO_TEST_NO_MOUNT") != "1" and subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(disk)], capture_output=True).returncode == 0
    except OSError:  # no mount command
        mounted = False
    yield disk, mounted
    if mounted:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def _ctx(run_dir, weights_bytes, mounted):
    def save_actor(directory):
        if not mounted and weights_bytes > 2**20:
            raise OSError(errno.ENOSPC, "No space left on device")
        torch.save({"w": torch.zeros(weights_bytes // 4)}, f"{directory}/weights.pt")

    return SimpleNamespace(run_dir=run_dir, dist=SimpleNamespace(rank=0, world_size=1, is_main=True),
                           actor=SimpleNamespace(save_checkpoint=lambda d: (os.makedirs(d), save_actor(d))),
                           critic=None, barrier=lambda: None, cfg=load_config("vcppo", ["trainer.keep_last=3"]),
                           log=SimpleNamespace(info=lambda m: None))


def _fill(disk):
    """Take every byte left on the small tmpfs (never call it on a real disk)."""
    with open(disk / "ballast", "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass


def test_a_full_disk_is_said_then_the_rerun_cleans_up_and_resumes(small_disk, monkeypatch):
    disk, mounted = small_disk
    run_dir = disk / "run"
    source = SimpleNamespace(checkpoint=lambda stage, state: {})
    record_segment(run_dir, phase="start", step=0, global_step=0, resumed_from=None, changes=[], argv=["x"])
    save_checkpoint(_ctx(run_dir, 256 * 1024, mounted), RunState(phase="ppo", step=1), source)
    assert [p.name for p in ckpt.list_complete(ckpt.checkpoint_root(run_dir))] == ["step_000001"]

    with pytest.raises(DiskFull) as err:  # step 2 does not fit
        save_checkpoint(_ctx(run_dir, 4 * 2**20, mounted), RunState(phase="ppo", step=2), source)
    message = str(err.value)
    assert "\n" not in message and "no space left on device" in message
    assert str(ckpt.checkpoint_root(run_dir)) in message
    assert "MiB needed" in message or "KiB" in message or "bytes needed" in message
    assert "step_000001 the newest" in message
    assert ckpt.staging_dir(run_dir, 2).exists()  # what the failed write left

    # the rerun: the stale step_000002.tmp goes first, with a line; the earlier checkpoint is intact
    notes = prepare_run_dir(run_dir, "auto")
    assert len(notes) == 1 and "step_000002.tmp" in notes[0] and not ckpt.staging_dir(run_dir, 2).exists()
    point = ckpt.find_resume_point(run_dir, "auto")
    assert point.name == "step_000001"

    # a disk still full: saving the rerun's config is one line, not an OSError traceback
    cfg = load_config("vcppo", [])
    if mounted:
        _fill(disk)
    else:
        monkeypatch.setattr("vcppo.driver.context.save_config",
                            lambda *a: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space left on device")))
    with pytest.raises(DiskFull, match=f"the run's config .* could not be written to {run_dir}: no space left"):
        record_config(cfg, run_dir, point, ckpt.peek_state(point), [], lambda m: None)
    (disk / "ballast").unlink(missing_ok=True)
    monkeypatch.undo()
    record_config(cfg, run_dir, point, ckpt.peek_state(point), [], lambda m: None)
    assert (run_dir / "config.yaml").exists()


def test_another_write_error_is_left_as_it_is(tmp_path):
    def broken(directory):
        raise RuntimeError("something else")
    ctx = _ctx(tmp_path, 0, True)
    ctx.actor = SimpleNamespace(save_checkpoint=broken)
    with pytest.raises(RuntimeError, match="something else"):
        save_checkpoint(ctx, RunState(phase="ppo", step=1), SimpleNamespace(checkpoint=lambda s, st: {}))
