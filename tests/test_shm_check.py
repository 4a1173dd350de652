"""The session's /dev/shm check (tests/shm_check.py, wired in tests/conftest.py): a DeepSpeed segment
that appeared during the session and that no process maps is a leftover (named, removed); one that
was there before, or that a living run still maps, is not."""
import mmap
import os

from tests import shm_check


def _segment(root, name):
    path = root / f"deepspeed_allreduce_buffer_{os.getuid()}_127.0.0.1_{name}_0"
    path.write_bytes(b"\0" * 4096)
    return path


def test_a_new_unmapped_segment_is_a_leftover_and_is_removed(tmp_path):
    old = _segment(tmp_path, "1")
    snapshot = (shm_check.segments(tmp_path), shm_check.time.time())
    left = _segment(tmp_path, "2")
    live = _segment(tmp_path, "3")
    (tmp_path / "something_else").write_bytes(b"x")
    with open(live, "r+b") as f, mmap.mmap(f.fileno(), 4096):  # a run in progress maps it
        assert shm_check.finish(snapshot, root=tmp_path) == [left]
    assert not left.exists() and old.exists() and live.exists()
    assert shm_check.finish(snapshot, root=tmp_path) == [live]  # no longer mapped
