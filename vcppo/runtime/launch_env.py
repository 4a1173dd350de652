"""The launcher's environment, read before any process group exists: ranks and world sizes under the
deepspeed launcher, torchrun, SLURM (``srun``) or plain ``python``; the device; and DeepSpeed's CPU
shared-memory collective (where it is built, when it is skipped, its ``/dev/shm`` segment)."""
from __future__ import annotations

import errno
import os
import socket
import sys
import time
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Mapping

import torch

from vcppo.errors import ConfigError


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (a rendezvous for ranks started here)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _expand_slurm_counts(counts: str) -> list[int]:
    """SLURM's compressed per-node list, e.g. ``"8(x2),4"`` -> ``[8, 8, 4]``."""
    out: list[int] = []
    for part in counts.split(","):
        n, _, times = part.partition("(x")
        out += [int(n)] * (int(times.rstrip(")")) if times else 1)
    return out


def slurm_launcher_env(env: Mapping[str, str]) -> dict[str, str]:
    """The torchrun-style variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE) of a task that
    ``srun`` started, from SLURM's own for the job step (``SLURM_PROCID``, ``SLURM_STEP_NUM_TASKS``,
    ``SLURM_LOCALID``, ``SLURM_STEP_TASKS_PER_NODE`` at ``SLURM_NODEID``). Empty outside a job step:
    a plain ``python`` inside an sbatch script (the batch step, which has no step variables) stays
    rank 0 of 1. Without it a multi-node job would take LOCAL_WORLD_SIZE = WORLD_SIZE and size
    per-node resources (reward workers) wrongly."""
    if "SLURM_PROCID" not in env or "SLURM_STEP_NUM_TASKS" not in env:
        return {}
    out = {"RANK": env["SLURM_PROCID"], "WORLD_SIZE": env["SLURM_STEP_NUM_TASKS"],
           "LOCAL_RANK": env.get("SLURM_LOCALID", "0")}
    per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    if per_node:
        counts = _expand_slurm_counts(per_node)
        node = int(env.get("SLURM_NODEID", "0"))
        out["LOCAL_WORLD_SIZE"] = str(counts[node] if node < len(counts) else counts[-1])
    return out


def _launcher_value(key: str) -> str | None:
    """A launcher variable (RANK, WORLD_SIZE, ...) as set, or as SLURM's step variables give it. The
    deepspeed launcher names the node's rank count LOCAL_SIZE (it sets no LOCAL_WORLD_SIZE)."""
    value = os.environ.get(key) or slurm_launcher_env(os.environ).get(key)
    if not value and key == "LOCAL_WORLD_SIZE":
        value = os.environ.get("LOCAL_SIZE")
    return value


def launched_world_size() -> int:
    """Ranks the launcher started (WORLD_SIZE, or SLURM's task count), before any group exists."""
    return int(_launcher_value("WORLD_SIZE") or 1)


def local_world_size() -> int:
    """Ranks on this node: the launcher's LOCAL_WORLD_SIZE, SLURM's count for this node, else 1."""
    return int(_launcher_value("LOCAL_WORLD_SIZE") or 1)


class RendezvousError(ConfigError):
    """No rendezvous within ``trainer.rendezvous_timeout_s``: the master unreachable, or ranks missing."""


def rendezvous_store(rank: int, world: int, timeout_s: float, collective_timeout_s: float):
    """The launcher's store (rank 0 hosts it at MASTER_ADDR:MASTER_PORT, or torchrun's agent does), joined
    by every rank within ``timeout_s``; later waits on it are bounded by ``collective_timeout_s``. Past
    ``timeout_s`` a :class:`RendezvousError` says, on one line, where this rank looked and what it found."""
    import torch.distributed as tdist

    try:
        joined = tdist.rendezvous("env://", rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s))
        store, _, _ = next(joined)
    except (RuntimeError, OSError) as error:  # torch's DistNetworkError / DistStoreError are RuntimeErrors
        raise RendezvousError(rendezvous_failure(rank, world, timeout_s, error)) from None
    store.set_timeout(timedelta(seconds=collective_timeout_s))
    return store


def rendezvous_failure(rank: int, world: int, timeout_s: float, error: BaseException) -> str:
    """One line for a rendezvous that failed: MASTER_ADDR / MASTER_PORT, what this rank tried, what it found."""
    addr, port = os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", "")
    where = f"MASTER_ADDR={addr} MASTER_PORT={port}"
    text = str(error).splitlines()[0] if str(error) else type(error).__name__
    if "EADDRINUSE" in text or "address already in use" in text.lower():
        return (f"rank {rank} cannot host the rendezvous at {where}: the port is taken on this node (another run?): "
                "pick another MASTER_PORT")
    if rank == 0 and "clients" in text:
        return (f"rank 0 hosted the rendezvous at {where} for {timeout_s:g} s (trainer.rendezvous_timeout_s) but not "
                f"all {world} ranks joined ({text}): start every node's launcher, with the same MASTER_ADDR and "
                "MASTER_PORT")
    return (f"rank {rank} of {world} could not join the rendezvous at {where} within {timeout_s:g} s "
            f"(trainer.rendezvous_timeout_s): tried {addr}:{port}, {probe_master(addr, port)}")


