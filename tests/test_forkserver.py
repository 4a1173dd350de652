"""The tests' warm interpreter (tests/forkserver.py), through the helpers every end-to-end test uses
(tests/conftest.py): a fork sees its own argv, working directory and launcher variables, several run
at once, exit codes and timeouts come back as subprocess reports them, and an environment the server
cannot reproduce gets a fresh process instead."""
import json
import os
import subprocess

import pytest

from tests.conftest import ENV, fork_server, run_ranks, start_process, vcppo

pytestmark = [pytest.mark.integration]

needs_server = pytest.mark.skipif(os.environ.get("VCPPO_TEST_FORK_SERVER", "1") == "0",
                                  reason="the fork server is turned off (VCPPO_TEST_FORK_SERVER=0)")


def _seen(path):
    return json.loads(open(path).read())


@needs_server
def test_ranks_are_concurrent_forks_each_with_its_own_launcher_variables(tmp_path):
    outs = [tmp_path / f"rank{r}.out" for r in (0, 1)]
    procs = [start_process("7", "1.0", cwd=tmp_path, module="tests.env_probe", out=outs[r],
                           env=dict(ENV, RANK=str(r), WORLD_SIZE="2", MASTER_PORT="29999")) for r in (0, 1)]
    assert [p.wait(timeout=60) for p in procs] == [7, 7]
    seen = [_seen(o) for o in outs]
    assert not any(isinstance(p, subprocess.Popen) for p in procs)  # forks, not fresh interpreters
    assert [s["env"] for s in seen] == [{"RANK": str(r), "WORLD_SIZE": "2", "MASTER_PORT": "29999",
                                         "OMP_NUM_THREADS": ENV.get("OMP_NUM_THREADS")} for r in (0, 1)]
    assert all(s["argv"] == ["7", "1.0"] and s["cwd"] == str(tmp_path) and s["pgid"] == s["pid"] for s in seen)
    assert [s["pid"] for s in seen] == [p.pid for p in procs]  # the pids the tests hold are the commands'


@needs_server
def test_poll_kill_and_a_timeout_end_a_fork_as_they_end_a_process(tmp_path):
    proc = start_process("0", "60", cwd=tmp_path, module="tests.env_probe")
    assert proc.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.2)
    proc.kill()
    assert proc.wait(timeout=30) == -9
    with pytest.raises(subprocess.TimeoutExpired):
        fork_server().run(["--help"], tmp_path, timeout=0.01, check=False)


def test_another_environment_gets_a_fresh_process_and_failures_show(tmp_path):
    other = start_process("3", cwd=tmp_path, module="tests.env_probe", out=tmp_path / "out",
                          env=dict(ENV, OMP_NUM_THREADS="3"))  # read at import: a fork would be wrong
    assert isinstance(other, subprocess.Popen) and other.wait(timeout=60) == 3
    assert _seen(tmp_path / "out")["env"]["OMP_NUM_THREADS"] == "3"
    with pytest.raises(AssertionError, match="rank 1 exited 5"):
        run_ranks("5", cwd=tmp_path, module="tests.env_probe", world_size=2)
    res = vcppo("no-such-command", cwd=tmp_path, check=False)
    assert res.returncode == 2 and "no-such-command" in res.stderr
