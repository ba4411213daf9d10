"""Events into and actions out of ``ObjectStoreState`` (see ``store_state``).

Events are what happened (a create was asked for, an object was sealed or freed, a
spill finished); actions are what the raylet must do (grant, unlink, rename, spill).
"""

from __future__ import annotations

import dataclasses
from typing import Union

from lumos._private.ids import ObjectID, WorkerID


# ----------------------------------------------------------------------------- events

@dataclasses.dataclass(slots=True)
class CreateRequested:
    request: int          #: id the server uses to answer the client
    object_id: ObjectID
    size_bytes: int
    client: WorkerID      #: worker id of the creating process


@dataclasses.dataclass(slots=True)
class ObjectSealed:
    object_id: ObjectID
    size_bytes: int


@dataclasses.dataclass(slots=True)
class ObjectsFreed:
    object_ids: list[ObjectID]
    recyclable: list[bool]


@dataclasses.dataclass(slots=True)
class ClientGone:
    client: WorkerID


@dataclasses.dataclass(slots=True)
class Ticked:
    pass


@dataclasses.dataclass(slots=True)
class MarkedShared:
    object_ids: list[ObjectID]


@dataclasses.dataclass(slots=True)
class ObjectsPinned:
    """``client`` now holds live views of these objects (they must stay in memory)."""
    client: WorkerID
    object_ids: list[ObjectID]


@dataclasses.dataclass(slots=True)
class ObjectsUnpinned:
    client: WorkerID
    object_ids: list[ObjectID]


@dataclasses.dataclass(slots=True)
class SpillFinished:
    object_id: ObjectID
    error: str = ""           #: empty: the spill file is complete
    out_of_disk: bool = False
    seconds: float = 0.0      #: how long the copy took
    started: float = 0.0      #: when it started (monotonic), for throughput over busy time


@dataclasses.dataclass(slots=True)
class RestoreRequested:
    object_id: ObjectID


@dataclasses.dataclass(slots=True)
class RestoreFinished:
    object_id: ObjectID
    error: str = ""
    seconds: float = 0.0
    started: float = 0.0


@dataclasses.dataclass(slots=True)
class SlotsReserveRequested:
    """``client`` asks for up to ``count`` files of ``size_bytes`` ahead of its creates."""
    request: int
    client: WorkerID
    size_bytes: int
    count: int


@dataclasses.dataclass(slots=True)
class ReservedSealed:
    """``client`` wrote ``object_id`` into its reserved ``slot`` and linked it under its
    final name (one-way: no round trip on the put path)."""
    client: WorkerID
    slot: int
    object_id: ObjectID
    size_bytes: int
    file_size: int


@dataclasses.dataclass(slots=True)
class DiskCreateFailed:
    """Preallocating the spill file of an object created straight on disk failed."""
    object_id: ObjectID
    error: str
    out_of_disk: bool


@dataclasses.dataclass(slots=True)
class MovedFilesFound:
    """Files under these objects' names that were unknown here at two looks at the store
    directory ``MOVED_SWEEP_S`` apart, the same file both times (``SweepMoved``)."""
    object_ids: list[ObjectID]


@dataclasses.dataclass(slots=True)
class CopiesKeepRequested:
    """The node that held these objects died: the copies pulled here are their primaries
    from now on (an owner's ``KeepObjectCopies``)."""
    request: int
    object_ids: list[ObjectID]


Event = Union[CreateRequested, ObjectSealed, ObjectsFreed, ClientGone, Ticked, MarkedShared,
              ObjectsPinned, ObjectsUnpinned, SpillFinished, RestoreRequested, RestoreFinished,
              DiskCreateFailed, SlotsReserveRequested, ReservedSealed, MovedFilesFound, CopiesKeepRequested]


# ----------------------------------------------------------------------------- actions

@dataclasses.dataclass(slots=True)
class GrantCreate:
    request: int
    object_id: ObjectID
    slot: int
    path: str             #: where the client writes (renamed to the final name when done)
    final_path: str
    file_size: int        #: size of the file; >= the requested size for a reused slot
    reused: bool
    #: Larger than the store: the file is in the spill dir; the server preallocates it
    #: (``posix_fallocate``, so a full disk is an error, not a SIGBUS) before answering.
    on_disk: bool = False


@dataclasses.dataclass(slots=True)
class RejectCreate:
    request: int
    object_id: ObjectID
    reason: str
    #: The object is already here, sealed, with that size (a copy pulled earlier): a
    #: task that made it again can use it as its result.
    exists: bool = False
    #: Room needs spilling and the spill directory is full.
    out_of_disk: bool = False


@dataclasses.dataclass(slots=True)
class GrantSlots:
    """Answer a reservation: ``slots`` of ``(slot, path, file size, reused)``, maybe none."""
    request: int
    slots: list[tuple[int, str, int, bool]]


@dataclasses.dataclass(slots=True)
class CopiesKept:
    """Answer a ``CopiesKeepRequested``: the ids sealed here (kept); the others are gone."""
    request: int
    object_ids: list[ObjectID]


@dataclasses.dataclass(slots=True)
class UnlinkFile:
    """Remove a file. An object's file (``<id>``, ``<id>.w``) leaves its name at once, the
    raylet's unlink thread removing it later (``RayletServer._name_gone``): the same id
    may be created again right after (a retry of a dead writer's task)."""
    path: str


@dataclasses.dataclass(slots=True)
class RenameFile:
    src: str
    dst: str


@dataclasses.dataclass(slots=True)
class DropSlot:
    client: WorkerID
    slot: int


@dataclasses.dataclass(slots=True)
class SpillObject:
    """Copy ``src`` (in the store) to ``tmp`` in the spill dir, then rename it to ``dst``."""
    object_id: ObjectID
    src: str
    tmp: str
    dst: str
    size_bytes: int


@dataclasses.dataclass(slots=True)
class RestoreObject:
    """Copy ``src`` (spill file) to ``tmp`` in the store, then rename it to ``dst``."""
    object_id: ObjectID
    src: str
    tmp: str
    dst: str
    size_bytes: int


@dataclasses.dataclass(slots=True)
class DropMappings:
    """Tell every process on the node: unmap these objects (their store files are gone)."""
    object_ids: list[ObjectID]


@dataclasses.dataclass(slots=True)
class AnswerRestore:
    """Answer every reader waiting to restore ``object_id``: ``path`` None when the object
    is gone, "" when it is in the store, else the spill file to map."""
    object_id: ObjectID
    path: str | None


@dataclasses.dataclass(slots=True)
class DiskFull:
    """An out-of-disk episode began (log it once)."""
    message: str


@dataclasses.dataclass(slots=True)
class SweepMoved:
    """A client went holding reserved slots; each entry is one slot's names (``resv-``,
    ``pool-``, ``lent-``). A slot with none of them left was moved under an object's name
    (a reserved put or return, a published argument) by a client that died before its
    seal: look at the store directory now and ``MOVED_SWEEP_S`` later for object files
    unknown both times (``MovedFilesFound``). Checked before the slots' files are unlinked."""
    slots: list[tuple[str, ...]]


Action = Union[GrantCreate, RejectCreate, GrantSlots, UnlinkFile, RenameFile, DropSlot, SpillObject, RestoreObject,
               DropMappings, AnswerRestore, DiskFull, SweepMoved, CopiesKept]
