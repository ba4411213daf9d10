"""Copies into the object store: the parallel copy, preallocated files, reused slots."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from typing import Any

import numpy as np
import pytest

import lumos
from lumos._private import serialization as ser
from lumos._private.object_store.client import StoreClient
from lumos._private.object_store.memcpy import PIECE_ALIGN, PIECES_PER_THREAD, ParallelCopier

THRESHOLD = 64 * 1024


@pytest.fixture
def copier():
    c = ParallelCopier(threads=3, threshold_bytes=THRESHOLD)
    c.threads = 3  # whatever this machine's core count: exercise three pieces
    try:
        yield c
    finally:
        c.close()


@pytest.mark.parametrize("n", [1, THRESHOLD - 1, THRESHOLD, THRESHOLD + 1, 2 * THRESHOLD - 1,
                               2 * THRESHOLD, 2 * THRESHOLD + 1, 3 * THRESHOLD + 4097, 10 * THRESHOLD + 13])
@pytest.mark.parametrize("src_off,dst_off", [(0, 0), (1, 0), (0, 3), (7, 61)])
def test_parallel_copy_gives_identical_bytes_around_the_threshold_at_odd_alignments(copier, n, src_off, dst_off):
    rng = np.random.default_rng(n + src_off)
    src = rng.integers(0, 256, size=n + src_off, dtype=np.uint8)
    dst = np.zeros(n + dst_off + 5, dtype=np.uint8)
    copier.copy(memoryview(dst)[dst_off:dst_off + n], memoryview(src)[src_off:])
    assert np.array_equal(dst[dst_off:dst_off + n], src[src_off:])
    assert not dst[:dst_off].any() and not dst[dst_off + n:].any()  # nothing written outside


def test_parallel_copy_splits_large_copies_into_page_aligned_pieces_shared_by_helper_threads(copier):
    for n in (THRESHOLD, 2 * THRESHOLD + 1, 3 * THRESHOLD, 100 * THRESHOLD + 7):
        pieces = copier.pieces(n)
        assert pieces[0][0] == 0 and pieces[-1][1] == n
        assert all(a % PIECE_ALIGN == 0 for a, _ in pieces)
        assert all(b == a2 for (_, b), (a2, _) in zip(pieces, pieces[1:]))
        assert len(pieces) == max(1, min(3 * PIECES_PER_THREAD, n // THRESHOLD))
    src = np.arange(100 * THRESHOLD, dtype=np.uint8)
    dst = np.empty_like(src)
    copier.copy(memoryview(dst), memoryview(src))
    assert np.array_equal(dst, src)
    assert {"lumos-memcpy-1", "lumos-memcpy-2"} <= {t.name for t in threading.enumerate()}


def test_parallel_copy_leaves_no_export_of_the_buffers_behind(copier):
    import mmap
    mm = mmap.mmap(-1, 10 * THRESHOLD)
    src = bytearray(10 * THRESHOLD)
    with memoryview(mm) as dst:
        copier.copy(dst, memoryview(src))
    mm.close()  # BufferError if a helper thread still held a view of it
    src.extend(b"x")  # likewise for the source


def test_parallel_copy_refuses_a_destination_of_another_size(copier):
    with pytest.raises(ValueError, match="destination"):
        copier.copy(memoryview(bytearray(10)), memoryview(bytes(11)))


def test_copier_never_uses_more_threads_than_usable_cpus():
    c = ParallelCopier(threads=1000, threshold_bytes=THRESHOLD)
    assert c.threads == len(os.sched_getaffinity(0))


@pytest.fixture
def store_client():
    directory = tempfile.mkdtemp(prefix="lumos-test-copy-", dir="/dev/shm")
    client = StoreClient(directory, memcpy_threads=2, memcpy_threshold_bytes=THRESHOLD,
                         recycle_bytes=64 * 1024 * 1024)
    try:
        yield client
    finally:
        client.close()
        shutil.rmtree(directory)


def _write(client: StoreClient, oid: bytes, slot: int, value: np.ndarray, reused: bool,
           grant_name: str | None = None) -> str:
    sv = ser.serialize(value)
    final = os.path.join(client.directory, oid.hex())
    grant = os.path.join(client.directory, grant_name or oid.hex() + ".w")
    size = ((sv.total_size + 4095) & ~4095) + 64 * 1024  # a tail the copy never touches
    client.write(oid, grant, final, slot, size, reused, sv.total_size,
                 lambda dest, copy: sv.write_into(dest, copy), keep_mapping=True)
    return final


def test_new_store_file_is_preallocated_and_its_slot_reused_with_the_same_mapping(store_client):
    a = np.arange(300_000, dtype=np.int64)
    path = _write(store_client, b"a" * 20, 1, a, reused=False)
    st = os.stat(path)
    assert st.st_blocks * 512 >= st.st_size  # every page allocated at create (no holes)
    view = store_client.view(b"a" * 20)
    assert np.array_equal(ser.deserialize(view)[1], a)
    mapping = store_client._created[b"a" * 20]
    del view
    # The owner frees it: nobody views it, so the slot (and its faulted mapping) is pooled.
    assert store_client.release(b"a" * 20, shared=False) is True
    assert store_client.stats()["pooled_slots"] == 1
    pool = os.path.join(store_client.directory, "pool-1")
    os.rename(path, pool)  # what the raylet does with a recyclable slot
    # The next create of that slot writes through the same mapping (already-faulted pages).
    os.rename(pool, os.path.join(store_client.directory, (b"b" * 20).hex() + ".w"))
    b = np.full(300_000, 5, dtype=np.int64)
    _write(store_client, b"b" * 20, 1, b, reused=True)
    assert store_client._created[b"b" * 20] is mapping
    assert store_client.stats()["pooled_slots"] == 0
    assert np.array_equal(ser.deserialize(store_client.view(b"b" * 20))[1], b)
    # Freed and then dropped by the raylet (evicted): the mapping goes.
    assert store_client.release(b"b" * 20, shared=False) in (True, None)
    store_client.drop_slot(1)
    assert store_client.stats()["pooled_slots"] == 0


def test_put_and_task_args_of_sizes_around_the_copy_threshold_round_trip(fresh_cluster):
    fresh_cluster(_system_config={"memcpy_threshold_bytes": THRESHOLD, "memcpy_threads": 2})

    @lumos.remote
    def echo(x):
        return x

    raw = np.random.default_rng(0).integers(0, 256, size=8 * THRESHOLD + 64, dtype=np.uint8)
    for n in (2 * THRESHOLD - 1, 2 * THRESHOLD + 1, 5 * THRESHOLD + 4097):
        for off in (0, 1, 3):  # an array that starts at an odd address
            value = raw[off:off + n]
            assert np.array_equal(lumos.get(lumos.put(value), timeout=30), value)
            assert np.array_equal(lumos.get(echo.remote(value), timeout=30), value)


@pytest.mark.parametrize("sizes", [[1], [3, 64, 65], [0, 7, 1000, 4096 + 1]])
def test_inline_blob_is_the_same_bytes_as_the_store_layout(sizes):
    arrays = [np.arange(n, dtype=np.uint8) for n in sizes]
    sv = ser.serialize({"a": arrays, "x": 1})
    laid_out = bytearray(sv.total_size)
    sv.write_into(memoryview(laid_out))
    blob = sv.to_bytes()
    assert blob == bytes(laid_out)
    out = ser.deserialize(blob)[1]
    assert out["x"] == 1 and all(np.array_equal(a, b) for a, b in zip(out["a"], arrays))


def _sealed(s, client: bytes, n: int, first_request: int) -> tuple[list[bytes], list[int]]:
    from lumos._private.object_store import store_state as st
    oids, slots = [client + i.to_bytes(4, "big") for i in range(n)], []
    for i, oid in enumerate(oids):
        (g,) = s.handle(st.CreateRequested(first_request + i, oid, 1 << 20, client), 0)
        s.handle(st.ObjectSealed(oid, 1 << 20), 0)
        slots.append(g.slot)
    return oids, slots


def test_a_create_reuses_its_own_pooled_slot_behind_many_of_another_process():
    from lumos._private.object_store import store_state as st
    s = st.ObjectStoreState("/dev/shm/lumos-test", 4096 << 20, 2048 << 20, 5.0, validate=True)
    their_oids, theirs = _sealed(s, b"W1", 300, 0)
    my_oids, mine = _sealed(s, b"W2", 2, 1000)
    s.handle(st.ObjectsFreed(their_oids + my_oids, [True] * 302), 0)  # W1's slots are older
    grants = [a for a in s.handle(st.CreateRequested(2000, b"new", 1 << 20, b"W2"), 0)
              if isinstance(a, st.GrantCreate)]
    assert grants[0].reused and grants[0].slot == mine[-1]  # its newest: freed last
    # A process with no slot of its own gets the oldest that fits, and its mapper drops it.
    acts = s.handle(st.CreateRequested(2001, b"other", 1 << 20, b"W3"), 0)
    assert st.DropSlot(b"W1", theirs[0]) in acts
    # A process that goes leaves its slots to nobody (no DropSlot to a process that is gone).
    s.handle(st.ClientGone(b"W1"), 0)
    acts = s.handle(st.CreateRequested(2002, b"third", 1 << 20, b"W3"), 0)
    assert any(isinstance(a, st.GrantCreate) and a.reused for a in acts)
    assert not any(isinstance(a, st.DropSlot) for a in acts)
    assert len(s.pool) == 302 - 3 and s.pool_bytes == len(s.pool) << 20


def test_slot_pool_check_finds_a_drifted_index():
    from lumos._private.object_store.slot_pool import SlotPool
    pool = SlotPool()
    pool.add(1, 4096, b"W1", 0.0)
    pool.add(2, 4096, b"W2", 0.0)
    pool.check()
    pool._by_mapper[b"W2"][2] = 8192
    with pytest.raises(AssertionError, match="index"):
        pool.check()


def test_a_deferred_unmap_releases_the_pin_at_once_and_the_mapping_after(store_client):
    import weakref

    pins: list[tuple[bytes, bool]] = []
    store_client.on_pin = lambda oid, pinned: pins.append((oid, pinned))
    oid = b"d" * 20
    with open(os.path.join(store_client.directory, oid.hex()), "wb") as f:  # another process's object
        f.write(ser.serialize(np.ones(100_000)).to_bytes())
    store_client.defer_unmaps()
    view = store_client.view(oid)
    mm = weakref.ref(store_client._read[oid].mm)
    store_client.release(oid, shared=True)  # a task's argument: views keep the mapping
    del view
    # The executor sends the task's reply here: the pin is released before it, as always...
    assert pins == [(oid, True), (oid, False)]
    assert mm() is not None  # ...the munmap waits until after it
    store_client.unmap_deferred()
    assert mm() is None
    view = store_client.view(oid)  # not deferring: the last view unmaps at once
    mm = weakref.ref(store_client._read[oid].mm)
    store_client.release(oid, shared=True)
    del view
    assert mm() is None


def _foreign_object(client: StoreClient, oid: bytes) -> None:
    with open(os.path.join(client.directory, oid.hex()), "wb") as f:  # another process's object
        f.write(ser.serialize(np.ones(100_000)).to_bytes())


def test_an_argument_viewed_and_dropped_within_its_task_sends_no_pin(store_client):
    pins: list[tuple[bytes, bool]] = []
    store_client.on_pin = lambda oid, pinned: pins.append((oid, pinned))
    oid = b"h" * 20
    _foreign_object(store_client, oid)
    store_client.hold_pins()
    value = ser.deserialize(store_client.view(oid, hold_pin=True))[1]
    store_client.release(oid, shared=True)
    assert value.sum() == 100_000
    del value
    escaped: list[list[bytes]] = []
    store_client.escaped_pins(escaped.append)
    assert pins == [] and escaped == []
    view = store_client.view(oid)  # not holding (or not an argument): pinned at once
    assert pins == [(oid, True)]
    del view
    assert pins == [(oid, True), (oid, False)]


def test_an_argument_kept_past_its_task_is_pinned_before_the_reply(store_client):
    pins: list[tuple[bytes, bool]] = []
    store_client.on_pin = lambda oid, pinned: pins.append((oid, pinned))
    oid = b"k" * 20
    _foreign_object(store_client, oid)
    store_client.hold_pins()
    kept = ser.deserialize(store_client.view(oid, hold_pin=True))[1]
    store_client.release(oid, shared=True)
    escaped: list[list[bytes]] = []
    store_client.escaped_pins(escaped.append)
    assert escaped == [[oid]] and pins == []  # pinned by the caller (a round trip)
    del kept
    assert pins == [(oid, False)]  # the unpin follows as usual


def test_an_argument_dropped_while_its_pin_is_sent_is_unpinned_after_it(store_client):
    pins: list[tuple[bytes, bool]] = []
    store_client.on_pin = lambda oid, pinned: pins.append((oid, pinned))
    oid = b"g" * 20
    _foreign_object(store_client, oid)
    store_client.hold_pins()
    kept = [ser.deserialize(store_client.view(oid, hold_pin=True))[1]]
    store_client.release(oid, shared=True)

    def pin(ids: list[bytes]) -> None:
        pins.append((ids[0], True))
        kept.clear()  # its last view goes (another thread, GC) while the pin is on its way
        assert pins == [(oid, True)]

    store_client.escaped_pins(pin)
    assert pins == [(oid, True), (oid, False)]


def _read_arg(client: StoreClient, oid: bytes) -> Any:
    """What the executor does with a task's argument: view, deserialize, keep as spare."""
    value = ser.deserialize(client.view(oid, hold_pin=True))[1]
    client.keep_spare(oid)
    return value


