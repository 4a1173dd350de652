"""dist.exit_process: a process that ran engines (a process group, one rank or several) ends with
its code and its output flushed, without interpreter teardown (where 2-rank CPU runs aborted with
SIGABRT after their work was done, and which only costs a 1-rank run time); a process that never set
up a group exits normally. runtime.lifetime: the console script's vLLM engine is dropped without
its shutdown, a longer-lived process keeps the full one."""
import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import atexit, os, sys
    from vcppo.runtime import dist
    if os.environ["RAN_ENGINES"] == "1":
        dist.init_distributed("cpu")
        dist.shutdown()
    atexit.register(lambda: print("teardown ran", flush=True))
    print("result line", end="")   # unflushed: exit_process must flush it
    sys.stderr.write("err line")
    dist.exit_process(3)
    print("unreachable")
""")


@pytest.mark.parametrize("ran_engines", [True, False])
def test_exit_code_and_flushed_output(ran_engines):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_PORT")}
    env["RAN_ENGINES"] = "1" if ran_engines else "0"
    res = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 3
    assert res.stdout.startswith("result line") and "err line" in res.stderr
    assert "unreachable" not in res.stdout
    # interpreter teardown (atexit, then C++ static destructors) runs only where no group was set up
    assert ("teardown ran" in res.stdout) is (not ran_engines)


def test_cli_entry_exits_with_mains_code(monkeypatch):
    from vcppo import cli
    from vcppo.runtime import lifetime
    monkeypatch.setattr(lifetime, "_ENDS_AFTER_COMMAND", False)  # entry() marks it: undone after the test
    monkeypatch.setattr(cli, "main", lambda: 2)
    monkeypatch.delitem(sys.modules, "vcppo.runtime.dist", raising=False)
    with pytest.raises(SystemExit) as e:
        cli.entry()
    assert e.value.code == 2


@pytest.mark.parametrize("ends_after_command, final, skipped", [
    (True, True, True),     # the console script's last close
    (True, False, False),   # a close mid-command (the RM's sampler before training): memory freed
    (False, True, False),   # a process that carries on (a test, a notebook)
])
def test_rollout_close_skips_vllms_shutdown_only_at_the_end_of_a_process(monkeypatch, ends_after_command, final,
                                                                        skipped):
    from types import SimpleNamespace

    from vcppo.runtime import lifetime
    from vcppo.engines.rollout import RolloutEngine
    monkeypatch.setattr(lifetime, "_ENDS_AFTER_COMMAND", ends_after_command)
    shutdowns = []
    engine = RolloutEngine.__new__(RolloutEngine)
    engine.on_gpu = False
    engine.llm = SimpleNamespace(llm_engine=SimpleNamespace(engine_core=SimpleNamespace(
        shutdown=lambda: shutdowns.append(1))))
    engine.close(final=final)
    assert engine.llm is None and shutdowns == ([] if skipped else [1])


def test_a_peer_that_died_is_named_as_the_cause_and_other_errors_pass_through(monkeypatch):
    from vcppo.runtime import dist
    monkeypatch.setenv("RANK", "1")
    gloo = RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:31635.")
    hint = dist.peer_loss_hint(gloo)
    assert hint.startswith("rank 1 stopped because another rank of the job died") and "same command" in hint
    assert dist.peer_loss_hint(RuntimeError("CUDA out of memory")) is None
    assert dist.peer_loss_hint(ValueError("bad row 3")) is None
