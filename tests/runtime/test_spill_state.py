"""ObjectStoreState's spilling, fed events without sockets or files."""

from __future__ import annotations

from lumos._private.object_store import store_state as st

MiB = 1024 * 1024
W1, W2 = b"w" * 20, b"v" * 20
A, B, C, D, E = (bytes([i]) * 20 for i in range(1, 6))


def store(capacity: int = 100 * MiB) -> st.ObjectStoreState:
    return st.ObjectStoreState("/dev/shm/lumos-test", capacity, 0, 2.0, validate=True, spill_dir="/spill")


def put(s: st.ObjectStoreState, rid: int, oid: bytes, size: int, now: float = 0.0) -> list[st.Action]:
    out = s.handle(st.CreateRequested(rid, oid, size, W1), now)
    if any(isinstance(a, st.GrantCreate) for a in out):
        out += s.handle(st.ObjectSealed(oid, size), now)
    return out


def of(actions: list[st.Action], kind: type) -> list:
    return [a for a in actions if isinstance(a, kind)]


def test_full_store_spills_oldest_unpinned_primary_and_grants_when_done():
    s = store()
    put(s, 1, A, 40 * MiB)
    put(s, 2, B, 40 * MiB)
    s.handle(st.ObjectsPinned(W2, [A]), 0)  # a reader holds views of A: never spilled
    out = put(s, 3, C, 40 * MiB)
    (spill,) = of(out, st.SpillObject)
    assert spill.object_id == B and spill.dst == "/spill/" + B.hex() and spill.tmp.startswith("/spill/")
    assert not of(out, st.GrantCreate) and len(s.pending) == 1
    out = s.handle(st.SpillFinished(B, seconds=0.1), 0)
    assert st.UnlinkFile(s.final_path(B)) in out and st.DropMappings([B]) in out
    (g,) = of(out, st.GrantCreate)
    assert g.object_id == C and s.used_bytes == 80 * MiB and s.disk_bytes == 40 * MiB
    assert s.spill_stats()["spilled_objects"] == 1


def test_spill_waits_for_unpin_and_pinned_object_stays():
    s = store()
    put(s, 1, A, 60 * MiB)
    s.handle(st.ObjectsPinned(W2, [A]), 0)
    out = put(s, 2, B, 60 * MiB)
    assert not of(out, st.SpillObject) and len(s.pending) == 1
    out = s.handle(st.ObjectsUnpinned(W2, [A]), 0)
    assert [a.object_id for a in of(out, st.SpillObject)] == [A]


def test_client_gone_releases_its_pins():
    s = store()
    put(s, 1, A, 60 * MiB)
    s.handle(st.ObjectsPinned(W2, [A]), 0)
    put(s, 2, B, 60 * MiB)
    out = s.handle(st.ClientGone(W2), 0)
    assert [a.object_id for a in of(out, st.SpillObject)] == [A]


def test_restore_comes_back_into_store_and_respill_is_an_unlink():
    s = store()
    put(s, 1, A, 60 * MiB)
    put(s, 2, B, 60 * MiB)
    s.handle(st.SpillFinished(A, seconds=0.1), 0)  # B granted
    s.handle(st.ObjectSealed(B, 60 * MiB), 0)
    # Reading A: B must go to disk first (a spill), then A comes back.
    out = s.handle(st.RestoreRequested(A), 0)
    assert [a.object_id for a in of(out, st.SpillObject)] == [B]
    out = s.handle(st.SpillFinished(B, seconds=0.1), 0)
    (r,) = of(out, st.RestoreObject)
    assert r.src == "/spill/" + A.hex() and r.dst == s.final_path(A)
    out = s.handle(st.RestoreFinished(A, seconds=0.1), 0)
    assert out == [st.AnswerRestore(A, "")]
    # Reading B now: A is on disk already, so it is dropped at once (no copy).
    out = s.handle(st.RestoreRequested(B), 0)
    assert not of(out, st.SpillObject) and st.UnlinkFile(s.final_path(A)) in out
    assert of(out, st.RestoreObject)[0].object_id == B


def test_restore_without_room_maps_the_spill_file():
    s = store()
    put(s, 1, A, 60 * MiB)
    put(s, 2, B, 60 * MiB)
    s.handle(st.SpillFinished(A, seconds=0.1), 0)
    s.handle(st.ObjectSealed(B, 60 * MiB), 0)
    s.handle(st.ObjectsPinned(W2, [B]), 0)
    assert s.handle(st.RestoreRequested(A), 0) == [st.AnswerRestore(A, "/spill/" + A.hex())]
    assert s.handle(st.RestoreRequested(C), 0) == [st.AnswerRestore(C, None)]


