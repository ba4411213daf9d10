"""Messages between nodes: spillback to the GCS global scheduler, object transfer between
raylets, placement groups and node logs (codes 108-127).

```
raylet --ScheduleLease--> GCS --SpillbackReply--> owner --RequestSpilledLease--> other raylet
other raylet --LeaseRecalled--> owner (an owner on that node needs the resources back)
other raylet --OwnersStopped--> the owner's raylet (a recalled lease not given back: is its owner stopped?)
raylet --ReadObjectChunk/GetObjectSize/FreeObjectCopies--> raylet
owner --KeepObjectCopies--> its raylet --KeepObjectCopies--> the copies' raylet
GCS --ReserveBundles/ReleaseBundles/GetNodeLog--> raylet
```
"""

from __future__ import annotations

import dataclasses
from typing import Any

from lumos._private.ids import JobID, NodeID, ObjectID, PlacementGroupID, WorkerID
from lumos._private.protocol.codec import message
from lumos._private.protocol.raylet_messages import RequestWorkerLease
from lumos._private.protocol.task_messages import Address


# --------------------------------------------------------------------------- multi-node (109-127)
# Bottom-up scheduling (spillback to the GCS global scheduler), object transfer between
# nodes, placement groups. Owned by the multi-node area (raylet, global_scheduler.py).


@message(110)
class ScheduleLease:
    """Raylet -> GCS: pick a node for a lease request this raylet should not serve itself.

    The reply is a ``SpillbackReply`` (possibly naming the asking node). An infeasible
    request is held by the GCS until a node that fits joins.
    """

    job_id: JobID
    resources: dict[str, float]
    strategy: Any
    function_name: str
    from_node: NodeID
    #: Bytes of the task's arguments held on each node, for locality.
    arg_bytes_by_node: dict[bytes, int] | None = None
    #: ``[pg_id, bundle_index]`` when the task runs in a placement group bundle.
    bundle: Any = None
    #: The asking raylet's resources free right now (fresher than its last heartbeat).
    local_available: dict[str, float] | None = None
    #: Lease requests queued at the asking raylet right now.
    local_queue: int = 0
    #: A request that waits at the node it was placed on: name another node only if the
    #: request fits there now (else the asking node, at once: it stays queued there).
    only_if_room: bool = False


@message(111)
class SpillbackReply:
    """Reply to ``RequestWorkerLease``: ask the raylet at ``retry_at`` instead."""

    retry_at: Address
    node_id: NodeID


@message(112)
class RequestSpilledLease:
    """Owner -> the raylet a spillback named: queue this request here, do not forward it again."""

    request: RequestWorkerLease
    #: How many times the request was forwarded already.
    hops: int


@message(127)
class LeaseRecalled:
    """Raylet -> the owner, on another node, of a task lease it granted: an owner on the
    raylet's own node waits for the resources the lease holds. Push nothing more to the
    worker and return the lease once its tasks in flight are done."""

    lease_id: int


@message(109)
class OwnersStopped:
    """Raylet -> the raylet of the node these owners run on: which of them are stopped
    processes (``SIGSTOP``, Ctrl-Z, a debugger's stop). Asked for owners that did not give
    back a recalled lease within ``RECALL_HOLD_S``: a stopped one never will, and its
    lease's idle worker is stopped so that the owners waiting there run. Reply: the
    worker ids among ``worker_ids`` whose process on that node is stopped."""

    worker_ids: list[WorkerID]


@message(113)
class PullObject:
    """Worker -> its raylet: make a local copy of an object held by ``from_node`` (blocks until sealed)."""

    object_id: ObjectID
    #: The node whose store holds the object.
    from_node: NodeID
    #: Object size in bytes when known (0: ask the holder).
    size: int
    #: The owner's worker id (the local copy's accounting owner).
    owner_worker_id: WorkerID


@message(114)
class ReadObjectChunk:
    """Raylet -> raylet: ``length`` bytes at ``offset`` of a sealed object (reply: bytes or None)."""

    object_id: ObjectID
    offset: int
    length: int


@message(115)
class GetObjectSize:
    """Raylet -> raylet: size of a sealed local object (reply: int, or -1 when not here)."""

    object_id: ObjectID


@message(116)
class FreeObjectCopies:
    """Raylet -> raylet: an owner freed these objects; drop local copies (not forwarded again)."""

    object_ids: list[ObjectID]


@message(108)
class KeepObjectCopies:
    """Owner -> its raylet, which passes it on to ``node_id``'s: the node that held these
    objects died; the copies pulled into ``node_id``'s store are their primaries now
    (never evicted as a cache; spilled under pressure). Reply: the ids kept (the others
    were not there any more)."""

    node_id: NodeID
    object_ids: list[ObjectID]

