"""Nothing in the tests or the env tools forks the calling process. A fork copies the caller's
address space (commit charge included): a pytest worker that holds vLLM, models and DeepSpeed failed
to fork with ENOMEM in a full run (the python tool's ``preexec_fn``, the gloo helpers'
``multiprocessing.Manager()`` under the default ``fork`` start method). Children start with
``vfork`` / ``posix_spawn`` / ``spawn`` instead, which copy nothing; Python calls the at-fork hooks
only for a real fork of the caller, so a hook counts them."""
import os

from tests.gloo_ranks import run_on_two_ranks
from vcppo.envs.tools import python

FORKS: list[int] = []
os.register_at_fork(before=lambda: FORKS.append(os.getpid()))


def _rank(rank, out):
    out[rank] = os.getpid()


def test_the_python_tool_never_forks_its_caller():
    before = len(FORKS)
    assert python("print(6 * 7)") == "42"
    assert "MemoryError" in python("x = bytearray(512 * 2 ** 20)", memory_mb=256)  # the limit holds
    assert len(FORKS) == before


def test_two_gloo_ranks_never_fork_the_test_process():
    before = len(FORKS)
    out = run_on_two_ranks(_rank)
    assert sorted(out) == [0, 1] and os.getpid() not in out.values()
    assert len(FORKS) == before