def probe_master(addr: str, port: str, timeout_s: float = 3.0) -> str:
    """What one TCP connection to the master's address says now, in words."""
    try:
        resolved = socket.getaddrinfo(addr, int(port), type=socket.SOCK_STREAM)[0][4][0]
    except (socket.gaierror, ValueError) as error:
        return f"and MASTER_ADDR does not resolve on this node ({error})"
    shown = resolved if resolved == addr else f"{addr} = {resolved}"
    try:
        with socket.create_connection((resolved, int(port)), timeout=timeout_s):
            return (f"and {shown} accepts a connection now (rank 0 started late: rerun, or raise "
                    "trainer.rendezvous_timeout_s)")
    except ConnectionRefusedError:
        return (f"and {shown} refuses the connection: nothing listens on port {port} there (is rank 0's node "
                "started, with this MASTER_PORT?)")
    except (socket.timeout, TimeoutError):
        return f"and {shown} gave no answer in {timeout_s:g} s (that node down, a firewall, or not its address)"
    except OSError as error:
        reason = errno.errorcode.get(error.errno, "") if error.errno else ""
        return f"and {shown} is unreachable from this node ({reason or error}: no route to that address)"


def use_cuda(device: str) -> bool:
    if device == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("device='cuda' requested but CUDA is not available")
        return True
    if device == "cpu":
        return False
    if device != "auto":
        raise ValueError(f"device must be 'auto', 'cuda' or 'cpu', got {device!r}")
    return torch.cuda.is_available()


def private_extension_dir() -> None:
    """Build DeepSpeed's JIT ops (the CPU shm collective) inside this environment, not in the
    shared ``~/.cache/torch_extensions``: the build there is keyed by op name only, so two virtual
    environments (a clean clone beside a dev checkout) rewrite each other's ``build.ninja`` and
    rebuild in turn, and a build killed mid-way leaves a ``lock`` file that makes every later start
    wait forever. A user's TORCH_EXTENSIONS_DIR wins. A lock older than 15 minutes is named in a
    warning (torch waits on it silently)."""
    root = os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(sys.prefix, "torch_extensions"))
    for lock in Path(root).glob("*/lock") if os.path.isdir(root) else ():
        age_min = (time.time() - lock.stat().st_mtime) / 60
        if age_min > 15:
            warnings.warn(f"{lock} is {age_min:.0f} min old: if no DeepSpeed op build is running, a killed "
                          "build left it and start-up will wait on it forever; delete it", stacklevel=2)


def skip_shm_collective() -> None:
    """One CPU rank has no peer to share memory with, yet DeepSpeed's CPU backend JIT-compiles its
    shm collective at ``init_distributed`` (59 s on the 2-core machine, once per environment: the
    first stage of a fresh ``make demo`` paid it). Marking the op incompatible makes DeepSpeed skip
    the build and use plain torch.distributed, as it does wherever the op cannot build. Multi-rank
    CPU runs keep the op (it is their fast all-reduce)."""
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is not None:
        deepspeed.ops.__compatible_ops__[builder.NAME] = False


def build_cpu_collective() -> str:
    """Compile DeepSpeed's CPU shm collective now (into this environment's extension dir) instead of
    at the first multi-rank CPU run's ``init_distributed``, which would wait on the build (~25 s on
    two cores). ``scripts/install.sh`` calls it on CPU machines. Returns the op's name."""
    os.environ["DS_ACCELERATOR"] = "cpu"  # must precede `import deepspeed`
    private_extension_dir()
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    builder.load()
    return builder.NAME


def shm_segment(rank: int, root: Path = Path("/dev/shm")) -> Path:
    """Where DeepSpeed's CPU shm all-reduce keeps ``rank``'s buffer (~66 MiB): named by user, MASTER_ADDR
    and MASTER_PORT (deepspeed/ops/csrc/cpu/comm/shm.cpp). The op runs where every rank is local
    (LOCAL_SIZE, which the deepspeed launcher sets). DeepSpeed unlinks the buffer only in a teardown
    that our ranks' ``os._exit`` (and any error exit or SIGKILL) skips, so the name would stay in
    /dev/shm, RAM held until reboot: :func:`vcppo.runtime.dist.init_distributed` removes it with
    :func:`unlink_shm_segment` as soon as every rank has mapped it."""
    addr, port = os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", "")
    return root / f"deepspeed_allreduce_buffer_{os.getuid()}_{addr}_{port}_{rank}"


def unlink_shm_segment(segment: Path | None) -> None:
    """Remove this rank's segment name (once every rank has mapped it); the ranks keep their mappings
    until they exit."""
    if segment is not None:
        try:
            segment.unlink()
        except OSError:  # never created (the op fell back to gloo), or already gone
            pass
