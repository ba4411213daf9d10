"""Objects: put/get, zero-copy reads from the shared-memory store, reference counting."""

from __future__ import annotations

import gc
import glob
import os
import threading

import numpy as np
import pyarrow as pa
import pytest

import lumos
from lumos.exceptions import ObjectStoreFullError

from ..conftest import wait_for


def store_dir() -> str:
    session = os.path.basename(lumos.api.worker_context.context.address_info["session_dir"])
    (d,) = glob.glob(f"/dev/shm/lumos-{session}-*")
    return d


def store_used() -> int:
    cw = lumos.api.worker_context.require()
    return cw.call_raylet(lumos._private.protocol.messages.GetNodeStats())["store"]["used_bytes"]


def test_put_get_small_and_large(fresh_cluster):
    fresh_cluster()
    assert lumos.get(lumos.put({"a": [1, 2]}), timeout=30) == {"a": [1, 2]}
    arr = np.arange(2_000_000, dtype=np.int64)
    out = lumos.get(lumos.put(arr), timeout=30)
    assert np.array_equal(out, arr)


def test_large_values_live_in_dev_shm_and_small_ones_do_not(fresh_cluster):
    fresh_cluster()
    before = set(os.listdir(store_dir()))
    small = lumos.put(b"x" * 1000)
    assert set(os.listdir(store_dir())) == before
    big = lumos.put(np.zeros(10 * 1024 * 1024, dtype=np.uint8))
    files = set(os.listdir(store_dir())) - before
    assert big.hex() in files
    del small, big


def test_numpy_get_is_zero_copy_read_only_and_shared(fresh_cluster):
    fresh_cluster()

    @lumos.remote
    def make():
        return np.arange(5_000_000, dtype=np.float64)

    ref = make.remote()  # written by a worker process
    a = lumos.get(ref, timeout=30)
    b = lumos.get(ref, timeout=30)
    assert not a.flags.writeable
    assert not a.flags.owndata
    assert np.shares_memory(a, b)
    with pytest.raises(ValueError):
        a[0] = 1.0
    assert a[-1] == 4_999_999.0


def test_put_by_driver_is_zero_copy_in_worker(fresh_cluster):
    fresh_cluster()
    ref = lumos.put(np.ones(4_000_000))

    @lumos.remote
    def probe(arr):
        return arr.flags.writeable, arr.flags.owndata, float(arr.sum())

    assert lumos.get(probe.remote(ref), timeout=30) == (False, False, 4_000_000.0)


def test_arrow_table_get_is_zero_copy(fresh_cluster):
    fresh_cluster()

    @lumos.remote
    def table():
        return pa.table({"x": pa.array(np.arange(2_000_000, dtype=np.int64))})

    ref = table.remote()
    t1 = lumos.get(ref, timeout=30)
    t2 = lumos.get(ref, timeout=30)
    assert t1.num_rows == 2_000_000
    buf1 = t1.column("x").chunk(0).buffers()[1]
    buf2 = t2.column("x").chunk(0).buffers()[1]
    assert buf1.address == buf2.address  # the same mapped memory
    assert not buf1.is_mutable


def test_put_and_drop_keeps_store_use_bounded(fresh_cluster):
    fresh_cluster(object_store_memory=600 * 1024 * 1024)
    arr = np.ones(50 * 1024 * 1024, dtype=np.uint8)
    peak = 0
    for _ in range(200):
        ref = lumos.put(arr)
        del ref
        peak = max(peak, store_used())
    assert peak <= 3 * 60 * 1024 * 1024, f"store use grew to {peak >> 20} MiB"


def test_freeing_last_ref_removes_the_file(fresh_cluster):
    fresh_cluster(_system_config={"object_store_recycle_bytes": 0})

    @lumos.remote
    def make():
        return np.zeros(3_000_000)

    ref = make.remote()
    lumos.get(ref, timeout=30)
    name = ref.hex()
    assert name in os.listdir(store_dir())
    del ref
    gc.collect()
    lumos.put(0)  # API calls apply dropped refs
    wait_for(lambda: name not in os.listdir(store_dir()), 10)


def test_value_survives_while_views_are_alive(fresh_cluster):
    fresh_cluster()
    ref = lumos.put(np.full(3_000_000, 7.0))
    view = lumos.get(ref, timeout=30)
    del ref
    for _ in range(5):  # reuse of freed slots must not overwrite live views
        lumos.put(np.zeros(3_000_000))
    assert view[0] == 7.0 and view[-1] == 7.0


