"""Split placement's transport (vcppo.runtime.bridge): roles from ranks, weight packing, and the
bridge groups on three real gloo processes (1 training rank + 2 rollout ranks)."""
import os
import time

import pytest
import torch
import torch.multiprocessing as mp

from vcppo.runtime.launch_env import free_port
from vcppo.config.placement import Roles
from vcppo.runtime.bridge import pack_weights, unpack_weights


def test_roles_put_the_rollout_ranks_last():
    roles = Roles(world_size=4, rollout_ranks=1)
    assert [roles.role_of(r) for r in range(4)] == ["train", "train", "train", "rollout"]
    assert [roles.role_rank(r) for r in range(4)] == [0, 1, 2, 0]
    assert [roles.role_size(r) for r in range(4)] == [3, 3, 3, 1]
    assert [roles.bridge_rank(r) for r in range(4)] == [0, None, None, 1]
    two = Roles(world_size=4, rollout_ranks=2)
    assert [two.bridge_rank(r) for r in range(4)] == [0, None, 1, 2]


@pytest.mark.parametrize("world, rollout", [(1, 1), (2, 2), (3, 0)])
def test_roles_need_a_rank_of_each_kind(world, rollout):
    with pytest.raises(ValueError, match="placement.rollout_ranks"):
        Roles(world_size=world, rollout_ranks=rollout)


def test_pack_unpack_round_trip_buckets_by_dtype_and_size():
    g = torch.Generator().manual_seed(0)
    named = [("a", torch.randn(3, 4, generator=g)), ("b", torch.randn(5, generator=g).to(torch.bfloat16)),
             ("c", torch.randn(2, 2, generator=g)), ("big", torch.randn(100, generator=g)),
             ("d", torch.randn(7, generator=g))]
    layout, flat = pack_weights(named, bucket_bytes=128)  # 32 fp32 values per bucket
    assert all(len({s.dtype for s in layout.slots if s.bucket == b}) == 1 for b in range(len(flat)))
    assert [f.dtype for f in flat] == [d for d, _ in layout.buckets]
    assert [f.numel() for f in flat] == [n for _, n in layout.buckets]
    assert sum(f.numel() for f in flat) == sum(t.numel() for _, t in named)
    # a tensor larger than a bucket gets one of its own; the others share within the bound
    big = next(s for s in layout.slots if s.name == "big")
    assert layout.buckets[big.bucket][1] == 100
    assert layout.slots[0].bucket == layout.slots[2].bucket  # a (12) and c (4) share a bucket
    out = unpack_weights(layout, flat)
    assert [n for n, _ in out] == [n for n, _ in named]
    for (_, want), (_, got) in zip(named, out):
        assert got.dtype == want.dtype and torch.equal(got, want)
    named[0][1].add_(1.0)  # the buckets are copies, not views of the sources
    assert not torch.equal(out[0][1], named[0][1])


def _bridge_member(rank, port, out):
    from datetime import timedelta

    import torch.distributed as tdist

    from vcppo.runtime.bridge import Bridge, init_role_world
    from vcppo.runtime.launch_env import rendezvous_store
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="3")
    roles, timeout = Roles(world_size=3, rollout_ranks=2), timedelta(seconds=60)
    store = rendezvous_store(rank, 3, 60, 60)
    init_role_world(roles, rank, "gloo", timeout, store)
    # each role world is a default group of its own: an all-reduce sums within the role only
    total = torch.tensor([float(rank + 1)])
    tdist.all_reduce(total)
    out[f"role_sum{rank}"] = float(total.item())
    out[f"env{rank}"] = (os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["VCPPO_ROLE"])
    bridge = Bridge(store, roles, rank, "gloo", torch.device("cpu"), timeout)
    if rank == 0:
        layout, flat = pack_weights([("w", torch.arange(6.0).view(2, 3)), ("h", torch.ones(4, dtype=torch.float64))],
                                    bucket_bytes=1024)
        out["ready_before"] = bridge.data_ready()  # rollout rank 0 sends only after "hello"
        bridge.broadcast_control({"hello": 1, "layout": layout}, flat)
        while not bridge.data_ready():  # a poll never blocks, and a later receive finishes its header
            time.sleep(0.005)
        # rollout rank 0 sent both before it blocked on the next control message: its sends must
        # be delivered while it waits (a send that needs its sender to wait would deadlock here)
        out["from1"] = [bridge.receive(), bridge.receive()]
        bridge.broadcast_control("second")
        bridge.flush()
    else:
        msg = bridge.receive_control()
        weights = dict(bridge.receive_weights(msg["layout"]))
        out[f"got{rank}"] = (msg["hello"], weights["w"].tolist(), weights["h"].dtype == torch.float64)
        if rank == 1:
            bridge.send({"rank": rank})
            bridge.send(torch.arange(50_000))
        out[f"second{rank}"] = bridge.receive_control()
        bridge.flush()
    tdist.destroy_process_group()


