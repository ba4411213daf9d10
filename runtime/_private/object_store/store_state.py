"""Space accounting of one node's shared-memory object store (pure state machine).

The raylet owns one ``ObjectStoreState``. Objects are files under the node's store
directory in ``/dev/shm``; this class decides names and sizes, never touches files
itself: it returns actions (``GrantCreate``, ``UnlinkFile``, ``RenameFile``, ...)
that ``RayletServer`` executes.

A file is a *slot*. A freed object whose creator was its only reader, and whose
creator holds no views of it any more, goes back to a bounded pool as a free slot;
the next create of a fitting size reuses it. Reuse matters: the creator process keeps
its mapping of the slot, so a later put writes to already-faulted pages (about 3x
faster than a new file on tmpfs). Every other freed file is unlinked, which is always
safe (readers' mappings keep their pages alive).

```
 create(id, n) ──► GrantCreate(slot, tmp path, reuse?) ──► client writes, renames to final
 sealed(id)    ──► object counted as sealed
 freed(ids)    ──► RenameFile(final → pool) when recyclable, else UnlinkFile
 no room       ──► evict pool slots (DropSlot to their mapper), then copies pulled from
                   other nodes (oldest first; a reader pulls again), else the create
                   waits for frees until its deadline, then RejectCreate
```
"""

from __future__ import annotations

import dataclasses
import os
from collections import OrderedDict, deque
from typing import Union

#: The creator of copies the raylet pulled from other nodes (secondary copies: the
#: primary stays where the object was made, so these may be evicted under pressure).
PULLED = b"object-manager"


# ----------------------------------------------------------------------------- events

@dataclasses.dataclass(slots=True)
class CreateRequested:
    request: int          #: id the server uses to answer the client
    object_id: bytes
    size_bytes: int
    client: bytes         #: worker id of the creating process


@dataclasses.dataclass(slots=True)
class ObjectSealed:
    object_id: bytes
    size_bytes: int


@dataclasses.dataclass(slots=True)
class ObjectsFreed:
    object_ids: list[bytes]
    recyclable: list[bool]


@dataclasses.dataclass(slots=True)
class ClientGone:
    client: bytes


@dataclasses.dataclass(slots=True)
class Ticked:
    pass


@dataclasses.dataclass(slots=True)
class MarkedShared:
    object_ids: list[bytes]


Event = Union[CreateRequested, ObjectSealed, ObjectsFreed, ClientGone, Ticked, MarkedShared]


# ----------------------------------------------------------------------------- actions

@dataclasses.dataclass(slots=True)
class GrantCreate:
    request: int
    object_id: bytes
    slot: int
    path: str             #: where the client writes (renamed to the final name when done)
    final_path: str
    file_size: int        #: size of the file; >= the requested size for a reused slot
    reused: bool


@dataclasses.dataclass(slots=True)
class RejectCreate:
    request: int
    object_id: bytes
    reason: str
    #: The object is already here, sealed, with that size (a copy pulled earlier): a
    #: task that made it again can use it as its result.
    exists: bool = False


@dataclasses.dataclass(slots=True)
class UnlinkFile:
    path: str


@dataclasses.dataclass(slots=True)
class RenameFile:
    src: str
    dst: str


@dataclasses.dataclass(slots=True)
class DropSlot:
    client: bytes
    slot: int


Action = Union[GrantCreate, RejectCreate, UnlinkFile, RenameFile, DropSlot]


@dataclasses.dataclass(slots=True)
class _Obj:
    slot: int
    file_size: int
    size_bytes: int
    creator: bytes
    sealed: bool
    shared: bool


@dataclasses.dataclass(slots=True)
class _Pending:
    request: CreateRequested
    deadline: float


