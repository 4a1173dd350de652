"""Escapes from the python tool, tried as the policy would: through ``make_env("tools")`` and a
``<tool_call>`` it writes. Each must fail (the escape) in the sandbox.

``VCPPO_ESCAPE_TESTS_UNSANDBOXED=1`` builds the envs with ``allow_unsandboxed_python=true`` (the
sandbox disabled on purpose): then every test but the first fails, which shows that each one can.
"""
import json
import os
import socket
import time
import uuid

import psutil
import pytest

from vcppo.envs.base import checked_turn, make_env
from vcppo.envs.worker import EnvRunner, EpisodeKey

UNSANDBOXED = os.environ.get("VCPPO_ESCAPE_TESTS_UNSANDBOXED") == "1"
ARGS = {"tools": ["python"], "allow_unsandboxed_python": UNSANDBOXED}


def _env(**args):
    env = make_env("tools", **ARGS, **args)
    env.reset({"answer": "0"}, seed=0)
    return env


def _call(code: str, **extra) -> str:
    return "<tool_call>" + json.dumps({"name": "python", "arguments": {"code": code, **extra}}) + "</tool_call>"


def _answer(env, code: str, **extra) -> str:
    """The tool's response to one call."""
    turn = checked_turn(env.step(_call(code, **extra)))
    return turn.observation.removeprefix("<tool_response>\n").removesuffix("\n</tool_response>")


def _marked(marker: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if marker in " ".join(p.info["cmdline"] or ()):
            found.append(p)
    return found


def _gone(marker: str, within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not _marked(marker):
            return True
        time.sleep(0.1)
    return False


@pytest.fixture
def marker():
    """A string a test's processes carry on their command line; survivors are killed afterwards."""
    mark = f"vcppo-escape-{uuid.uuid4().hex}"
    yield mark
    for p in _marked(mark):
        p.kill()


def _spawn(marker: str, setsid: bool) -> str:
    """Code that double-forks a 30 s sleeper carrying ``marker`` (``setsid``: in a session of its
    own, out of the parent's process group), then hangs."""
    return (f"import os, sys, time\n"
            f"if os.fork() == 0:\n"
            f"    {'os.setsid()' if setsid else 'pass'}\n"
            f"    if os.fork() == 0:\n"
            f"        os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(30)', '{marker}'])\n"
            f"    os._exit(0)\n"
            f"time.sleep(0.5)\n"
            f"while True: time.sleep(1)\n")


def test_model_set_limits_are_ignored():
    """The call's own limits are refused; the env's 256 MiB holds."""
    env = _env()
    big = "x = bytearray(1024 ** 3); print('allocated')"
    assert "allocated" not in _answer(env, big, memory_mb=4096, timeout_s=60)
    assert "MemoryError" in _answer(env, big)


def test_file_outside_is_not_readable(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("the-secret")
    env = _env()
    assert "the-secret" not in _answer(env, f"print(open({str(secret)!r}).read())")
    assert "root:" not in _answer(env, "print(open('/etc/passwd').read())")


def test_run_dir_is_not_writable(tmp_path):
    ckpt = tmp_path / "runs" / "demo" / "ckpt_step_10"
    ckpt.mkdir(parents=True)
    (ckpt / "model.safetensors").write_text("weights")
    env = _env()
    assert _answer(env, "import os; print(os.listdir('.'))") == "[]"  # a private, empty working directory
    _answer(env, f"import shutil; open({str(tmp_path / 'runs' / 'x')!r}, 'w').write('1'); "
                 f"shutil.rmtree({str(ckpt)!r})")
    assert (ckpt / "model.safetensors").read_text() == "weights" and not (tmp_path / "runs" / "x").exists()


def test_environment_is_empty(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_the_token")
    env = _env()
    answer = _answer(env, "import os; print(sorted(os.environ))")
    assert "HF_TOKEN" not in answer and "PATH" not in answer and answer.startswith("[")


def test_loopback_listener_is_out_of_reach():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    try:
        answer = _answer(_env(), f"import socket; socket.create_connection(('127.0.0.1', {server.getsockname()[1]}), "
                                 "timeout=2); print('connected')")
        server.setblocking(False)
        with pytest.raises(BlockingIOError):  # no connection waits in the backlog
            server.accept()[0].close()
    finally:
        server.close()
    assert "connected" not in answer


def test_grandchild_is_gone_after_the_timeout(marker):
    env = _env(python_timeout_s=1.5)
    assert "timed out after 1.5 s" in _answer(env, _spawn(marker, setsid=True))
    assert _gone(marker), [p.info["cmdline"] for p in _marked(marker)]


def test_pool_kill_of_a_hung_worker_leaves_no_child(marker):
    """The env worker is killed mid-call (its tool's own limit is longer than the pool's): what the
    tool started dies with it."""
    runner = EnvRunner(num_workers=1, timeout_s=2.0)
    try:
        args = tuple(sorted({**ARGS, "python_timeout_s": 60}.items()))
        key = EpisodeKey("e0", "tools", args, (("answer", "0"),), 0)
        out = runner.step([(_call(_spawn(marker, setsid=False)), key)])
        assert out[0].startswith("timeout") and runner.num_timeouts == 1
        assert _gone(marker), [p.info["cmdline"] for p in _marked(marker)]
    finally:
        runner.close()
