"""DeepSpeed's JIT ops build inside the environment, and a stale build lock is named (engines.dist)."""
import os
import sys
import time

import pytest

from vcppo.engines import dist


def test_ops_build_in_this_environment_unless_the_user_chose(monkeypatch, tmp_path):
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    dist._private_extension_dir()
    assert os.environ["TORCH_EXTENSIONS_DIR"] == os.path.join(sys.prefix, "torch_extensions")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    dist._private_extension_dir()
    assert os.environ["TORCH_EXTENSIONS_DIR"] == str(tmp_path)


def test_a_stale_build_lock_is_named(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    lock = tmp_path / "deepspeed_shm_comm" / "lock"
    lock.parent.mkdir()
    lock.touch()
    dist._private_extension_dir()  # fresh: a build may be running, no warning
    old = time.time() - 3600
    os.utime(lock, (old, old))
    with pytest.warns(UserWarning, match="deepspeed_shm_comm/lock is 60 min old"):
        dist._private_extension_dir()
