"""Nothing vcppo starts outlives the trainer: a trainer SIGKILLed while its env turns hang (one
worker spinning in Python, one waiting on a python tool child) leaves no process behind: not the
env and reward workers, not their fork server, not the resource tracker, not the tool's child."""
import subprocess
import sys
import time

import psutil

from tests.conftest import ENV, REPO


SANDBOXED = ["-I", "-S", "/code/main.py"]  # the tool's program, once it runs in its sandbox (after the set-up)


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:  # it ended meanwhile
        return []


def _hanging(trainer: psutil.Process, deadline: float) -> list[psutil.Process]:
    """The trainer's descendants once the tool's child sleeps and the other worker spins."""
    while time.monotonic() < deadline:
        procs = trainer.children(recursive=True)
        if any(_cmdline(p)[-3:] == SANDBOXED and len(_cmdline(p)) == 4 for p in procs):
            return procs
        time.sleep(0.2)
    raise AssertionError(f"the turns never hung: {[_cmdline(p) for p in trainer.children(recursive=True)]}")


def test_nothing_outlives_a_sigkilled_trainer():
    proc = subprocess.Popen([sys.executable, "-m", "tests.envs.hang_trainer"], cwd=REPO, env=ENV,
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    alive: list[psutil.Process] = []
    try:
        assert proc.stdout.readline().startswith("hanging")
        started = _hanging(psutil.Process(proc.pid), time.monotonic() + 60)
        assert len(started) >= 5  # fork server, resource tracker, 3 workers, the tool's child
        proc.kill()
        proc.wait()
        _, alive = psutil.wait_procs(started, timeout=10)
        alive = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert not alive, f"outlived the trainer: {[' '.join(_cmdline(p))[:120] for p in alive]}"
    finally:
        proc.kill()
        for p in alive:
            p.kill()