def test_task_returns_and_args_reuse_freed_slots_without_changing_live_values(fresh_cluster):
    fresh_cluster()

    @lumos.remote
    def make(i):
        return np.full(2_000_000, float(i))

    @lumos.remote
    class Keeper:
        def keep(self, arr):
            self.arr = arr  # a view of the argument's store file, kept past the call

        def first_and_last(self):
            return float(self.arr[0]), float(self.arr[-1])

    keeper = Keeper.remote()
    lumos.get(keeper.keep.remote(np.full(2_000_000, -1.0)), timeout=30)
    kept = lumos.get(make.remote(0), timeout=30)  # a view of a return, its ref dropped
    for i in range(1, 6):
        assert lumos.get(make.remote(i), timeout=30)[-1] == i
        assert lumos.get(keeper.first_and_last.remote(), timeout=30) == (-1.0, -1.0)
    gc.collect()
    lumos.put(0)  # API calls apply dropped refs
    # A freed return nobody views goes back to the pool for the next create.
    wait_for(lambda: any(n.startswith("pool-") for n in os.listdir(store_dir())), 10)
    assert kept[0] == 0.0 and kept[-1] == 0.0
    for i in range(3):
        lumos.get(keeper.keep.remote(np.full(2_000_000, float(i))), timeout=30)
        lumos.put(np.zeros(2_000_000))
    assert lumos.get(keeper.first_and_last.remote(), timeout=30) == (2.0, 2.0)


def test_return_freed_while_viewed_is_pooled_when_its_last_view_goes(fresh_cluster):
    fresh_cluster()

    @lumos.remote
    def make():
        return np.full(2_000_000, 3.0)

    ref = make.remote()
    out = lumos.get(ref, timeout=30)  # the usual loop: the array outlives its ref
    name = ref.hex()
    del ref
    gc.collect()
    lumos.put(0)  # API calls apply dropped refs
    assert name in os.listdir(store_dir())  # still viewed here: not freed yet
    assert out[0] == 3.0 and out[-1] == 3.0
    del out
    gc.collect()
    wait_for(lambda: name not in os.listdir(store_dir()), 10)
    assert any(n.startswith("pool-") for n in os.listdir(store_dir()))
    assert lumos.get(make.remote(), timeout=30)[-1] == 3.0


def test_put_larger_than_store_fails_clearly_and_nothing_breaks(fresh_cluster):
    fresh_cluster(object_store_memory=64 * 1024 * 1024, _system_config={"object_spilling_enabled": False})
    with pytest.raises(ObjectStoreFullError, match="larger than the object store"):
        lumos.put(np.zeros(100 * 1024 * 1024, dtype=np.uint8))
    ok = lumos.put(np.zeros(10 * 1024 * 1024, dtype=np.uint8))
    assert lumos.get(ok, timeout=30).nbytes == 10 * 1024 * 1024


def test_store_full_of_live_objects_raises_after_waiting(fresh_cluster):
    fresh_cluster(object_store_memory=64 * 1024 * 1024, _system_config={"object_spilling_enabled": False})
    keep = [lumos.put(np.zeros(20 * 1024 * 1024, dtype=np.uint8)) for _ in range(3)]
    with pytest.raises(ObjectStoreFullError, match="full"):
        lumos.put(np.zeros(20 * 1024 * 1024, dtype=np.uint8))
    del keep
    gc.collect()
    lumos.put(0)
    assert lumos.get(lumos.put(np.zeros(20 * 1024 * 1024, dtype=np.uint8)), timeout=30).size


def test_put_of_objectref_is_rejected(fresh_cluster):
    fresh_cluster()
    with pytest.raises(TypeError, match="ObjectRef"):
        lumos.put(lumos.put(1))


def test_ref_created_in_task_and_returned_nested_stays_readable(fresh_cluster):
    fresh_cluster()

    @lumos.remote
    def make_inner():
        return [lumos.put(np.full(1_000_000, 3.0)), lumos.put("small")]

    outer = lumos.get(make_inner.remote(), timeout=30)
    gc.collect()
    big, small = lumos.get(outer, timeout=30)
    assert big[0] == 3.0 and small == "small"


