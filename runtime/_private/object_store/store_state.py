"""Space accounting of one node's shared-memory object store (pure state machine).

The raylet owns one ``ObjectStoreState``. Objects are files under the node's store
directory in ``/dev/shm``; this class decides names and sizes, never touches files
itself: it returns actions (``GrantCreate``, ``UnlinkFile``, ``RenameFile``, ...)
that ``RayletServer`` executes.

A file is a *slot*. A freed object that no process views any more (its owner says
so and no reader's pin is left) goes back to a bounded pool as a free slot; the next
create of a fitting size reuses it. Reuse matters: the creator process keeps its
mapping of the slot, so a later put or task return writes to already-faulted pages
(a 16 MiB value: ~2 ms of CPU instead of ~16 ms for a new file on tmpfs, most of it
page faults). Every other freed file is unlinked, which is always safe (readers'
mappings keep their pages alive), and its creator is told to drop its mapping.

```
 create(id, n) ──► GrantCreate(slot, tmp path, reuse?) ──► client writes, renames to final
 sealed(id)    ──► object counted as sealed
 freed(ids)    ──► RenameFile(final → pool) when recyclable, else UnlinkFile
 tick          ──► pool slots freed, and reserved slots granted, pool_idle_s ago or
                   more: UnlinkFile (DropSlot to their mapper or holder)
 no room       ──► evict pool slots (DropSlot to their mapper), then copies pulled from
                   other nodes, then drop primaries already on disk, then SpillObject
                   primaries no process views (oldest first); the create waits for the
                   spills (or frees) until its deadline, then is written to the spill dir
                   (RejectCreate without spilling); one that nothing in flight or
                   spillable can serve goes there after FALLBACK_GRACE_S
 n > capacity  ──► GrantCreate(on_disk): the creator writes straight into the spill dir
 create(id) while another process writes id ──► waits for its seal or its end, then goes
                   on as a create of a sealed object or of a new one; refused after
                   full_timeout_s
 keep copies(ids) ──► pulled copies here become primaries (CopiesKept: those sealed here)
 create(id) another process sealed ──► that file goes (UnlinkFile) and this create goes
                   on (a retry's return), unless a process views it, it is on disk, or
                   it is a copy pulled here of that size (RejectCreate, "exists" at the
                   same size)
 reserve(n, k) ──► GrantSlots(files resv-<slot>, or pool-<slot> from the pool; counted as used)
 reserved seal ──► the file (linked to its final name by the client) becomes the object
 client gone   ──► its reserved files go, under any of their names (resv-, pool-, lent-);
                   one it moved under an object's name and never sealed goes once
                   SweepMoved finds it unknown at two looks (MovedFilesFound); its
                   unsealed objects go under both names (.w and final)
```

Reservations take the create round trip off the put path: a process asks ahead for a
few files of the size it writes (``SlotsReserveRequested``), maps them off its hot
path, and for a put writes one, moves it to the object's final name (never over an
existing file) and says so one way (``ReservedSealed``). Reserved files count as used; they are granted only from the
pool or free room (never by evicting or spilling), and are the first thing taken back
when a create needs room (``UnlinkFile`` + ``DropSlot``). A taken-back file that its
client moved first lives on as the object, counted again when its seal arrives. A free
that arrives before the seal of a reserved object (the owner's free travels on another
connection) leaves a tombstone so the late seal frees it at once. Likewise a reader's pin
can overtake the seal of a reserved put (the owner sealed it one way, then sent the task
that reads it to a worker, whose pin comes on a third connection): a pin of an object
not known yet is kept (``_early_pins``) and counted when the object appears, or it would
be lost, and the object's slot reused under a view that outlives its task.

Lent slots: a process may also write a task's by-value argument into one of its reserved
files and hand that file (renamed ``lent-<slot>``, a name only it and this class use) to
a worker on this node, then write the next argument into it once the task is done; the
raylet never hears of those values (``core_worker/objects.py``). To this class the file
is still a reserved slot: taking it back unlinks only its ``resv-``/``pool-`` name (the
client unlinks a ``lent-`` file itself when told, once its task is done), and when the
client goes every file of its reservations, and of those taken back from it, is unlinked
under all three names.

Spilling (``spill_dir`` set). A primary is spillable when sealed and no process holds
a live view of it (``ObjectsPinned``/``ObjectsUnpinned``, sent by each reader's
``StoreClient`` when its view count of an object leaves or reaches zero; a task's
arguments only when their views outlive the task, their owner holding them meanwhile).
A spill is a
plain file copy in a raylet thread; when it is done the ``/dev/shm`` file is unlinked
and every process on the node is told to drop its cached mapping (``DropMappings``),
so the pages really go. A reader that then misses the file asks for a restore
(``RestoreRequested``): the copy comes back into the store when room can be made at
once, otherwise the reader maps the spill file itself (page cache). The spill file is
kept until the object is freed, so the next spill of a restored object is an unlink.
A spill that fails for lack of disk starts an *episode* (``DiskFull``, logged once).
While it lasts, spills are tried again only every ``DISK_FULL_RETRY_S`` (or at once
after a free of something on disk), and creates that need one fail with
``RejectCreate(out_of_disk=True)``; the first spill that succeeds ends it.
"""

from __future__ import annotations

import dataclasses
import os
from collections import OrderedDict, deque

from .slot_pool import SlotPool
from .store_events import (  # noqa: F401  (re-exported: the raylet uses st.<name>)
    CreateRequested, ObjectSealed, ObjectsFreed, ClientGone, Ticked, MarkedShared, ObjectsPinned,
    ObjectsUnpinned, SpillFinished, RestoreRequested, RestoreFinished, DiskCreateFailed,
    GrantCreate, RejectCreate, UnlinkFile, RenameFile, DropSlot, SpillObject, RestoreObject,
    DropMappings, AnswerRestore, DiskFull, Event, Action, SlotsReserveRequested, ReservedSealed, GrantSlots,
    SweepMoved, MovedFilesFound, CopiesKeepRequested, CopiesKept)

from lumos._private.ids import ObjectID, WorkerID

