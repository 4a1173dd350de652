"""DeepSpeed's JIT ops build inside the environment, and a stale build lock is named (runtime.launch_env)."""
import os
import sys
import time

import pytest

from vcppo.runtime import launch_env


def test_ops_build_in_this_environment_unless_the_user_chose(monkeypatch, tmp_path):
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    launch_env.private_extension_dir()
    assert os.environ["TORCH_EXTENSIONS_DIR"] == os.path.join(sys.prefix, "torch_extensions")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    launch_env.private_extension_dir()
    assert os.environ["TORCH_EXTENSIONS_DIR"] == str(tmp_path)


def test_a_stale_build_lock_is_named(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    lock = tmp_path / "deepspeed_shm_comm" / "lock"
    lock.parent.mkdir()
    lock.touch()
    launch_env.private_extension_dir()  # fresh: a build may be running, no warning
    old = time.time() - 3600
    os.utime(lock, (old, old))
    with pytest.warns(UserWarning, match="deepspeed_shm_comm/lock is 60 min old"):
        launch_env.private_extension_dir()


ONE_RANK = """
import torch
from vcppo.runtime import dist
info = dist.init_distributed("cpu")
t = torch.ones(3)
torch.distributed.all_reduce(t)
from deepspeed.comm import comm as dscomm
print("world", info.world_size, "sum", float(t.sum()), "shm", dscomm.cdb.shm_comm_op is not None)
"""


def test_one_cpu_rank_does_not_build_the_shm_collective(tmp_path):
    """A single CPU rank has no peer: DeepSpeed must not spend ~1 min compiling its shm op."""
    import subprocess
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path), "RANK": "0", "WORLD_SIZE": "1"}
    env.pop("MASTER_PORT", None)
    out = subprocess.run([sys.executable, "-c", ONE_RANK], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "world 1 sum 3.0 shm False" in out.stdout
    assert not list(tmp_path.rglob("*.so")), "the shm op was compiled for one rank"


def test_the_install_built_the_cpu_collective_into_this_environment():
    """scripts/install.sh compiles the shm op, so no first multi-rank CPU run waits ~25 s on it."""
    from pathlib import Path

    import torch
    ours = Path(sys.prefix) / "torch_extensions"
    if torch.cuda.is_available() or not (Path(sys.prefix) / ".vcppo-installed").exists():
        pytest.skip("only a CPU environment made by scripts/install.sh")
    if os.environ.get("TORCH_EXTENSIONS_DIR", str(ours)) != str(ours):
        pytest.skip("TORCH_EXTENSIONS_DIR is the user's: the op is built there on first use")
    assert list((ours / "deepspeed_shm_comm").glob("*.so"))
