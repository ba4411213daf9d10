"""Large arguments on the fast path: a call whose argument refs are owned here and ready
(a by-value array just put, a ``put`` ref) is written straight to an idle worker by the
user thread; the store's mapping thread; copies that let other threads run."""

from __future__ import annotations

import sys
import threading
from typing import Any, Callable

import numpy as np
import pytest

import lumos
from lumos._private import worker_context
from lumos._private.object_store.client import StoreClient
from lumos._private.object_store.memcpy import UNLOCKED_COPY_BYTES, ParallelCopier
from lumos._private.protocol import messages as m

from tests.conftest import wait_for

pytestmark = pytest.mark.timeout(120)
MiB = 1024 * 1024


@lumos.remote
def _total(a: Any) -> int:
    return int(a.sum())


@lumos.remote
class _Holder:
    def total(self, a: Any) -> int:
        return int(a.sum())


def _store_objects(cw: Any) -> int:
    return cw.call_raylet(m.GetNodeStats())["store"]["num_objects"]  # type: ignore[no-any-return]


def test_a_task_with_a_large_argument_by_value_or_ready_ref_is_written_straight_to_its_worker(
        fresh_cluster: Callable[..., Any]) -> None:
    fresh_cluster(num_cpus=1, include_dashboard=False)
    cw = worker_context.require()
    arr = np.ones(MiB, dtype=np.uint8)
    assert lumos.get(_total.remote(arr), timeout=60) == MiB  # the lease, the function exported
    baseline = _store_objects(cw)
    before = cw.direct_tasks
    for i in range(30):
        assert lumos.get(_total.remote(np.full(MiB, i % 7, dtype=np.uint8)), timeout=60) == (i % 7) * MiB
    ref = lumos.put(np.full(MiB, 3, dtype=np.uint8))
    for _ in range(10):
        assert lumos.get(_total.remote(ref), timeout=60) == 3 * MiB
    # Most calls skipped the io thread's resolve (a call finding it busy goes through it).
    assert cw.direct_tasks - before >= 20
    del ref
    # Every by-value argument (and the put) is freed once its call is done.
    wait_for(lambda: _store_objects(cw) <= baseline, 30)


def test_a_call_whose_argument_is_not_ready_waits_for_it_on_the_io_thread(
        fresh_cluster: Callable[..., Any]) -> None:
    fresh_cluster(num_cpus=2, include_dashboard=False)
    cw = worker_context.require()

    @lumos.remote
    def slow_array() -> Any:
        import time
        time.sleep(0.5)
        return np.full(MiB, 2, dtype=np.uint8)

    assert lumos.get(_total.remote(np.ones(4, dtype=np.uint8)), timeout=60) == 4
    before = cw.direct_tasks
    pending = slow_array.remote()
    out = _total.remote(pending)  # not ready: resolved by the io thread, not written straight
    assert cw.direct_tasks == before
    assert lumos.get(out, timeout=60) == 2 * MiB


def test_calls_with_large_arguments_made_while_others_are_in_flight_go_through_the_io_thread(
        fresh_cluster: Callable[..., Any]) -> None:
    """A burst: the io thread sends its calls (batched writes), not the user thread one by one."""
    fresh_cluster(num_cpus=2, include_dashboard=False)
    cw = worker_context.require()

    @lumos.remote
    def nap() -> None:
        import time
        time.sleep(1.0)

    busy = nap.remote()
    # A call of the same shape beside it: its lease is idle and claimable after this.
    assert lumos.get(_total.remote(np.ones(MiB, dtype=np.uint8)), timeout=60) == MiB
    wait_for(cw.io.idle, 10)
    before = cw.direct_tasks
    refs = [_total.remote(np.full(MiB, 1, dtype=np.uint8)) for _ in range(5)]
    assert cw.direct_tasks == before
    assert lumos.get(refs, timeout=60) == [MiB] * 5
    lumos.get(busy, timeout=60)


def test_an_actor_call_with_a_large_argument_by_value_is_written_straight(
        fresh_cluster: Callable[..., Any]) -> None:
    fresh_cluster(num_cpus=1, include_dashboard=False)
    cw = worker_context.require()
    h = _Holder.remote()
    assert lumos.get(h.total.remote(np.ones(MiB, dtype=np.uint8)), timeout=60) == MiB
    before = cw.actor_submitter.direct_sent
    for i in range(20):
        assert lumos.get(h.total.remote(np.full(MiB, i % 5, dtype=np.uint8)), timeout=60) == (i % 5) * MiB
    assert cw.actor_submitter.direct_sent - before >= 10


def test_a_large_single_piece_copy_lets_other_threads_run() -> None:
    """A copy under the parallel threshold but over ``UNLOCKED_COPY_BYTES`` runs without
    the GIL: a thread spinning in Python makes progress while it copies."""
    copier = ParallelCopier(threads=1, threshold_bytes=1 << 40)
    src = np.ones(256 * MiB, dtype=np.uint8)
    dst = np.zeros_like(src)
    assert src.nbytes >= UNLOCKED_COPY_BYTES
    count = [0]
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            count[0] += 1

    old = sys.getswitchinterval()
    # No forced switch for a second: only a call that releases the GIL lets the spinner run.
    sys.setswitchinterval(1.0)
    t = threading.Thread(target=spin, name="spinner")
    try:
        t.start()
        progressed = False
        for _ in range(5):
            c0 = count[0]
            copier.copy(memoryview(dst), memoryview(src))
            if count[0] > c0:
                progressed = True
                break
    finally:
        stop.set()
        sys.setswitchinterval(old)
        t.join(10)
        copier.close()
    assert progressed
    assert np.array_equal(dst[:: 1 << 20], src[:: 1 << 20])


def test_reserved_slots_are_mapped_by_one_store_thread_that_close_ends(tmp_path: Any) -> None:
    store = StoreClient(str(tmp_path), 1, 1 << 40, 64 * MiB)
    try:
        store.map_reserved_soon([(1, str(tmp_path / "resv-1"), MiB, False), (2, str(tmp_path / "resv-2"), MiB, False)])
        store.map_reserved_soon([(3, str(tmp_path / "resv-3"), MiB, False)])
        wait_for(lambda: store.stats()["ready_reserved_slots"] == 3, 10)
        assert [t.name for t in threading.enumerate()].count("lumos-store-map") == 1
        mapping = store.take_reserved(MiB)
        assert mapping is not None and mapping.size == MiB
        store._close(mapping)
    finally:
        store.close()
    assert "lumos-store-map" not in {t.name for t in threading.enumerate()}