class ObjectStoreState:
    """Space accounting and slot reuse for one node's store."""

    def __init__(self, directory: str, capacity_bytes: int, recycle_bytes: int,
                 full_timeout_s: float, validate: bool = False) -> None:
        self.directory = directory
        #: Bytes of files allowed in the store (objects + pooled slots).
        self.capacity_bytes = capacity_bytes
        #: Bytes of free slots kept for reuse.
        self.recycle_bytes = recycle_bytes
        self.full_timeout_s = full_timeout_s
        self.validate = validate
        #: Object id -> its file (creating or sealed).
        self.objects: dict[bytes, _Obj] = {}
        #: Free slots: slot -> (file size, last mapper), oldest first.
        self.pool: OrderedDict[int, tuple[int, bytes]] = OrderedDict()
        self.pool_bytes = 0
        #: Bytes of all files (objects and pool).
        self.used_bytes = 0
        #: Creates waiting for space, first come first served.
        self.pending: deque[_Pending] = deque()
        self._next_slot = 1
        #: Pulled copies evicted to make room.
        self.evicted = 0

    # ------------------------------------------------------------------ paths

    def final_path(self, object_id: bytes) -> str:
        return os.path.join(self.directory, object_id.hex())

    def _tmp_path(self, object_id: bytes) -> str:
        return os.path.join(self.directory, object_id.hex() + ".w")

    def _pool_path(self, slot: int) -> str:
        return os.path.join(self.directory, f"pool-{slot}")

    # ------------------------------------------------------------------ events

    def handle(self, event: Event, now: float) -> list[Action]:
        actions: list[Action] = []
        if isinstance(event, CreateRequested):
            self._create(event, now, actions)
        elif isinstance(event, ObjectSealed):
            obj = self.objects.get(event.object_id)
            if obj is not None:
                obj.sealed = True
        elif isinstance(event, ObjectsFreed):
            for oid, recyclable in zip(event.object_ids, event.recyclable):
                self._free(oid, recyclable, actions)
            self._retry_pending(now, actions)
        elif isinstance(event, MarkedShared):
            for oid in event.object_ids:
                obj = self.objects.get(oid)
                if obj is not None:
                    obj.shared = True
        elif isinstance(event, ClientGone):
            for oid, obj in list(self.objects.items()):
                if obj.creator == event.client and not obj.sealed:
                    self._free(oid, False, actions, tmp=True)
            for slot, (size, mapper) in list(self.pool.items()):
                if mapper == event.client:
                    self.pool[slot] = (size, b"")
            self.pending = deque(p for p in self.pending if p.request.client != event.client)
            self._retry_pending(now, actions)
        elif isinstance(event, Ticked):
            while self.pending and self.pending[0].deadline <= now:
                p = self.pending.popleft()
                actions.append(RejectCreate(p.request.request, p.request.object_id, self._full_reason(
                    p.request.size_bytes, waited=True)))
        if self.validate:
            self.check_invariants()
        return actions

    def _create(self, ev: CreateRequested, now: float, actions: list[Action]) -> None:
        obj = self.objects.get(ev.object_id)
        if obj is not None:
            same = obj.sealed and obj.size_bytes == ev.size_bytes
            if same and ev.client != PULLED:
                obj.creator = ev.client  # a re-run's result now: a primary, never evicted
            actions.append(RejectCreate(ev.request, ev.object_id, "object already exists in the store", same))
            return
        if ev.size_bytes > self.capacity_bytes:
            actions.append(RejectCreate(ev.request, ev.object_id, self._full_reason(ev.size_bytes, waited=False)))
            return
        if self.pending or not self._try_grant(ev, actions):
            self.pending.append(_Pending(ev, now + self.full_timeout_s))

    def _try_grant(self, ev: CreateRequested, actions: list[Action]) -> bool:
        slot = self._pick_slot(ev.size_bytes, ev.client)
        if slot is not None:
            file_size, _mapper = self.pool.pop(slot)
            self.pool_bytes -= file_size
            tmp = self._tmp_path(ev.object_id)
            actions.append(RenameFile(self._pool_path(slot), tmp))
            self.objects[ev.object_id] = _Obj(slot, file_size, ev.size_bytes, ev.client, False, False)
            actions.append(GrantCreate(ev.request, ev.object_id, slot, tmp,
                                       self.final_path(ev.object_id), file_size, True))
            return True
        if not self._make_room(ev.size_bytes, actions):
            return False
        slot = self._next_slot
        self._next_slot += 1
        self.used_bytes += ev.size_bytes
        self.objects[ev.object_id] = _Obj(slot, ev.size_bytes, ev.size_bytes, ev.client, False, False)
        actions.append(GrantCreate(ev.request, ev.object_id, slot, self._tmp_path(ev.object_id),
                                   self.final_path(ev.object_id), ev.size_bytes, False))
        return True

    def _pick_slot(self, size: int, client: bytes) -> int | None:
        """A pooled slot that fits without wasting more than half; the client's own first."""
        best = None
        for slot, (file_size, mapper) in self.pool.items():
            if size <= file_size <= 2 * size + 4096:
                if mapper == client:
                    return slot
                if best is None:
                    best = slot
        return best

    def _make_room(self, size: int, actions: list[Action]) -> bool:
        while self.used_bytes + size > self.capacity_bytes and self.pool:
            self._evict_oldest_slot(actions)
        if self.used_bytes + size > self.capacity_bytes:
            self._evict_pulled_copies(size, actions)
        return self.used_bytes + size <= self.capacity_bytes

    def _evict_pulled_copies(self, size: int, actions: list[Action]) -> None:
        """Unlink sealed copies pulled from other nodes, oldest first, until ``size`` fits
        (only if it then fits: evicting for a create that must wait anyway gains nothing).
        Readers that map one keep their pages; a later reader pulls it again."""
        need = self.used_bytes + size - self.capacity_bytes
        victims = []
        for oid, obj in self.objects.items():
            if need <= 0:
                break
            if obj.sealed and obj.creator == PULLED:
                victims.append(oid)
                need -= obj.file_size
        if need > 0:
            return
        for oid in victims:
            obj = self.objects.pop(oid)
            self.used_bytes -= obj.file_size
            self.evicted += 1
            actions.append(UnlinkFile(self.final_path(oid)))

    def _evict_oldest_slot(self, actions: list[Action]) -> None:
        slot, (file_size, mapper) = self.pool.popitem(last=False)
        self.pool_bytes -= file_size
        self.used_bytes -= file_size
        actions.append(UnlinkFile(self._pool_path(slot)))
        if mapper:
            actions.append(DropSlot(mapper, slot))

    def _free(self, oid: bytes, recyclable: bool, actions: list[Action], tmp: bool = False) -> None:
        obj = self.objects.pop(oid, None)
        if obj is None:
            return
        path = self._tmp_path(oid) if tmp or not obj.sealed else self.final_path(oid)
        if recyclable and obj.sealed and not obj.shared and obj.file_size <= self.recycle_bytes:
            while self.pool_bytes + obj.file_size > self.recycle_bytes and self.pool:
                self._evict_oldest_slot(actions)
            self.pool[obj.slot] = (obj.file_size, obj.creator)
            self.pool_bytes += obj.file_size
            actions.append(RenameFile(path, self._pool_path(obj.slot)))
        else:
            self.used_bytes -= obj.file_size
            actions.append(UnlinkFile(path))
            actions.append(DropSlot(obj.creator, obj.slot))

    def _retry_pending(self, now: float, actions: list[Action]) -> None:
        while self.pending:
            if not self._try_grant(self.pending[0].request, actions):
                return
            self.pending.popleft()

    def _full_reason(self, size: int, waited: bool) -> str:
        mib = 1024 * 1024
        if size > self.capacity_bytes:
            return (f"object of {size / mib:.1f} MiB is larger than the object store "
                    f"({self.capacity_bytes / mib:.1f} MiB); start the cluster with a larger "
                    "object_store_memory or split the value")
        return (f"object store is full: {self.used_bytes / mib:.1f} of {self.capacity_bytes / mib:.1f} MiB "
                f"in use, {size / mib:.1f} MiB needed" + (f", waited {self.full_timeout_s:.0f}s for frees" if waited else "")
                + "; drop references to objects you no longer need, or raise object_store_memory")

    # ------------------------------------------------------------------ queries

    def stats(self) -> dict[str, int]:
        return {"used_bytes": self.used_bytes, "capacity_bytes": self.capacity_bytes,
                "pool_bytes": self.pool_bytes, "num_objects": len(self.objects),
                "pending_creates": len(self.pending), "evicted_copies": self.evicted}

    def check_invariants(self) -> None:
        total = sum(o.file_size for o in self.objects.values()) + sum(s for s, _ in self.pool.values())
        if total != self.used_bytes:
            raise AssertionError(f"store accounting drifted: files {total} != used {self.used_bytes}")
        if sum(s for s, _ in self.pool.values()) != self.pool_bytes:
            raise AssertionError("pool accounting drifted")
