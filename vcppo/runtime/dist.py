"""Process-group set-up shared by every engine: the default group (or the groups a placement sets up), the
process's exit and the ordered teardown (the launcher's environment: :mod:`vcppo.runtime.launch_env`;
the collectives: :mod:`vcppo.runtime.collectives`).

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
import sys
import warnings
from dataclasses import dataclass
from typing import Callable

import torch

from vcppo.config.placement import BOTH
from vcppo.runtime.launch_env import (free_port, private_extension_dir, rendezvous_store, shm_segment,
                                     skip_shm_collective, slurm_launcher_env, unlink_shm_segment, use_cuda)


@dataclass
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str
    is_main: bool
    role: str = BOTH     # vcppo.config.placement: TRAIN, CRITIC or ROLLOUT where ranks have roles


@dataclass(frozen=True)
class GroupSetup:
    """What a placement's own process groups are made from (:func:`init_distributed`'s ``groups``): the
    launcher's rank and world, the device, the backend, the collectives' timeout and the rendezvous store."""
    rank: int
    world: int
    local_rank: int
    device: torch.device
    backend: str
    timeout_s: float
    store: object


_INFO: DistInfo | None = None
_CLOSERS: list[Callable[[], None]] = []
_EVER_INITIALISED = False  # a process group was set up in this process (exit_process)


def init_distributed(device: str = "auto", timeout_s: float = 1800.0, rendezvous_timeout_s: float = 600.0,
                     groups: Callable[[GroupSetup], DistInfo] | None = None) -> DistInfo:
    """Initialise (once) the default process group and return this rank's :class:`DistInfo`.

    ``rendezvous_timeout_s`` bounds the ranks' meeting at MASTER_ADDR:MASTER_PORT (a
    :class:`~vcppo.runtime.launch_env.RendezvousError` past it), ``timeout_s`` every collective after it.

    ``groups``: a placement whose ranks have roles sets up its own groups from the rendezvous store
    (:meth:`vcppo.config.placement.Placement.init_groups`; split placement's role worlds and bridge:
    :mod:`vcppo.runtime.bridge`) and returns this rank's DistInfo."""
    global _INFO, _EVER_INITIALISED
    if _INFO is not None:
        return _INFO
    _EVER_INITIALISED = True
    cuda = use_cuda(device)
    if not cuda:
        os.environ["DS_ACCELERATOR"] = "cpu"  # must precede `import deepspeed`
    # torchrun / deepspeed set these (srun sets SLURM's, mapped here); a plain `python` run is rank 0 of 1.
    for key, value in slurm_launcher_env(os.environ).items():
        os.environ.setdefault(key, value)
    rank = int(os.environ.setdefault("RANK", "0"))
    world = int(os.environ.setdefault("WORLD_SIZE", "1"))
    local_rank = int(os.environ.setdefault("LOCAL_RANK", str(rank)))
    os.environ.setdefault("LOCAL_WORLD_SIZE", os.environ.get("LOCAL_SIZE") or str(world))  # LOCAL_SIZE: deepspeed's
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
    private_extension_dir()
    import deepspeed  # noqa: E402,F401  (after DS_ACCELERATOR: it fixes its accelerator at import)

    # DeepSpeed 0.19 calls a torch collective that torch 2.13 deprecates, once per ZeRO-3 step:
    # a warning per step buries the progress bar and says nothing the user can act on.
    warnings.filterwarnings("ignore", message=r".*reduce_scatter_tensor.*is deprecated", category=FutureWarning)

    if groups is not None:
        store = rendezvous_store(rank, world, rendezvous_timeout_s, timeout_s)
        _INFO = groups(GroupSetup(rank, world, local_rank, dev, backend, timeout_s, store))
        return _INFO
    if not cuda and world == 1:
        skip_shm_collective()
    if not torch.distributed.is_initialized():
        _init_default_group(rank, world, backend, dev, timeout_s, rendezvous_timeout_s)
    if not cuda and world > 1:
        _release_shm_name(shm_segment(rank))
    _INFO = DistInfo(rank=rank, world_size=world, local_rank=local_rank, device=dev,
                     backend=backend, is_main=(rank == 0))
    return _INFO


def _release_shm_name(segment) -> None:
    """Remove this rank's DeepSpeed shm segment NAME once every rank has mapped it. DeepSpeed's CPU
    shm all-reduce opens its peers' segments by name only inside ``init_distributed`` (each rank
    waits there until every peer's exists), so once every rank is past it (the barrier) no one
    needs the names: the memory stays mapped in the ranks and goes back to the system when the last
    of them ends, however it ends. Left there, a name outlives a run that ends by an error (a bad
    data row, a config error found after start), ``os._exit`` or SIGKILL: ~66 MiB a rank in
    /dev/shm until reboot."""
    torch.distributed.barrier()
    unlink_shm_segment(segment)


def timeouts(trainer) -> dict[str, float]:
    """:func:`init_distributed`'s bounds from the config's ``trainer`` section (collective_timeout_s,
    rendezvous_timeout_s)."""
    return {"timeout_s": trainer.collective_timeout_s, "rendezvous_timeout_s": trainer.rendezvous_timeout_s}


def _init_default_group(rank: int, world: int, backend: str, dev: torch.device, timeout_s: float,
                        rendezvous_timeout_s: float) -> None:
    """The default group of all ranks, from a rendezvous bounded by ``rendezvous_timeout_s``; DeepSpeed adopts it."""
    from datetime import timedelta

    import deepspeed

    store = rendezvous_store(rank, world, rendezvous_timeout_s, timeout_s)
    # DeepSpeed binds the device where it makes the group itself (several CUDA ranks): so does this
    bind = {"device_id": dev} if dev.type == "cuda" and world > 1 else {}
    torch.distributed.init_process_group(backend, store=store, rank=rank, world_size=world,
                                         timeout=timedelta(seconds=timeout_s), **bind)
    deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False)


def exit_process(code: int) -> None:
    """End the process with ``code``; a process that had peers skips interpreter teardown.

    After :func:`shutdown` every result is written, but a multi-rank CPU process can still abort
    in C++ static destruction ("terminate called without an active exception", SIGABRT, rc -6):
    CI hit it twice in 2-rank gloo runs, once after the barrier of ``wait_for_peers`` was added,
    and the launcher then kills the healthy peer and reports the whole run failed. Python-level
    teardown is done by hand (streams, logging), then ``os._exit`` skips the C++ destructors.
    A single-rank process that ran engines does the same: the interpreter's teardown of torch and
    vLLM writes nothing and only costs time (:mod:`vcppo.runtime.lifetime`). Only a process that never
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
    rewritten to the rank within the role's world (:mod:`vcppo.runtime.bridge`)."""
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
    global _INFO
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
    _INFO = None


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