def test_ref_round_trip_through_task_keeps_driver_object_alive(fresh_cluster):
    fresh_cluster()

    @lumos.remote
    def echo(items):
        return items

    ref = lumos.put(np.full(1_000_000, 5.0))
    back = echo.remote([ref])
    del ref
    gc.collect()
    (inner,) = lumos.get(back, timeout=30)
    assert lumos.get(inner, timeout=30)[0] == 5.0


def test_an_argument_a_task_keeps_survives_its_ref_and_the_slots_reuse(fresh_cluster):
    fresh_cluster(num_cpus=1)

    @lumos.remote
    class Keeper:
        def keep(self, arr):
            self.kept = arr  # outlives the call: its store view must stay mapped and pinned
            return float(arr.sum())

        def total(self):
            return float(self.kept.sum())

    k = Keeper.remote()
    ref = lumos.put(np.full(2 * 2**20, 3.0, dtype=np.float32))
    assert lumos.get(k.keep.remote(ref), timeout=30) == 3.0 * 2 * 2**20
    del ref
    gc.collect()
    for i in range(4):  # same-sized objects: the freed slot would be reused were it not pinned
        lumos.get(lumos.put(np.full(2 * 2**20, float(i), dtype=np.float32)), timeout=30)
    assert lumos.get(k.total.remote(), timeout=30) == 3.0 * 2 * 2**20


def test_a_worker_unmaps_an_argument_it_did_not_keep_after_the_task(fresh_cluster):
    fresh_cluster(num_cpus=1)

    @lumos.remote
    def touch(arr):
        return os.getpid(), float(arr.sum())

    ref = lumos.put(np.ones(4 * 2**20, dtype=np.float32))
    pid, total = lumos.get(touch.remote(ref), timeout=30)
    assert total == 4 * 2**20
    name = ref.hex()  # still referenced here: the file keeps its name

    def unmapped() -> bool:
        with open(f"/proc/{pid}/maps") as f:
            return name not in f.read()

    wait_for(unmapped, 10)


def test_store_frees_of_one_io_loop_turn_reach_the_raylet_as_one_message(fresh_cluster):
    from lumos._private.protocol import messages as m
    from lumos.api import worker_context
    fresh_cluster(num_cpus=1)
    cw = worker_context.core_worker
    size = len(lumos.put(np.ones(2**18))._id)
    ids = [bytes([i]) * size for i in range(3)]  # ids the raylet does not know: freeing them does nothing
    sent: list[m.FreeObjects] = []
    notify = cw.raylet.notify

    def spy(msg):
        if isinstance(msg, m.FreeObjects):
            sent.append(msg)
        notify(msg)

    async def release_in_one_turn():
        cw.raylet.notify = spy
        for oid in ids:  # as the replies of three tasks read at once release their arguments
            cw._send_releases([oid], [False], {})

    cw.io.run_sync(release_in_one_turn(), 10)
    wait_for(lambda: sent, 10)
    cw.raylet.notify = notify
    assert [msg.object_ids for msg in sent] == [ids]


def test_a_get_of_many_values_pins_them_in_one_message_and_dropping_them_unpins_in_one(fresh_cluster):
    from lumos._private.protocol import messages as m
    from lumos.api import worker_context
    fresh_cluster(num_cpus=1)
    cw = worker_context.core_worker

    @lumos.remote
    def make(i):
        return np.full(2**17, float(i))  # 1 MiB: in the store

    refs = [make.remote(i) for i in range(4)]
    lumos.wait(refs, num_returns=4, timeout=30)
    sent: list[m.PinObjects] = []
    to_raylet = cw._to_raylet

    def spy(msg):
        if isinstance(msg, m.PinObjects):
            sent.append(msg)
        to_raylet(msg)

    notify = cw.raylet.notify

    def spy_notify(msg):  # the io thread's flushes write pins straight to the link
        if isinstance(msg, m.PinObjects):
            sent.append(msg)
        return notify(msg)

    cw._to_raylet = spy
    cw.raylet.notify = spy_notify
    try:
        values = lumos.get(refs, timeout=30)
        assert [float(v[0]) for v in values] == [0.0, 1.0, 2.0, 3.0]
        assert [(sorted(p.object_ids), p.pinned) for p in sent] == [(sorted(r._id for r in refs), True)]
        del values
        wait_for(lambda: len(sent) == 2, 10)
        assert (sorted(sent[1].object_ids), sent[1].pinned) == (sorted(r._id for r in refs), False)
        one = lumos.get(refs[0], timeout=30)  # a lone view: pinned at once
        assert (sent[2].object_ids, sent[2].pinned) == ([refs[0]._id], True)
        del one
    finally:
        cw._to_raylet = to_raylet
        del cw.raylet.notify