# --------------------------------------------------------------------------- placement groups (117-139)
# GCS placement-group table (gcs/placement_groups.py) and bundle reservation on raylets.


@message(117)
class ReserveBundles:
    """GCS -> raylet: reserve these bundles of a placement group now, all or none.

    Replies ``[ok, reason, [[bundle index, [GPU index, ...]], ...]]``: the node GPUs each
    requested bundle holds (an older raylet replies ``[ok, reason]`` only).
    """

    pg_id: PlacementGroupID
    #: ``[[bundle index, {resource: amount}], ...]``.
    bundles: list[Any]


@message(118)
class ReleaseBundles:
    """GCS -> raylet: free bundles of a placement group (workers running in them are stopped)."""

    pg_id: PlacementGroupID
    #: Bundle indices; None for every bundle of the group on that node.
    indices: list[int] | None = None


#: How ``PlacementGroupInfo.detail`` begins while a pending group fits no alive node, and
#: what it says while the group waits for resources other work holds (the state API reads
#: Ray's INFEASIBLE and NO_RESOURCES scheduling states from them).
PG_INFEASIBLE_DETAIL = "infeasible: "
PG_WAITING_DETAIL = "waiting for resources held by other work"


@message(119)
class PlacementGroupInfo:
    pg_id: PlacementGroupID
    name: str
    namespace: str
    #: PACK, SPREAD, STRICT_PACK or STRICT_SPREAD.
    strategy: str
    #: One ``{resource: amount}`` per bundle.
    bundles: list[dict[str, float]]
    #: PENDING, CREATED, RESCHEDULING or REMOVED.
    state: str
    #: The node holding each bundle (None while unplaced).
    bundle_nodes: list[bytes | None]
    job_id: JobID
    detached: bool
    creation_time: float
    #: Why it is still pending, or what happened to it.
    detail: str = ""
    #: Bumped on every change (published on the "placement_groups" channel).
    version: int = 0
    #: The node GPU indices each bundle holds (``[]`` while unplaced or without GPUs;
    #: the whole list is empty from a GCS that predates it).
    bundle_gpu_ids: list[list[int]] = dataclasses.field(default_factory=list)
    #: Each bundle's node-label conditions (``bundle_label_selector``: ``[key, negated,
    #: values]`` lists, as a ``["LABELS", ...]`` strategy's); empty: none.
    bundle_labels: list[list[Any]] = dataclasses.field(default_factory=list)


@message(120)
class CreatePlacementGroup:
    """Driver -> GCS: add a placement group (reply: ``PlacementGroupInfo``); bundles are reserved async."""

    pg_id: PlacementGroupID
    bundles: list[dict[str, float]]
    strategy: str
    name: str
    namespace: str
    job_id: JobID
    detached: bool
    #: Each bundle's node-label conditions (``bundle_label_selector``); empty: none.
    bundle_labels: list[list[Any]] = dataclasses.field(default_factory=list)


@message(121)
class RemovePlacementGroup:
    """Driver -> GCS: free a placement group's bundles (reply: False when it was removed already)."""

    pg_id: PlacementGroupID


@message(122)
class GetPlacementGroup:
    """Driver -> GCS: a group by id, or by name in a namespace (reply: ``PlacementGroupInfo`` or None)."""

    pg_id: PlacementGroupID | None
    name: str = ""
    namespace: str = ""


@message(123)
class ListPlacementGroups:
    """Reply: every ``PlacementGroupInfo`` (removed ones too, bounded)."""

    job_id: JobID | None = None


@message(124)
class WaitPlacementGroupReady:
    """Driver -> GCS: reply True once every bundle is reserved, False after ``timeout_s``.

    Raises ValueError when the group was removed (or never existed).
    """

    pg_id: PlacementGroupID
    timeout_s: float


@message(125)
class GetNodeLog:
    """State client -> GCS -> that node's raylet: the end of one of the node's log files.

    The raylet builds the path from ids only (``<session>/logs/raylet-<node id[:12]>.<suffix>``
    or ``worker-<worker id[:12]>.<suffix>``). Reply: ``NodeLog``. Raises ``LookupError``
    (no such alive node, or no such file) or ``ValueError`` (bad arguments).
    """

    node_id: NodeID
    #: A worker of that node, or None for the raylet's own log.
    worker_id: WorkerID | None
    #: At most this many lines (1..200; at most 64 KiB are read).
    tail_lines: int
    #: "log" (the process's log) or "out" (a worker's stdout and stderr).
    suffix: str = "log"


@message(126)
class NodeLog:
    #: The file's name (no directory).
    name: str
    text: str
    #: The file held more than was returned.
    truncated: bool
