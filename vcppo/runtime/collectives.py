"""The collectives the driver and the engines use, over the default process group: no-ops at world
size 1 (or before a group exists), so single-rank code calls them unconditionally."""
from __future__ import annotations

from typing import Any

import torch

from vcppo.runtime.dist import get_info


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
    info = get_info()
    return info.device if info is not None else torch.device("cpu")


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
