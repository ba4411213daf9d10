"""Large by-value arguments lent in reserved store slots (``StoreClient.write_lent``):
the raylet never hears of them, a slot takes the next argument once its task is done
(never while a worker still views the last one: ``test_kept_arguments.py``), a worker on
another node gets an object, and no file outlives a slot taken back or an owner gone."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import textwrap
import time
from typing import Any, Callable, Iterator

import numpy as np
import pytest

import lumos
from lumos._private import worker_context
from lumos._private.object_store.client import StoreClient
from lumos._private.protocol import messages as m
from tests.conftest import running_two_nodes, wait_for

pytestmark = pytest.mark.timeout(120)
MiB = 1024 * 1024
N = MiB // 8  # int64 elements of a 1 MiB argument


def _arg(i: int) -> np.ndarray:
    return np.full(N, i, dtype=np.int64)


@lumos.remote
def _first_last_sum(a: Any) -> tuple[int, int, int]:
    return int(a[0]), int(a[-1]), int(a.sum())


def _expected(i: int) -> tuple[int, int, int]:
    return i, i, i * N


def _store_objects(cw: Any) -> int:
    return cw.call_raylet(m.GetNodeStats())["store"]["num_objects"]  # type: ignore[no-any-return]


def _lent_files(cw: Any) -> list[str]:
    return glob.glob(os.path.join(cw.store.directory, "lent-*"))


def test_by_value_arguments_are_lent_slots_the_raylet_never_hears_of(
        fresh_cluster: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> None:
    fresh_cluster(num_cpus=1, include_dashboard=False)
    cw = worker_context.require()
    for i in range(8):  # the lease, slots of this size reserved
        assert lumos.get(_first_last_sum.remote(_arg(i)), timeout=60) == _expected(i)
    wait_for(cw.io.idle, 10)
    objects = _store_objects(cw)
    before = cw.store.stats()
    sent: list[str] = []
    raylet = cw.raylet
    for name in ("notify", "write_now"):
        real = getattr(raylet, name)
        monkeypatch.setattr(raylet, name, lambda msg, real=real: (sent.append(type(msg).__name__), real(msg))[1])
    real_all = raylet.write_all_now
    monkeypatch.setattr(raylet, "write_all_now",
                        lambda msgs: (sent.extend(type(x).__name__ for x in msgs), real_all(msgs))[1])
    for i in range(40):
        assert lumos.get(_first_last_sum.remote(_arg(i)), timeout=60) == _expected(i)
    monkeypatch.undo()
    after = cw.store.stats()
    assert after["lent_writes"] - before["lent_writes"] == 40
    wait_for(lambda: cw.store.stats()["lent_reclaimed"] - before["lent_reclaimed"] == 40, 10)
    assert after["reserved_writes"] == before["reserved_writes"]  # no argument became an object
    # No seal, free, pin or reservation for any of them: the raylet saw nothing.
    assert [s for s in sent if s in ("SealObject", "FreeObjects", "PinObjects", "ReserveSlots")] == [], sent
    assert _store_objects(cw) == objects
    assert 0 < len(_lent_files(cw)) <= cw.store.stats()["reserved_slots"]


def test_lent_slots_never_mix_the_values_of_calls_in_flight(fresh_cluster: Callable[..., Any]) -> None:
    fresh_cluster(num_cpus=2, include_dashboard=False)

    @lumos.remote
    class Summer:
        def first_last_sum(self, a: Any) -> tuple[int, int, int]:
            return int(a[0]), int(a[-1]), int(a.sum())

    s = Summer.remote()
    for _ in range(3):  # bursts: slots come back and take the next arguments while others run
        refs = [_first_last_sum.remote(_arg(i)) for i in range(150)]
        calls = [s.first_last_sum.remote(_arg(1000 + i)) for i in range(150)]
        assert lumos.get(refs, timeout=120) == [_expected(i) for i in range(150)]
        assert lumos.get(calls, timeout=120) == [_expected(1000 + i) for i in range(150)]
    cw = worker_context.require()
    assert cw.store.stats()["lent_writes"] >= 100


@pytest.fixture
def two_nodes() -> Iterator[tuple[Any, Any]]:
    yield from running_two_nodes(1, num_cpus=1, resources={"far": 1})


def test_a_task_on_another_node_gets_its_by_value_argument_as_an_object(two_nodes: tuple[Any, Any]) -> None:
    from lumos.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    _cluster, node = two_nodes
    cw = worker_context.require()
    there = _first_last_sum.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False))
    here = _first_last_sum.options(num_cpus=1)
    assert lumos.get(here.remote(_arg(1)), timeout=60) == _expected(1)
    for i in range(10):
        assert lumos.get(there.remote(_arg(10 + i)), timeout=60) == _expected(10 + i)
        assert lumos.get(here.remote(_arg(50 + i)), timeout=60) == _expected(50 + i)

    @lumos.remote(resources={"far": 1})
    class Far:
        def first_last_sum(self, a: Any) -> tuple[int, int, int]:
            return int(a[0]), int(a[-1]), int(a.sum())

    f = Far.remote()
    assert lumos.get([f.first_last_sum.remote(_arg(90 + i)) for i in range(10)], timeout=60) == \
        [_expected(90 + i) for i in range(10)]
    wait_for(lambda: not cw.store.stats()["lent_slots"], 10)


def test_a_slot_the_raylet_takes_back_while_lent_is_unlinked_once_its_task_is_done(
        fresh_cluster: Callable[..., Any]) -> None:
    fresh_cluster(num_cpus=1, object_store_memory=32 * MiB, include_dashboard=False)
    cw = worker_context.require()

    @lumos.remote
    def slow_first_last_sum(a: Any, wait_s: float) -> tuple[int, int, int]:
        time.sleep(wait_s)
        return int(a[0]), int(a[-1]), int(a.sum())

    for i in range(6):
        assert lumos.get(slow_first_last_sum.remote(_arg(i), 0.0), timeout=60) == _expected(i)
    wait_for(lambda: cw.store.stats()["ready_reserved_slots"] > 0, 30)
    ref = slow_first_last_sum.remote(_arg(77), 1.5)
    wait_for(lambda: cw.store.stats()["lent_slots"] == 1, 10)
    (slot,) = cw.store._lending
    # Room for this takes back every reservation, the lent slot's too.
    big = lumos.put(np.ones(31 * MiB, dtype=np.uint8))
    wait_for(lambda: slot in cw.store._lent_dropped, 10)
    assert os.path.exists(cw.store.lent_path(slot))
    assert lumos.get(ref, timeout=60) == _expected(77)  # its file stayed for it
    wait_for(lambda: not _lent_files(cw) and not cw.store.stats()["lent_slots"], 10)
    del big
    for i in range(5):  # and later arguments still get through (lent again or as objects)
        assert lumos.get(slow_first_last_sum.remote(_arg(300 + i), 0.0), timeout=60) == _expected(300 + i)


DRIVER = """
    import os, time
    import numpy as np
    import lumos
    lumos.init(address={address!r}, _token={token!r})

    @lumos.remote
    def slow_sum(a):
        time.sleep(3)
        return int(a.sum())

    @lumos.remote
    def total(a):
        return int(a.sum())

    for _ in range(6):  # slots of this size reserved
        lumos.get(total.options(num_cpus=0).remote(np.ones(1 << 20, dtype=np.uint8)))
    ref = slow_sum.options(num_cpus=0).remote(np.ones(1 << 20, dtype=np.uint8))
    time.sleep(1.0)
    print("LENT", len([f for f in os.listdir({store!r}) if f.startswith("lent-")]), flush=True)
    os._exit(0)  # gone with its argument lent to a running task
