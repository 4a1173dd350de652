"""Reward scoring in worker processes, with a hard wall-clock timeout per sample.

Why processes: math-verify's timeouts are signals, which work only on a main thread, and a power
tower such as ``\\boxed{9^{9^{9^{9}}}}`` can hold the GIL inside one C call for seconds (or for
good), so neither a signal nor a thread pool can bound a sample. Killing a process can.

Why ``forkserver`` (``spawn`` where it is missing) and not ``fork``: the trainer process holds vLLM,
DeepSpeed, CUDA contexts, communicator threads and gigabytes of weights. ``fork`` would copy that
address space into every worker (and a forked child may not touch CUDA, nor hold a lock another
thread had taken). Workers instead start from a clean interpreter that imports only the reward
code; the fork server preloads it, so a replacement worker starts in milliseconds. Every process
of a pool dies with the trainer, SIGKILL included (:mod:`vcppo.sandbox.lifeline`).

Protocol: each worker owns a duplex pipe. The parent sends a chunk of samples; the worker answers
once per sample, in order: ``("ok", reward)`` or ``("error", message)``. The parent times each
sample from the worker's previous answer; past ``timeout_s`` it kills the worker, records that
sample as ``("timeout", ...)``, puts the chunk's unanswered samples back in the queue and starts
a replacement. A worker that dies mid-chunk is handled the same way (its sample is an error).
"""
from __future__ import annotations

import logging
import math
import multiprocessing as mp
import os
import pickle
import signal
import time
import weakref
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any, Callable

from vcppo.sandbox.lifeline import die_with_parent
from vcppo.rewards.loading import load_reward_fn

logger = logging.getLogger(__name__)

Item = tuple[str, Any, dict]        # (response text, ground truth, keyword arguments)
Outcome = tuple[str, Any]           # ("ok", reward) | ("error", message) | ("timeout", message)
READY_TIMEOUT_S = 120.0             # a worker that cannot even import the reward code
MAX_FAILED_STARTS = 3


