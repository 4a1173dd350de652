"""A warm interpreter that forks the tests' one-rank `vcppo` commands.

Why: most of a tiny `vcppo` command's time is importing torch, transformers, vLLM and DeepSpeed before
its first line of work (docs/history.md has the profile), and `make test` starts dozens of them. The server imports
those once per pytest worker; each command is a fork of it that runs ``python -m vcppo.cli``'s own
code (``runpy`` on ``vcppo.cli`` as ``__main__``) with the command's argv and working directory, its
stdout and stderr in files, its exit status reported back. From the fork on, the command is the
user's command: the same entry point, the same exit path (``dist.exit_process``), real engines.

What a fork cannot give is a fresh interpreter's import-time view of the environment, so the
server only takes commands whose environment is the one it was started with (the tests' ``ENV``),
apart from the launcher's variables (``LAUNCH_KEYS``), which a command reads when it sets up its
process group, after its imports: so the ranks of a 2-rank run started by hand are forks too.
Anything else, and every launcher (torchrun, the deepspeed launcher), starts a fresh interpreter.
The server refuses to fork once a thread other than the main one exists (forking a threaded
process can copy a held lock), and says so instead.

Protocol (JSON lines on the server's stdin and stdout; the server answers each request in turn):
``{"op": "spawn", "module", "argv", "cwd", "env", "out", "err"}`` forks ``python -m MODULE ARGV``
and answers ``{"pid"}``; ``{"op": "wait", "pid", "timeout"}`` answers ``{"status"}`` (subprocess's
convention: the exit code, or -N for signal N) once that command has ended, or ``{"running"}``
after ``timeout`` seconds (null: no limit). Several commands may run at once.
"""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

# What a launcher sets per rank; read by vcppo.runtime.dist when the group is set up, never at import.
LAUNCH_KEYS = frozenset({"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"})


def _warm_up() -> None:
    """Import the libraries, every command's module and every engine and driver module: what any
    command imports itself, so a fork starts where a fresh process would be after its imports."""
    import importlib
    import pkgutil

    from vcppo import cli
    from vcppo.sandbox.lifeline import CPU_WARM_LIBRARIES, WARM_LIBRARIES
    # CPU or CUDA from DS_ACCELERATOR (tests/conftest.py): asking torch would start CUDA here, in the
    # process every command is forked from
    on_cpu = CPU_WARM_LIBRARIES if os.environ.get("DS_ACCELERATOR") == "cpu" else ()
    for name in (*WARM_LIBRARIES, *on_cpu, *(module for module, _ in cli.COMMANDS.values())):
        importlib.import_module(name)
    for package in ("vcppo.engines", "vcppo.driver", "vcppo.commands"):
        for module in pkgutil.iter_modules(importlib.import_module(package).__path__):
            importlib.import_module(f"{package}.{module.name}")


def _run_command(request: dict) -> None:
    """In the forked child: become ``python -m MODULE ARGV`` run from ``cwd`` with the launcher's
    variables of ``env``. Never returns; SystemExit (or any error) unwinds to the interpreter's
    top level, as in a fresh process."""
    os.setpgid(0, 0)  # a timeout or a kill ends the command's whole group (its own children too)
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    null = os.open(os.devnull, os.O_RDONLY)
    out = os.open(request["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    err = os.open(request["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for fd, target in ((null, 0), (out, 1), (err, 2)):
        os.dup2(fd, target)
        os.close(fd)
    # What `python -m` puts first; the repository stays next (the server's own first entry), as
    # PYTHONPATH puts it for a fresh process that runs a test module such as tests/kill_at.py.
    sys.path.insert(0, request["cwd"])
    from vcppo.sandbox.lifeline import run_module_here
    run_module_here(request["module"], request["argv"])


def _wait(pid: int, timeout: float | None) -> dict:
    """A forked command's status once it ended, or ``{"running"}`` past ``timeout`` seconds."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG if deadline is not None else 0)
        if done:
            return {"status": os.waitstatus_to_exitcode(status)}
        if time.monotonic() >= deadline:
            return {"running": True}
        time.sleep(0.02)


def serve() -> None:
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything an import prints goes to the log, not into the replies
    _warm_up()
    replies.write(json.dumps({"ready": threading.active_count()}) + "\n")
    for line in sys.stdin:
        request = json.loads(line)
        if request["op"] == "wait":
            replies.write(json.dumps(_wait(request["pid"], request["timeout"])) + "\n")
            continue
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


class ForkedProcess:
    """A forked command, with the part of :class:`subprocess.Popen`'s interface the tests use."""

    def __init__(self, server: "ForkServer", pid: int, args: list[str]):
        self.server, self.pid, self.args = server, pid, args
        self.returncode: int | None = None

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            reply = self.server.request({"op": "wait", "pid": self.pid, "timeout": timeout})
            if reply is None:
                raise RuntimeError(f"the fork server ended while {self.args} ran (its log: {self.server.log_path})")
            if "status" not in reply:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self.returncode = reply["status"]
        return self.returncode

    def poll(self) -> int | None:
        try:
            return self.wait(timeout=0)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        """SIGKILL the command's process group (the command and whatever it started)."""
        if self.returncode is None:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


class ForkServer:
    """The client: one server process per pytest worker, started at the first command."""

    def __init__(self, env: dict[str, str]):
        self.env = env
        self.proc: subprocess.Popen | None = None
        self.usable = True
        self._pending = b""
        self.log_path: Path | None = None

    def _start(self) -> None:
        self.log_path = Path(tempfile.gettempdir()) / f"vcppo-forkserver-{os.getpid()}.log"
        log = open(self.log_path, "w")
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

    def request(self, message: dict) -> dict | None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")
        self.proc.stdin.flush()
        return self._reply(timeout=None if message["op"] == "wait" else 60)

    def popen(self, argv: list[str], cwd, env: dict[str, str] | None = None, module: str = "vcppo.cli",
              out: Path | str = os.devnull, err: Path | str = os.devnull) -> ForkedProcess | None:
        """``python -m MODULE ARGV`` forked from the warm interpreter, its stdout and stderr written
        to ``out`` and ``err``; None when the server cannot take it (``env`` differs from the
        server's beyond the launcher's variables, or the server is gone or refused)."""
        env = self.env if env is None else env
        extra = {k: v for k, v in env.items() if self.env.get(k) != v}
        if set(extra) - LAUNCH_KEYS or set(self.env) - set(env):
            return None
        if self.proc is None and self.usable:
            self._start()
        if not self.usable or self.proc is None or self.proc.poll() is not None:
            return None
        request = {"op": "spawn", "module": module, "argv": [str(a) for a in argv], "cwd": str(cwd), "env": extra,
                   "out": str(out), "err": str(err)}
        started = self.request(request)
        if started is None or "pid" not in started:
            self.usable = False
            return None
        return ForkedProcess(self, started["pid"], [sys.executable, "-m", module, *request["argv"]])

    def run(self, argv: list[str], cwd, timeout: float | None, check: bool) -> subprocess.CompletedProcess | None:
        """The command's CompletedProcess, or None when the server cannot take it (the caller then
        starts a process of its own)."""
        with tempfile.TemporaryDirectory() as tmp:
            out, err = Path(tmp) / "out", Path(tmp) / "err"
            proc = self.popen(argv, cwd, out=out, err=err)
            if proc is None:
                return None
            try:
                status = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:  # kill the command as subprocess.run would
                proc.kill()
                proc.wait()
                raise subprocess.TimeoutExpired(proc.args, timeout, out.read_text(), err.read_text()) from None
            res = subprocess.CompletedProcess(proc.args, status, out.read_text(errors="replace"),
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