@pytest.mark.distributed
def test_bridge_carries_control_weights_and_data_between_role_worlds():
    out = mp.get_context("spawn").Manager().dict()  # never a fork of this (large) process
    mp.start_processes(_bridge_member, args=(free_port(), out), nprocs=3, start_method="spawn", join=True)
    assert out["role_sum0"] == 1.0 and out["role_sum1"] == out["role_sum2"] == 2.0 + 3.0
    assert out["env0"] == ("0", "1", "train") and out["env2"] == ("1", "2", "rollout")
    for r in (1, 2):
        assert out[f"got{r}"] == (1, [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]], True)
        assert out[f"second{r}"] == "second"
    assert out["ready_before"] is False
    assert out["from1"][0] == {"rank": 1} and torch.equal(out["from1"][1], torch.arange(50_000))


def test_roles_with_critic_ranks_put_them_between_the_actor_and_rollout_ranks():
    roles = Roles(world_size=5, rollout_ranks=1, critic_ranks=2)
    assert [roles.role_of(r) for r in range(5)] == ["train", "train", "critic", "critic", "rollout"]
    assert [roles.role_rank(r) for r in range(5)] == [0, 1, 0, 1, 0]
    assert [roles.role_size(r) for r in range(5)] == [2, 2, 2, 2, 1]
    assert [roles.bridge_rank(r) for r in range(5)] == [0, None, None, None, 1]
    assert [roles.critic_partner(r) for r in range(5)] == [2, 3, 0, 1, None]
    assert Roles(world_size=4, rollout_ranks=1).critic_partner(0) is None


@pytest.mark.parametrize("world, rollout, critic", [(4, 1, 2), (4, 1, 1), (3, 2, 1)])
def test_critic_ranks_must_match_the_actor_ranks(world, rollout, critic):
    with pytest.raises(ValueError, match="placement"):
        Roles(world_size=world, rollout_ranks=rollout, critic_ranks=critic)


def _link_member(rank, port, out):
    from datetime import timedelta

    import torch.distributed as tdist

    from vcppo.runtime.bridge import CriticLink, init_role_world
    from vcppo.runtime.launch_env import rendezvous_store
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="3")
    roles, timeout = Roles(world_size=3, rollout_ranks=1, critic_ranks=1), timedelta(seconds=60)
    store = rendezvous_store(rank, 3, 60, 60)
    init_role_world(roles, rank, "gloo", timeout, store)
    if rank < 2:
        link = CriticLink(store, roles, rank, timeout)
        # both send before either receives: each direction has its own group, so nothing waits
        for i in range(3):
            link.send({"from": rank, "i": i, "payload": torch.full((1000,), float(rank))})
        out[f"got{rank}"] = [(m["from"], m["i"], float(m["payload"].sum())) for m in (link.receive() for _ in range(3))]
        link.flush()
    else:
        with pytest.raises(ValueError, match="no critic partner"):
            CriticLink(store, roles, rank, timeout)
        out["rollout"] = True
    tdist.destroy_process_group()


@pytest.mark.distributed
def test_critic_link_carries_objects_both_ways_between_an_actor_and_its_critic_rank():
    out = mp.get_context("spawn").Manager().dict()  # never a fork of this (large) process
    mp.start_processes(_link_member, args=(free_port(), out), nprocs=3, start_method="spawn", join=True)
    assert out["got0"] == [(1, i, 1000.0) for i in range(3)]
    assert out["got1"] == [(0, i, 0.0) for i in range(3)]
    assert out["rollout"]