"""


def test_an_owner_gone_with_a_lent_argument_out_leaves_no_file(fresh_cluster: Callable[..., Any]) -> None:
    ctx = fresh_cluster(num_cpus=1, include_dashboard=False)
    cw = worker_context.require()
    info = ctx.address_info
    with open(os.path.join(info["session_dir"], "token")) as f:
        token = f.read().strip()
    before = set(_lent_files(cw))
    code = textwrap.dedent(DRIVER).format(address=info["gcs_address"], token=token, store=cw.store.directory)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("LENT ") and int(out.stdout.split()[1]) >= 1, \
        (out.stdout, out.stderr)  # (its slots keep their lent- name while reserved again)
    wait_for(lambda: set(_lent_files(cw)) <= before, 20)


def _client(tmp_path: Any, slots: list[int]) -> StoreClient:
    client = StoreClient(str(tmp_path), 1, 1 << 40, 1 << 30)
    grants = [(slot, str(tmp_path / f"resv-{slot}"), MiB, False) for slot in slots]
    client.reserved_granted(grants)
    client.map_reserved(grants)
    return client


def _fill(value: int) -> Callable[[memoryview, Callable[[memoryview, memoryview], None]], None]:
    def fill(dest: memoryview, copy: Callable[[memoryview, memoryview], None]) -> None:
        dest[:] = bytes([value]) * len(dest)
    return fill


def test_a_lent_slot_is_renamed_once_reserved_again_after_its_task_and_published_on_demand(tmp_path: Any) -> None:
    client = _client(tmp_path, [1, 2])
    try:
        mapping = client.take_reserved(MiB, lend=True)
        assert mapping is not None and mapping.slot == 2  # (the one that came last first)
        assert client.write_lent(b"a" * 16, mapping, MiB, _fill(7))
        assert sorted(os.listdir(tmp_path)) == ["lent-2", "resv-1"]
        assert client.reservations(MiB) == 1 and client.stats()["lent_slots"] == 1
        with open(tmp_path / "lent-2", "rb") as f:
            assert f.read(4) == b"\x07" * 4
        assert client.reclaim(b"a" * 16)
        assert client.reservations(MiB) == 2 and not client.stats()["lent_slots"]
        again = client.take_reserved(MiB, lend=True)
        assert again is not None and again.slot == 2 and again.path.endswith("lent-2")  # back last: lent next
        assert client.write_lent(b"b" * 16, again, MiB, _fill(8))
        third = client.take_reserved(MiB, lend=True)
        assert third is not None and third.slot == 1
        assert client.write_lent(b"c" * 16, third, MiB, _fill(9))
        assert sorted(os.listdir(tmp_path)) == ["lent-1", "lent-2"]  # no rename of lent-2 the second time
        assert client.publish(b"b" * 16) == (2, MiB)
        assert sorted(os.listdir(tmp_path)) == [(b"b" * 16).hex(), "lent-1"]
        assert not client.reclaim(b"b" * 16)  # an object now: freed as one
    finally:
        client.close()


def test_a_slot_taken_back_while_lent_is_unlinked_when_reclaimed(tmp_path: Any) -> None:
    client = _client(tmp_path, [1, 2])
    try:
        mapping = client.take_reserved(MiB, lend=True)
        assert mapping is not None and mapping.slot == 2
        assert client.write_lent(b"a" * 16, mapping, MiB, _fill(1))
        client.drop_slot(2)  # the raylet took it back: its resv- name was gone already
        assert os.path.exists(tmp_path / "lent-2")  # the task may still open it
        assert client.reclaim(b"a" * 16)
        assert not os.path.exists(tmp_path / "lent-2") and client.reservations(MiB) == 1
        # Taken back before it was ever lent: the write finds its file gone and says so.
        other = client.take_reserved(MiB, lend=True)
        assert other is not None and other.slot == 1
        os.unlink(tmp_path / "resv-1")
        client.drop_slot(1)
        assert not client.write_lent(b"b" * 16, other, MiB, _fill(2))
        assert not client.stats()["lent_slots"] and not os.listdir(tmp_path)
    finally:
        client.close()


def test_a_lent_view_sends_no_pin_and_counts_as_viewed_until_it_goes(tmp_path: Any) -> None:
    owner = _client(tmp_path, [1])
    reader = StoreClient(str(tmp_path), 1, 1 << 40, 1 << 30)
    pins: list[tuple[bytes, bool]] = []
    reader.on_pin = lambda oid, pinned: pins.append((oid, pinned))
    try:
        mapping = owner.take_reserved(MiB, lend=True)
        assert mapping is not None
        assert owner.write_lent(b"a" * 16, mapping, MiB, _fill(5))
        view = reader.view(b"a" * 16, hold_pin=True, lent_slot=1)
        assert view is not None and view[0] == 5
        assert reader.viewed([b"a" * 16, b"z" * 16]) == [b"a" * 16]
        view.release()
        del view
        assert reader.viewed([b"a" * 16]) == [] and pins == []
    finally:
        reader.close()
        owner.close()
