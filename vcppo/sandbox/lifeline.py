"""Processes that die with the trainer, however it ends (SIGKILL included): Linux's
``PR_SET_PDEATHSIG`` has the kernel send SIGKILL to a process when its parent ends, which no
hang can ignore (a Python loop, a C call holding the GIL, a sleep).

The chain, for the worker pools (:mod:`vcppo.rewards.pool`): the trainer starts multiprocessing's
fork server, which imports this module first (the pool puts it first in the server's preload),
and so dies with the trainer; each worker, forked by that server, dies with it; a tool's child
(:func:`limited`) dies with its worker. The resource tracker then sees its last writer close and
exits by itself, after cleaning what the dead left. Without the fork server (``spawn``) a worker's
parent is the trainer itself. Where ``prctl`` does not exist (not Linux) no death signal is set.

A parent-death signal follows the parent *thread*: pools are started from the trainer's main
thread (as vcppo does).
"""
from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys

PR_SET_PDEATHSIG = 1

# Run in the child before the program: die with the parent (argv[1]: its pid, so a parent that ended
# before the call is seen), apply the limits, become the program.
_BOOT = """import ctypes, os, resource, signal, sys
parent, libc = int(sys.argv[1]), ctypes.CDLL(None)
if hasattr(libc, "prctl"):
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)
memory, cpu, fsize, nproc = (int(x) for x in sys.argv[2:6])
for limit, value in ((resource.RLIMIT_AS, memory), (resource.RLIMIT_CPU, cpu), (resource.RLIMIT_FSIZE, fsize),
                     (resource.RLIMIT_NPROC, nproc)):
    if value:
        resource.setrlimit(limit, (value, value))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
os.execv(sys.argv[6], sys.argv[6:])
"""


def die_with_parent(parent: int | None = None) -> bool:
    """Have the kernel SIGKILL this process when its parent ends; exit at once if the parent already
    ended (the process was adopted before the call; ``parent``: the pid it had, by default the one it
    has now). False where ``prctl`` is missing."""
    if not sys.platform.startswith("linux"):
        return False
    parent = os.getppid() if parent is None else parent
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return False
    if os.getppid() != parent:
        os._exit(1)
    return True


def limited(argv: list[str], memory_bytes: int = 0, cpu_s: int = 0, file_bytes: int = 0,
            processes: int = 0) -> list[str]:
    """``argv`` (its first entry an absolute path) as a command whose process dies with its parent and
    runs under an address-space limit of ``memory_bytes``, a CPU-time limit of ``cpu_s`` seconds, a
    file-size limit of ``file_bytes`` and a process limit of ``processes`` (0: none; no core dumps). Set in the child by a small Python program that then ``exec``s ``argv``: the parent
    needs no ``preexec_fn``, so ``subprocess`` starts it with ``vfork`` / ``posix_spawn`` and never
    copies the parent (a fork of a large process can fail with ENOMEM)."""
    limits = (memory_bytes, cpu_s, file_bytes, processes)
    return [sys.executable, "-I", "-S", "-c", _BOOT, str(os.getpid()), *(str(int(x)) for x in limits), *argv]


def run_tied(argv: list[str]) -> int:
    """Run ``argv`` to its end as a child that dies with this process, however this process ends
    (SIGKILL included); its exit code. A program not found on PATH runs as given, so the error
    names it."""
    program = argv[0] if os.path.isabs(argv[0]) else shutil.which(argv[0])
    return subprocess.run(limited([program, *argv[1:]]) if program else argv).returncode


# The libraries a `vcppo` command imports before its first line of work: a parent that starts several
# commands imports them once (:func:`warm_up`) and each command forked from it starts past them.
WARM_LIBRARIES = ("torch", "transformers", "datasets", "deepspeed", "vllm.entrypoints.llm")
# vLLM's CPU worker: with the model runner, layers and kernels it pulls in, the ~1,000 more modules a
# CPU engine imports as it starts.
CPU_WARM_LIBRARIES = ("vllm.v1.worker.cpu_worker",)


def warm_up() -> None:
    """Import :data:`WARM_LIBRARIES` (and, as a fork runs on the CPU, :data:`CPU_WARM_LIBRARIES`) here,
    where :func:`run_command_tied` can fork them; a no-op where it cannot (a fresh interpreter imports
    them itself)."""
    import importlib
    if fork_is_safe():
        for name in (*WARM_LIBRARIES, *CPU_WARM_LIBRARIES):
            importlib.import_module(name)


def fork_is_safe() -> bool:
    """Whether a fork of this process can run a command: Linux, one thread (a fork copies no other
    thread, and a lock one of them held stays held), and no usable CUDA (a CUDA context does not
    survive a fork)."""
    import threading
    if not sys.platform.startswith("linux") or threading.active_count() > 1:
        return False
    torch = sys.modules.get("torch")
    return torch is None or not torch.cuda.is_available()


def run_module_here(module: str, argv: list[str]) -> None:
    """Become ``python -m MODULE ARGV`` in this (forked) process and end it as the interpreter would end
    that program: its exit code, its exit handlers run, its streams flushed; never returns. The
    interpreter's teardown of every module is skipped (seconds with vLLM imported, and nothing a
    command relies on)."""
    import atexit
    import runpy
    import traceback
    sys.argv = [module, *argv]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as end:
        code = exit_code(end.code)
    except BaseException:
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


def exit_code(code) -> int:
    """SystemExit's code as the interpreter turns it into a status (None: 0; text: printed, 1)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def run_command_tied(args: list[str], module: str = "vcppo.cli") -> int:
    """``python -m MODULE ARGS`` (by default ``vcppo ARGS``) run to its end as a child that dies with this
    process (as :func:`run_tied`); its exit code. Where :func:`fork_is_safe`, the child is a fork of this
    interpreter that runs ``module`` as ``__main__``, so it starts past whatever this process imported
    (:func:`warm_up`); else, or where the fork fails, a fresh interpreter."""
    fresh = [sys.executable, "-m", module, *map(str, args)]
    if not fork_is_safe():
        return run_tied(fresh)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    parent = os.getpid()
    try:
        pid = os.fork()
    except OSError:  # ENOMEM / EAGAIN: a fresh process asks for less
        return run_tied(fresh)
    if pid == 0:
        die_with_parent(parent)
        run_module_here(module, list(map(str, args)))
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def _imported_by_fork_server() -> bool:
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_globals.get("__name__") == "multiprocessing.forkserver" and frame.f_code.co_name == "main":
            return True
        frame = frame.f_back
    return False


if _imported_by_fork_server():
    die_with_parent()
