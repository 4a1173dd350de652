"""Process-group set-up shared by every engine: launcher env, device (cuda / cpu), backend.

One call, :func:`init_distributed`, works under the deepspeed launcher, torchrun and a plain
``python`` (world size 1: a 1-rank gloo/nccl group is created because DeepSpeed needs one).
On CPU it sets ``DS_ACCELERATOR=cpu`` *before* deepspeed is imported anywhere.

Teardown (:func:`shutdown`) is ordered: registered closers (the vLLM engine) first, then vLLM's
own process groups, then the default group. Without ``destroy_process_group`` ranks abort at
exit ("terminate called without an active exception"); vLLM's groups share the default group,
so destroying it twice raises "Invalid process group specified" -- that one error is swallowed.
"""
from __future__ import annotations

import os
import socket
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import torch


@dataclass
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str
    is_main: bool
    role: str = "both"   # placement.mode=split: "train", "critic" or "rollout" (engines.bridge); else "both"


_INFO: DistInfo | None = None
_BRIDGE = None  # split placement: this rank's engines.bridge.Bridge (trainer 0 and rollout ranks)
_CRITIC_LINK = None  # split placement with critic ranks: this training / critic rank's engines.bridge.CriticLink
_CLOSERS: list[Callable[[], None]] = []
_EVER_INITIALISED = False  # a process group was set up in this process (exit_process)
_SHM_SEGMENT: Path | None = None  # DeepSpeed's CPU all-reduce segment of this rank (unlinked at shutdown)


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
    """A launcher variable (RANK, WORLD_SIZE, ...) as set, or as SLURM's step variables give it."""
    return os.environ.get(key) or slurm_launcher_env(os.environ).get(key)


def launched_world_size() -> int:
    """Ranks the launcher started (WORLD_SIZE, or SLURM's task count), before any group exists."""
    return int(_launcher_value("WORLD_SIZE") or 1)


def local_world_size() -> int:
    """Ranks on this node: the launcher's LOCAL_WORLD_SIZE, SLURM's count for this node, else 1."""
    return int(_launcher_value("LOCAL_WORLD_SIZE") or 1)


def _use_cuda(device: str) -> bool:
    if device == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("device='cuda' requested but CUDA is not available")
        return True
    if device == "cpu":
        return False
    if device != "auto":
        raise ValueError(f"device must be 'auto', 'cuda' or 'cpu', got {device!r}")
    return torch.cuda.is_available()


def _private_extension_dir() -> None:
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


def _skip_shm_collective() -> None:
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
    _private_extension_dir()
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    builder.load()
    return builder.NAME


def init_distributed(device: str = "auto", split_rollout_ranks: int | None = None,
                     timeout_s: float = 1800.0, split_critic_ranks: int = 0) -> DistInfo:
    """Initialise (once) the default process group and return this rank's :class:`DistInfo`.

    ``split_rollout_ranks``: split placement with that many rollout ranks (and ``split_critic_ranks``
    critic ranks): the default group is then this rank's role world and the bridge (and the
    critic links) are built (:mod:`vcppo.engines.bridge`)."""
    global _INFO, _EVER_INITIALISED
    if _INFO is not None:
        return _INFO
    _EVER_INITIALISED = True
    cuda = _use_cuda(device)
    if not cuda:
        os.environ["DS_ACCELERATOR"] = "cpu"  # must precede `import deepspeed`
    # torchrun / deepspeed set these (srun sets SLURM's, mapped here); a plain `python` run is rank 0 of 1.
    for key, value in slurm_launcher_env(os.environ).items():
        os.environ.setdefault(key, value)
    rank = int(os.environ.setdefault("RANK", "0"))
    world = int(os.environ.setdefault("WORLD_SIZE", "1"))
    local_rank = int(os.environ.setdefault("LOCAL_RANK", str(rank)))
    os.environ.setdefault("LOCAL_WORLD_SIZE", str(world))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        if world > 1:
            raise RuntimeError("WORLD_SIZE > 1 but MASTER_PORT is unset: use the deepspeed launcher or torchrun")
        os.environ["MASTER_PORT"] = str(free_port())
    backend = "nccl" if cuda else "gloo"
    if cuda:
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
    else:
        dev = torch.device("cpu")
    _private_extension_dir()
    import deepspeed  # noqa: E402  (after DS_ACCELERATOR)

    # DeepSpeed 0.19 calls a torch collective that torch 2.13 deprecates, once per ZeRO-3 step:
    # a warning per step buries the progress bar and says nothing the user can act on.
    warnings.filterwarnings("ignore", message=r".*reduce_scatter_tensor.*is deprecated", category=FutureWarning)

    if split_rollout_ranks is not None:
        return _init_split(split_rollout_ranks, split_critic_ranks, rank, world, local_rank, dev, backend, timeout_s)
    if not cuda and world == 1:
        _skip_shm_collective()
    if not torch.distributed.is_initialized():
        from datetime import timedelta
        deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False, rank=rank, world_size=world,
                                   init_method="env://", timeout=timedelta(seconds=timeout_s))
    if not cuda and world > 1:
        global _SHM_SEGMENT
        _SHM_SEGMENT = shm_segment(rank)
    _INFO = DistInfo(rank=rank, world_size=world, local_rank=local_rank, device=dev,
                     backend=backend, is_main=(rank == 0))
    return _INFO


