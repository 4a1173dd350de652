"""dist.exit_process: a process that had peers ends with its code and its output flushed, without
interpreter teardown (where 2-rank CPU runs aborted with SIGABRT after their work was done); a
single-rank process exits normally."""
import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import atexit, sys
    from vcppo.engines import dist
    atexit.register(lambda: print("teardown ran", flush=True))
    print("result line", end="")   # unflushed: exit_process must flush it
    sys.stderr.write("err line")
    dist.exit_process(3)
    print("unreachable")
""")


@pytest.mark.parametrize("had_peers", [True, False])
def test_exit_code_and_flushed_output(had_peers):
    env = dict(os.environ, WORLD_SIZE="2" if had_peers else "1")  # as the launcher sets it
    res = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 3
    assert res.stdout.startswith("result line") and "err line" in res.stderr
    assert "unreachable" not in res.stdout
    # interpreter teardown (atexit, then C++ static destructors) runs only without peers
    assert ("teardown ran" in res.stdout) is (not had_peers)


def test_cli_entry_exits_with_mains_code(monkeypatch):
    from vcppo import cli
    monkeypatch.setattr(cli, "main", lambda: 2)
    monkeypatch.delitem(sys.modules, "vcppo.engines.dist", raising=False)
    with pytest.raises(SystemExit) as e:
        cli.entry()
    assert e.value.code == 2