def test_a_reused_slot_read_again_as_an_argument_reuses_the_spare_mapping(store_client):
    d = store_client.directory
    a, b = b"a" * 20, b"b" * 20
    with open(os.path.join(d, a.hex()), "wb") as f:
        f.write(ser.serialize(np.full(100_000, 1.0)).to_bytes())
    store_client.defer_unmaps()
    assert _read_arg(store_client, a).sum() == 100_000  # the value (and its view) goes here
    store_client.unmap_deferred()
    assert store_client.stats()["spare_mappings"] == 1
    # Its writer reuses the slot for the next object: the same file, a new name and value.
    os.rename(os.path.join(d, a.hex()), os.path.join(d, b.hex()))
    with open(os.path.join(d, b.hex()), "r+b") as f:
        f.write(ser.serialize(np.full(100_000, 2.0)).to_bytes())
    store_client.defer_unmaps()
    kept = _read_arg(store_client, b)
    assert store_client.stats()["spare_hits"] == 1 and kept.sum() == 200_000
    store_client.unmap_deferred()
    assert store_client.stats()["spare_mappings"] == 0  # still viewed: not a spare
    assert kept.sum() == 200_000


def test_a_spare_mapping_of_a_removed_file_is_unmapped_after_a_later_task(store_client, monkeypatch):
    """The oldest spares' files are checked after a task, at most once per
    ``SPARE_CHECK_INTERVAL_S`` (not four ``fstat`` calls after every task)."""
    import weakref
    from lumos._private.object_store import client as client_module
    monkeypatch.setattr(client_module, "SPARE_CHECK_INTERVAL_S", 3600.0)
    d = store_client.directory
    a, c, e = b"r" * 20, b"c" * 20, b"e" * 20
    for oid in (a, c, e):
        with open(os.path.join(d, oid.hex()), "wb") as f:
            f.write(ser.serialize(np.ones(100_000)).to_bytes())
    for oid in (a, c):  # after the second task, the first spare's file was checked
        store_client.defer_unmaps()
        _read_arg(store_client, oid)
        store_client.unmap_deferred()
    spare = store_client._spare[os.stat(os.path.join(d, a.hex())).st_ino]
    mm = weakref.ref(spare.mm)
    del spare
    os.unlink(os.path.join(d, a.hex()))  # the raylet evicted the slot: its pages must go
    store_client.defer_unmaps()
    _read_arg(store_client, e)
    store_client.unmap_deferred()
    assert mm() is not None and store_client.stats()["spare_mappings"] == 3  # checked a moment ago
    store_client._next_spare_check = 0.0  # the interval has passed
    store_client.defer_unmaps()
    store_client.unmap_deferred()  # a task without arguments
    assert mm() is None and store_client.stats()["spare_mappings"] == 2


def test_a_process_gets_its_most_recently_freed_slot_first():
    from lumos._private.object_store.slot_pool import SlotPool
    pool = SlotPool()
    for slot in (1, 2, 3):
        pool.add(slot, 4096, b"W1", 0.0)
    pool.add(4, 4096, b"W2", 0.0)
    assert pool.pick(4096, b"W1") == 3  # its pages and its readers' mappings are warmest
    assert pool.pick(4096, b"W3") == 1  # another process's: the oldest
    assert pool.take_oldest()[0] == 1  # eviction is still oldest first
