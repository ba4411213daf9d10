"""Messages to a node's raylet from its workers and drivers: registration, worker leases
and the object store (codes 40-59).

```
core worker --RegisterClient/RequestWorkerLease/ReturnWorker/CreateObject/FreeObjects--> raylet
raylet --DropSlots/DropMappings--> processes on its node
raylet --LeasedWorkerExited--> a lease's owner
```
"""

from __future__ import annotations

from typing import Any

from lumos._private.ids import ActorID, JobID, NodeID, ObjectID, WorkerID
from lumos._private.protocol.codec import message
from lumos._private.protocol.task_messages import Address
from lumos._private.protocol.vocab import WorkerExitType


# --------------------------------------------------------------------------- raylet


@message(40)
class RegisterClient:
    """A worker or driver introduces itself to its node's raylet."""

    worker_id: WorkerID
    pid: int
    address: Address
    is_driver: bool
    job_id: JobID | None


#: ``RequestWorkerLease.owner_worker_id`` of an actor's creation the GCS asks for.
GCS_OWNER = b"gcs"
#: How long a finished job's worker (task or actor) gets to send what it holds (task
#: events, output, the application metrics since its last report) and exit before it is
#: killed (``ExitWorker`` without clean-up).
JOB_END_EXIT_S = 1.0


@message(41)
class RequestWorkerLease:
    job_id: JobID
    resources: dict[str, float]
    owner_worker_id: WorkerID
    #: Scheduling strategy (see options.py) or None.
    strategy: Any
    #: Used in log lines and infeasibility warnings.
    function_name: str
    #: For an actor creation, the actor id (the worker is dedicated to it).
    actor_id: ActorID | None = None
    #: Bytes of arguments on each node: ``{node_id: bytes}``, for locality.
    arg_bytes_by_node: dict[bytes, int] | None = None
    #: Bundle reference ``[pg_id, bundle_index]`` when scheduled in a placement group.
    bundle: Any = None
    #: Retry budget of the work this lease runs, for the memory monitor: the tasks'
    #: ``max_retries`` or the actor's ``max_restarts`` (-1: unlimited, 0: none); None from
    #: older peers (tasks then count as retriable, actors not).
    retry_budget: int | None = None
    #: The owner's node (None from older peers): a raylet on another node asks that
    #: node's raylet whether the owner is stopped (``OwnersStopped``).
    owner_node_id: NodeID | None = None


@message(42)
class LeaseGrant:
    lease_id: int
    worker_id: WorkerID
    worker_address: Address
    #: ``{"GPU": [[index, fraction], ...], ...}`` for resources with instances.
    resource_ids: dict[str, list[Any]]
    node_id: NodeID


@message(43)
class ReturnWorker:
    lease_id: int
    #: The owner saw the worker fail; do not reuse it.
    disconnect: bool
    #: An actor's lease (from the GCS): what its worker's row says of the end that
    #: follows (None: lumos's own stop).
    exit_type: WorkerExitType | None = None


@message(45)
class WorkerBlocked:
    worker_id: WorkerID


@message(46)
class WorkerUnblocked:
    worker_id: WorkerID


@message(47)
class CreateObject:
    object_id: ObjectID
    size_bytes: int
    #: The creating process (it writes the file).
    owner_worker_id: WorkerID
    #: The object's owner when it is not the creator (a task's return): the raylet frees
    #: the object when that process dies.
    owner: WorkerID = WorkerID(b"")


@message(48)
class SealObject:
    object_id: ObjectID
    size_bytes: int
    #: The creator is the only process that ever mapped it (safe to recycle later).
    private: bool = True
    #: > 0: written into this reserved slot (``ReserveSlots``) and linked under its
    #: final name; the raylet learns of the object from this message (no create).
    slot: int = 0
    #: The reserved file's size (the raylet counts it again if it took the slot back).
    file_size: int = 0
    #: The object's owner when it is not the creator (as in ``CreateObject``).
    owner: WorkerID = WorkerID(b"")


@message(59)
class ReserveSlots:
    """Worker -> its raylet: up to ``count`` store files of ``size_bytes`` ahead of its
    puts. Answer: ``[[slot, path, file size, reused], ...]``, maybe fewer or none; the
    raylet may take any back (``DropSlots``) while unused."""

    size_bytes: int
    count: int


@message(49)
class FreeObjects:
    object_ids: list[ObjectID]
    #: Per id: no process but the creator mapped it, and the creator's views are gone.
    recyclable: list[bool]


@message(44)
class LeasedWorkerExited:
    """Raylet -> a lease's owner: the leased worker's process exited. The owner may not see
    its connection to the worker close: a process the task forked holds a copy of it."""

    lease_id: int
    worker_id: WorkerID


@message(50)
class GetWorkerExit:
    worker_id: WorkerID
    wait_s: float


@message(51)
class KillWorker:
    worker_id: WorkerID
    reason: str
    #: Above 0: ask the worker to exit (``ExitWorker``: an actor runs its clean-up) and
    #: kill it only if it is still there after this many seconds.
    graceful_s: float = 0.0
    #: What the worker's row says of its end (None: lumos's own stop, INTENDED_SYSTEM_EXIT).
    exit_type: WorkerExitType | None = None
    #: With ``graceful_s``: an actor runs its clean-up (``ExitWorker.clean_up``).
    clean_up: bool = True


@message(52)
class GetNodeStats:
    pass


@message(53)
class MarkShared:
    """A process other than the creator is about to map these objects."""

    object_ids: list[ObjectID]


@message(54)
class ShutdownNode:
    reason: str


@message(55)
class DropSlots:
    """Raylet to creator: these pooled files are gone; unmap them."""

    slots: list[int]


@message(56)
class PinObjects:
    """Worker -> its raylet: this process now holds live views of these objects
    (``pinned``), or no longer does; pinned objects are never spilled."""

    object_ids: list[ObjectID]
    pinned: bool


@message(57)
class RestoreSpilled:
    """Worker -> its raylet: the object's store file is missing; bring it back. Answer:
    None (not here), "" (in the store again), or the spill file to map read-only."""

    object_id: ObjectID


@message(58)
class DropMappings:
    """Raylet -> every process on its node: these objects left the store (spilled);
    unmap them unless views are alive."""

    object_ids: list[ObjectID]
