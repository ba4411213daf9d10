"""Store slots reserved ahead of puts: the state's accounting, and puts through real processes."""

from __future__ import annotations

from typing import Any, Callable

import pytest

import lumos
from lumos._private.object_store import store_state as st
from tests.conftest import wait_for

MiB = 1024 * 1024
D = "/dev/shm/lumos-test"


def state(capacity: int = 64 * MiB, spill_dir: str = "") -> st.ObjectStoreState:
    return st.ObjectStoreState(D, capacity, 32 * MiB, 2.0, validate=True, spill_dir=spill_dir)


def reserve(s: st.ObjectStoreState, client: bytes, size: int, count: int, now: float = 0) -> list[Any]:
    (grant,) = [a for a in s.handle(st.SlotsReserveRequested(1, client, size, count), now)
                if isinstance(a, st.GrantSlots)]
    return grant.slots


def test_reserved_slots_count_as_used_until_sealed_as_objects() -> None:
    s = state()
    slots = reserve(s, b"w1", MiB, 2)
    assert [(slot, path, size, reused) for slot, path, size, reused in slots] == [
        (1, f"{D}/resv-1", MiB, False), (2, f"{D}/resv-2", MiB, False)]
    assert s.used_bytes == 2 * MiB and s.reserved_bytes == 2 * MiB
    assert s.handle(st.ReservedSealed(b"w1", 1, b"o1", MiB - 10, MiB), 0) == []
    assert s.objects[b"o1"].sealed and s.objects[b"o1"].creator == b"w1"
    assert s.used_bytes == 2 * MiB and s.reserved_bytes == MiB
    # Freed like any object: its file goes to the pool, and the next reservation reuses it.
    assert s.handle(st.ObjectsFreed([b"o1"], [True]), 0) == [st.RenameFile(f"{D}/{b'o1'.hex()}", f"{D}/pool-1")]
    # Under its pool name: the raylet renames nothing; the client moves it to its object's.
    acts = s.handle(st.SlotsReserveRequested(2, b"w1", MiB, 1), 0)
    assert acts == [st.GrantSlots(2, [(1, f"{D}/pool-1", MiB, True)])]
    assert s.used_bytes == 2 * MiB and s.pool_bytes == 0
    # Taken back under pressure, the file under that name goes.
    assert st.UnlinkFile(f"{D}/pool-1") in s.handle(st.CreateRequested(9, b"x", 64 * MiB, b"w2"), 0)


def test_reservations_only_take_free_room_never_evict_or_delay_creates() -> None:
    s = state(capacity=16 * MiB, spill_dir="/spill")
    s.handle(st.CreateRequested(1, b"big", 15 * MiB, b"w1"), 0)
    s.handle(st.ObjectSealed(b"big", 15 * MiB), 0)
    assert reserve(s, b"w1", MiB, 2) == [(2, f"{D}/resv-2", MiB, False)]  # one fits, no spill
    assert not any(isinstance(a, st.SpillObject) for a in s.handle(st.Ticked(), 0))
    assert reserve(s, b"w1", 2 * MiB, 2) == []  # larger than capacity / 16
    assert reserve(s, b"w2", MiB, 2) == []  # the store is full


def test_a_create_takes_back_unused_reservations_before_anything_else() -> None:
    s = state(capacity=16 * MiB)
    assert len(reserve(s, b"w1", MiB, 2)) == 2
    assert len(reserve(s, b"w2", MiB, 2)) == 2
    actions = s.handle(st.CreateRequested(7, b"o", 13 * MiB, b"w3"), 0)
    # Without the reservations it fits: no ObjectStoreFullError and no wait.
    assert [a for a in actions if isinstance(a, st.DropSlot)] == [st.DropSlot(b"w1", 1)]
    assert st.UnlinkFile(f"{D}/resv-1") in actions
    assert isinstance(actions[-1], st.GrantCreate) and actions[-1].object_id == b"o"
    assert s.used_bytes == 16 * MiB and s.reserved_bytes == 3 * MiB


