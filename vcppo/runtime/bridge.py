"""Split placement's process groups and transport: rollout ranks apart from training ranks.

The launcher (deepspeed, torchrun, SLURM) starts W processes as usual. With
``placement.mode=split`` the last R of them are *rollout ranks* (vLLM only) and the first
T = W - R *training ranks* (actor, critic, reference). Each process learns its role from its
rank and joins its role's own default process group (a "role world"), made from the launcher's
one rendezvous store under a per-role prefix: ZeRO-3 and every collective of the training code run
among the training ranks only, vLLM's tensor-parallel groups among the rollout ranks only. The
environment's RANK / WORLD_SIZE are rewritten to the role world's (DeepSpeed and vLLM read them);
the launcher's values stay in VCPPO_GLOBAL_RANK / VCPPO_GLOBAL_WORLD_SIZE.

Three more groups join training rank 0 (bridge rank 0) with every rollout rank (bridge ranks
1..R), built from the same store outside torch.distributed's registry, so neither world's
collectives can interleave with them:

* ``control`` (gloo): trainer 0 broadcasts control messages (pickled objects);
* ``weights`` (gloo on CPU, NCCL on GPU): trainer 0 broadcasts the actor's weights, packed into
  flat buckets, right after the control message that announces them;
* ``data`` (gloo, trainer 0 and rollout rank 0 only): rollout rank 0 sends scored batches and
  validation results to trainer 0.

Sends and broadcasts from trainer 0 are asynchronous (the trainer goes on training while a
rollout rank is still sampling); their buffers are kept until they complete.

With ``placement.critic_ranks`` = C the middle C ranks hold the critic only (a third role world),
and each training rank i and critic rank i share a :class:`CriticLink`: two gloo groups of two,
one per direction, carrying pickled objects (the step's share, V_old, metrics, commands).
"""
from __future__ import annotations

import os
import pickle
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as tdist

from vcppo.config.placement import Roles


def init_role_world(roles: Roles, rank: int, backend: str, timeout: timedelta, store: tdist.Store) -> None:
    """Make ``rank``'s role world the default process group, from the launcher's rendezvous ``store``
    (shared with the bridge). The environment is rewritten to the role world's RANK / WORLD_SIZE."""
    role = roles.role_of(rank)
    os.environ["VCPPO_GLOBAL_RANK"], os.environ["VCPPO_GLOBAL_WORLD_SIZE"] = str(rank), str(roles.world_size)
    os.environ["VCPPO_ROLE"] = role
    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(roles.role_rank(rank)), str(roles.role_size(rank))
    tdist.init_process_group(backend, store=tdist.PrefixStore(f"vcppo/{role}/", store),
                             rank=roles.role_rank(rank), world_size=roles.role_size(rank), timeout=timeout)


def _group(store, name: str, rank: int, size: int, backend: str, timeout: timedelta):
    prefixed = tdist.PrefixStore(f"vcppo/bridge/{name}/", store)
    if backend == "nccl":
        opts = tdist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        return tdist.ProcessGroupNCCL(prefixed, rank, size, opts)
    return tdist.ProcessGroupGloo(prefixed, rank, size, timeout)


def _to_bytes(obj) -> torch.Tensor:
    return torch.frombuffer(bytearray(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)), dtype=torch.uint8)


def _from_bytes(t: torch.Tensor):
    return pickle.loads(t.numpy().tobytes())


@dataclass(frozen=True)
class TensorSlot:
    """Where one named tensor lies in the packed weight buckets."""
    name: str
    shape: tuple
    dtype: torch.dtype
    bucket: int
    offset: int
    numel: int


@dataclass(frozen=True)
class WeightsLayout:
    """The packing of one weight transfer: the slots, and each bucket's (dtype, numel)."""
    slots: tuple
    buckets: tuple


