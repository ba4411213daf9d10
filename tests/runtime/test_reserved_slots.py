"""A process's reserved store slots: counted and taken per file size, and the slot that
came back last lent next (a loop of by-value arguments writes the same few slots)."""

from __future__ import annotations

from typing import Any, Callable

import pytest

import lumos
from lumos._private.object_store import client as client_mod
from lumos._private.object_store.client import SlotsBySize, StoreClient

MiB = 1024 * 1024


def test_slots_by_size_count_and_take_per_file_size() -> None:
    slots = SlotsBySize(int)
    for slot in range(1, 6):
        slots[slot] = MiB
    slots[10] = 64 * 1024
    slots[11] = 2 * MiB + 8192  # fits 2 MiB and 4 MiB requests, not 1 MiB (over half wasted)
    assert len(slots) == 7 and 3 in slots and 12 not in slots
    assert slots.count_fitting(MiB) == 5 and slots.count_fitting(60 * 1024) == 1
    assert slots.count_fitting(2 * MiB) == 1 and slots.count_fitting(8 * MiB) == 0
    assert slots.last_fitting(MiB) == (5, MiB)  # the slot that came last
    assert slots.last_fitting(8 * MiB) is None
    assert slots.pop(5) == MiB and slots.pop(5, "gone") == "gone"
    slots[2] = 64 * 1024  # a slot given again under another size moves to that size
    assert slots.count_fitting(MiB) == 3 and slots.count_fitting(60 * 1024) == 2
    assert slots.last_fitting(MiB) == (4, MiB) and slots.last_fitting(60 * 1024) == (2, 64 * 1024)
    slots[1] = MiB  # back again: now the last of its size
    assert slots.last_fitting(MiB) == (1, MiB)
    assert sorted(slots.values()) == [64 * 1024] * 2 + [MiB] * 3 + [2 * MiB + 8192]
    slots.clear()
    assert not slots and slots.count_fitting(MiB) == 0 and slots.last_fitting(MiB) is None


def test_counting_reserved_slots_looks_at_each_file_size_once(tmp_path: Any,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A count of the slots that fit a size ran once or twice per put and by-value
    argument over every reserved slot (hundreds after a burst of 1 MiB arguments)."""
    store = StoreClient(str(tmp_path), 1, 1 << 40, 1 << 30)
    try:
        store.reserved_granted([(slot, str(tmp_path / f"resv-{slot}"), MiB, False) for slot in range(300)]
                               + [(300, str(tmp_path / "resv-300"), 4096, False),
                                  (301, str(tmp_path / "resv-301"), 8 * MiB, False)])
        calls: list[int] = []
        fits = client_mod._fits

        def counted(size: int, file_size: int) -> bool:
            calls.append(file_size)
            return fits(size, file_size)

        monkeypatch.setattr(client_mod, "_fits", counted)
        assert store.reservations(MiB) == 300 and store.reservations(4096) == 1
        assert store.reservations(5 * MiB) == 1 and store.reservations(64 * MiB) == 0
        assert len(calls) <= 4 * 3, len(calls)  # three file sizes, four counts
    finally:
        store.close()


@pytest.mark.timeout(120)
def test_a_loop_of_by_value_calls_lends_the_slot_its_last_call_gave_back(
        fresh_cluster: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver lends the slot that came back last: a sync loop writes one slot (or two,
    when the next call is made before the last one's slot is back), and the worker reads
    it through the mapping it kept (a spare hit per call). The oldest first went round
    every reserved slot: a different file, and a fresh mmap in the worker, per call."""
    import numpy as np
    from lumos.api import worker_context
    fresh_cluster(num_cpus=1, object_store_memory=512 * MiB, include_dashboard=False)
    cw = worker_context.core_worker

    @lumos.remote
    def first(a: Any) -> int:
        return int(a[0])

    @lumos.remote
    def spare_hits() -> int:
        return int(worker_context.core_worker.store.stats()["spare_hits"])

    arr = np.ones(MiB, dtype=np.uint8)
    assert lumos.get([first.remote(arr) for _ in range(60)], timeout=60) == [1] * 60  # a burst: many slots
    assert cw.store.stats()["reserved_slots"] >= 16
    lent: list[int] = []
    take = cw.store.take_reserved

    def spy(size: int, lend: bool = False) -> Any:
        mapping = take(size, lend)
        if mapping is not None and lend:
            lent.append(mapping.slot)
        return mapping

    monkeypatch.setattr(cw.store, "take_reserved", spy)
    hits = lumos.get(spare_hits.remote(), timeout=30)
    for i in range(40):
        arr[0] = i
        assert lumos.get(first.remote(arr), timeout=30) == i
    monkeypatch.undo()
    assert len(lent) == 40 and len(set(lent)) <= 3, lent
    assert lumos.get(spare_hits.remote(), timeout=30) - hits >= 30