def default_num_workers(cores: int, local_world_size: int, busy_cores_per_rank: int) -> int:
    """Worker processes per rank: the cores the trainer leaves idle on this node, shared among its
    ranks (each rank scores its own samples), at least 1.

    ``busy_cores_per_rank``: what a rank keeps busy itself; a GPU rank mostly one core feeding its
    device, a CPU rank its torch intra-op threads.
    """
    idle = cores - local_world_size * busy_cores_per_rank
    return max(1, idle // max(1, local_world_size))


def resolve_reward_fn(reward_fn: Callable | str) -> Callable:
    return load_reward_fn(reward_fn) if isinstance(reward_fn, str) else reward_fn


def _worker_main(conn: Connection, reward_fn: Callable | str, convert: Callable | None = float) -> None:
    """A worker's loop: chunks in, one answer per sample out (``convert``-ed: a float for a reward,
    None: as the function returned it); exits when the pipe closes."""
    die_with_parent()  # the fork server (or, spawned, the trainer): it dies with the trainer
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle
    fn = resolve_reward_fn(reward_fn)
    conn.send(("ready", os.getpid()))
    while True:
        try:
            chunk = conn.recv()
        except (EOFError, OSError):
            return
        if chunk is None:
            return
        for text, truth, kwargs in chunk:
            try:
                out = fn(text, truth, **kwargs)
                conn.send(("ok", convert(out) if convert is not None else out))
            except Exception as e:  # the parent counts it and scores the sample wrong
                conn.send(("error", repr(e)[:500]))


@dataclass(eq=False)
class _Worker:
    process: Any
    conn: Connection
    started: float
    ready: bool = False
    assigned: deque = field(default_factory=deque)   # indices of samples sent, not yet answered
    since: float = 0.0                               # when its current sample started


def _stop_workers(workers: list[_Worker]) -> None:
    for w in workers:
        try:
            w.conn.send(None)
        except (OSError, ValueError):
            pass
    for w in workers:
        w.process.join(timeout=2)
        if w.process.is_alive():
            w.process.kill()
            w.process.join(timeout=2)
        w.conn.close()


class RewardPool:
    """``num_workers`` processes scoring with ``reward_fn`` (a ``'module:function'`` path, or a
    callable that pickles by reference); see the module docstring. ``convert``: what a worker sends
    back of each answer (``float`` for a reward; None: the answer as returned, which must pickle:
    the environments' turns, :mod:`vcppo.envs.worker`). ``preload``: modules the fork server imports.
    ``max_chunk``: the most items sent to a worker at once (1: a hang holds up no other item, and
    hangs time out side by side, one per worker). ``role``: what the pool computes, in its messages
    and process names (``reward``, ``env``)."""

    def __init__(self, reward_fn: Callable | str, num_workers: int, timeout_s: float,
                 start_method: str | None = None, convert: Callable | None = float,
                 preload: tuple[str, ...] = ("vcppo.rewards.verifier", "math_verify"), max_chunk: int = 32,
                 role: str = "reward"):
        if num_workers < 1 or not (timeout_s > 0 and math.isfinite(timeout_s)):
            raise ValueError(f"RewardPool needs num_workers >= 1 and a finite timeout_s > 0, got "
                             f"{num_workers}, {timeout_s}")
        try:
            pickle.dumps(reward_fn)
        except Exception as e:
            raise TypeError(f"reward function {reward_fn!r} cannot be sent to worker processes ({e}); "
                            "pass a 'module:function' path, or score serially (num_workers=0)") from None
        self.reward_fn, self.timeout_s, self.num_workers = reward_fn, float(timeout_s), num_workers
        self.convert, self.max_chunk, self.role = convert, max_chunk, role
        method = start_method or ("forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn")
        self._ctx = mp.get_context(method)
        if method == "forkserver":  # workers fork from a server that already imported these; the
            # lifeline first: the server dies with the trainer, and its workers with it
            self._ctx.set_forkserver_preload(["vcppo.sandbox.lifeline", *preload])
        self.num_timeouts = 0
        self.num_restarts = 0
        self._failed_starts = 0
        self._workers = [self._start() for _ in range(num_workers)]
        self._finalizer = weakref.finalize(self, _stop_workers, self._workers)

    def _start(self) -> _Worker:
        parent, child = self._ctx.Pipe(duplex=True)
        process = self._ctx.Process(target=_worker_main, args=(child, self.reward_fn, self.convert), daemon=True,
                                    name=f"vcppo-{self.role}")
        process.start()
        child.close()
        return _Worker(process, parent, started=time.monotonic())

    def _replace(self, w: _Worker, pending: deque) -> None:
        """Kill ``w``, requeue its unanswered samples (first in line), start a replacement."""
        pending.extendleft(reversed(w.assigned))
        w.assigned.clear()
        w.process.kill()
        w.process.join(timeout=5)
        w.conn.close()
        self._workers[self._workers.index(w)] = self._start()
        self.num_restarts += 1

    def map(self, items: list[Item]) -> list[Outcome]:
        """One outcome per item, in order."""
        results: list[Outcome | None] = [None] * len(items)
        pending = deque(range(len(items)))
        chunk = max(1, min(self.max_chunk, -(-len(items) // (4 * self.num_workers))))
        while pending or any(w.assigned for w in self._workers):
            self._dispatch(items, pending, chunk)
            by_conn = {w.conn: w for w in self._workers}
            for conn in wait(list(by_conn), timeout=self._wait_s()):
                self._receive(by_conn[conn], results, pending)
            self._expire(results, pending)
        return results  # type: ignore[return-value]

    def _dispatch(self, items: list[Item], pending: deque, chunk: int) -> None:
        now = time.monotonic()
        for w in self._workers:
            if w.ready and not w.assigned and pending:
                w.assigned.extend(pending.popleft() for _ in range(min(chunk, len(pending))))
                w.since = now
                try:
                    w.conn.send([items[i] for i in w.assigned])
                except (OSError, ValueError):  # it died since its last answer
                    self._replace(w, pending)

    def _wait_s(self) -> float:
        now, deadlines = time.monotonic(), []
        for w in self._workers:
            if w.assigned:
                deadlines.append(w.since + self.timeout_s)
            elif not w.ready:
                deadlines.append(w.started + READY_TIMEOUT_S)
        return max(0.0, min(deadlines) - now) if deadlines else 0.05

    def _receive(self, w: _Worker, results: list, pending: deque) -> None:
        try:
            kind, value = w.conn.recv()
        except (EOFError, OSError):  # the worker died: a crashing reward function, or a kill
            self._worker_died(w, results, pending)
            return
        if kind == "ready":
            w.ready, self._failed_starts = True, 0
            return
        results[w.assigned.popleft()] = (kind, value)
        w.since = time.monotonic()

    def _worker_died(self, w: _Worker, results: list, pending: deque) -> None:
        w.process.join(timeout=1)  # reaped, so its exit code is known
        if w.assigned:
            results[w.assigned.popleft()] = ("error", f"{self.role} worker died (exit code {w.process.exitcode})")
        elif not w.ready:
            self._failed_starts += 1
            if self._failed_starts >= MAX_FAILED_STARTS:
                raise RuntimeError(f"{self.role} worker processes exit at start-up ({self._failed_starts} in a "
                                   f"row, exit code {w.process.exitcode}); run with reward.num_workers=0 to "
                                   "see the error in this process")
        self._replace(w, pending)

    def _expire(self, results: list, pending: deque) -> None:
        now = time.monotonic()
        for w in list(self._workers):
            if w.assigned and now - w.since > self.timeout_s:
                results[w.assigned.popleft()] = ("timeout", f"no {self.role} answer within {self.timeout_s:g} s")
                self.num_timeouts += 1
                self._replace(w, pending)
            elif not w.ready and now - w.started > READY_TIMEOUT_S:
                self._worker_died(w, results, pending)

    def close(self) -> None:
        self._finalizer()