def pack_weights(named: list[tuple[str, torch.Tensor]], bucket_bytes: int) -> tuple[WeightsLayout, list[torch.Tensor]]:
    """Flat buckets of one dtype each, at most ~``bucket_bytes`` (a larger tensor gets its own)."""
    slots, buckets, parts = [], [], []
    current: dict[torch.dtype, int] = {}  # dtype -> the bucket being filled
    for name, t in named:
        b = current.get(t.dtype)
        if b is None or (buckets[b][1] + t.numel()) * t.element_size() > bucket_bytes and buckets[b][1] > 0:
            b = len(buckets)
            buckets.append([t.dtype, 0])
            parts.append([])
            current[t.dtype] = b
        slots.append(TensorSlot(name, tuple(t.shape), t.dtype, b, buckets[b][1], t.numel()))
        buckets[b][1] += t.numel()
        parts[b].append(t.detach().reshape(-1))
    flat = [torch.cat(p) if len(p) > 1 else p[0].clone() for p in parts]
    return WeightsLayout(tuple(slots), tuple((d, n) for d, n in buckets)), flat


def unpack_weights(layout: WeightsLayout, flat: list[torch.Tensor]) -> list[tuple[str, torch.Tensor]]:
    """The named tensors of :func:`pack_weights` (views into ``flat``)."""
    return [(s.name, flat[s.bucket][s.offset:s.offset + s.numel].view(s.shape)) for s in layout.slots]


def _post(group, root: int, obj) -> list[tuple[object, torch.Tensor]]:
    """Broadcast the pickled ``obj`` from ``root`` (a size header, then the payload), asynchronously:
    the works and the buffers they read, to be kept until they complete."""
    payload = _to_bytes(obj)
    size = torch.tensor([payload.numel()], dtype=torch.int64)
    return [(group.broadcast(size, root), size), (group.broadcast(payload, root), payload)]


class _Sends:
    """Asynchronous sends and the buffers they read, kept until the sends complete."""

    def __init__(self):
        self.pending: list[tuple[object, torch.Tensor]] = []

    def add(self, sends: list[tuple[object, torch.Tensor]]) -> None:
        self.pending += sends

    def reap(self) -> None:
        """Drop the buffers of completed sends."""
        self.pending = [(w, b) for w, b in self.pending if not w.is_completed()]

    def flush(self) -> None:
        """Wait for every send."""
        for work, _ in self.pending:
            work.wait()
        self.pending.clear()


class _Inbox:
    """The receiving end of pickled objects that ``root`` broadcasts in ``group`` (a size header,
    then the payload). :meth:`ready` posts the header's receive and asks whether it completed, so a
    member can poll without blocking; :meth:`receive` then finishes that same receive."""

    def __init__(self, group, root: int):
        self.group, self.root = group, root
        self._header: tuple | None = None  # a posted header receive: (work, tensor)

    def ready(self) -> bool:
        if self._header is None:
            size = torch.zeros(1, dtype=torch.int64)
            self._header = (self.group.broadcast(size, self.root), size)
        return self._header[0].is_completed()

    def receive(self):
        self.ready()
        work, size = self._header
        self._header = None
        work.wait()
        payload = torch.empty(int(size.item()), dtype=torch.uint8)
        self.group.broadcast(payload, self.root).wait()
        return _from_bytes(payload)


