"""A rank that dies (SIGKILL, as the OOM killer or a lost node does) ends the job even where no
launcher ends the others: two `vcppo train` ranks started by hand (RANK / WORLD_SIZE / MASTER_PORT,
no torchrun, no deepspeed launcher), rank 1 killed during PPO after the step-1 checkpoint. The
survivor fails at its next collective (gloo: the peer's connection closes) and exits non-zero; every
checkpoint left is complete and intact, and there is no final export. (A hung but living peer is
bounded by trainer.collective_timeout_s: tests/engines/test_collective_timeout.py.)"""
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import ENV
from tests.driver.test_train_e2e import base_overrides
from tests.gloo_ranks import _free_port
from vcppo.driver import manifest
from vcppo.driver.checkpoint import checkpoint_root, list_complete

pytestmark = [pytest.mark.integration, pytest.mark.distributed, pytest.mark.slow]


def test_a_killed_rank_ends_its_peer_without_a_launcher_and_leaves_intact_checkpoints(tiny_artifacts, tmp_path):
    args = base_overrides(tiny_artifacts, tmp_path, **{"value_pretrain.enabled": False, "trainer.total_steps": 8,
                                                      "trainer.save_every": 1, "trainer.keep_last": 8,
                                                      "rollout.max_response_tokens": 32})
    port = str(_free_port())
    ranks = [subprocess.Popen([sys.executable, "-m", "vcppo.cli", "train", "vcppo", *args], cwd=tmp_path,
                              env=dict(ENV, OMP_NUM_THREADS="1", RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2",
                                       MASTER_ADDR="127.0.0.1", MASTER_PORT=port),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    ckpts = checkpoint_root(tmp_path / "vcppo-seed0")
    try:
        deadline = time.time() + 600
        while time.time() < deadline and not list_complete(ckpts) and ranks[0].poll() is None:
            time.sleep(0.05)
        assert ranks[0].poll() is None and ranks[1].poll() is None, "a rank ended before the kill"
        os.kill(ranks[1].pid, signal.SIGKILL)
        killed_at = time.time()
        code = ranks[0].wait(timeout=120)
        waited = time.time() - killed_at
    finally:
        for proc in ranks:
            if proc.poll() is None:
                proc.kill()
    stderr = ranks[0].stderr.read()
    assert code != 0 and waited < 60, (code, waited, stderr[-3000:])
    assert "Connection reset by peer" in stderr or "Connection closed by peer" in stderr, stderr[-3000:]
    left = list_complete(ckpts)
    assert left and all(manifest.problems(p, 0, 1) == [] for p in left)  # each one whole (one verifier)
    assert not (tmp_path / "vcppo-seed0" / "final").exists()