def test_the_seal_of_a_slot_taken_back_after_its_link_counts_the_file_again() -> None:
    s = state(capacity=16 * MiB)
    reserve(s, b"w1", MiB, 2)
    s.handle(st.CreateRequested(7, b"o", 15 * MiB, b"w2"), 0)  # takes back slot 1
    assert s.reserved == {2: (MiB, b"w1")}
    s.handle(st.ReservedSealed(b"w1", 1, b"late", MiB, MiB), 0)  # linked before the unlink ran
    assert s.objects[b"late"].file_size == MiB and s.used_bytes == 17 * MiB
    # Over capacity for a moment; a free brings it back, and the file is never pooled.
    assert s.handle(st.ObjectsFreed([b"late"], [True]), 0)[0] == st.UnlinkFile(f"{D}/{b'late'.hex()}")
    assert s.used_bytes == 16 * MiB


def test_a_free_that_overtakes_a_reserved_seal_frees_the_object_at_its_seal() -> None:
    s = state()
    reserve(s, b"w1", MiB, 1)
    # The owner's free travels on its own connection and may arrive first.
    assert s.handle(st.ObjectsFreed([b"ret"], [False]), 0) == []
    actions = s.handle(st.ReservedSealed(b"w1", 1, b"ret", MiB, MiB), 1)
    assert actions[:2] == [st.UnlinkFile(f"{D}/{b'ret'.hex()}"), st.DropSlot(b"w1", 1)]
    assert b"ret" not in s.objects and s.used_bytes == 0
    # Tombstones expire.
    reserve(s, b"w1", MiB, 1)
    s.handle(st.ObjectsFreed([b"other"], [False]), 2)
    s.handle(st.Ticked(), 2 + st.FREED_UNKNOWN_S + 1)
    s.handle(st.ReservedSealed(b"w1", 1, b"other", MiB, MiB), 100)
    assert b"other" in s.objects


def test_a_client_going_away_frees_its_reservations() -> None:
    s = state()
    reserve(s, b"w1", MiB, 2)
    reserve(s, b"w2", MiB, 1)
    actions = s.handle(st.ClientGone(b"w1"), 0)
    # Under whichever name the client left each file (a lent slot is ``lent-<slot>``);
    # first a look for files it moved under objects' names (checked before the unlinks).
    assert actions == [st.SweepMoved([(f"{D}/resv-1", f"{D}/lent-1"), (f"{D}/resv-2", f"{D}/lent-2")]),
                       st.UnlinkFile(f"{D}/resv-1"), st.UnlinkFile(f"{D}/lent-1"),
                       st.UnlinkFile(f"{D}/resv-2"), st.UnlinkFile(f"{D}/lent-2")]
    assert s.reserved == {3: (MiB, b"w2")} and s.used_bytes == MiB
    assert s.handle(st.ClientGone(b"w3"), 0) == []  # no reservations: nothing to look for


def test_files_a_dead_client_moved_under_object_names_are_unlinked_when_still_unknown() -> None:
    """``MovedFilesFound`` names files seen unknown twice: those still unknown go, and a
    seal that comes after all (a frozen writer, not a dead one) frees its object at once."""
    s = state()
    (slot, _, _, _), (slot2, _, _, _) = reserve(s, b"w1", MiB, 2)
    reserve(s, b"w2", MiB, 1)
    known = b"k" * 20
    s.handle(st.ReservedSealed(b"w1", slot2, known, MiB, MiB), 0)
    s.handle(st.ClientGone(b"w1"), 1)
    used = s.used_bytes
    lost, late = b"a" * 20, b"b" * 20
    actions = s.handle(st.MovedFilesFound([lost, known, late]), 3)
    assert actions == [st.UnlinkFile(f"{D}/{lost.hex()}"), st.UnlinkFile(f"{D}/{late.hex()}")]
    assert s.stats()["swept_files"] == 2 and s.used_bytes == used  # never counted
    (w2_slot,) = s.reserved
    seal = s.handle(st.ReservedSealed(b"w2", w2_slot, late, MiB, MiB), 4)
    assert late not in s.objects and st.DropSlot(b"w2", w2_slot) in seal
    assert s.used_bytes == used - MiB and s.reserved_bytes == 0