def test_object_larger_than_store_is_created_on_disk_and_freed_there():
    s = store()
    (g,) = s.handle(st.CreateRequested(1, A, 300 * MiB, W1), 0)
    assert g.on_disk and g.path.startswith("/spill/") and g.final_path == "/spill/" + A.hex()
    s.handle(st.ObjectSealed(A, 300 * MiB), 0)
    assert s.used_bytes == 0 and s.disk_bytes == 300 * MiB
    assert s.handle(st.RestoreRequested(A), 0) == [st.AnswerRestore(A, "/spill/" + A.hex())]
    out = s.handle(st.ObjectsFreed([A], [True]), 0)
    assert out == [st.UnlinkFile("/spill/" + A.hex())] and s.disk_bytes == 0


def test_full_disk_is_one_episode_and_creates_fail_out_of_disk():
    s = store()
    put(s, 1, A, 60 * MiB)
    put(s, 2, B, 60 * MiB)
    out = s.handle(st.SpillFinished(A, "No space left on device", True), 0)
    assert len(of(out, st.DiskFull)) == 1
    (r,) = of(out, st.RejectCreate)
    assert r.out_of_disk and r.request == 2 and "spill directory" in r.reason
    # While the episode lasts: no spill is tried, no second log line.
    out = put(s, 3, C, 60 * MiB)
    assert not of(out, st.SpillObject) and not of(out, st.DiskFull) and of(out, st.RejectCreate)[0].out_of_disk
    (r,) = s.handle(st.CreateRequested(4, D, 300 * MiB, W1), 0)
    assert r.out_of_disk
    # A retry that fails again is the same episode: still no second log line.
    s.handle(st.Ticked(), st.DISK_FULL_RETRY_S)
    out = put(s, 6, C, 60 * MiB, now=st.DISK_FULL_RETRY_S)
    assert [a.object_id for a in of(out, st.SpillObject)] == [A]
    out = s.handle(st.SpillFinished(A, "No space left on device", True), st.DISK_FULL_RETRY_S)
    assert not of(out, st.DiskFull) and of(out, st.RejectCreate)[0].out_of_disk
    # After the retry delay spilling is tried again; a success ends the episode.
    t = 2 * st.DISK_FULL_RETRY_S + 1
    s.handle(st.Ticked(), t)
    out = put(s, 5, E, 60 * MiB, now=t)
    assert [a.object_id for a in of(out, st.SpillObject)] == [A]
    s.handle(st.SpillFinished(A, seconds=0.1), t)
    assert not s.disk_full


def test_free_during_spill_and_restore_removes_the_files_when_done():
    s = store()
    put(s, 1, A, 60 * MiB)
    put(s, 2, B, 60 * MiB)
    out = s.handle(st.ObjectsFreed([A], [False]), 0)  # freed mid-spill
    assert st.UnlinkFile(s.final_path(A)) in out and of(out, st.GrantCreate)  # room at once
    out = s.handle(st.SpillFinished(A, seconds=0.1), 0)
    assert st.UnlinkFile("/spill/" + A.hex()) in out
    s.handle(st.ObjectSealed(B, 60 * MiB), 0)
    put(s, 3, C, 60 * MiB)
    s.handle(st.SpillFinished(B, seconds=0.1), 0)
    put(s, 4, D, 30 * MiB)
    s.handle(st.ObjectsFreed([C], [False]), 0)
    (r,) = of(s.handle(st.RestoreRequested(B), 0), st.RestoreObject)
    out = s.handle(st.ObjectsFreed([B], [False]), 0)
    assert st.UnlinkFile("/spill/" + B.hex()) in out
    out = s.handle(st.RestoreFinished(B, seconds=0.1), 0)
    assert st.UnlinkFile(s.final_path(B)) in out and st.AnswerRestore(B, None) in out
    assert s.disk_bytes == 0 and s.used_bytes == 30 * MiB


def test_pulled_copies_are_evicted_not_spilled_and_spilling_off_rejects():
    s = store()
    s.handle(st.CreateRequested(1, A, 60 * MiB, st.PULLED), 0)
    s.handle(st.ObjectSealed(A, 60 * MiB), 0)
    out = put(s, 2, B, 60 * MiB)
    assert not of(out, st.SpillObject) and st.UnlinkFile(s.final_path(A)) in out
    off = st.ObjectStoreState("/dev/shm/x", 100 * MiB, 0, 2.0, validate=True)
    (r,) = off.handle(st.CreateRequested(1, A, 300 * MiB, W1), 0)
    assert isinstance(r, st.RejectCreate) and "larger than the object store" in r.reason


