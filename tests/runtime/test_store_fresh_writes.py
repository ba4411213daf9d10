"""A reserved slot's new file is not pre-faulted: its first value goes in with one gather
write (``write_fresh``), pages allocated as they are written, and the file is mapped
afterwards only when the process will read it or write the slot again. Checked on a
``StoreClient`` over a temporary directory, as the raylet's grants would drive it."""

from __future__ import annotations

import mmap
import os
import time
from typing import Any

import numpy as np
import pytest

from lumos._private import serialization as ser
from lumos._private.object_store import client as client_mod
from lumos._private.object_store.client import StoreClient, write_fresh

MiB = 1024 * 1024


@pytest.fixture
def store(tmp_path: Any) -> Any:
    """A store client over ``tmp_path`` keeping up to 1 GiB of slots' mappings for reuse."""
    client = StoreClient(str(tmp_path), 1, 1 << 40, 1 << 30)
    try:
        yield client
    finally:
        client.close()


def _allocated(path: str) -> int:
    return os.stat(path).st_blocks * 512


def _grant(store: StoreClient, tmp_path: Any, slot: int, file_size: int) -> str:
    path = str(tmp_path / f"resv-{slot}")
    grants = [(slot, path, file_size, False)]
    store.reserved_granted(grants)
    store.map_reserved(grants)  # (what the store's mapping thread runs)
    return path