class Bridge:
    """The three bridge groups of one member (trainer 0 or a rollout rank)."""

    def __init__(self, store, roles: Roles, rank: int, weights_backend: str, device: torch.device,
                 timeout: timedelta):
        self.rank = roles.bridge_rank(rank)
        if self.rank is None:
            raise ValueError(f"rank {rank} is not a member of the bridge (training rank 0 and the rollout ranks)")
        self.size, self.device = roles.rollout_ranks + 1, device
        self.control = _group(store, "control", self.rank, self.size, "gloo", timeout)
        # trainer 0 and rollout rank 0 only: the rollout ranks gather a batch on their rank 0 first
        self.data = _group(store, "data", self.rank, 2, "gloo", timeout) if self.rank <= 1 else None
        self.weights = _group(store, "weights", self.rank, self.size, weights_backend, timeout)
        self._sends = _Sends()
        # what a member receives: the rollout ranks control from trainer 0, trainer 0 data from rollout rank 0
        self._control_in = _Inbox(self.control, 0) if self.rank > 0 else None
        self._data_in = _Inbox(self.data, 1) if self.rank == 0 else None

    # --- trainer 0 -> every rollout rank -------------------------------------------------------
    def broadcast_control(self, obj, weights: list[torch.Tensor] = ()) -> None:
        """Root: ``obj`` (and then the weight buckets), asynchronously."""
        self._sends.add(_post(self.control, 0, obj))
        for bucket in weights:
            bucket = bucket.to(self.device)
            self._sends.add([(self.weights.broadcast([bucket]), bucket)])

    def control_ready(self) -> bool:
        """Member: a control message has arrived (never blocks)."""
        return self._control_in.ready()

    def receive_control(self):
        """Member: the next control message (blocking)."""
        return self._control_in.receive()

    def receive_weights(self, layout: WeightsLayout) -> list[tuple[str, torch.Tensor]]:
        """Member: the weight buckets announced by the last control message, unpacked."""
        flat = [torch.empty(n, dtype=dtype, device=self.device) for dtype, n in layout.buckets]
        for bucket in flat:
            self.weights.broadcast([bucket]).wait()
        return unpack_weights(layout, flat)

    # --- rollout rank 0 -> trainer 0 -----------------------------------------------------------
    def send(self, obj) -> None:
        """Rollout rank 0: ``obj`` to trainer 0, asynchronously (in order with earlier sends).

        A broadcast from bridge rank 1 in the two-member data group, not a gloo ``send``: gloo's
        point-to-point send only makes progress while the sender waits on it, a collective runs
        on the group's own threads, so the rollout rank goes on sampling while it is delivered."""
        self._sends.add(_post(self.data, 1, obj))

    def data_ready(self) -> bool:
        """Trainer 0: an object from rollout rank 0 has arrived (never blocks)."""
        return self._data_in.ready()

    def receive(self):
        """Trainer 0: the next object rollout rank 0 sent (blocking)."""
        return self._data_in.receive()

    # --- both ------------------------------------------------------------------------------------
    def reap(self) -> None:
        """Drop the buffers of completed asynchronous sends."""
        self._sends.reap()

    def flush(self) -> None:
        """Wait for every asynchronous send of this member."""
        self._sends.flush()


class CriticLink:
    """A training rank and its critic rank (``placement.critic_ranks``): two gloo groups of two, one
    per direction (a group's broadcasts are matched in issue order, so each has one sender).
    Objects are pickled and sent asynchronously, as on the bridge."""

    def __init__(self, store, roles: Roles, rank: int, timeout: timedelta):
        partner = roles.critic_partner(rank)
        if partner is None:
            raise ValueError(f"rank {rank} has no critic partner (placement.critic_ranks = {roles.critic_ranks})")
        pair = min(rank, partner)  # the training rank's index names the pair
        self.me = 0 if rank < partner else 1  # 0: the training rank, 1: the critic rank
        # in each group the sender is rank 0; both members build "down" first (building is collective)
        down = _group(store, f"critic{pair}/down", self.me, 2, "gloo", timeout)
        up = _group(store, f"critic{pair}/up", 1 - self.me, 2, "gloo", timeout)
        self._out, inbound = (down, up) if self.me == 0 else (up, down)
        self._in = _Inbox(inbound, 0)
        self._sends = _Sends()

    def send(self, obj) -> None:
        self._sends.reap()
        self._sends.add(_post(self._out, 0, obj))

    def receive(self):
        """The partner's next object (blocking)."""
        return self._in.receive()

    def flush(self) -> None:
        self._sends.flush()