#: The creator of copies the raylet pulled from other nodes (secondary copies: the
#: primary stays where the object was made, so these may be evicted under pressure).
PULLED = b"object-manager"
#: The creator of such a copy once its object's primary died with its node and the
#: owner made this copy the primary (``CopiesKeepRequested``): spilled, never evicted.
KEPT_COPY = b"kept-copy"

#: A tombstone of an id freed before its reserved seal arrived is kept this long, and at
#: most this many.
FREED_UNKNOWN_S = 60.0
FREED_UNKNOWN_MAX = 65536

#: A file's name under its object's final name (the id in hex), and being written.
OBJECT_NAME_LEN = 40
TMP_SUFFIX = ".w"


def names_an_object(name: str) -> bool:
    """A store or spill file name of an object (``final_path``, ``_tmp_path``), not of a
    slot (``pool-``, ``resv-``, ``lent-``: never named again once gone)."""
    return len(name) == OBJECT_NAME_LEN or (len(name) == OBJECT_NAME_LEN + len(TMP_SUFFIX)
                                            and name.endswith(TMP_SUFFIX))


#: A client that goes may have moved reserved files under objects' names and died before
#: their seals: an object file unknown here at two looks at the store directory this far
#: apart (the same file, ``SweepMoved``) is unlinked. Much longer than a seal takes to come.
MOVED_SWEEP_S = 2.0

#: Pins of objects not known yet (``_early_pins``) kept at most.
EARLY_PINS_MAX = 65536

#: After a spill failed for lack of disk, spills are tried again after this long.
DISK_FULL_RETRY_S = 2.0

#: A create that waits this long while no spill or free could make its room (every
#: object in the store is viewed by some process, say) is written to the spill directory
#: instead, as an object larger than the store is (Ray's fallback allocation).
FALLBACK_GRACE_S = 1.0

#: Reserved slots taken back from a client remembered for its exit (one it had lent
#: keeps its ``lent-`` file until its task is done, or until the client goes).
TAKEN_BACK_MAX = 4096

#: Slots one ``SlotsReserveRequested`` grants at most (a process keeps up to 16 slots of
#: small values reserved, asked for at its first put, then topped up by half).
MAX_GRANT = 16


@dataclasses.dataclass(slots=True)
class _Obj:
    slot: int
    file_size: int
    size_bytes: int
    creator: WorkerID
    sealed: bool
    shared: bool
    #: The file is in the store (counted in ``used_bytes``), or being restored into it.
    in_shm: bool = True
    #: A complete copy is in the spill dir.
    on_disk: bool = False
    spilling: bool = False
    restoring: bool = False
    #: Processes holding live views.
    pins: int = 0
    #: Its store file was dropped once: never pool it (a creator may map an older inode).
    moved: bool = False


@dataclasses.dataclass(slots=True)
class _Pending:
    request: CreateRequested
    deadline: float
    since: float