@pytest.mark.timeout(60)
def test_a_new_reserved_slot_is_created_unmapped_and_written_with_one_gather_write(
        store: StoreClient, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    gathers: list[int] = []
    pwritev = os.pwritev

    def counting(fd: int, buffers: Any, offset: int) -> int:
        buffers = list(buffers)
        gathers.append(len(buffers))
        return pwritev(fd, buffers, offset)

    monkeypatch.setattr(os, "pwritev", counting)
    value = {"a": np.arange(MiB // 8, dtype=np.int64), "b": np.ones(3000, dtype=np.uint8)}
    sv = ser.serialize(value)
    file_size = sv.total_size + 3 * 4096  # a grant may be larger than the value
    path = _grant(store, tmp_path, 7, file_size)
    mapping = store.take_reserved(sv.total_size)
    assert mapping is not None and mapping.mm is None, "pre-faulted ahead of the write"
    assert _allocated(path) < MiB // 2, "the new file's pages were allocated before its value came"
    oid = b"\x01" * 20
    assert store.write_reserved(oid, mapping, sv.total_size, sv.write_into, True, sv.pieces)
    assert gathers == [len(sv.pieces())]
    final = str(tmp_path / oid.hex())
    assert _allocated(final) >= file_size  # the tail too: no page is left to allocate later
    view = store.view(oid)
    assert view is not None
    got = ser.deserialize(view)[1]
    assert np.array_equal(got["a"], value["a"]) and np.array_equal(got["b"], value["b"])
    del got, view
    assert store.stats()["reserved_created"] == 1


@pytest.mark.timeout(60)
def test_a_return_written_into_a_new_slot_is_mapped_only_while_the_slot_is_kept_for_reuse(tmp_path: Any) -> None:
    # A task's return (keep_mapping False): the writer keeps the slot's mapping for its
    # next value while it keeps no more than ``recycle_bytes`` of them; past that, the
    # new file is written and never mapped here.
    store = StoreClient(str(tmp_path), 1, 1 << 40, 2 * MiB)
    try:
        sv = ser.serialize(np.ones(MiB, dtype=np.uint8))
        kept = []
        for slot in (1, 2, 3):
            _grant(store, tmp_path, slot, sv.total_size)
            mapping = store.take_reserved(sv.total_size)
            assert mapping is not None and mapping.mm is None
            assert store.write_reserved(bytes([slot]) * 20, mapping, sv.total_size, sv.write_into, False, sv.pieces)
            kept.append(mapping.mm is not None)
        assert kept == [True, False, False]  # (1 MiB and a page each: one fits in 2 MiB)
        assert store.stats()["pooled_slots"] == 1
        with open(tmp_path / (b"\x02" * 20).hex(), "rb") as f:
            data = f.read()
        assert ser.deserialize(memoryview(data))[1].sum() == MiB
    finally:
        store.close()


@pytest.mark.timeout(60)
def test_write_fresh_goes_on_after_short_writes_and_past_the_pieces_one_call_takes(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    pieces = [bytes([i % 251]) * (1 + i % 7) for i in range(client_mod.PWRITE_PIECES * 2 + 5)]
    want = b"".join(pieces)
    pwritev = os.pwritev
    calls: list[int] = []

    def short(fd: int, buffers: Any, offset: int) -> int:
        buffers = list(buffers)
        calls.append(len(buffers))
        assert len(buffers) <= client_mod.PWRITE_PIECES
        data = b"".join(bytes(b) for b in buffers)
        return pwritev(fd, [data[:max(1, len(data) // 3)]], offset)  # a third at a time

    monkeypatch.setattr(os, "pwritev", short)
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        write_fresh(fd, list(pieces), len(want), len(want) + 10_000)
        assert os.pread(fd, len(want) + 10, 0) == want + bytes(10)
        assert os.fstat(fd).st_size == len(want) + 10_000 and len(calls) > 3
    finally:
        os.close(fd)


@pytest.mark.timeout(60)
def test_a_full_store_is_an_error_of_the_write_not_a_sigbus_later(
        store: StoreClient, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(fd: int, buffers: Any, offset: int) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "pwritev", full)
    sv = ser.serialize(np.ones(MiB, dtype=np.uint8))
    _grant(store, tmp_path, 1, sv.total_size)
    mapping = store.take_reserved(sv.total_size)
    with pytest.raises(OSError):
        store.write_reserved(b"\x03" * 20, mapping, sv.total_size, sv.write_into, True, sv.pieces)
    assert mapping.mm is None


@pytest.mark.timeout(60)
def test_values_without_a_gather_write_still_fill_a_new_slot_through_a_mapping(
        store: StoreClient, tmp_path: Any) -> None:
    sv = ser.serialize(np.arange(1000, dtype=np.float64))
    _grant(store, tmp_path, 1, sv.total_size)
    mapping = store.take_reserved(sv.total_size)
    assert store.write_reserved(b"\x04" * 20, mapping, sv.total_size, sv.write_into, True)
    assert isinstance(mapping.mm, mmap.mmap)
    view = store.view(b"\x04" * 20)
    assert ser.deserialize(view)[1].sum() == sum(range(1000))


@pytest.mark.timeout(60)
def test_a_new_slot_left_untaken_is_pre_faulted_in_the_background_and_a_taken_one_is_not(
        store: StoreClient, tmp_path: Any) -> None:
    # Between a workload's rounds a reserved slot waits: its pages are made ready by the
    # mapping thread, so the next write is a copy into faulted pages. In a burst it is
    # taken first, and written with one gather write instead.
    sv = ser.serialize(np.ones(MiB, dtype=np.uint8))
    grants = [(slot, str(tmp_path / f"resv-{slot}"), sv.total_size, False) for slot in (1, 2)]
    store.reserved_granted(grants)
    fresh = store.map_reserved(grants)
    assert [m.slot for m in fresh] == [1, 2] and all(m.mm is None for m in fresh)
    taken = store.take_reserved(sv.total_size)  # the last made: slot 2
    assert taken is fresh[1]
    for mapping in fresh:
        store.prefault(mapping)
    assert fresh[0].mm is not None and _allocated(str(tmp_path / "resv-1")) >= sv.total_size
    assert taken.mm is None and _allocated(str(tmp_path / "resv-2")) < MiB // 2  # left to its writer
    assert store.take_reserved(sv.total_size) is fresh[0]
    assert store.write_reserved(b"\x05" * 20, fresh[0], sv.total_size, sv.write_into, True, sv.pieces)
    assert store.write_reserved(b"\x06" * 20, taken, sv.total_size, sv.write_into, True, sv.pieces)
    for oid in (b"\x05" * 20, b"\x06" * 20):
        assert ser.deserialize(store.view(oid))[1].sum() == MiB


@pytest.mark.timeout(60)
def test_the_mapping_thread_pre_faults_a_waiting_new_slot_by_itself(store: StoreClient, tmp_path: Any) -> None:
    grants = [(3, str(tmp_path / "resv-3"), MiB, False)]
    store.map_reserved_soon(grants)  # (the mapping thread makes it, then pre-faults it)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        mapping = store._reserved.get(3)
        if mapping is not None and mapping.mm is not None:
            break
        time.sleep(0.01)
    else:
        raise AssertionError("the untaken slot was never pre-faulted")
    assert _allocated(str(tmp_path / "resv-3")) >= MiB


@pytest.mark.timeout(60)
def test_a_new_slot_taken_back_before_its_write_is_written_the_other_way(store: StoreClient, tmp_path: Any) -> None:
    # The raylet may take an unused reserved slot back (``DropSlots``) and unlink its file
    # while a writer holds it: the write finds the file gone and the caller creates the
    # object instead (False), as a write that lost the rename race did before.
    sv = ser.serialize(np.ones(MiB, dtype=np.uint8))
    path = _grant(store, tmp_path, 1, sv.total_size)
    mapping = store.take_reserved(sv.total_size)
    os.unlink(path)  # (the raylet's unlink)
    assert not store.write_reserved(b"\x07" * 20, mapping, sv.total_size, sv.write_into, True, sv.pieces)
    assert not (tmp_path / (b"\x07" * 20).hex()).exists() and not os.path.exists(path)
    path = _grant(store, tmp_path, 2, sv.total_size)
    mapping = store.take_reserved(sv.total_size, lend=True)
    os.unlink(path)
    assert not store.write_lent(b"\x08" * 20, mapping, sv.total_size, sv.write_into, sv.pieces)
    assert store.stats()["lent_slots"] == 0


@pytest.mark.timeout(60)
def test_the_mapping_thread_forgets_new_slots_taken_in_a_long_burst(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # A burst that never pauses takes each new slot as it comes; the mapping thread's list
    # of slots to pre-fault later must not grow with the burst's length.
    monkeypatch.setattr(client_mod, "PREFAULT_AFTER_S", 60.0)  # (no pause in this test)
    store = StoreClient(str(tmp_path), 1, 1 << 40, 0)
    tracked: list[int] = []
    deque_type = client_mod.collections.deque

    class Counting(deque_type):  # type: ignore[misc,valid-type]
        def extend(self, items: Any) -> None:
            super().extend(items)
            tracked.append(len(self))

    monkeypatch.setattr(client_mod.collections, "deque", Counting)
    try:
        sv = ser.serialize(np.ones(4096, dtype=np.uint8))
        for slot in range(1, 401):
            grant = [(slot, str(tmp_path / f"resv-{slot}"), sv.total_size, False)]
            store.map_reserved_soon(grant)
            deadline = time.monotonic() + 10
            while (mapping := store.take_reserved(sv.total_size)) is None:
                assert time.monotonic() < deadline, "the slot was never made"
                time.sleep(0.001)
            assert store.write_reserved(slot.to_bytes(20, "big"), mapping, sv.total_size, sv.write_into, False,
                                        sv.pieces)
        assert tracked and max(tracked) <= client_mod.PREFAULT_TRACKED + 1, max(tracked)
    finally:
        store.close()
