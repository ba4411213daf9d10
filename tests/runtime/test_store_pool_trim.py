"""Freed store files kept for reuse, and slots reserved for a process's next puts, go
once idle (``object_store_pool_idle_s``)."""

from __future__ import annotations

import os

import lumos
from lumos._private import worker_context
from lumos._private.object_store import store_state as st
from tests.conftest import wait_for

MiB = 1024 * 1024
D = "/dev/shm/lumos-test"


def made(s: st.ObjectStoreState, oid: bytes, client: bytes) -> None:
    s.handle(st.CreateRequested(1, oid, MiB, client), 0.0)
    s.handle(st.ObjectSealed(oid, MiB), 0.0)


def freed(s: st.ObjectStoreState, oid: bytes, now: float) -> None:
    """``oid`` freed at ``now``: its slot is pooled."""
    assert [type(a) for a in s.handle(st.ObjectsFreed([oid], [True]), now)] == [st.RenameFile]


def test_pooled_slots_idle_past_the_limit_are_unlinked_and_their_mapper_told() -> None:
    s = st.ObjectStoreState(D, 64 * MiB, 32 * MiB, 2.0, validate=True, pool_idle_s=30.0)
    made(s, b"a", b"w1")
    made(s, b"b", b"w2")
    freed(s, b"a", 0.0)
    freed(s, b"b", 10.0)
    assert s.handle(st.Ticked(), 29.9) == []
    assert s.pool_bytes == 2 * MiB
    # The first slot's 30 s are up: it goes, the younger one stays.
    assert s.handle(st.Ticked(), 30.0) == [st.UnlinkFile(f"{D}/pool-1"), st.DropSlot(b"w1", 1)]
    assert s.pool_bytes == MiB and s.used_bytes == MiB and s.stats()["trimmed_slots"] == 1
    # A create takes the other one back before its time: the slot is pooled again later,
    # and its idle time counts from then.
    (grant,) = [a for a in s.handle(st.CreateRequested(2, b"c", MiB, b"w2"), 35.0) if isinstance(a, st.GrantCreate)]
    assert grant.reused and grant.slot == 2
    s.handle(st.ObjectSealed(b"c", MiB), 35.0)
    s.handle(st.ObjectsFreed([b"c"], [True]), 50.0)
    assert s.handle(st.Ticked(), 79.0) == []
    assert s.handle(st.Ticked(), 80.0) == [st.UnlinkFile(f"{D}/pool-2"), st.DropSlot(b"w2", 2)]
    assert s.pool_bytes == 0 and s.used_bytes == 0 and s.stats()["trimmed_slots"] == 2


def test_reserved_slots_unused_past_the_limit_are_taken_back() -> None:
    s = st.ObjectStoreState(D, 64 * MiB, 32 * MiB, 2.0, validate=True, pool_idle_s=30.0)
    (grant,) = [a for a in s.handle(st.SlotsReserveRequested(1, b"w1", MiB, 2), 0.0) if isinstance(a, st.GrantSlots)]
    assert [slot for slot, *_ in grant.slots] == [1, 2]
    # One is used for a put at 10 s: an object now, not a reservation.
    s.handle(st.ReservedSealed(b"w1", 1, b"o1", MiB, MiB), 10.0)
    assert s.handle(st.Ticked(), 29.0) == []
    assert s.handle(st.Ticked(), 30.0) == [st.UnlinkFile(f"{D}/resv-2"), st.DropSlot(b"w1", 2)]
    assert s.reserved_bytes == 0 and s.used_bytes == MiB and b"o1" in s.objects


def test_without_an_idle_limit_pooled_slots_stay() -> None:
    s = st.ObjectStoreState(D, 64 * MiB, 32 * MiB, 2.0, validate=True)
    made(s, b"a", b"w1")
    freed(s, b"a", 0.0)
    assert s.handle(st.Ticked(), 1e9) == [] and s.pool_bytes == MiB


def test_a_burst_leaves_no_store_files_on_an_idle_node(fresh_cluster) -> None:
    import numpy as np
    fresh_cluster(num_cpus=1, include_dashboard=False, _system_config={"object_store_pool_idle_s": 1.0})
    store_dir = os.path.dirname(worker_context.core_worker.store._prefix)

    @lumos.remote
    def make(i: int) -> np.ndarray:
        return np.full(MiB, i, dtype=np.uint8)

    assert [int(a[0]) for a in lumos.get([make.remote(i) for i in range(20)], timeout=60)] == list(range(20))
    refs = [lumos.put(np.ones(MiB, dtype=np.uint8)) for _ in range(20)]
    del refs
    # Freed, the values' files are kept for reuse a while, and slots are reserved for the
    # processes' next puts; then all are removed: the node holds no /dev/shm for them,
    # and its row says so.
    wait_for(lambda: not [n for n in os.listdir(store_dir) if n.startswith(("pool-", "resv-"))], 20)
    wait_for(lambda: lumos.state.list_nodes()[0]["object_store_pooled_bytes"] == 0, 10)
    # The store still serves new values.
    assert int(lumos.get(make.remote(7), timeout=30)[0]) == 7