class ObjectStoreState:
    """Space accounting and slot reuse for one node's store."""

    def __init__(self, directory: str, capacity_bytes: int, recycle_bytes: int,
                 full_timeout_s: float, validate: bool = False, spill_dir: str = "",
                 spill_threshold: float = 1.0, pool_idle_s: float = 0.0) -> None:
        self.directory = directory
        #: Where primaries go under pressure ("" : spilling off).
        self.spill_dir = spill_dir
        self._dir_prefix = os.path.join(directory, "")
        self._spill_prefix = os.path.join(spill_dir, "") if spill_dir else ""
        #: Above this fraction of capacity in use, sealed primaries are spilled ahead of
        #: need, so a stream of puts rarely waits for a spill.
        self.spill_threshold = spill_threshold
        #: End of the latest spill / restore copy counted in the busy time.
        self._busy_until = {"spill": 0.0, "restore": 0.0}
        #: Bytes of files allowed in the store (objects + pooled slots).
        self.capacity_bytes = capacity_bytes
        #: Bytes of free slots kept for reuse.
        self.recycle_bytes = recycle_bytes
        #: A pooled slot no create took, or a reserved slot its holder did not use, for
        #: this long is unlinked at a tick, so a burst leaves no /dev/shm held on an idle
        #: node (0: kept until room is needed).
        self.pool_idle_s = pool_idle_s
        #: Pooled and reserved slots unlinked for being idle that long.
        self.trimmed_slots = 0
        self.full_timeout_s = full_timeout_s
        self.validate = validate
        #: Object id -> its file (creating or sealed), in the store or on disk.
        self.objects: dict[bytes, _Obj] = {}
        #: The objects whose file is in the store, least recently made or restored first
        #: (what spilling and eviction scan, so spilled objects cost them nothing).
        self.resident: OrderedDict[bytes, _Obj] = OrderedDict()
        #: Free slots: slot -> (file size, last mapper), oldest first.
        self.pool = SlotPool()
        #: Bytes of all files (objects and pool).
        self.used_bytes = 0
        #: Creates waiting for space, first come first served.
        self.pending: deque[_Pending] = deque()
        self._next_slot = 1
        #: Pulled copies evicted to make room.
        self.evicted = 0
        #: Client -> objects it holds live views of.
        self.pins: dict[WorkerID, set[ObjectID]] = {}
        #: Bytes of spills in flight (freed from the store when they finish).
        self.spilling_bytes = 0
        #: Spills / restores in flight of objects freed meanwhile: their files go when done.
        self._spill_orphans: set[bytes] = set()
        self._restore_orphans: set[bytes] = set()
        #: Out-of-disk episode: when it began (None: no episode).
        self.disk_full = False
        #: During an episode, when spilling may be tried again.
        self.disk_retry_at = 0.0
        #: ``now`` of the event being handled.
        self._now = 0.0
        #: Bytes of files in the spill dir.
        self.disk_bytes = 0
        self.spilled_bytes = 0
        self.spilled_objects = 0
        #: Creates written to the spill dir because no room could be made in the store.
        self.fallback_objects = 0
        self.spill_seconds = 0.0
        self.restored_bytes = 0
        self.restored_objects = 0
        self.restore_seconds = 0.0
        #: Restores answered with the spill file (no room in the store): read from disk.
        self.restored_from_disk = 0
        self.out_of_disk_rejects = 0
        #: Restores waiting for spills in flight to make room: (object id, deadline).
        self.restores_waiting: deque[tuple[bytes, float]] = deque()
        #: Reserved files: slot -> (file size, client), oldest first (counted in used_bytes).
        self.reserved: dict[int, tuple[int, bytes]] = {}
        #: Reserved slot -> when it was granted, oldest first: one unused past
        #: ``pool_idle_s`` is taken back at a tick, like a pooled slot.
        self._reserved_at: dict[int, float] = {}
        #: Reserved slots granted from the pool, under their pool names (``pool-<slot>``;
        #: new ones are ``resv-<slot>``): the client renames that file to its object's.
        self._reserved_from_pool: set[int] = set()
        self.reserved_bytes = 0
        #: Ids freed while unknown here and reservations were out: id -> when (a reserved
        #: seal may still be on its way; it frees the object at once).
        self._freed_unknown: OrderedDict[ObjectID, float] = OrderedDict()
        #: Object id -> clients that pinned it before it was known here (in their
        #: ``pins`` too); counted when it appears, forgotten at their unpin or exit.
        self._early_pins: OrderedDict[ObjectID, set[WorkerID]] = OrderedDict()
        #: Client -> reserved slots taken back from it (``TAKEN_BACK_MAX`` at most): a
        #: ``lent-`` file of one is unlinked when the client goes, if it is still there.
        self._taken_back: dict[WorkerID, OrderedDict[int, None]] = {}
        #: Files a dead client left under objects' names, unsealed, that were unlinked
        #: (``MovedFilesFound``).
        self.swept_files = 0
        #: Object id -> creates of it waiting for another process that writes it now
        #: (its seal or its end, ``_create``); refused at their deadline.
        self._same_id_waiting: dict[ObjectID, list[_Pending]] = {}

    @property
    def pool_bytes(self) -> int:
        """Bytes of free slots kept for reuse."""
        return self.pool.bytes

    # ------------------------------------------------------------------ paths

    # Paths are a kept prefix plus the name: ``os.path.join`` was a tenth of the raylet's
    # CPU under 1 MiB by-value task arguments (a pooled slot's free and reserve each
    # build two).

    def final_path(self, object_id: ObjectID) -> str:
        return self._dir_prefix + object_id.hex()

    def _tmp_path(self, object_id: ObjectID) -> str:
        return self._dir_prefix + object_id.hex() + TMP_SUFFIX

    def _pool_path(self, slot: int) -> str:
        return f"{self._dir_prefix}pool-{slot}"

    def _resv_path(self, slot: int) -> str:
        return f"{self._dir_prefix}resv-{slot}"

    def lent_path(self, slot: int) -> str:
        """A reserved slot's file while its client lends it to a task (``lent-<slot>``)."""
        return f"{self._dir_prefix}lent-{slot}"

    def spill_path(self, object_id: ObjectID) -> str:
        return self._spill_prefix + object_id.hex()

    def _spill_tmp_path(self, object_id: ObjectID) -> str:
        return self._spill_prefix + object_id.hex() + TMP_SUFFIX

    # ------------------------------------------------------------------ events

    def handle(self, event: Event, now: float) -> list[Action]:
        actions: list[Action] = []
        self._now = now
        if isinstance(event, CreateRequested):
            self._create(event, now, actions)
        elif isinstance(event, ObjectSealed):
            obj = self.objects.get(event.object_id)
            if obj is not None:
                obj.sealed = True
                self._spill_ahead(actions)
                self._wake_same_id(event.object_id, now, actions)
        elif isinstance(event, ReservedSealed):
            self._reserved_sealed(event, now, actions)
        elif isinstance(event, SlotsReserveRequested):
            self._reserve(event, actions)
        elif isinstance(event, ObjectsFreed):
            for oid, recyclable in zip(event.object_ids, event.recyclable):
                if self.reserved and oid not in self.objects:
                    self._freed_unknown[oid] = now
                self._free(oid, recyclable, actions)
            while len(self._freed_unknown) > FREED_UNKNOWN_MAX:
                self._freed_unknown.popitem(last=False)
            self._retry_pending(now, actions)
        elif isinstance(event, MarkedShared):
            for oid in event.object_ids:
                obj = self.objects.get(oid)
                if obj is not None:
                    obj.shared = True
        elif isinstance(event, ClientGone):
            for oid, obj in list(self.objects.items()):
                if obj.creator == event.client and not obj.sealed:
                    # Under its name being written, and under its final name: the client
                    # renames the file there before it sends the seal, and may have died
                    # in between.
                    final = self.final_path(oid) if obj.in_shm else self.spill_path(oid)
                    self._free(oid, False, actions, tmp=True)
                    actions.append(UnlinkFile(final))
            self.pool.forget_mapper(event.client)
            mine = [s for s, (_, c) in self.reserved.items() if c == event.client]
            if mine:
                actions.append(SweepMoved([(self._pool_path(slot) if slot in self._reserved_from_pool
                                            else self._resv_path(slot), self.lent_path(slot)) for slot in mine]))
            for slot in mine:
                self._drop_reservation(slot, actions, tell=False)
            for slot in self._taken_back.pop(event.client, ()):
                actions.append(UnlinkFile(self.lent_path(slot)))
            self._unpin(event.client, list(self.pins.get(event.client, ())))
            self.pins.pop(event.client, None)
            self.pending = deque(p for p in self.pending if p.request.client != event.client)
            for oid, waiting in list(self._same_id_waiting.items()):
                waiting[:] = [p for p in waiting if p.request.client != event.client]
                if not waiting:
                    del self._same_id_waiting[oid]
            self._retry_pending(now, actions)
        elif isinstance(event, Ticked):
            if self.pool_idle_s > 0:
                self._trim_idle(now - self.pool_idle_s, actions)
            while self._freed_unknown and next(iter(self._freed_unknown.values())) < now - FREED_UNKNOWN_S:
                self._freed_unknown.popitem(last=False)
            if self.disk_full and now >= self.disk_retry_at and self.pending:
                self._retry_pending(now, actions)
            for oid, waiting in list(self._same_id_waiting.items()):
                for p in [p for p in waiting if p.deadline <= now]:
                    waiting.remove(p)
                    actions.append(RejectCreate(p.request.request, oid, (
                        f"object {oid.hex()} is still being written by another process after "
                        f"{self.full_timeout_s:.0f}s (object_store_full_timeout_s)")))
                if not waiting:
                    del self._same_id_waiting[oid]
            while self.restores_waiting and self.restores_waiting[0][1] <= now:
                self._restore_from_disk(self.restores_waiting.popleft()[0], actions)
            while self.pending:
                p = self.pending[0]
                if self._fall_back_to_disk(p, now):
                    self.pending.popleft()
                    self.fallback_objects += 1
                    self._create_on_disk(p.request, actions)
                elif p.deadline <= now:
                    self.pending.popleft()
                    actions.append(RejectCreate(p.request.request, p.request.object_id, self._full_reason(
                        p.request.size_bytes, waited=True)))
                else:
                    break
        elif isinstance(event, ObjectsPinned):
            held = self.pins.setdefault(event.client, set())
            for oid in event.object_ids:
                if oid in held:
                    continue
                obj = self.objects.get(oid)
                if obj is not None:
                    held.add(oid)
                    obj.pins += 1
                elif oid not in self._freed_unknown:  # (its seal is on its way)
                    held.add(oid)
                    self._early_pins.setdefault(oid, set()).add(event.client)
                    while len(self._early_pins) > EARLY_PINS_MAX:
                        old, clients = self._early_pins.popitem(last=False)
                        for c in clients:
                            self.pins.get(c, set()).discard(old)
        elif isinstance(event, ObjectsUnpinned):
            self._unpin(event.client, event.object_ids)
            self._retry_pending(now, actions)
        elif isinstance(event, SpillFinished):
            self._spill_finished(event, now, actions)
        elif isinstance(event, RestoreRequested):
            self._restore(event.object_id, now, actions)
        elif isinstance(event, RestoreFinished):
            self._restore_finished(event, actions)
        elif isinstance(event, MovedFilesFound):
            for oid in event.object_ids:
                if oid not in self.objects:
                    actions.append(UnlinkFile(self.final_path(oid)))
                    self.swept_files += 1
                    # Its writer, frozen rather than dead, may still send the seal: that
                    # seal finds the object freed (its readers find it lost).
                    self._freed_unknown[oid] = now
        elif isinstance(event, CopiesKeepRequested):
            kept = []
            for oid in event.object_ids:
                obj = self.objects.get(oid)
                if obj is not None and obj.sealed:
                    if obj.creator == PULLED:
                        obj.creator = KEPT_COPY
                    kept.append(oid)
            actions.append(CopiesKept(event.request, kept))
            self._spill_ahead(actions)
        elif isinstance(event, DiskCreateFailed):
            obj = self.objects.pop(event.object_id, None)
            if obj is not None:
                self.disk_bytes -= obj.file_size
                actions.append(UnlinkFile(self._spill_tmp_path(event.object_id)))
            self._disk_full(now, event.error, actions)
            self._wake_same_id(event.object_id, now, actions)
        if self.validate:
            self.check_invariants()
        return actions

    def _create(self, ev: CreateRequested, now: float, actions: list[Action]) -> None:
        obj = self.objects.get(ev.object_id)
        if obj is not None:
            if not obj.sealed and ev.client != PULLED and obj.creator not in (ev.client, PULLED):
                # Another process writes this id now: most often a task's attempt that
                # died, its worker not reaped yet, and this is the retry's. After its seal
                # this create goes on as one of a sealed object (below), after its end as
                # one of a new object. Refused at once, the retry's put failed with
                # "object already exists in the store".
                self._same_id_waiting.setdefault(ev.object_id, []).append(
                    _Pending(ev, now + self.full_timeout_s, now))
                return
            same = obj.sealed and obj.size_bytes == ev.size_bytes
            if ev.client == PULLED or obj.creator == ev.client or not obj.sealed or obj.pins or obj.spilling \
                    or obj.restoring or obj.on_disk or (same and obj.creator == PULLED):
                if same and ev.client != PULLED:
                    obj.creator = ev.client  # a re-run's result now: a primary, never evicted
                actions.append(RejectCreate(ev.request, ev.object_id, "object already exists in the store", same))
                return
            # Sealed by another process, in the store only, viewed by nobody: a task's
            # return its attempt sealed before it died (its owner never had the reply),
            # and this is the retry's. The retry's value replaces it: of another size, a
            # refusal failed the retry ("object already exists in the store"), and of
            # the same size, keeping it gave a task of several returns two attempts' values.
            # A copy pulled here of another size (a re-run of a task whose value
            # changed) is a cache: it goes too.
            self._free(ev.object_id, False, actions)
        if ev.size_bytes > self.capacity_bytes:
            if not self.spill_dir:
                actions.append(RejectCreate(ev.request, ev.object_id, self._full_reason(ev.size_bytes, waited=False)))
            elif self._disk_blocked():
                self.out_of_disk_rejects += 1
                actions.append(RejectCreate(ev.request, ev.object_id, self._disk_reason(ev.size_bytes),
                                            out_of_disk=True))
            else:
                self._create_on_disk(ev, actions)
            return
        if self.pending or not self._try_grant(ev, actions):
            self.pending.append(_Pending(ev, now + self.full_timeout_s, now))
            self._reject_hopeless(actions)

    def _create_on_disk(self, ev: CreateRequested, actions: list[Action]) -> None:
        """The creator writes the object straight into the spill dir; readers map that file
        (or get it restored into the store once there is room)."""
        self.objects[ev.object_id] = self._with_early_pins(ev.object_id, _Obj(
            -1, ev.size_bytes, ev.size_bytes, ev.client, False, False, in_shm=False, on_disk=True, moved=True))
        self.disk_bytes += ev.size_bytes
        if ev.client != PULLED:
            self.spilled_bytes += ev.size_bytes
            self.spilled_objects += 1
        actions.append(GrantCreate(ev.request, ev.object_id, -1, self._spill_tmp_path(ev.object_id),
                                   self.spill_path(ev.object_id), ev.size_bytes, True, on_disk=True))

    def _fall_back_to_disk(self, p: _Pending, now: float) -> bool:
        """Write the create at the head of the queue to disk: its deadline passed, or it
        waited ``FALLBACK_GRACE_S`` while nothing in flight or spillable could make room."""
        if not self.spill_dir or self._disk_blocked():
            return False
        if p.deadline <= now:
            return True
        return now - p.since >= FALLBACK_GRACE_S and self.spilling_bytes == 0 \
            and not self._would_fit_with_spilling(p.request.size_bytes)

    def _try_grant(self, ev: CreateRequested, actions: list[Action]) -> bool:
        slot = self._pick_slot(ev.size_bytes, ev.client)
        if slot is not None:
            file_size, mapper = self.pool.take(slot)
            if mapper and mapper != ev.client:
                actions.append(DropSlot(mapper, slot))  # its old mapping would only pin pages
            tmp = self._tmp_path(ev.object_id)
            actions.append(RenameFile(self._pool_path(slot), tmp))
            self.objects[ev.object_id] = self.resident[ev.object_id] = self._with_early_pins(ev.object_id, _Obj(
                slot, file_size, ev.size_bytes, ev.client, False, False))
            actions.append(GrantCreate(ev.request, ev.object_id, slot, tmp,
                                       self.final_path(ev.object_id), file_size, True))
            return True
        if not self._make_room(ev.size_bytes, actions):
            return False
        slot = self._next_slot
        self._next_slot += 1
        self.used_bytes += ev.size_bytes
        self.objects[ev.object_id] = self.resident[ev.object_id] = self._with_early_pins(ev.object_id, _Obj(
            slot, ev.size_bytes, ev.size_bytes, ev.client, False, False))
        actions.append(GrantCreate(ev.request, ev.object_id, slot, self._tmp_path(ev.object_id),
                                   self.final_path(ev.object_id), ev.size_bytes, False))
        return True

    def _reserve(self, ev: SlotsReserveRequested, actions: list[Action]) -> None:
        granted: list[tuple[int, str, int, bool]] = []
        if not self.pending and 0 < ev.size_bytes <= self.capacity_bytes // 16:
            held = sum(size for size, client in self.reserved.values() if client == ev.client)
            for _ in range(min(ev.count, MAX_GRANT)):
                slot = self.pool.pick(ev.size_bytes, ev.client)
                if slot is not None:
                    file_size, mapper = self.pool.peek(slot)
                    if held + file_size > self.capacity_bytes // 8:
                        break
                    self.pool.take(slot)
                    if mapper and mapper != ev.client:
                        actions.append(DropSlot(mapper, slot))
                    # Granted under its pool name: no rename here (a slot out of the pool
                    # is under that name for nobody else; taken back, it is unlinked).
                    self._reserved_from_pool.add(slot)
                    reused = True
                else:
                    file_size = ev.size_bytes
                    # Only free room: speculation never evicts, spills or delays a create.
                    if held + file_size > self.capacity_bytes // 8 or \
                            self.used_bytes + file_size > self.capacity_bytes:
                        break
                    slot = self._next_slot
                    self._next_slot += 1
                    self.used_bytes += file_size
                    reused = False
                held += file_size
                self.reserved[slot] = (file_size, ev.client)
                self._reserved_at[slot] = self._now
                self.reserved_bytes += file_size
                path = self._pool_path(slot) if reused else self._resv_path(slot)
                granted.append((slot, path, file_size, reused))
        actions.append(GrantSlots(ev.request, granted))

    def _reserved_sealed(self, ev: ReservedSealed, now: float, actions: list[Action]) -> None:
        held = self.reserved.get(ev.slot)
        if held is not None and held[1] == ev.client:
            del self.reserved[ev.slot]
            del self._reserved_at[ev.slot]
            self._reserved_from_pool.discard(ev.slot)
            self.reserved_bytes -= held[0]
            file_size, moved = held[0], False
        else:  # taken back after the client linked it: the file lives on, count it again
            file_size, moved = ev.file_size, True
            self.used_bytes += file_size
        if ev.object_id in self.objects:  # cannot be under that name (the link refused)
            self.used_bytes -= file_size
            return
        if self._freed_unknown.pop(ev.object_id, None) is not None:  # its owner freed it already
            self.used_bytes -= file_size
            actions.append(UnlinkFile(self.final_path(ev.object_id)))
            actions.append(DropSlot(ev.client, ev.slot))
            self._retry_pending(now, actions)
            return
        self.objects[ev.object_id] = self.resident[ev.object_id] = self._with_early_pins(ev.object_id, _Obj(
            ev.slot, file_size, ev.size_bytes, ev.client, True, False, moved=moved))
        self._spill_ahead(actions)

    def _with_early_pins(self, oid: ObjectID, obj: _Obj) -> _Obj:
        """``obj``, appearing now, counting the pins that came before it (``_early_pins``)."""
        if self._early_pins:
            obj.pins += len(self._early_pins.pop(oid, ()))
        return obj

    def _drop_reservation(self, slot: int, actions: list[Action], tell: bool = True) -> None:
        """Take a reserved slot back (``tell``: the client lives on and is told), or drop
        it with its client. Its ``lent-`` file, if the client lent it to a task, is the
        client's to unlink once that task is done: unlinked here only with the client."""
        file_size, client = self.reserved.pop(slot)
        del self._reserved_at[slot]
        self.reserved_bytes -= file_size
        self.used_bytes -= file_size
        if slot in self._reserved_from_pool:
            self._reserved_from_pool.discard(slot)
            actions.append(UnlinkFile(self._pool_path(slot)))
        else:
            actions.append(UnlinkFile(self._resv_path(slot)))
        if tell:
            actions.append(DropSlot(client, slot))
            taken = self._taken_back.setdefault(client, OrderedDict())
            taken[slot] = None
            if len(taken) > TAKEN_BACK_MAX:
                taken.popitem(last=False)
        else:
            actions.append(UnlinkFile(self.lent_path(slot)))

    def _pick_slot(self, size: int, client: WorkerID) -> int | None:
        return self.pool.pick(size, client)

    def _make_room(self, size: int, actions: list[Action], spill: bool = True) -> bool:
        """Free store space for ``size`` bytes: synchronously where a copy is elsewhere
        (pool slots, pulled copies, primaries already on disk), else by starting spills
        (``spill``) that free it when done. True if ``size`` fits now."""
        while self.used_bytes + size > self.capacity_bytes and self.pool:
            self._evict_oldest_slot(actions)
        while self.used_bytes + size > self.capacity_bytes and self.reserved:
            self._drop_reservation(next(iter(self.reserved)), actions)
        if self.used_bytes + size > self.capacity_bytes:
            self._evict_pulled_copies(size, actions)
        if self.used_bytes + size > self.capacity_bytes and self.spill_dir:
            self._drop_or_spill(size, actions, spill)
        return self.used_bytes + size <= self.capacity_bytes

    def _spillable(self, obj: _Obj) -> bool:
        return obj.sealed and obj.in_shm and not obj.restoring and not obj.spilling and obj.pins == 0 \
            and obj.creator != PULLED

    def _spill_ahead(self, actions: list[Action]) -> None:
        if not self.spill_dir or self.pending or self._disk_blocked():
            return
        target = int(self.capacity_bytes * self.spill_threshold)
        over = self.used_bytes - self.pool_bytes - self.reserved_bytes - self.spilling_bytes - target
        if over <= 0:
            return
        spills = []
        for oid, obj in self.resident.items():
            if over <= 0:
                break
            if not obj.on_disk and self._spillable(obj):
                spills.append(oid)
                over -= obj.file_size
        self._start_spills(spills, actions)

    def _start_spills(self, spills: list[bytes], actions: list[Action]) -> None:
        for oid in spills:
            obj = self.objects[oid]
            obj.spilling = True
            self.spilling_bytes += obj.file_size
            actions.append(SpillObject(oid, self.final_path(oid), self._spill_tmp_path(oid), self.spill_path(oid),
                                       obj.size_bytes))

    def _count_busy(self, kind: str, started: float, seconds: float) -> float:
        """Seconds of ``[started, started + seconds]`` not yet counted (copies overlap)."""
        end = started + seconds
        add = max(0.0, end - max(started, self._busy_until[kind]))
        self._busy_until[kind] = max(self._busy_until[kind], end)
        return add

    def _drop_or_spill(self, size: int, actions: list[Action], spill: bool) -> None:
        need = self.used_bytes + size - self.capacity_bytes - self.spilling_bytes
        if need <= 0:
            return  # spills in flight will make the room
        drops: list[bytes] = []
        spills: list[bytes] = []
        for oid, obj in self.resident.items():  # oldest first; primaries already on disk first
            if need <= 0:
                break
            if obj.on_disk and self._spillable(obj):
                drops.append(oid)
                need -= obj.file_size
        if need > 0 and spill and not self._disk_blocked():
            for oid, obj in self.resident.items():
                if need <= 0:
                    break
                if not obj.on_disk and self._spillable(obj):
                    spills.append(oid)
                    need -= obj.file_size
        if need > 0:
            return  # cannot fit yet: wait for frees and unpins rather than move data for nothing
        if drops:
            for oid in drops:
                self._drop_from_store(oid, actions)
            actions.append(DropMappings(drops))
        self._start_spills(spills, actions)

    def _drop_from_store(self, oid: ObjectID, actions: list[Action]) -> None:
        obj = self.resident.pop(oid)
        obj.in_shm = False
        obj.moved = True
        self.used_bytes -= obj.file_size
        actions.append(UnlinkFile(self.final_path(oid)))

    def _spill_finished(self, ev: SpillFinished, now: float, actions: list[Action]) -> None:
        oid = ev.object_id
        if oid in self._spill_orphans:  # freed while spilling: the store file went then
            self._spill_orphans.discard(oid)
            if not ev.error:
                actions.append(UnlinkFile(self.spill_path(oid)))
            self._retry_pending(now, actions)
            return
        obj = self.objects.get(oid)
        if obj is None or not obj.spilling:
            return
        obj.spilling = False
        self.spilling_bytes -= obj.file_size
        if ev.error:  # any failure pauses spilling (a retry loop on a broken disk helps nobody)
            self._disk_full(now, ev.error, actions)
            self._retry_pending(now, actions)
            return
        self.disk_full = False
        obj.on_disk = True
        self.disk_bytes += obj.file_size
        self.spilled_bytes += obj.size_bytes
        self.spilled_objects += 1
        self.spill_seconds += self._count_busy("spill", ev.started, ev.seconds)
        if obj.pins == 0:
            self._drop_from_store(oid, actions)
            actions.append(DropMappings([oid]))
        self._retry_pending(now, actions)

    def _disk_full(self, now: float, error: str, actions: list[Action]) -> None:
        self.disk_retry_at = now + DISK_FULL_RETRY_S
        if not self.disk_full:
            self.disk_full = True
            actions.append(DiskFull(f"spilling to {self.spill_dir} failed ({error}); creates that need "
                                    "spilling fail with OutOfDiskError until space is freed there"))

    def _disk_blocked(self) -> bool:
        """An out-of-disk episode is on and the next try is not due yet."""
        return self.disk_full and self._now < self.disk_retry_at

    def _reject_hopeless(self, actions: list[Action]) -> None:
        """During an out-of-disk episode, creates that only spilling could serve fail now."""
        while self.pending and self._disk_blocked() and self.spilling_bytes == 0:
            p = self.pending[0]
            if self._would_fit_with_spilling(p.request.size_bytes):
                self.pending.popleft()
                self.out_of_disk_rejects += 1
                actions.append(RejectCreate(p.request.request, p.request.object_id,
                                            self._disk_reason(p.request.size_bytes), out_of_disk=True))
            else:
                return

    def _would_fit_with_spilling(self, size: int) -> bool:
        free = self.capacity_bytes - self.used_bytes + self.pool_bytes + self.reserved_bytes
        free += sum(o.file_size for o in self.resident.values() if self._spillable(o) or
                    (o.in_shm and o.sealed and o.creator == PULLED))
        return size <= free

    def _restore(self, oid: ObjectID, now: float, actions: list[Action]) -> None:
        obj = self.objects.get(oid)
        if obj is None or not obj.sealed:
            actions.append(AnswerRestore(oid, None))
            return
        if obj.restoring or any(w == oid for w, _ in self.restores_waiting):
            return  # answered when it is done
        if obj.in_shm:
            self.resident.move_to_end(oid)  # recently used: spilled last
            actions.append(AnswerRestore(oid, ""))
            return
        if not obj.on_disk:
            actions.append(AnswerRestore(oid, None))
            return
        if obj.file_size <= self.capacity_bytes and not self.pending and not self.restores_waiting:
            if self._try_restore(oid, actions):
                return
            if self.spilling_bytes:  # spills in flight make the room
                self.restores_waiting.append((oid, now + self.full_timeout_s))
                return
        self._restore_from_disk(oid, actions)

    def _try_restore(self, oid: ObjectID, actions: list[Action]) -> bool:
        obj = self.objects[oid]
        if not self._make_room(obj.file_size, actions):
            return False
        obj.restoring = True
        obj.in_shm = True
        self.used_bytes += obj.file_size
        self.resident[oid] = obj
        actions.append(RestoreObject(oid, self.spill_path(oid), self._tmp_path(oid) + "r", self.final_path(oid),
                                     obj.size_bytes))
        return True

    def _retry_restores(self, actions: list[Action]) -> None:
        while self.restores_waiting:
            oid = self.restores_waiting[0][0]
            obj = self.objects.get(oid)
            if obj is None or obj.in_shm or not obj.on_disk:
                self.restores_waiting.popleft()
                self._restore_answer_now(oid, actions)
                continue
            if self._try_restore(oid, actions):
                self.restores_waiting.popleft()
                continue
            if self.spilling_bytes:
                return
            self.restores_waiting.popleft()
            self._restore_from_disk(oid, actions)

    def _restore_answer_now(self, oid: ObjectID, actions: list[Action]) -> None:
        obj = self.objects.get(oid)
        if obj is None or not obj.sealed:
            actions.append(AnswerRestore(oid, None))
        elif obj.in_shm and not obj.restoring:
            actions.append(AnswerRestore(oid, ""))
        elif not obj.restoring:
            self._restore_from_disk(oid, actions)

    def _restore_from_disk(self, oid: ObjectID, actions: list[Action]) -> None:
        """No room in the store soon: the reader maps the spill file (page cache)."""
        obj = self.objects.get(oid)
        if obj is not None and obj.in_shm:
            self._restore_answer_now(oid, actions)
            return
        if obj is None or not obj.on_disk:
            actions.append(AnswerRestore(oid, None))
            return
        self.restored_from_disk += 1
        self.restored_bytes += obj.size_bytes
        self.restored_objects += 1
        actions.append(AnswerRestore(oid, self.spill_path(oid)))

    def _restore_finished(self, ev: RestoreFinished, actions: list[Action]) -> None:
        oid = ev.object_id
        if oid in self._restore_orphans:
            self._restore_orphans.discard(oid)
            if not ev.error:
                actions.append(UnlinkFile(self.final_path(oid)))
            actions.append(AnswerRestore(oid, None))
            return
        obj = self.objects.get(oid)
        if obj is None or not obj.restoring:
            return
        obj.restoring = False
        self.restored_bytes += obj.size_bytes
        self.restored_objects += 1
        if ev.error:
            obj.in_shm = False
            del self.resident[oid]
            self.used_bytes -= obj.file_size
            self.restored_from_disk += 1
            actions.append(AnswerRestore(oid, self.spill_path(oid)))
            return
        self.restore_seconds += self._count_busy("restore", ev.started, ev.seconds)
        actions.append(AnswerRestore(oid, ""))

    def _unpin(self, client: WorkerID, object_ids: list[ObjectID]) -> None:
        held = self.pins.get(client)
        if held is None:
            return
        for oid in object_ids:
            if oid in held:
                held.discard(oid)
                obj = self.objects.get(oid)
                if obj is not None and obj.pins > 0:
                    obj.pins -= 1
                elif obj is None and oid in self._early_pins:
                    early = self._early_pins[oid]
                    early.discard(client)
                    if not early:
                        del self._early_pins[oid]
        if not held:
            del self.pins[client]

    def _evict_pulled_copies(self, size: int, actions: list[Action]) -> None:
        """Unlink sealed copies pulled from other nodes, oldest first, until ``size`` fits
        (only if it then fits: evicting for a create that must wait anyway gains nothing).
        Readers that map one keep their pages; a later reader pulls it again."""
        need = self.used_bytes + size - self.capacity_bytes
        victims = []
        for oid, obj in self.resident.items():
            if need <= 0:
                break
            if obj.sealed and obj.creator == PULLED:
                victims.append(oid)
                need -= obj.file_size
        if need > 0:
            return
        for oid in victims:
            del self.objects[oid]
            obj = self.resident.pop(oid)
            self.used_bytes -= obj.file_size
            self.evicted += 1
            actions.append(UnlinkFile(self.final_path(oid)))

    def _evict_oldest_slot(self, actions: list[Action]) -> None:
        slot, file_size, mapper = self.pool.take_oldest()
        self.used_bytes -= file_size
        actions.append(UnlinkFile(self._pool_path(slot)))
        if mapper:
            actions.append(DropSlot(mapper, slot))

    def _trim_idle(self, before: float, actions: list[Action]) -> None:
        """Unlink pooled slots freed, and take back reserved slots granted, at ``before``
        or earlier: a burst's files stay only while the node keeps using them."""
        while (since := self.pool.idle_since()) is not None and since <= before:
            self._evict_oldest_slot(actions)
            self.trimmed_slots += 1
        while self._reserved_at:
            slot, granted = next(iter(self._reserved_at.items()))  # (the oldest: no copy each tick)
            if granted > before:
                break
            self._drop_reservation(slot, actions)
            self.trimmed_slots += 1

    def _wake_same_id(self, oid: ObjectID, now: float, actions: list[Action]) -> None:
        """``oid`` was sealed or freed: creates that waited for its other writer go on."""
        for p in self._same_id_waiting.pop(oid, ()):
            self._create(p.request, now, actions)

    def _free(self, oid: ObjectID, recyclable: bool, actions: list[Action], tmp: bool = False) -> None:
        self._free_file(oid, recyclable, actions, tmp)
        self._wake_same_id(oid, self._now, actions)

    def _free_file(self, oid: ObjectID, recyclable: bool, actions: list[Action], tmp: bool = False) -> None:
        obj = self.objects.pop(oid, None)
        if obj is None:
            return
        self.resident.pop(oid, None)
        if obj.spilling:
            self.spilling_bytes -= obj.file_size
            self._spill_orphans.add(oid)
        if obj.on_disk:
            self.disk_bytes -= obj.file_size
            self.disk_retry_at = self._now  # disk space comes back: spilling may work again
            actions.append(UnlinkFile(self.spill_path(oid) if obj.sealed and not tmp else self._spill_tmp_path(oid)))
        if not obj.in_shm:
            return
        if obj.restoring:
            self.used_bytes -= obj.file_size
            self._restore_orphans.add(oid)
            return
        path = self._tmp_path(oid) if tmp or not obj.sealed else self.final_path(oid)
        if obj.moved:
            recyclable = False
        # pins == 0: no process views it, so rewriting the file changes nobody's value.
        if recyclable and obj.sealed and not obj.shared and obj.pins == 0 and obj.file_size <= self.recycle_bytes:
            while self.pool_bytes + obj.file_size > self.recycle_bytes and self.pool:
                self._evict_oldest_slot(actions)
            self.pool.add(obj.slot, obj.file_size, obj.creator, self._now)
            actions.append(RenameFile(path, self._pool_path(obj.slot)))
        else:
            self.used_bytes -= obj.file_size
            actions.append(UnlinkFile(path))
            actions.append(DropSlot(obj.creator, obj.slot))

    def _retry_pending(self, now: float, actions: list[Action]) -> None:
        self._retry_restores(actions)
        while self.pending:
            if self._try_grant(self.pending[0].request, actions):
                self.pending.popleft()
                continue
            before = len(self.pending)
            self._reject_hopeless(actions)
            if len(self.pending) == before:
                return

    def _full_reason(self, size: int, waited: bool) -> str:
        mib = 1024 * 1024
        if size > self.capacity_bytes:
            return (f"object of {size / mib:.1f} MiB is larger than the object store "
                    f"({self.capacity_bytes / mib:.1f} MiB); start the cluster with a larger "
                    "object_store_memory or split the value")
        return (f"object store is full: {self.used_bytes / mib:.1f} of {self.capacity_bytes / mib:.1f} MiB "
                f"in use, {size / mib:.1f} MiB needed" + (f", waited {self.full_timeout_s:.0f}s for frees" if waited else "")
                + "; drop references to objects you no longer need, or raise object_store_memory")

    def _disk_reason(self, size: int) -> str:
        mib = 1024 * 1024
        return (f"object of {size / mib:.1f} MiB needs spilling, and the spill directory {self.spill_dir} is "
                f"full ({self.disk_bytes / mib:.1f} MiB spilled by this node); free space there, drop "
                "references to objects you no longer need, or set object_spilling_directory to a larger disk")

    # ------------------------------------------------------------------ queries

    def stats(self) -> dict[str, int]:
        return {"used_bytes": self.used_bytes, "capacity_bytes": self.capacity_bytes,
                "pool_bytes": self.pool_bytes, "reserved_bytes": self.reserved_bytes, "num_objects": len(self.objects),
                "pending_creates": len(self.pending), "evicted_copies": self.evicted,
                "swept_files": self.swept_files, "trimmed_slots": self.trimmed_slots}

    def spill_stats(self) -> dict[str, float]:
        mib = 1024 * 1024
        return {"spilled_bytes": self.spilled_bytes, "spilled_objects": self.spilled_objects,
                "restored_bytes": self.restored_bytes, "restored_objects": self.restored_objects,
                "restored_from_disk": self.restored_from_disk, "fallback_objects": self.fallback_objects,
                "spill_mib_s": self.spilled_bytes / mib / self.spill_seconds if self.spill_seconds else 0.0,
                "restore_mib_s": self.restored_bytes / mib / self.restore_seconds if self.restore_seconds else 0.0,
                "disk_bytes": self.disk_bytes, "spilling_bytes": self.spilling_bytes,
                "out_of_disk": self.disk_full, "out_of_disk_rejects": self.out_of_disk_rejects,
                "spill_dir": self.spill_dir}  # type: ignore[dict-item]

    def check_invariants(self) -> None:
        total = sum(o.file_size for o in self.objects.values() if o.in_shm) + self.pool.bytes \
            + self.reserved_bytes
        for oid, clients in self._early_pins.items():
            if oid in self.objects or not clients or any(oid not in self.pins.get(c, ()) for c in clients):
                raise AssertionError(f"early pins of {oid.hex()} drifted")
        if sum(size for size, _ in self.reserved.values()) != self.reserved_bytes:
            raise AssertionError("reservation accounting drifted")
        if self._reserved_at.keys() != self.reserved.keys():
            raise AssertionError("reservation times drifted")
        if total != self.used_bytes:
            raise AssertionError(f"store accounting drifted: files {total} != used {self.used_bytes}")
        self.pool.check()
        if {k for k, o in self.objects.items() if o.in_shm} != set(self.resident):
            raise AssertionError("resident objects drifted")
        if sum(o.file_size for o in self.objects.values() if o.spilling) != self.spilling_bytes:
            raise AssertionError("spill accounting drifted")
        if sum(o.file_size for o in self.objects.values() if o.on_disk) != self.disk_bytes:
            raise AssertionError("spill-dir accounting drifted")