def test_primaries_are_spilled_ahead_above_the_threshold():
    s = st.ObjectStoreState("/dev/shm/x", 100 * MiB, 0, 2.0, validate=True, spill_dir="/spill", spill_threshold=0.5)
    assert not of(put(s, 1, A, 40 * MiB), st.SpillObject)
    out = put(s, 2, B, 40 * MiB)  # 80% in use: the oldest goes to disk before anyone waits
    assert [a.object_id for a in of(out, st.SpillObject)] == [A]
    assert not of(put(s, 3, C, 10 * MiB), st.SpillObject)  # A's spill already covers it
    s.handle(st.SpillFinished(A, seconds=1.0, started=0.0), 1)
    assert s.used_bytes == 50 * MiB and s.spill_stats()["spill_mib_s"] == 40.0


def test_a_create_no_spill_can_serve_is_written_to_disk_after_a_grace():
    """Every object in the store viewed by some process (arrays from get() kept): a create
    goes to the spill dir after FALLBACK_GRACE_S, as in Ray (it failed with
    ObjectStoreFullError after waiting object_store_full_timeout_s)."""
    s = store()
    put(s, 1, A, 40 * MiB)
    put(s, 2, B, 40 * MiB)
    s.handle(st.ObjectsPinned(W2, [A, B]), 0)
    out = put(s, 3, C, 40 * MiB)
    assert not of(out, st.GrantCreate) and not of(out, st.SpillObject) and len(s.pending) == 1
    assert not of(s.handle(st.Ticked(), st.FALLBACK_GRACE_S / 2), st.GrantCreate)
    (g,) = of(s.handle(st.Ticked(), st.FALLBACK_GRACE_S), st.GrantCreate)
    assert g.on_disk and g.object_id == C and g.final_path == "/spill/" + C.hex() and not s.pending
    s.handle(st.ObjectSealed(C, 40 * MiB), st.FALLBACK_GRACE_S)
    assert s.used_bytes == 80 * MiB and s.disk_bytes == 40 * MiB and s.spill_stats()["fallback_objects"] == 1
    # Read while the store is still full: the reader maps the file on disk.
    assert s.handle(st.RestoreRequested(C), 2) == [st.AnswerRestore(C, "/spill/" + C.hex())]
    # Once there is room, a read brings it into the store.
    s.handle(st.ObjectsUnpinned(W2, [A]), 2)
    s.handle(st.ObjectsFreed([A], [False]), 2)
    (r,) = of(s.handle(st.RestoreRequested(C), 2), st.RestoreObject)
    assert r.object_id == C


def test_a_create_a_spill_in_flight_serves_waits_for_it():
    s = store()
    put(s, 1, A, 60 * MiB)
    out = put(s, 2, B, 60 * MiB)
    assert [a.object_id for a in of(out, st.SpillObject)] == [A]
    assert not of(s.handle(st.Ticked(), st.FALLBACK_GRACE_S + 0.5), st.GrantCreate)  # not to disk
    (g,) = of(s.handle(st.SpillFinished(A, seconds=0.1), 1.6), st.GrantCreate)
    assert g.object_id == B and not g.on_disk


def test_without_spilling_a_create_that_finds_no_room_fails_at_its_deadline():
    off = st.ObjectStoreState("/dev/shm/x", 100 * MiB, 0, 2.0, validate=True)
    put(off, 1, A, 60 * MiB)
    off.handle(st.ObjectsPinned(W2, [A]), 0)
    assert not of(put(off, 2, B, 60 * MiB), st.GrantCreate)
    assert not off.handle(st.Ticked(), st.FALLBACK_GRACE_S)
    (r,) = off.handle(st.Ticked(), 2.0)
    assert isinstance(r, st.RejectCreate) and "object store is full" in r.reason


def test_a_kept_copy_is_a_primary_spilled_under_pressure_never_evicted() -> None:
    s = store()
    for rid, oid in ((1, A), (2, B)):  # copies pulled from another node
        s.handle(st.CreateRequested(rid, oid, 40 * MiB, st.PULLED), 0)
        s.handle(st.ObjectSealed(oid, 40 * MiB), 0)
    # A's home died and its owner keeps this copy; C was never here.
    (kept,) = s.handle(st.CopiesKeepRequested(7, [A, C]), 0)
    assert kept == st.CopiesKept(7, [A]) and s.objects[A].creator == st.KEPT_COPY
    out = s.handle(st.CreateRequested(3, D, 40 * MiB, W1), 0)
    assert st.UnlinkFile(s.final_path(B)) in out and B not in s.objects  # the cache goes
    assert of(out, st.GrantCreate) and A in s.objects
    s.handle(st.ObjectSealed(D, 40 * MiB), 0)
    out = s.handle(st.CreateRequested(4, E, 40 * MiB, W1), 0)
    (spill,) = of(out, st.SpillObject)
    assert spill.object_id == A  # a primary now: spilled, not dropped
    (kept,) = s.handle(st.CopiesKeepRequested(8, [A]), 0)
    assert kept.object_ids == [A]  # kept twice is still kept