def test_a_dropped_value_is_unpinned_with_its_free_without_a_wake_up_of_its_own(fresh_cluster, monkeypatch):
    """``get(f.remote())`` in a loop: the value's unpin waits for its free and goes first
    in the same turn (the raylet then reuses its slot); no io-thread wake-up of its own."""
    from lumos._private.ids import TASK_ID_SIZE
    from lumos._private.protocol import messages as m
    from lumos.api import worker_context
    fresh_cluster(num_cpus=1)
    cw = worker_context.core_worker

    @lumos.remote
    def make():
        return np.ones(2**17)  # 1 MiB: in the store

    ref = make.remote()
    value = lumos.get(ref, timeout=30)
    oid = ref._id
    ref_task_id = oid[:TASK_ID_SIZE]
    assert ref_task_id in cw.owner.lineage  # kept while its return lives (to rebuild it)
    posted, sent, writes = [], [], []
    post, notify, write_now, write_all_now = cw._post, cw.raylet.notify, cw.raylet.write_now, cw.raylet.write_all_now
    monkeypatch.setattr(cw, "_post", lambda fn, *args: (posted.append(getattr(fn, "__name__", "")),
                                                         post(fn, *args))[1])

    def note(msg):
        if isinstance(msg, (m.PinObjects, m.FreeObjects)) and oid in msg.object_ids:
            sent.append((type(msg).__name__, getattr(msg, "pinned", None), getattr(msg, "recyclable", None)))

    def spy(send):
        def sending(msg, *args, **kwargs):
            note(msg)
            return send(msg, *args, **kwargs)
        return sending

    def spy_all(msgs):
        writes.append(threading.current_thread().name)
        for msg in msgs:
            note(msg)
        return write_all_now(msgs)

    monkeypatch.setattr(cw.raylet, "notify", spy(notify))
    monkeypatch.setattr(cw.raylet, "write_now", spy(write_now))
    monkeypatch.setattr(cw.raylet, "write_all_now", spy_all)
    assert float(value.sum()) == 2**17
    del value
    assert "_flush_pins" not in posted
    wait_for(cw.io.idle, 10)
    del ref
    cw.drain_refs()
    wait_for(lambda: len(sent) == 2, 10)
    assert sent == [("PinObjects", False, None), ("FreeObjects", None, [True])]
    # Both left from this thread in one write: the io thread was not woken for them, nor
    # for the task's lineage (dropped at its next turn), so the next call can be written
    # straight to its worker.
    assert writes == [threading.current_thread().name]
    assert "_send_releases" not in posted and "_drop_lineage" not in posted
    wait_for(lambda: ref_task_id not in cw.owner.lineage, 10)
    # An unpin with no free behind it still goes, within the flush interval.
    ref = make.remote()
    value = lumos.get(ref, timeout=30)
    oid = ref._id
    del value
    wait_for(lambda: ("PinObjects", False, None) in sent[2:], 10)
    assert "_flush_pins" not in posted


def test_awaiting_refs_from_asyncio_and_cancelling_the_awaiting_task(fresh_cluster, caplog):
    # ``await ref`` in the driver's own event loop; a cancelled awaiting task leaves no
    # error behind (its value, ready later, went to a cancelled future and logged a
    # traceback: "object-ready callback failed ... InvalidStateError").
    import asyncio
    import logging
    import time

    fresh_cluster(num_cpus=2, include_dashboard=False)

    @lumos.remote
    def slow(x, s):
        time.sleep(s)
        return x

    async def main():
        assert await slow.remote(1, 0) == 1
        assert sum(await asyncio.gather(*[slow.remote(i, 0) for i in range(10)])) == 45
        waiting = [asyncio.ensure_future(slow.remote(i, 0.3)) for i in range(4)]
        waiting.append(asyncio.ensure_future(asyncio.wrap_future(slow.remote(9, 0.3).future())))
        await asyncio.sleep(0.05)
        for t in waiting:
            t.cancel()
        for t in waiting:
            with pytest.raises(asyncio.CancelledError):
                await t
        await asyncio.sleep(1.0)  # the values arrive meanwhile
        return await slow.remote(2, 0)

    with caplog.at_level(logging.ERROR, logger="lumos"):
        assert asyncio.run(main()) == 2
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