def shm_segment(rank: int, root: Path = Path("/dev/shm")) -> Path:
    """Where DeepSpeed's CPU shm all-reduce keeps ``rank``'s buffer (~66 MiB): named by user, MASTER_ADDR
    and MASTER_PORT (deepspeed/ops/csrc/cpu/comm/shm.cpp). The op runs where every rank is local
    (LOCAL_SIZE, which the deepspeed launcher sets). DeepSpeed unlinks the buffer only in a teardown
    that our ranks' ``os._exit`` skips: :func:`unlink_shm_segment` removes it, or it stays in /dev/shm,
    RAM held until reboot."""
    addr, port = os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", "")
    return root / f"deepspeed_allreduce_buffer_{os.getuid()}_{addr}_{port}_{rank}"


def unlink_shm_segment(segment: Path | None) -> None:
    """Remove this rank's segment name (after a clean run's last barrier); peers that still map it keep
    their mapping until they exit."""
    if segment is not None:
        try:
            segment.unlink()
        except OSError:  # never created (the op fell back to gloo), or already gone
            pass


def _init_split(rollout_ranks: int, critic_ranks: int, rank: int, world: int, local_rank: int, dev: torch.device,
                backend: str, timeout_s: float) -> DistInfo:
    """Split placement: this rank's role world as the default group, then the bridge and the critic
    links. A critic world's rank 0 is its main rank (it writes the critic's exports)."""
    global _INFO, _BRIDGE, _CRITIC_LINK
    from datetime import timedelta

    import deepspeed

    from vcppo.engines.bridge import CRITIC, Bridge, CriticLink, Roles, init_role_world
    roles, timeout = Roles(world, rollout_ranks, critic_ranks), timedelta(seconds=timeout_s)
    if dev.type == "cpu":
        # DeepSpeed's CPU shm all-reduce sizes itself by the node's launcher ranks, which now
        # include the rollout ranks: plain gloo collectives within the training world instead.
        _skip_shm_collective()
    store = init_role_world(roles, rank, backend, timeout)
    deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False)  # adopts the role world
    role = roles.role_of(rank)
    if roles.bridge_rank(rank) is not None:
        _BRIDGE = Bridge(store, roles, rank, backend, dev, timeout)
    if roles.critic_partner(rank) is not None:
        _CRITIC_LINK = CriticLink(store, roles, rank, timeout)
    main = rank == 0 or (role == CRITIC and roles.role_rank(rank) == 0)
    _INFO = DistInfo(rank=roles.role_rank(rank), world_size=roles.role_size(rank), local_rank=local_rank,
                     device=dev, backend=backend, is_main=main, role=role)
    return _INFO


def get_bridge():
    """This rank's bridge (split placement, trainer 0 and the rollout ranks), else None."""
    return _BRIDGE


def get_critic_link():
    """This training or critic rank's link to its partner (split placement with critic ranks), else None."""
    return _CRITIC_LINK


def exit_process(code: int) -> None:
    """End the process with ``code``; a process that had peers skips interpreter teardown.

    After :func:`shutdown` every result is written, but a multi-rank CPU process can still abort
    in C++ static destruction ("terminate called without an active exception", SIGABRT, rc -6):
    CI hit it twice in 2-rank gloo runs, once after the barrier of ``wait_for_peers`` was added,
    and the launcher then kills the healthy peer and reports the whole run failed. Python-level
    teardown is done by hand (streams, logging), then ``os._exit`` skips the C++ destructors.
    A single-rank process that ran engines does the same: the interpreter's teardown of torch and
    vLLM writes nothing and only costs time (:mod:`vcppo.engines.lifetime`). Only a process that never
    initialised a process group exits normally."""
    if not _EVER_INITIALISED:
        sys.exit(code)
    import logging
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing left to flush
            pass
    os._exit(code)


# What the collective libraries say when a peer process is gone (gloo's TCP pair; NCCL's watchdog).
_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "remote process exited",
              "NCCL communicator was aborted")


def global_rank() -> int:
    """This process's rank in the whole job: the launcher's, also in a split run, where RANK is
    rewritten to the rank within the role's world (:mod:`vcppo.engines.bridge`)."""
    return int(os.environ.get("VCPPO_GLOBAL_RANK", os.environ.get("RANK", "0")))


def peer_loss_hint(error: BaseException) -> str | None:
    """One line for the end of a rank's output when ``error`` is a collective failing because another
    rank died (its error is the cause, this one a consequence); None for any other error."""
    if not any(marker in str(error) for marker in _PEER_GONE):
        return None
    return (f"rank {global_rank()} stopped because another rank of the job died mid-collective: the error above is a "
            "consequence. Look for the rank that failed first (its own error, or the OOM killer in `dmesg`); "
            "running the same command again resumes from the last complete checkpoint.")


