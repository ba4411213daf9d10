"""One process's table of objects: values it owns, refs it borrows, and their counts.

Owned by the ``CoreWorker``; used from user threads and the ``lumos-io`` thread under
one reentrant lock. An entry lives while anything holds the object:

- ``local``: live ``ObjectRef`` instances in this process;
- ``submitted``: tasks this process submitted that take it as an argument;
- ``contained``: objects this process holds whose values contain this ref;
- ``borrowers`` (owned objects): other processes that hold refs to it.

When all reach zero the entry goes: an owned object is freed (its store file too), a
borrowed one is released at its owner. ``ObjectRef.__del__`` only appends to
``decrements`` (safe from any thread, during GC, without the lock); ``drain`` folds
them in at well-defined points.

```
  owner (this process)                    borrower
  entry.borrowers += B  <── AddBorrowers ──  (via the task reply or a get)
  entry.borrowers -= B  <── RemoveBorrowers  local+submitted+contained == 0
```
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
from collections import deque
from typing import Any, Callable, Iterable

from lumos import exceptions as exc
from lumos._private import interrupts
from lumos._private.ids import NodeID, ObjectID, WorkerID, short
from lumos._private.protocol import messages as m
from lumos._private.serialization import KIND_ERROR, deserialize, kind_of
from lumos._private.transport.connection import Connection, ConnectionLost
from lumos.object_ref import ObjectRef

logger = logging.getLogger(__name__)

PENDING, READY, FAILED = 0, 1, 2


def holds_error(e: "ObjectEntry") -> bool:
    """The object is done and its value is an error (a failed task's, or a system one)."""
    if e.state == FAILED:
        return True
    return e.state == READY and e.data is not None and kind_of(e.data) == KIND_ERROR


class Waiter:
    """A user thread waiting for ``remaining`` objects; released when it reaches zero, or,
    with ``fail_fast`` (a get), at the first of them that failed (``failed`` names it)."""

    __slots__ = ("lock", "remaining", "order", "fail_fast", "failed", "_released", "_single")

    #: Waits for one object released so far, in this process (a sync call's get; the
    #: io thread spins after a reply that released one: ``ResultsMixin._spin_after_reply``).
    single_releases = 0

    def __init__(self, remaining: int, fail_fast: bool = False) -> None:
        self.lock = threading.Lock()
        self.lock.acquire()
        self.remaining = remaining
        #: Object ids in the order they became ready.
        self.order: list[bytes] = []
        self.fail_fast = fail_fast
        self.failed: bytes | None = None
        self._released = False
        self._single = remaining == 1

    def hit(self, object_id: ObjectID, failed: bool = False) -> None:
        """One of them is done (under the object table's lock)."""
        self.order.append(object_id)
        self.remaining -= 1
        if failed and self.failed is None:
            self.failed = object_id
        if not self._released and (self.remaining == 0 or (self.fail_fast and self.failed is not None)):
            self._released = True
            if self._single:
                Waiter.single_releases += 1  # (under the object table's lock, as every hit)
            self.lock.release()


class ObjectEntry:
    __slots__ = ("owned", "owner", "local", "submitted", "contained", "borrowers", "state",
                 "data", "node_id", "size", "waiters", "nested", "shared", "registered",
                 "fetching", "callbacks", "lent", "kept", "seen", "copies")

    def __init__(self, owned: bool, owner: m.Address | None) -> None:
        self.owned = owned
        #: Owner's address (None when owned here).
        self.owner = owner
        self.local = 0
        self.submitted = 0
        self.contained = 0
        #: Borrower worker id -> address (owned objects only).
        self.borrowers: dict[bytes, m.Address] | None = None
        self.state = PENDING
        #: The serialized value when it is small (inline), else None.
        self.data: bytes | None = None
        #: Node whose store holds the value when it is large.
        self.node_id: NodeID | None = None
        #: Owned: other nodes whose stores hold copies of that value (``copies.py``; io thread).
        self.copies: list[NodeID] | None = None
        self.size = 0
        self.waiters: list[Waiter] | None = None
        #: Refs nested in the value: ``[(object_id, owner Address)]``; held while this lives.
        self.nested: list[tuple[bytes, m.Address]] | None = None
        #: The ref left this process (its store file may have other readers).
        self.shared = False
        #: Borrowed: the owner knows we hold it (we must tell it when we let go).
        self.registered = False
        #: Borrowed: a status request to the owner is in flight.
        self.fetching = False
        #: Functions to call (on the io thread) when the object is ready.
        self.callbacks: list[Any] | None = None
        #: A by-value argument lent in this reserved slot's file (``StoreClient.write_lent``;
        #: the raylet does not know it); -1: not lent.
        self.lent = -1
        #: A worker still viewed the lent value after its task (``TaskReply.kept``).
        self.kept = False
        #: Its error value was raised by a ``get`` here, or became a dependent task's
        #: (an error nobody saw is reported when the entry goes: ``unhandled_error``).
        self.seen = False

    def alive(self) -> bool:
        return bool(self.local or self.submitted or self.contained or self.borrowers)


class Freed:
    """An entry that just went away; the core worker releases what it held."""

    __slots__ = ("object_id", "entry")

    def __init__(self, object_id: ObjectID, entry: ObjectEntry) -> None:
        self.object_id = object_id
        self.entry = entry


class ObjectTable:
    def __init__(self, worker_id: WorkerID) -> None:
        self.worker_id = worker_id
        # Reentrant: a drain may run from a __del__ while the same thread holds it.
        self.lock = threading.RLock()
        #: Object id -> entry.
        self.entries: dict[bytes, ObjectEntry] = {}
        #: Object ids whose ObjectRef instances died (from any thread).
        self.decrements: deque[bytes] = deque()
        #: Called once, outside the lock, when the first borrower of an owned object is
        #: recorded (a worker follows other workers' deaths from then on).
        self.on_first_borrower: Callable[[], None] | None = None
        #: Borrower worker id -> the owned objects it borrows (a death drops its borrows
        #: without a scan of every entry).
        self.lent: dict[bytes, set[bytes]] = {}
        #: This process's node (set by its core worker), and whether a value stored on
        #: another node was ever recorded here (``wait(fetch_local=True)`` looks only then).
        self.local_node: bytes | None = None
        self.remote_values = False

    # ------------------------------------------------------------------ creation

    def add_owned(self, object_id: ObjectID, local: int = 1) -> ObjectEntry:
        e = self.entries.get(object_id)
        if e is None:
            e = self.entries[object_id] = ObjectEntry(True, None)
        e.local += local
        return e

    def ref_created(self, object_id: ObjectID, owner: m.Address | None, worker_id: WorkerID) -> ObjectEntry:
        """An ObjectRef instance appeared (deserialized or copied)."""
        with self.lock:
            e = self.entries.get(object_id)
            if e is None:
                owned = owner is None or owner.worker_id == worker_id
                e = self.entries[object_id] = ObjectEntry(owned, None if owned else owner)
            e.local += 1
            return e

    # ------------------------------------------------------------------ counts

    def drain(self) -> list[Freed]:
        """Apply pending ``ObjectRef`` deaths. Returns the entries that went away."""
        decs = self.decrements
        if not decs:
            return []
        freed: list[Freed] = []
        with self.lock:
            entries = self.entries
            while decs:
                oid = decs.popleft()
                e = entries.get(oid)
                if e is None:
                    continue
                e.local -= 1
                if e.local <= 0 and not e.alive():
                    self._remove(oid, e, freed)
        return freed

    def add_submitted(self, ids: Iterable[bytes]) -> None:
        with self.lock:
            for oid in ids:
                e = self.entries.get(oid)
                if e is not None:
                    e.submitted += 1
                    e.shared = True

    def remove_submitted(self, ids: Iterable[bytes]) -> list[Freed]:
        freed: list[Freed] = []
        with self.lock:
            for oid in ids:
                e = self.entries.get(oid)
                if e is None:
                    continue
                e.submitted -= 1
                if not e.alive():
                    self._remove(oid, e, freed)
        return freed

    def add_contained(self, refs: Iterable[tuple[bytes, m.Address]], registered: bool) -> None:
        """Refs nested in a value this process holds; keep them while it lives."""
        with self.lock:
            for oid, owner in refs:
                e = self.entries.get(oid)
                if e is None:
                    owned = owner.worker_id == self.worker_id
                    e = self.entries[oid] = ObjectEntry(owned, None if owned else owner)
                e.contained += 1
                if registered and not e.owned:
                    e.registered = True

    def add_borrower(self, oid: ObjectID, borrower: m.Address) -> bool:
        with self.lock:
            e = self.entries.get(oid)
            if e is None or not e.owned:
                return False
            if e.borrowers is None:
                e.borrowers = {}
            e.borrowers[borrower.worker_id] = borrower
            e.shared = True
            lent = self.lent.get(borrower.worker_id)
            if lent is None:
                lent = self.lent[borrower.worker_id] = set()
            lent.add(oid)
            first, self.on_first_borrower = self.on_first_borrower, None
        if first is not None:
            first()
        return True

    def remove_borrower(self, ids: Iterable[bytes], borrower_worker_id: WorkerID) -> list[Freed]:
        freed: list[Freed] = []
        with self.lock:
            for oid in ids:
                e = self.entries.get(oid)
                if e is None or not e.borrowers:
                    continue
                e.borrowers.pop(borrower_worker_id, None)
                lent = self.lent.get(borrower_worker_id)
                if lent is not None:
                    lent.discard(oid)
                    if not lent:
                        del self.lent[borrower_worker_id]
                if not e.borrowers:
                    e.borrowers = None
                if not e.alive():
                    self._remove(oid, e, freed)
        return freed

    def remove_borrowers_on(self, worker_ids: set[WorkerID]) -> list[Freed]:
        """Processes died: drop them as borrowers everywhere."""
        freed: list[Freed] = []
        with self.lock:
            for wid in worker_ids:
                for oid in self.lent.pop(wid, ()):
                    e = self.entries.get(oid)
                    if e is None or not e.borrowers or e.borrowers.pop(wid, None) is None:
                        continue
                    if not e.borrowers:
                        e.borrowers = None
                    if not e.alive():
                        self._remove(oid, e, freed)
        return freed

    def release_nested(self, nested: list[tuple[bytes, m.Address]]) -> list[Freed]:
        freed: list[Freed] = []
        with self.lock:
            for oid, _owner in nested:
                e = self.entries.get(oid)
                if e is None:
                    continue
                e.contained -= 1
                if not e.alive():
                    self._remove(oid, e, freed)
        return freed

    def _remove(self, oid: ObjectID, e: ObjectEntry, freed: list[Freed]) -> None:
        del self.entries[oid]
        freed.append(Freed(oid, e))
        if e.nested:
            for noid, _owner in e.nested:
                ne = self.entries.get(noid)
                if ne is None:
                    continue
                ne.contained -= 1
                if not ne.alive():
                    self._remove(noid, ne, freed)
        if e.waiters:
            # Nobody can be waiting on an object nobody references; release defensively.
            for w in e.waiters:
                w.hit(oid)

    # ------------------------------------------------------------------ values

    def complete(self, oid: ObjectID, state: int, data: bytes | None, node_id: NodeID | None,
                 size: int, nested: list[tuple[bytes, m.Address]] | None) -> ObjectEntry | None:
        """The value is known. Returns the entry (None if nobody holds it any more)."""
        with self.lock:
            e = self.entries.get(oid)
            if e is None:
                return None
            if e.state != PENDING and e.owned:
                return e  # a late duplicate (retry raced a reply)
            e.state = state
            e.data = data
            e.node_id = node_id
            e.copies = None
            e.size = size
            if node_id is not None and node_id != self.local_node:
                self.remote_values = True
            if nested:
                e.nested = list(nested)
            waiters, e.waiters = e.waiters, None
            if waiters:
                failed = holds_error(e)
                for w in waiters:
                    w.hit(oid, failed)
            return e

    def reset_pending(self, oid: ObjectID) -> None:
        """A retried or reconstructed task will produce this value again."""
        with self.lock:
            e = self.entries.get(oid)
            if e is not None:
                e.state = PENDING
                e.data = None
                e.node_id = None
                e.copies = None

    def stats(self) -> dict[str, int]:
        with self.lock:
            owned = sum(1 for e in self.entries.values() if e.owned)
            return {"entries": len(self.entries), "owned": owned, "borrowed": len(self.entries) - owned}


class ReferencesMixin:
    """``CoreWorker``'s reference counting across processes: borrowers registered with
    owners, entries released (store frees, ``RemoveBorrowers``), lineage dropped with
    the last return of a task (any thread unless noted)."""

    objects: ObjectTable
    worker_id: WorkerID
    address: m.Address
    store: Any
    raylet: Any
    executor: Any
    io: Any
    #: Store frees gathered in this turn of the io loop: ``(ids, recyclable)``, sent as
    #: one ``FreeObjects`` by ``_flush_frees`` (io thread only).
    _pending_frees: tuple[list[bytes], list[bool]] | None = None
    _lineage_drops: Any

    def on_ref_deserialized(self, object_id: ObjectID, owner: m.Address | None) -> ObjectRef:
        e = self.objects.ref_created(object_id, owner, self.worker_id)
        if not e.owned and not e.registered and owner is not None:
            if self._in_arg_context():
                # Passed in a task's arguments: the executor reports it with the reply if
                # the task keeps it (the caller then registers this process as borrower).
                self.executor.note_arg_borrow(object_id, owner)
            else:
                e.registered = True
                self._post(self._send_add_borrower, object_id, owner)
        return ObjectRef(object_id, owner, True)

    def _in_arg_context(self) -> bool:
        ex = self.executor
        return ex is not None and ex.deserializing_args()

    def _send_add_borrower(self, object_id: ObjectID, owner: m.Address) -> None:
        self._spawn(self._notify_peer(owner, m.AddBorrowers([object_id], self.address)), "add-borrower")

    async def _notify_peer(self, address: m.Address, msg: Any) -> None:
        try:
            conn = await self._peer(address)
        except (OSError, ConnectionLost, TimeoutError) as e:
            logger.debug("cannot reach %s for %s: %s", short(address.worker_id), type(msg).__name__, e)
            return
        conn.notify(msg)

    def drain_refs(self) -> None:
        """Apply dropped ObjectRefs (user threads call this at API entry). The stop button
        is held off meanwhile: between the entries' removal and their frees, it left the
        values in the store for the driver's life."""
        if self.objects.decrements:
            held = interrupts.hold()
            try:
                freed = self.objects.drain()
                if freed:
                    self._release(freed)
            finally:
                if held:
                    interrupts.release()

    def _release(self, freed: list[Freed]) -> None:
        """Entries went away: free owned values, release borrowed ones (any thread)."""
        store_frees: list[bytes] = []
        recyclable: list[bool] = []
        unborrow: dict[bytes, tuple[m.Address, list[bytes]]] = {}
        dropped = self.owner.lineage_hit(freed)
        seals: list[m.SealObject] | None = None
        for f in freed:
            e = f.entry
            if e.owned:
                if e.data is not None and not e.seen and holds_error(e):
                    unhandled_error(e.data)
                if e.lent >= 0:
                    # A lent argument whose task is done: its slot takes the next one, unless
                    # a worker still views it (then it becomes an object, freed at once: its
                    # file is unlinked, the worker's mapping keeps the pages).
                    if not e.kept and self.store.reclaim(f.object_id):
                        continue
                    seal = self._publish_lent(f.object_id, e)
                    if seal is None:
                        continue
                    if seals is None:
                        seals = []
                    seals.append(seal)
                    self.store.release(f.object_id, True)
                    store_frees.append(f.object_id)
                    recyclable.append(False)
                elif e.node_id is not None and e.data is None:
                    # Readers elsewhere may still view it: the raylet checks their pins.
                    r = self.store.release(f.object_id, False)
                    if r is None:
                        continue  # viewed here: freed when the last view goes (_free_after_views)
                    store_frees.append(f.object_id)
                    recyclable.append(r)
            else:
                self.store.release(f.object_id, True)
                if e.registered and e.owner is not None:
                    unborrow.setdefault(e.owner.worker_id, (e.owner, []))[1].append(f.object_id)
        if seals:  # (before their frees, on the same connection)
            if self.io.in_io_thread():
                self._notify_all_raylet(seals)
            else:
                self._post(self._notify_all_raylet, seals)
        if store_frees or unborrow:
            if self.io.in_io_thread():  # a task's reply released its arguments: no wake-up
                self._send_releases(store_frees, recyclable, unborrow)
            elif unborrow or seals or not self._free_now(store_frees, recyclable):
                self._post(self._send_releases, store_frees, recyclable, unborrow)
        if dropped:
            if self.io.in_io_thread():
                self._post(self._drop_lineage, dropped)
            else:
                # Not posted: in a sync loop the next call follows at once, and a post
                # would wake the io thread and send that call through it (the direct
                # write needs it idle). Dropped at its next turn (a reply, a flush).
                self._lineage_drops.extend(dropped)
                self.wake_flush()

    def _send_releases(self, store_frees: list[bytes], recyclable: list[bool],
                       unborrow: dict[bytes, tuple[m.Address, list[bytes]]]) -> None:
        """Io thread. Store frees leave together at the end of this loop turn: the
        replies of a burst of tasks free their arguments in one message to the raylet."""
        if store_frees and self.raylet is not None:
            pending = self._pending_frees
            if pending is None:
                self._pending_frees = (list(store_frees), list(recyclable))
                asyncio.get_running_loop().call_soon(self._flush_frees)
            else:
                pending[0].extend(store_frees)
                pending[1].extend(recyclable)
        for owner, ids in unborrow.values():
            self._spawn(self._notify_peer(owner, m.RemoveBorrowers(ids, self.worker_id)), "remove-borrower")

    def _free_now(self, store_frees: list[bytes], recyclable: list[bool]) -> bool:
        """User thread: write the frees (after the pin changes waiting, as ``_flush_frees``
        does) straight to the raylet when nothing posted waits to leave before them. A
        sync loop over large return values drops the last one as it submits the next
        call: posted, the free woke the io thread and, the io thread no longer idle, sent
        that call through it too (a second hand-over on its path). False: nothing sent."""
        raylet = self.raylet
        if raylet is None or not self.io.idle() or self._pending_frees is not None:
            return False
        msgs: list[Any] = self._pin_messages()
        msgs.append(m.FreeObjects(store_frees, recyclable))
        if raylet.write_all_now(msgs):
            return True
        if len(msgs) > 1:  # the pin changes were taken: they leave first, through the io thread
            self._post(self._notify_all_raylet, msgs[:-1])
        return False

    def _notify_all_raylet(self, msgs: list[Any]) -> None:
        if self.raylet is not None:
            for msg in msgs:
                self.raylet.notify(msg)

    def _flush_frees(self) -> None:
        pending, self._pending_frees = self._pending_frees, None
        if pending is not None and self.raylet is not None:
            # Unpins waiting (``_store_pin_changed``) go first, in the same write: a free
            # of an object the raylet still counts as viewed here would not reuse its slot.
            for msg in self._pin_messages():
                self.raylet.notify(msg)
            self.raylet.notify(m.FreeObjects(*pending))

    def _handle_add_borrowers(self, conn: Connection, msg: m.AddBorrowers) -> bool:
        for oid in msg.object_ids:
            self.objects.add_borrower(oid, msg.borrower)
        return True

    def _handle_remove_borrowers(self, conn: Connection, msg: m.RemoveBorrowers) -> None:
        freed = self.objects.remove_borrower(msg.object_ids, msg.borrower_worker_id)
        if freed:
            self._release(freed)

    def _handle_drop_slots(self, conn: Connection, msg: m.DropSlots) -> None:
        for slot in msg.slots:
            self.store.drop_slot(slot)


#: Set either to 1 to keep errors nobody looked at to themselves (Ray's name works too).
IGNORE_UNHANDLED_ENV = ("LUMOS_IGNORE_UNHANDLED_ERRORS", "RAY_IGNORE_UNHANDLED_ERRORS")


def unhandled_error(blob: bytes) -> None:
    """An error value this process owns is going away and nobody ever got it (a task
    called and its ref dropped, ``f.remote()`` alone on a line): print it once, as Ray
    does, so a failing fire-and-forget call does not go unnoticed. A cancelled task's
    error is not worth a line."""
    if any(os.environ.get(name, "") not in ("", "0") for name in IGNORE_UNHANDLED_ENV):
        return
    try:
        _, error = deserialize(blob)
    except Exception:  # (an error that does not unpickle here: nothing to show)
        return
    if isinstance(error, exc.TaskCancelledError):
        return
    text = str(error).rstrip()
    try:
        sys.stderr.write(f"Unhandled error (suppress with '{IGNORE_UNHANDLED_ENV[0]}=1'): {text}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