def test_a_dead_creator_s_unsealed_object_goes_under_both_names() -> None:
    """The creator renames ``<id>.w`` to ``<id>`` before it sends the seal; its task's
    retry creates the same id at once, under the same names (the raylet moves the old
    files out of those names before it answers anything else: ``test_store_worker_kills``)."""
    s = state()
    oid = b"c" * 20
    s.handle(st.CreateRequested(1, oid, MiB, b"w1"), 0)
    actions = s.handle(st.ClientGone(b"w1"), 1)
    assert st.UnlinkFile(f"{D}/{oid.hex()}.w") in actions
    assert st.UnlinkFile(f"{D}/{oid.hex()}") in actions
    assert oid not in s.objects and s.used_bytes == 0
    (grant,) = [a for a in s.handle(st.CreateRequested(2, oid, MiB, b"w2"), 2) if isinstance(a, st.GrantCreate)]
    assert grant.path == f"{D}/{oid.hex()}.w"  # the retry's, under the same names


def test_a_slot_taken_back_while_lent_keeps_its_lent_file_until_its_client_goes() -> None:
    """Taking back a reserved slot unlinks only its resv-/pool- name: a file the client
    lent to a running task (``lent-<slot>``) is the client's to unlink once that task is
    done; if the client goes first, its exit unlinks it."""
    s = state(capacity=16 * MiB)
    reserve(s, b"w1", MiB, 2)
    actions = s.handle(st.CreateRequested(7, b"o", 15 * MiB, b"w2"), 0)  # takes back slot 1
    assert st.UnlinkFile(f"{D}/resv-1") in actions and st.DropSlot(b"w1", 1) in actions
    assert st.UnlinkFile(f"{D}/lent-1") not in actions
    assert s.used_bytes == 16 * MiB
    gone = s.handle(st.ClientGone(b"w1"), 1)
    assert st.UnlinkFile(f"{D}/lent-1") in gone  # taken back earlier, remembered
    assert st.UnlinkFile(f"{D}/resv-2") in gone and st.UnlinkFile(f"{D}/lent-2") in gone
    assert s.handle(st.ClientGone(b"w1"), 2) == []  # once


def test_spilling_counts_reservations_as_room() -> None:
    s = state(capacity=8 * MiB, spill_dir="/spill")
    reserve(s, b"w1", MiB, 1)
    s.handle(st.CreateRequested(1, b"a", 6 * MiB, b"w2"), 0)
    s.handle(st.ObjectSealed(b"a", 6 * MiB), 0)
    # 2 MiB needed, 1 free and 1 reserved: the reservation goes, nothing is spilled.
    actions = s.handle(st.CreateRequested(2, b"b", 2 * MiB, b"w2"), 0)
    assert not any(isinstance(a, st.SpillObject) for a in actions)
    assert isinstance(actions[-1], st.GrantCreate) and s.reserved == {}


