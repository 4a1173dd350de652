"""A warm interpreter that forks the tests' one-rank `vcppo` commands.

Why: most of a tiny `vcppo` command's time is importing torch, transformers, vLLM and DeepSpeed before
its first line of work (docs/history.md has the profile), and `make test` starts dozens of them. The server imports
those once per pytest worker; each command is a fork of it that runs ``python -m vcppo.cli``'s own
code (``runpy`` on ``vcppo.cli`` as ``__main__``) with the command's argv and working directory, its
stdout and stderr in files, its exit status reported back. From the fork on, the command is the
user's command: the same entry point, the same exit path (``dist.exit_process``), real engines.

What a fork cannot give is a fresh interpreter's import-time view of the environment, so the
server only takes commands whose environment is the one it was started with (the tests' ``ENV``);
anything else, and every multi-rank launch, starts a fresh interpreter. The server refuses
to fork once a thread other than the main one exists (forking a threaded process can copy a held
lock), and says so instead.

Protocol (one command at a time, JSON lines): the client writes ``{"argv", "cwd", "out", "err"}`` on
the server's stdin; the server answers ``{"pid"}`` at the fork and ``{"status"}`` (subprocess's
convention: the exit code, or -N for signal N) when the command has ended.
"""
from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

# The libraries a `vcppo` command imports before its first line of work.
WARM_LIBRARIES = ("torch", "transformers", "datasets", "deepspeed", "vllm.entrypoints.llm")


def _warm_up() -> None:
    """Import the libraries, every command's module and every engine and driver module: what any
    command imports itself, so a fork starts where a fresh process would be after its imports."""
    import importlib
    import pkgutil

    from vcppo import cli
    for name in (*WARM_LIBRARIES, *(module for module, _ in cli.COMMANDS.values())):
        importlib.import_module(name)
    for package in ("vcppo.engines", "vcppo.driver", "vcppo.commands"):
        for module in pkgutil.iter_modules(importlib.import_module(package).__path__):
            importlib.import_module(f"{package}.{module.name}")


def _run_command(request: dict) -> None:
    """In the forked child: become ``python -m vcppo.cli ARGV`` run from ``cwd``. Never returns;
    SystemExit (or any error) unwinds to the interpreter's top level, as in a fresh process."""
    os.setpgid(0, 0)  # the client's timeout kills the command's whole group (its own children too)
    os.chdir(request["cwd"])
    null = os.open(os.devnull, os.O_RDONLY)
    out = os.open(request["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    err = os.open(request["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for fd, target in ((null, 0), (out, 1), (err, 2)):
        os.dup2(fd, target)
        os.close(fd)
    sys.path[0] = request["cwd"]  # what `python -m` puts first
    import atexit
    import runpy
    import traceback
    sys.argv = ["vcppo.cli", *request["argv"]]
    try:
        runpy.run_module("vcppo.cli", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as end:
        code = _exit_code(end.code)
    except BaseException:
        traceback.print_exc()
        code = 1
    # The interpreter's own ending, less its teardown of every module (seconds with vLLM imported,
    # and nothing a command relies on: its exit handlers run, its streams are flushed).
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


def _exit_code(code) -> int:
    """SystemExit's code as the interpreter turns it into a status (None: 0; text: printed, 1)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def serve() -> None:
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything an import prints goes to the log, not into the replies
    _warm_up()
    replies.write(json.dumps({"ready": threading.active_count()}) + "\n")
    for line in sys.stdin:
        request = json.loads(line)
        if threading.active_count() > 1:
            replies.write(json.dumps({"refused": [t.name for t in threading.enumerate()]}) + "\n")
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            replies.close()
            _run_command(request)
        replies.write(json.dumps({"pid": pid}) + "\n")
        _, status = os.waitpid(pid, 0)
        replies.write(json.dumps({"status": os.waitstatus_to_exitcode(status)}) + "\n")


class ForkServer:
    """The client: one server process per pytest worker, started at the first command."""

    def __init__(self, env: dict[str, str]):
        self.env = env
        self.proc: subprocess.Popen | None = None
        self.usable = True
        self._pending = b""

    def _start(self) -> None:
        log = open(Path(tempfile.gettempdir()) / f"vcppo-forkserver-{os.getpid()}.log", "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.forkserver"], cwd=Path(__file__).parent.parent,
                                     env=self.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log)
        ready = self._reply(timeout=300)
        self.usable = ready is not None and ready.get("ready") == 1

    def _reply(self, timeout: float | None) -> dict | None:
        """The server's next line, or None past ``timeout`` seconds of silence or at its end. Read
        from the raw pipe: a buffered reader could hold the next line where select cannot see it."""
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._pending:
            if timeout is not None and not select.select([fd], [], [], timeout)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        return json.loads(line)

    def run(self, argv: list[str], cwd, timeout: float | None, check: bool) -> subprocess.CompletedProcess | None:
        """The command's CompletedProcess, or None when the server cannot take it (the caller then
        starts a process of its own)."""
        if self.proc is None and self.usable:
            self._start()
        if not self.usable or self.proc is None or self.proc.poll() is not None:
            return None
        with tempfile.TemporaryDirectory() as tmp:
            out, err = Path(tmp) / "out", Path(tmp) / "err"
            request = {"argv": [str(a) for a in argv], "cwd": str(cwd), "out": str(out), "err": str(err)}
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
            self.proc.stdin.flush()
            started = self._reply(timeout=60)
            if started is None or "pid" not in started:
                self.usable = False
                return None
            ended = self._reply(timeout=timeout)
            cmd = [sys.executable, "-m", "vcppo.cli", *request["argv"]]
            if ended is None:  # past the timeout: kill the command as subprocess.run would
                os.killpg(started["pid"], 9)
                self._reply(timeout=60)
                raise subprocess.TimeoutExpired(cmd, timeout, out.read_text(), err.read_text())
            res = subprocess.CompletedProcess(cmd, ended["status"], out.read_text(errors="replace"),
                                              err.read_text(errors="replace"))
        if check:
            res.check_returncode()
        return res

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


if __name__ == "__main__":
    serve()
