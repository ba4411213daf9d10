"""Typed identifiers.

IDs are plain ``bytes`` at run time (``NewType``: no cost on hot paths) and typed for
readers and mypy. They are turned into hex only at the edges (logs, state API, UI).

Layout:
- ``JobID``: 4 bytes. ``NodeID``, ``WorkerID``, ``ActorID``, ``PlacementGroupID``: 16 random bytes.
- ``TaskID``: 16 bytes: 8 pseudo-random bytes (so short forms differ) and an 8-byte
  per-process random suffix; minted without a syscall.
- ``ObjectID``: 20 bytes, the ``TaskID`` that created it plus a 4-byte index: return
  values count 1, 2, ...; objects from ``put`` set the top bit.
"""

from __future__ import annotations

import os
import random
import struct
from typing import NewType

JobID = NewType("JobID", bytes)
NodeID = NewType("NodeID", bytes)
WorkerID = NewType("WorkerID", bytes)
ActorID = NewType("ActorID", bytes)
TaskID = NewType("TaskID", bytes)
ObjectID = NewType("ObjectID", bytes)
PlacementGroupID = NewType("PlacementGroupID", bytes)

TASK_ID_SIZE = 16
_PUT_BIT = 0x8000_0000

_suffix = os.urandom(8)
_rand64 = random.getrandbits
_pack_i = struct.Struct(">I").pack
_unpack_i = struct.Struct(">I").unpack


def _reseed_after_fork() -> None:
    global _suffix
    _suffix = os.urandom(8)


os.register_at_fork(after_in_child=_reseed_after_fork)


def random_id(size: int = 16) -> bytes:
    return os.urandom(size)


def new_task_id() -> TaskID:
    return TaskID(_rand64(64).to_bytes(8, "little") + _suffix)


def return_object_id(task_id: TaskID, index: int) -> ObjectID:
    """Id of a task's ``index``-th return value (1-based)."""
    return ObjectID(task_id + _pack_i(index))


def put_object_id(task_id: TaskID, put_index: int) -> ObjectID:
    return ObjectID(task_id + _pack_i(_PUT_BIT | put_index))


def task_id_of(object_id: ObjectID) -> TaskID:
    """The task that created an object (for puts: the task that called ``put``)."""
    return TaskID(object_id[:TASK_ID_SIZE])


def is_put_object(object_id: ObjectID) -> bool:
    return bool(_unpack_i(object_id[TASK_ID_SIZE:])[0] & _PUT_BIT)


def new_job_id() -> JobID:
    return JobID(os.urandom(4))


def short(id_: bytes | None) -> str:
    """A short hex form for log lines and error messages."""
    return id_.hex()[:8] if id_ else "-"
