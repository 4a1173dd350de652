"""`vcppo sweep` (and `vcppo demo`, through the same call) start their runs so that a run dies with them,
however they end: SIGKILL of the sweep leaves no run behind."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from vcppo.sandbox.lifeline import run_tied


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _wait_for(path: Path, timeout: float = 60.0) -> int:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if path.exists() and path.read_text().strip():
            return int(path.read_text())
        time.sleep(0.1)
    raise AssertionError(f"{path} never written")


def test_a_sweep_killed_takes_its_run_with_it(tmp_path):
    pidfile = tmp_path / "run.pid"
    launcher = f"/bin/sh -c 'echo $$ > {pidfile}; exec sleep 300' sh"
    sweep = subprocess.Popen([sys.executable, "-m", "vcppo.cli", "sweep", "slow_critic", "--launcher", launcher],
                             cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run = None
    try:
        run = _wait_for(pidfile)
        assert _alive(run)
        os.kill(sweep.pid, signal.SIGKILL)
        sweep.wait()
        deadline = time.time() + 10
        while _alive(run) and time.time() < deadline:
            time.sleep(0.1)
        assert not _alive(run), "the sweep's run outlived the sweep"
    finally:
        sweep.kill()
        if run is not None and _alive(run):
            os.kill(run, signal.SIGKILL)


def test_run_tied_returns_the_exit_code_and_names_a_missing_program():
    assert run_tied(["sh", "-c", "exit 3"]) == 3
    try:
        run_tied(["no-such-program-here"])
    except FileNotFoundError as e:
        assert "no-such-program-here" in str(e)
    else:
        raise AssertionError("a missing program ran")
