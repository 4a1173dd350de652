"""`vcppo sweep` (and `vcppo demo`, through the same calls) start their runs so that a run dies with them,
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


def _written(path: Path, timeout: float = 60.0) -> str:
    """The line a child writes to ``path`` (whole: up to its newline), once it is there."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        text = path.read_text() if path.exists() else ""
        if text.endswith("\n"):
            return text
        time.sleep(0.1)
    raise AssertionError(f"{path} never written")


def _kill_parent_and_expect_gone(parent: subprocess.Popen, child: int, what: str) -> None:
    """SIGKILL ``parent``; ``child`` must be gone within 10 s."""
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.time() + 10
    while _alive(child) and time.time() < deadline:
        time.sleep(0.1)
    assert not _alive(child), what


def test_a_sweep_killed_takes_its_run_with_it(tmp_path):
    pidfile = tmp_path / "run.pid"
    launcher = f"/bin/sh -c 'echo $$ > {pidfile}; exec sleep 300' sh"
    sweep = subprocess.Popen([sys.executable, "-m", "vcppo.cli", "sweep", "slow_critic", "--launcher", launcher],
                             cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run = None
    try:
        run = int(_written(pidfile))
        assert _alive(run)
        _kill_parent_and_expect_gone(sweep, run, "the sweep's run outlived the sweep")
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


PARENT = """import sys, threading
sys.path.insert(0, {repo!r})
import tests.sandbox.warm_marker
from vcppo.sandbox.lifeline import run_command_tied
if {threaded}:  # a second thread: a fork is not safe, the command starts fresh
    threading.Thread(target=threading.Event().wait, daemon=True).start()
print("parent got", run_command_tied(["5", {out!r}, {sleep!r}], module="tests.sandbox.warm_probe"), flush=True)
"""
REPO = str(Path(__file__).resolve().parents[2])


def _parent(tmp_path, threaded: bool, sleep: float = 0.0) -> subprocess.Popen:
    code = PARENT.format(repo=REPO, threaded=threaded, out=str(tmp_path / "probe.txt"), sleep=str(sleep))
    return subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=REPO))


def test_a_command_runs_as_a_warm_fork_where_safe_and_fresh_beside_a_thread(tmp_path):
    for threaded, start in ((False, "warm"), (True, "fresh")):
        parent = _parent(tmp_path, threaded)
        out, _ = parent.communicate(timeout=120)
        # the command's own output, then its exit code handed back
        assert out.splitlines() == ["probe done", "parent got 5"], out
        assert (tmp_path / "probe.txt").read_text().split()[0] == start


def test_a_killed_parent_takes_its_forked_command_with_it(tmp_path):
    parent = _parent(tmp_path, threaded=False, sleep=300)
    child = None
    try:
        start, pid = _written(tmp_path / "probe.txt").split()
        child = int(pid)
        assert start == "warm" and _alive(child)
        _kill_parent_and_expect_gone(parent, child, "the forked command outlived its parent")
    finally:
        parent.kill()
        if child is not None and _alive(child):
            os.kill(child, signal.SIGKILL)