@pytest.mark.timeout(120)
def test_puts_and_returns_through_reserved_slots_keep_their_values(
        fresh_cluster: Callable[..., Any]) -> None:
    import numpy as np
    from lumos.api import worker_context
    fresh_cluster(num_cpus=1, object_store_memory=32 * MiB, include_dashboard=False)
    cw = worker_context.core_worker

    @lumos.remote
    def make(i: int) -> Any:
        return np.full(MiB // 8, i, dtype=np.int64)

    @lumos.remote
    def total(a: Any) -> int:
        return int(a.sum())

    first = lumos.put(np.zeros(MiB // 8, dtype=np.int64))  # created, and asks for slots of its size
    wait_for(lambda: cw.store.stats()["ready_reserved_slots"] > 0, 30)
    refs = [lumos.put(np.full(MiB // 8, i, dtype=np.int64)) for i in range(6)]
    assert cw.store.stats()["reserved_writes"] > 0
    assert [int(v[0]) for v in lumos.get(refs, timeout=30)] == list(range(6))
    assert lumos.get([total.remote(np.full(MiB // 8, i, dtype=np.int64)) for i in range(6)],
                     timeout=60) == [i * (MiB // 8) for i in range(6)]
    assert [int(v[-1]) for v in lumos.get([make.remote(i) for i in range(6)], timeout=60)] == list(range(6))
    assert int(lumos.get(first, timeout=30).sum()) == 0
    del refs, first
    # A store full of live objects: creates take reservations back, never fail for them.
    held = [lumos.put(np.full(MiB // 8, i, dtype=np.int64)) for i in range(31)]
    assert int(lumos.get(held[-1], timeout=30)[0]) == 30
    del held


@pytest.mark.parametrize("through", ["reserved slot", "create"])
def test_a_worker_killed_between_naming_its_object_file_and_sealing_it_leaves_no_file(
        fresh_cluster: Callable[..., Any], through: str) -> None:
    """A put moves its written file under the object's name, then sends the seal: a
    worker killed in between (SIGKILL just after the move, from inside the worker) leaves
    a file the raylet never heard of. It goes with the worker (a reserved slot's within
    ``MOVED_SWEEP_S`` or so, a created object's at once), not at the session's end."""
    import os

    from lumos.api import worker_context
    fresh_cluster(num_cpus=1, object_store_memory=64 * MiB, include_dashboard=False)
    store_dir = worker_context.core_worker.store._prefix

    @lumos.remote(max_retries=0)
    def put_and_die(reserved: bool) -> None:
        import signal
        import time

        import numpy as np
        from lumos._private.object_store import client
        from lumos.api import worker_context
        store = worker_context.core_worker.store
        if reserved:
            lumos.put(np.zeros(MiB // 8))  # created; slots of its size are reserved after it
            deadline = time.monotonic() + 30
            while store.stats()["ready_reserved_slots"] == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert store.stats()["ready_reserved_slots"] > 0
        moved_by = client.move_noreplace if reserved else os.rename

        def move_then_die(src: str, dst: str) -> None:
            moved_by(src, dst)
            if dst.startswith(store._prefix):
                os.kill(os.getpid(), signal.SIGKILL)

        if reserved:
            client.move_noreplace = move_then_die
        else:
            os.rename = move_then_die  # type: ignore[assignment]
        # Into a slot reserved for its size, or (a size no slot is reserved for) created.
        lumos.put(np.ones(MiB // 8 if reserved else 3 * MiB // 8 + 5))
        raise AssertionError("not killed after its file was moved")

    with pytest.raises(lumos.exceptions.WorkerCrashedError):
        lumos.get(put_and_die.remote(through == "reserved slot"), timeout=60)

    def object_files() -> list[str]:
        return [n for n in os.listdir(store_dir) if len(n) == 40]
    try:
        wait_for(lambda: not object_files(), 20)
    except AssertionError:
        raise AssertionError(f"object files left in the store: {object_files()}") from None


def test_a_put_into_a_reserved_slot_seals_without_waking_the_io_thread(
        fresh_cluster: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy as np
    from lumos._private.core_worker.objects import reserve_ahead
    from lumos._private.protocol import messages as m
    from lumos.api import worker_context
    fresh_cluster(num_cpus=1, object_store_memory=256 * MiB, include_dashboard=False)
    cw = worker_context.core_worker
    first = lumos.put(np.zeros(MiB // 8, dtype=np.int64))  # created, and asks for slots of its size
    wait_for(lambda: cw.store.stats()["ready_reserved_slots"] > reserve_ahead(MiB) // 2 + 1, 30)
    objects = cw.call_raylet(m.GetNodeStats())["store"]["num_objects"]
    wait_for(cw.io.idle, 10)
    posted: list[Any] = []
    post = cw.io.post
    spy = lambda fn, *args: (posted.append(fn), post(fn, *args))[1]  # noqa: E731
    monkeypatch.setattr(cw.io, "post", spy)
    monkeypatch.setattr(cw, "_post", spy)  # (the core worker binds io.post at start-up)
    ref = lumos.put(np.full(MiB // 8, 7, dtype=np.int64))
    monkeypatch.undo()
    assert posted == [] and cw.store.stats()["reserved_writes"] == 1
    wait_for(lambda: cw.call_raylet(m.GetNodeStats())["store"]["num_objects"] == objects + 1, 10)
    assert int(lumos.get(ref, timeout=30).sum()) == 7 * (MiB // 8)
    del first


def test_slots_running_low_are_asked_for_after_the_call_they_were_for_is_written(
        fresh_cluster: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """A by-value argument (or a return) that takes its size's reserved slots down to half
    asks for more once its call (or reply) is written: asked before, the request woke the
    io thread, and the write, finding it busy, went through it too (a hop more on the
    call's path, for one call in six or seven of a sync loop). Arguments are not lent here
    (``lend_args``): a lent one's slot takes the next, so a sync loop never runs low."""
    import numpy as np
    from lumos.api import worker_context
    fresh_cluster(num_cpus=1, object_store_memory=256 * MiB, include_dashboard=False,
                  _system_config={"lend_args": False})
    cw = worker_context.core_worker

    @lumos.remote
    def total(a: Any) -> int:
        return int(a.sum())

    @lumos.remote
    def make() -> Any:
        return np.ones(MiB, dtype=np.uint8)

    @lumos.remote
    def spy_on_posts(install: bool) -> list[str]:
        """In the worker: log its posts and replies, in order (``install``), or return the log."""
        import builtins
        w = worker_context.core_worker
        if install:
            log: list[str] = []
            post, reply = w._post, w.send_reply
            w._post = lambda fn, *args: (log.append(getattr(fn, "__name__", "?")), post(fn, *args))[1]
            w.send_reply = lambda conn, msg, *hold: (log.append("reply"), reply(conn, msg, *hold))[1]
            builtins._lumos_test_log = log  # type: ignore[attr-defined]
            return []
        return list(builtins._lumos_test_log)  # type: ignore[attr-defined]

    arr = np.ones(MiB, dtype=np.uint8)
    for _ in range(12):  # slots of this size reserved, on both sides
        assert lumos.get(total.remote(arr), timeout=30) == MiB
        assert lumos.get(make.remote(), timeout=30).nbytes == MiB
    wait_for(lambda: cw.store.stats()["ready_reserved_slots"] > 0, 30)
    lumos.get(spy_on_posts.remote(True), timeout=30)
    log: list[str] = []
    post, write_then_book = cw._post, cw.io.write_then_book
    monkeypatch.setattr(cw, "_post", lambda fn, *args: (log.append(getattr(fn, "__name__", "?")), post(fn, *args))[1])
    monkeypatch.setattr(cw.io, "write_then_book", lambda *args: (log.append("push"), write_then_book(*args))[1])
    for _ in range(40):
        assert lumos.get(total.remote(arr), timeout=30) == MiB
        assert lumos.get(make.remote(), timeout=30).nbytes == MiB
    monkeypatch.undo()
    worker_log = lumos.get(spy_on_posts.remote(False), timeout=30)
    for side, entries in (("driver", log), ("worker", worker_log)):
        assert "_sealed_reserved" not in entries, (side, entries)  # (nor asked for before the write)
        top_ups = [i for i, what in enumerate(entries) if what == "_top_up_now"]
        assert top_ups, (side, entries)  # slots are still asked for
        # Right after the write of the call whose argument (or return) ran them low: the
        # user thread's own ("push"), or the post that has the io thread write it
        # ("_on_submit": the io thread was busy, with the last reply say, when the call was
        # made; it writes the call before it runs the top-up posted after it).
        after = ("push", "_on_submit") if side == "driver" else ("reply", "notify")
        assert all(entries[i - 1] in after for i in top_ups), (side, entries)


@pytest.mark.timeout(60)
def test_a_large_argument_by_value_is_pickled_once(cluster: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy as np
    from lumos._private import serialization as ser

    @lumos.remote
    def total(a: Any, scale: int = 1) -> int:
        return int(a.sum()) * scale

    assert lumos.get(total.remote(np.ones(8)), timeout=30) == 8  # exported, worker warm
    calls: list[int] = []
    serialize = ser.serialize

    def counting(value: Any, *args: Any) -> Any:
        sv = serialize(value, *args)
        calls.append(sv.total_size)
        return sv

    monkeypatch.setattr(ser, "serialize", counting)
    ref = total.remote(np.ones(MiB, dtype=np.uint8), scale=2)
    # The array once (its bytes go into the store as they are), besides the small rest.
    assert len([size for size in calls if size >= MiB]) == 1, calls
    monkeypatch.undo()
    assert lumos.get(ref, timeout=30) == 2 * MiB


@pytest.mark.timeout(60)
def test_an_array_under_the_inline_limit_travels_inside_the_call(cluster: Any, monkeypatch: pytest.MonkeyPatch
                                                                  ) -> None:
    import numpy as np
    from lumos.api import worker_context

    @lumos.remote
    def total(a: Any) -> int:
        return int(a.sum())

    cw = worker_context.core_worker
    inline = cw.config.max_inline_arg_bytes
    assert lumos.get(total.remote(np.ones(8)), timeout=30) == 8  # exported, worker warm
    promoted: list[int] = []
    put_serialized = cw._put_serialized

    def counting(sv: Any, *args: Any) -> Any:
        promoted.append(sv.total_size)
        return put_serialized(sv, *args)

    monkeypatch.setattr(cw, "_put_serialized", counting)
    # Under the limit (a 64 KiB observation): inline, no object of its own.
    assert lumos.get(total.remote(np.ones(inline * 5 // 8, dtype=np.uint8)), timeout=30) == inline * 5 // 8
    assert promoted == []
    # Over it: put once, passed by ref.
    assert lumos.get(total.remote(np.ones(inline * 2, dtype=np.uint8)), timeout=30) == inline * 2
    assert len(promoted) == 1 and promoted[0] >= inline * 2
    # Two arrays under it whose sum is over it: each big one is promoted.
    half = np.ones(inline * 5 // 8, dtype=np.uint8)
    assert lumos.get(total.remote(half), timeout=30) == half.size
    promoted.clear()

    @lumos.remote
    def both(a: Any, b: Any) -> int:
        return int(a.sum() + b.sum())

    assert lumos.get(both.remote(half, half.copy()), timeout=30) == 2 * half.size
    assert len(promoted) == 2


def test_a_reserved_slot_moves_to_its_object_name_never_over_another(tmp_path: Any) -> None:
    from lumos._private.object_store.client import move_noreplace
    (tmp_path / "resv-1").write_bytes(b"new")
    (tmp_path / "taken").write_bytes(b"old")
    with pytest.raises(FileExistsError):
        move_noreplace(str(tmp_path / "resv-1"), str(tmp_path / "taken"))
    assert (tmp_path / "taken").read_bytes() == b"old" and (tmp_path / "resv-1").exists()
    move_noreplace(str(tmp_path / "resv-1"), str(tmp_path / "obj"))
    assert (tmp_path / "obj").read_bytes() == b"new" and not (tmp_path / "resv-1").exists()
    with pytest.raises(FileNotFoundError):  # taken back by the raylet meanwhile
        move_noreplace(str(tmp_path / "resv-1"), str(tmp_path / "obj2"))


def test_small_values_keep_more_slots_reserved_and_one_request_grants_them() -> None:
    from lumos._private.core_worker.objects import RESERVE_AHEAD, reserve_ahead
    assert reserve_ahead(MiB) == 16 and reserve_ahead(64 * 1024) == 16
    assert reserve_ahead(8 * MiB) == RESERVE_AHEAD == reserve_ahead(16 * MiB)
    s = state(capacity=256 * MiB)
    assert len(reserve(s, b"w1", MiB, reserve_ahead(MiB))) == 16



def test_by_default_a_burst_of_two_thousand_1_mib_values_is_kept_for_reuse_when_freed() -> None:
    """A burst of 2,000 1 MiB task returns (or by-value arguments) freed together keeps
    all its files for the next burst: each new file's pages cost far more than a reuse."""
    from lumos._private.config import Config
    n = 2000
    s = st.ObjectStoreState(D, 8 * 1024 * MiB, Config().object_store_recycle_bytes, 2.0)
    for i in range(n):
        oid = b"o%d" % i
        grant = [a for a in s.handle(st.CreateRequested(i, oid, MiB, b"w1"), 0) if isinstance(a, st.GrantCreate)]
        assert grant
        s.handle(st.ObjectSealed(oid, MiB), 0)
    actions = s.handle(st.ObjectsFreed([b"o%d" % i for i in range(n)], [True] * n), 0)
    assert not [a for a in actions if isinstance(a, st.UnlinkFile)]
    assert len(s.pool) == n


def test_a_granted_slot_the_client_still_maps_is_ready_without_the_mapping_thread(tmp_path: Any) -> None:
    """A pooled slot handed back to the process that wrote it last (a task's return, or a
    put freed) is reused through the mapping it kept: ready at once, no mapping thread."""
    import os
    from lumos._private.object_store.client import StoreClient
    store = StoreClient(str(tmp_path), 1, 1 << 30, 64 * MiB)
    try:
        data = b"v" * MiB

        def fill(dest: memoryview, copy: Callable[[memoryview, memoryview], None]) -> None:
            copy(dest, memoryview(data))

        o1, o2 = b"\x01" * 16, b"\x02" * 16
        store.write(o1, str(tmp_path / "o1.w"), str(tmp_path / o1.hex()), 1, MiB, False, MiB, fill,
                    keep_mapping=False)  # a return: the writer keeps the mapping by slot
        assert store.stats()["pooled_slots"] == 1
        # Freed: the raylet moves it to its pool name and grants it back to its writer.
        os.rename(tmp_path / o1.hex(), tmp_path / "pool-1")
        store.map_reserved_soon([(1, str(tmp_path / "pool-1"), MiB, True)])
        stats = store.stats()
        assert stats["ready_reserved_slots"] == 1 and stats["pooled_slots"] == 0
        assert store._mapper is None and stats["reserved_remapped"] == 0
        mapping = store.take_reserved(MiB)
        assert mapping is not None
        data = b"w" * MiB
        assert store.write_reserved(o2, mapping, MiB, fill, keep_mapping=True)
        assert (tmp_path / o2.hex()).read_bytes() == data and not (tmp_path / "pool-1").exists()
        # A slot it does not map (or at another size) still goes to the mapping thread.
        (tmp_path / "pool-2").write_bytes(b"\0" * MiB)
        store.map_reserved_soon([(2, str(tmp_path / "pool-2"), MiB, True)])
        wait_for(lambda: store.stats()["ready_reserved_slots"] == 1, 10)
        assert store._mapper is not None and store.stats()["reserved_remapped"] == 1
    finally:
        store.close()


@pytest.mark.timeout(60)
def test_a_driver_reading_returns_in_a_loop_reuses_spare_mappings_and_drops_them_when_idle(
        cluster: Any) -> None:
    import numpy as np
    from lumos._private.object_store import client as store_client
    from lumos.api import worker_context
    cw = worker_context.core_worker

    @lumos.remote
    def make(i: int) -> Any:
        return np.full(MiB // 8, i, dtype=np.int64)

    hits = cw.store.stats()["spare_hits"]
    for i in range(40):  # each value dropped with its ref: the workers' pooled files come back
        assert int(lumos.get(make.remote(i), timeout=30)[-1]) == i
    kept = lumos.get(make.remote(99), timeout=30)  # viewed past its ref: never reused meanwhile
    for i in range(10):
        assert int(lumos.get(make.remote(i), timeout=30)[0]) == i
    assert int(kept.sum()) == 99 * (MiB // 8)
    del kept
    stats = cw.store.stats()
    assert stats["spare_hits"] > hits
    assert 0 < stats["spare_mappings"] <= store_client.SPARE_MAPPINGS
    # An idle driver holds no spare mappings (nor their pages and fds).
    wait_for(lambda: cw.store.stats()["spare_mappings"] == 0, store_client.SPARE_IDLE_S + 10)