def get_info() -> DistInfo | None:
    return _INFO


def register_closer(fn: Callable[[], None]) -> None:
    """Engines that must be torn down before the default group (vLLM) register here."""
    _CLOSERS.append(fn)


def unregister_closer(fn: Callable[[], None]) -> None:
    if fn in _CLOSERS:
        _CLOSERS.remove(fn)


def _is_invalid_pg(e: BaseException) -> bool:
    return "Invalid process group" in str(e)


def shutdown(wait_for_peers: bool = False) -> None:
    """Close engines (vLLM first), then vLLM's groups, then the default group. Idempotent.

    ``wait_for_peers``: meet every rank at a barrier before the default group is destroyed, so
    no rank tears its sockets down while a peer is still in its last collective (the suspect of a
    2-rank gloo abort at exit seen once in CI). Only on a clean end: a rank unwinding an error
    must not wait at a barrier its peers never reach."""
    global _INFO, _BRIDGE, _CRITIC_LINK, _SHM_SEGMENT
    while _CLOSERS:
        _CLOSERS.pop()()
    try:  # vLLM's TP/PP/world group wrappers (only present if an LLM was built)
        import sys
        if "vllm.distributed.parallel_state" in sys.modules:
            from vllm.distributed.parallel_state import destroy_model_parallel
            ps = sys.modules["vllm.distributed.parallel_state"]
            destroy_model_parallel()
            if getattr(ps, "_WORLD", None) is not None:
                ps._WORLD.destroy()
                ps._WORLD = None
    except Exception as e:  # noqa: BLE001
        if not _is_invalid_pg(e):
            raise
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        if wait_for_peers and torch.distributed.get_world_size() > 1:
            try:
                torch.distributed.barrier()
            except Exception as e:  # noqa: BLE001  (vLLM's teardown can leave the group invalid)
                if not _is_invalid_pg(e):
                    raise
        try:
            torch.distributed.destroy_process_group()
        except Exception as e:  # noqa: BLE001
            if not _is_invalid_pg(e):
                raise
    _forget_deepspeed_groups()
    if wait_for_peers:
        # every peer met the barrier above, so it mapped this segment long ago; after an error one still
        # starting up would wait for the name forever, so the segment stays there
        unlink_shm_segment(_SHM_SEGMENT)
    _SHM_SEGMENT = None
    _INFO = None
    _BRIDGE = None
    _CRITIC_LINK = None


def _forget_deepspeed_groups() -> None:
    """DeepSpeed caches its world / data-parallel group objects (deepspeed.utils.groups); after the
    default group is destroyed they are dead, and the next ZeRO-3 engine of a new process group in
    the same process fails ("Group ... is not registered"). DeepSpeed's own destroy_process_group
    releases them the same way."""
    import sys
    groups = sys.modules.get("deepspeed.utils.groups")
    release = getattr(groups, "_release_process_group_references", None)
    if release is not None:
        release(group=None)


# --- collectives: no-ops at world size 1 ------------------------------------------------------

def _active() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized() \
        and torch.distributed.get_world_size() > 1


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """In-place sum over ranks; returns ``t``."""
    if _active():
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.SUM)
    return t


def all_reduce_max(t: torch.Tensor) -> torch.Tensor:
    """In-place max over ranks; returns ``t``."""
    if _active():
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    return t


def comm_device() -> torch.device:
    """Where collective tensors must live: the rank's GPU under nccl (which rejects CPU tensors),
    the CPU under gloo or before init."""
    return _INFO.device if _INFO is not None else torch.device("cpu")


def global_sum(x: float | torch.Tensor) -> float:
    """Sum of a scalar over ranks, in float64."""
    t = torch.as_tensor(x, dtype=torch.float64, device=comm_device()).clone().reshape(1)
    return float(all_reduce_sum(t).item())


def gather_cat(t: torch.Tensor, pad_value: float = 0.0) -> torch.Tensor:
    """Concatenate a (B_r, ...) tensor over ranks along dim 0 on the CPU, right-padding dim 1 to
    the longest. For metrics: a step's batch is small enough to gather (at cluster scale this
    would be replaced by reduced moments)."""
    if not _active():
        return t.detach().cpu()
    parts = all_gather_object(t.detach().cpu())
    if t.dim() >= 2:
        width = max(p.shape[1] for p in parts)
        parts = [torch.nn.functional.pad(p, (0, width - p.shape[1]), value=pad_value) for p in parts]
    return torch.cat(parts, dim=0)


def all_gather_object(obj: Any) -> list:
    if not _active():
        return [obj]
    out: list = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(out, obj)
    return out


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """``obj`` of rank ``src``, on every rank."""
    if not _active():
        return obj
    box = [obj]
    torch.distributed.broadcast_object_list(box, src=src)
    return box[0]


def barrier() -> None:
    if _active():
        torch.distributed.barrier()
