"""Message types of the lumos protocol and their msgpack encoding.

Every message is a ``@dataclass(slots=True)`` registered under a one-byte code. On the
wire a message is a msgpack extension type whose payload is the list of its fields, so
messages nest (a ``PushTask`` carries a ``TaskSpec`` that carries ``Address``es).

A frame's payload is ``[kind, request_id, body]``; ``body`` is a message for
``REQUEST`` and ``NOTIFY``, any msgpack value for ``REPLY``, and ``[type_name, text]``
for ``ERROR``.

Who sends what:

```
core worker --RegisterJob/Kv*/AddTaskEvents/Subscribe--> GCS
raylet      --RegisterNode/NodeHeartbeat/WorkerLogBatch--> GCS
core worker --RequestWorkerLease/ReturnWorker/CreateObject/FreeObjects--> raylet
owner       --PushTask/CancelTask--> executing worker
executing worker --GeneratorItem (streaming), TaskReply--> owner
borrower    --GetObjectStatus/AddBorrowers/RemoveBorrowers--> owner
```
"""

from __future__ import annotations

import dataclasses
import operator
import threading
from typing import Any, Callable

import msgpack

from lumos._private.protocol.framing import ProtocolError

REQUEST = 0
REPLY = 1
ERROR = 2
NOTIFY = 3

_REGISTRY: dict[int, type] = {}


def message(code: int) -> Callable[[type], type]:
    """Register a dataclass as message ``code`` (0..127)."""

    def wrap(cls: type) -> type:
        if code in _REGISTRY:
            raise RuntimeError(f"message code {code} used twice ({_REGISTRY[code].__name__}, {cls.__name__})")
        cls = dataclasses.dataclass(slots=True)(cls)
        names = [f.name for f in dataclasses.fields(cls)]
        if len(names) > 1:
            getter: Callable[[Any], tuple[Any, ...]] = operator.attrgetter(*names)
        elif names:
            single = operator.attrgetter(names[0])
            getter = lambda obj: (single(obj),)  # noqa: E731
        else:
            getter = lambda obj: ()  # noqa: E731
        cls._code = code  # type: ignore[attr-defined]
        cls._fields_of = getter  # type: ignore[attr-defined]
        _REGISTRY[code] = cls
        return cls

    return wrap


class _Packers(threading.local):
    """Reused packers, one per nesting depth and thread.

    ``msgpack.packb`` builds a new ``Packer`` (with a 1 MiB buffer) per call; for nested
    messages that dominated encoding time (35 us for a PushTask, 6 us with reuse).
    """

    def __init__(self) -> None:
        self.stack: list[msgpack.Packer] = []
        self.depth = 0


_packers = _Packers()


def _packer(depth: int) -> msgpack.Packer:
    stack = _packers.stack
    while len(stack) <= depth:
        stack.append(msgpack.Packer(default=_default, use_bin_type=True, autoreset=True))
    return stack[depth]


def _default(obj: Any) -> Any:
    code = getattr(type(obj), "_code", None)
    if code is None:
        if isinstance(obj, (set, frozenset)):
            return list(obj)
        raise TypeError(f"cannot encode {type(obj).__name__} in a lumos message")
    local = _packers
    local.depth += 1
    try:
        return msgpack.ExtType(code, _packer(local.depth).pack(type(obj)._fields_of(obj)))
    finally:
        local.depth -= 1


#: Deepest nesting of messages inside messages a frame may carry. Real messages nest a
#: few levels (PushTask > TaskSpec > Address); each level recurses through
#: ``msgpack.unpackb`` on the C stack, and a few kilobytes of nested extension types
#: used to overflow it (SIGSEGV, issue 11).
MAX_MESSAGE_NESTING = 16


class _Nesting(threading.local):
    def __init__(self) -> None:
        self.depth = 0


_nesting = _Nesting()


def _ext_hook(code: int, data: bytes) -> Any:
    cls = _REGISTRY.get(code)
    if cls is None:
        raise ProtocolError(f"unknown message code {code}")
    local = _nesting
    if local.depth >= MAX_MESSAGE_NESTING:
        raise ProtocolError(f"messages nested more than {MAX_MESSAGE_NESTING} deep")
    local.depth += 1
    try:
        fields = msgpack.unpackb(data, ext_hook=_ext_hook, raw=False)
    finally:
        local.depth -= 1
    if not isinstance(fields, list):
        raise ProtocolError(f"malformed {cls.__name__}")
    try:
        return cls(*fields)
    except TypeError as e:
        raise ProtocolError(f"malformed {cls.__name__}: {e}") from None


def encode(kind: int, request_id: int, body: Any) -> bytes:
    local = _packers
    depth = local.depth
    try:
        return _packer(depth).pack((kind, request_id, body))  # type: ignore[no-any-return]
    except BaseException:
        # A failed pack leaves the packer's buffer half-written: start the next one afresh.
        del local.stack[depth:]
        local.depth = depth
        raise


def decode(payload: bytes) -> tuple[int, int, Any]:
    try:
        obj = msgpack.unpackb(payload, ext_hook=_ext_hook, raw=False)
    except ProtocolError:
        raise
    except Exception as e:  # msgpack raises several unrelated types on garbage
        raise ProtocolError(f"undecodable frame: {type(e).__name__}: {e}") from None
    if not (isinstance(obj, list) and len(obj) == 3 and isinstance(obj[0], int) and isinstance(obj[1], int)):
        raise ProtocolError("frame is not [kind, request_id, body]")
    return obj[0], obj[1], obj[2]


# --------------------------------------------------------------------------- common


@message(1)
class Address:
    """Where a process listens: a Unix socket on its node, TCP from elsewhere."""

    node_id: bytes
    worker_id: bytes
    unix_path: str
    host: str
    port: int


@message(2)
class Dep:
    """A task argument passed by reference, as the owner knows it at push time."""

    object_id: bytes
    owner: Address
    #: The serialized value when the owner holds it inline, else None.
    data: bytes | None
    #: Node whose store holds the value (None when inline or unknown).
    node_id: bytes | None


@message(3)
class TaskSpec:
    task_id: bytes
    job_id: bytes
    parent_task_id: bytes
    #: 0 normal task, 1 actor creation, 2 actor method call.
    kind: int
    name: str
    function_id: bytes
    function_name: str
    #: Serialized ``(args, kwargs)``; top-level refs replaced by placeholders for ``deps``.
    args: bytes
    deps: list[Dep]
    #: Refs nested inside ``args``: ``[object_id, owner Address]`` pairs.
    nested_refs: list[Any]
    num_returns: int
    resources: dict[str, float]
    max_retries: int
    #: 0 never, 1 any exception, 2 the classes pickled in ``retry_exception_types``.
    retry_exceptions: int
    retry_exception_types: bytes | None
    owner: Address
    attempt: int
    #: Scheduling strategy as a plain list (see options.py), or None for default.
    strategy: Any
    #: Actor fields: the actor, the caller's sequence number, the caller id.
    actor_id: bytes | None = None
    sequence_no: int = 0
    caller_id: bytes | None = None
    #: Actor creation: extra options (max_concurrency, concurrency_groups, ...). Actor
    #: call: the name of its concurrency group, or None for the default group.
    actor_options: Any = None
    #: Root task of the driver call tree, used to route output to a notebook cell.
    #: (``num_returns`` is -1 for a streaming generator: see ``GeneratorItem``.)
    root_task_id: bytes | None = None
    #: Environment variables of the task or actor (its own over its parent's), or None.
    #: The job's (``init(runtime_env=...)``) come from the job config, under these.
    runtime_env: dict[str, str] | None = None
    #: The worker exits after running this function that many times (0: no limit).
    max_calls: int = 0
    #: False: no task events for this task or call, from its owner, its executor or the
    #: GCS (``enable_task_events=False``); it still runs, retries and rebuilds as usual.
    enable_task_events: bool = True


@message(4)
class ReturnObject:
    object_id: bytes
    #: The serialized value when small enough to travel inline, else None.
    data: bytes | None
    size: int
    #: Node whose store holds the value when ``data`` is None.
    node_id: bytes | None
    #: Refs nested in the value: ``[object_id, owner Address]`` pairs.
    nested_refs: list[Any]


@message(6)
class GeneratorItem:
    """Executor -> owner: the next value of a streaming generator task, sent as soon as it
    is yielded (``num_returns=-1`` in the spec). Items of one task arrive in order, before
    its ``TaskReply``; a retried run sends them again from the first."""

    task_id: bytes
    #: 0-based position in the stream; the value's id is ``return_object_id(task_id, index + 1)``.
    index: int
    item: ReturnObject


@message(5)
class TaskReply:
    task_id: bytes
    returns: list[ReturnObject]
    #: The user's code raised; the returns hold the error.
    app_error: bool
    #: The error matches ``retry_exceptions``.
    retryable: bool
    #: Refs from the arguments the executor still holds: ``[object_id, owner Address]``.
    borrowed: list[Any]
    worker_id: bytes
    start_time: float
    end_time: float
    #: Set when the task never ran (cancelled before start, unknown function, ...).
    system_error: str | None = None
    #: The error's kind: "cancelled", "actor_died", ... (None for other errors).
    error_kind: str | None = None


# --------------------------------------------------------------------------- GCS


@message(10)
class NodeInfo:
    node_id: bytes
    address: Address
    hostname: str
    pid: int
    resources_total: dict[str, float]
    state: str
    start_time: float
    object_store_dir: str
    object_store_bytes: int
    session_dir: str
    is_head: bool
    labels: dict[str, str]
    #: Process ids of the node's services (for ``lumos stop``).
    pids: list[int]
    end_time: float = 0.0
    death_reason: str = ""
    dashboard_url: str = ""


@message(11)
class RegisterNode:
    info: NodeInfo


@message(12)
class NodeHeartbeat:
    node_id: bytes
    resources_available: dict[str, float]
    #: Lease requests queued at the node's local scheduler.
    queue_length: int
    store_used_bytes: int
    num_workers: int
    #: Resource shapes that nothing on the node can run (infeasible).
    infeasible: list[dict[str, float]]
    #: The node's machine memory (psutil), bytes; 0 when not measured.
    memory_total_bytes: int = 0
    memory_available_bytes: int = 0
    #: Resident memory of the node's raylet and workers, bytes.
    lumos_rss_bytes: int = 0
    #: The machine's CPU load, percent of all cores, over the last second or so.
    cpu_percent: float = 0.0


@message(13)
class GetAllNodes:
    pass


@message(14)
class RegisterJob:
    driver: Address
    pid: int
    namespace: str
    entrypoint: str
    #: A driver reconnecting to a restarted GCS: the job it already has.
    job_id: bytes = b""


@message(15)
class JobInfo:
    job_id: bytes
    driver: Address
    pid: int
    namespace: str
    entrypoint: str
    state: str
    start_time: float
    end_time: float


@message(16)
class MarkJobFinished:
    job_id: bytes


@message(17)
class GetAllJobs:
    pass


@message(18)
class KvPut:
    namespace: str
    key: bytes
    value: bytes
    overwrite: bool


@message(19)
class KvGet:
    namespace: str
    key: bytes
    #: Wait up to this long for the key to appear (0: answer at once).
    wait_s: float = 0.0


@message(20)
class KvDel:
    namespace: str
    key: bytes


@message(21)
class KvKeys:
    namespace: str
    prefix: bytes


@message(22)
class TaskEvent:
    task_id: bytes
    attempt: int
    #: SUBMITTED, PENDING_ARGS, SCHEDULED, RUNNING, FINISHED, FAILED, RETRIED, CANCELLED
    state: str
    time: float
    job_id: bytes
    #: Static facts, sent with SUBMITTED only (None otherwise).
    info: Any = None
    node_id: bytes | None = None
    worker_id: bytes | None = None
    error: str | None = None


@message(23)
class AddTaskEvents:
    events: list[TaskEvent]


@message(24)
class GetTasks:
    job_id: bytes | None
    limit: int


@message(25)
class Subscribe:
    #: "nodes", "workers", "worker_deaths" (DEAD workers only), "jobs", "logs", "actors", "errors"
    channel: str
    #: Only messages with this key (a job id for logs), or None for all.
    key: bytes | None


@message(26)
class Publish:
    channel: str
    key: bytes | None
    data: Any


@message(27)
class WorkerInfo:
    worker_id: bytes
    node_id: bytes
    pid: int
    address: Address
    job_id: bytes | None
    is_driver: bool
    state: str
    start_time: float
    end_time: float = 0.0
    exit_detail: str = ""


@message(28)
class ReportWorker:
    info: WorkerInfo


@message(29)
class GetAllWorkers:
    pass


@message(30)
class LogBatch:
    """Worker output: lines ``[job_id, task_id, task_name, pid, is_stderr, text]``."""

    lines: list[Any]


@message(31)
class PublishError:
    job_id: bytes | None
    kind: str
    text: str


@message(32)
class GetClusterStatus:
    pass


@message(33)
class NodeResources:
    node_id: bytes
    total: dict[str, float]
    available: dict[str, float]
    queue_length: int
    store_used_bytes: int
    store_capacity_bytes: int
    num_workers: int
    infeasible: list[dict[str, float]]
    #: As of the node's last heartbeat (see ``NodeHeartbeat``); 0 when not reported yet.
    memory_total_bytes: int = 0
    memory_available_bytes: int = 0
    lumos_rss_bytes: int = 0
    cpu_percent: float = 0.0


# --------------------------------------------------------------------------- raylet


@message(40)
class RegisterClient:
    """A worker or driver introduces itself to its node's raylet."""

    worker_id: bytes
    pid: int
    address: Address
    is_driver: bool
    job_id: bytes | None


@message(41)
class RequestWorkerLease:
    job_id: bytes
    resources: dict[str, float]
    owner_worker_id: bytes
    #: Scheduling strategy (see options.py) or None.
    strategy: Any
    #: Used in log lines and infeasibility warnings.
    function_name: str
    #: For an actor creation, the actor id (the worker is dedicated to it).
    actor_id: bytes | None = None
    #: Bytes of arguments on each node: ``{node_id: bytes}``, for locality.
    arg_bytes_by_node: dict[bytes, int] | None = None
    #: Bundle reference ``[pg_id, bundle_index]`` when scheduled in a placement group.
    bundle: Any = None


@message(42)
class LeaseGrant:
    lease_id: int
    worker_id: bytes
    worker_address: Address
    #: ``{"GPU": [[index, fraction], ...], ...}`` for resources with instances.
    resource_ids: dict[str, list[Any]]
    node_id: bytes


@message(43)
class ReturnWorker:
    lease_id: int
    #: The owner saw the worker fail; do not reuse it.
    disconnect: bool


@message(44)
class CancelLeaseRequest:
    owner_worker_id: bytes
    request_id: int


@message(45)
class WorkerBlocked:
    worker_id: bytes


@message(46)
class WorkerUnblocked:
    worker_id: bytes


@message(47)
class CreateObject:
    object_id: bytes
    size_bytes: int
    #: The creating process (it writes the file).
    owner_worker_id: bytes
    #: The object's owner when it is not the creator (a task's return): the raylet frees
    #: the object when that process dies.
    owner: bytes = b""


@message(48)
class SealObject:
    object_id: bytes
    size_bytes: int
    #: The creator is the only process that ever mapped it (safe to recycle later).
    private: bool = True


@message(49)
class FreeObjects:
    object_ids: list[bytes]
    #: Per id: no process but the creator mapped it, and the creator's views are gone.
    recyclable: list[bool]


@message(50)
class GetWorkerExit:
    worker_id: bytes
    wait_s: float


@message(51)
class KillWorker:
    worker_id: bytes
    reason: str


@message(52)
class GetNodeStats:
    pass


@message(53)
class MarkShared:
    """A process other than the creator is about to map these objects."""

    object_ids: list[bytes]


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

    object_ids: list[bytes]
    pinned: bool


@message(57)
class RestoreSpilled:
    """Worker -> its raylet: the object's store file is missing; bring it back. Answer:
    None (not here), "" (in the store again), or the spill file to map read-only."""

    object_id: bytes


@message(58)
class DropMappings:
    """Raylet -> every process on its node: these objects left the store (spilled);
    unmap them unless views are alive."""

    object_ids: list[bytes]


# --------------------------------------------------------------------------- core worker


@message(60)
class PushTask:
    spec: TaskSpec
    #: Instances granted with the lease, e.g. ``{"GPU": [[0, 1.0]]}``.
    resource_ids: dict[str, list[Any]]


@message(61)
class CancelTask:
    task_id: bytes
    force: bool
    recursive: bool


@message(62)
class GetObjectStatus:
    object_id: bytes
    #: Wait until the object is ready (long poll) instead of answering at once.
    wait: bool
    #: The asker (registered as borrower while it waits).
    borrower: Address | None = None
    #: The asker could not read the value from this node (it died): rebuild the value
    #: from its lineage if it is still recorded there, then answer.
    lost_node: bytes | None = None


@message(63)
class ObjectStatus:
    #: 0 pending, 1 ready, 2 freed or never known, 3 lost
    status: int
    data: bytes | None
    node_id: bytes | None
    size: int
    error: str | None = None


@message(64)
class AddBorrowers:
    #: ``[object_id, ...]`` owned by the receiver.
    object_ids: list[bytes]
    borrower: Address


@message(65)
class RemoveBorrowers:
    object_ids: list[bytes]
    borrower_worker_id: bytes


@message(66)
class GetCoreWorkerStats:
    pass


@message(67)
class ExitWorker:
    reason: str


@message(68)
class ReportTaskOutput:
    """Worker output for the driver that owns the root task (per-cell routing)."""

    lines: list[Any]


# --------------------------------------------------------------------------- actors (70-89)


@message(70)
class ActorInfo:
    """One row of the GCS actor table, as published on the "actors" channel."""

    actor_id: bytes
    job_id: bytes
    #: PENDING_CREATION, ALIVE, RESTARTING, DEAD
    state: str
    class_name: str
    name: str
    namespace: str
    detached: bool
    #: The worker hosting the actor while ALIVE.
    address: Address | None
    node_id: bytes | None
    pid: int
    num_restarts: int
    max_restarts: int
    #: Why it died or restarted (empty while healthy).
    death_cause: str
    #: Serialized error that calls raise once the actor is dead (e.g. its ``__init__``'s).
    death_error: bytes | None
    #: Increases with every change; subscribers ignore older rows.
    version: int
    start_time: float
    end_time: float
    resources: dict[str, float]
    #: Pickled method table of the class (for handles made by ``get_actor``).
    handle_meta: bytes
    owner_worker_id: bytes
    #: Calls not yet answered, as last reported (dashboard only).
    pending_calls: int = 0


@message(71)
class RegisterActor:
    """Create an actor from its creation task (``spec.kind == 1``); returns ``ActorInfo``.

    ``spec.actor_options`` holds name, namespace, detached, max_restarts, get_if_exists,
    max_concurrency, concurrency_groups, checkpoint_interval, class_name and handle_meta.
    """

    spec: TaskSpec


@message(72)
class GetActorInfo:
    actor_id: bytes


@message(73)
class GetNamedActor:
    name: str
    namespace: str


@message(74)
class KillActor:
    actor_id: bytes
    no_restart: bool
    reason: str


@message(75)
class ListActors:
    #: Only this job's actors, or all when None.
    job_id: bytes | None


@message(76)
class ActorExiting:
    """The actor's worker is ending the actor on purpose (``exit_actor()``); no restart."""

    actor_id: bytes
    reason: str


# --------------------------------------------------------------------------- dashboard / state (90-99)


@message(90)
class GetTaskUpdates:
    """Task records changed after ``since`` (a GCS task-log sequence number), oldest change first.

    Replies ``[last_seq, rows, more]``: ``rows`` are compact lists (see
    ``task_log.ROW_FIELDS``), ``last_seq`` is what to pass as ``since`` next time, and
    ``more`` is true when ``limit`` cut the answer short.
    """

    since: int
    limit: int


# --------------------------------------------------------------------------- multi-node (110-139)
# Bottom-up scheduling (spillback to the GCS global scheduler), object transfer between
# nodes, placement groups. Owned by the multi-node area (raylet, global_scheduler.py).


@message(110)
class ScheduleLease:
    """Raylet -> GCS: pick a node for a lease request this raylet should not serve itself.

    The reply is a ``SpillbackReply`` (possibly naming the asking node). An infeasible
    request is held by the GCS until a node that fits joins.
    """

    job_id: bytes
    resources: dict[str, float]
    strategy: Any
    function_name: str
    from_node: bytes
    #: Bytes of the task's arguments held on each node, for locality.
    arg_bytes_by_node: dict[bytes, int] | None = None
    #: ``[pg_id, bundle_index]`` when the task runs in a placement group bundle.
    bundle: Any = None
    #: The asking raylet's resources free right now (fresher than its last heartbeat).
    local_available: dict[str, float] | None = None
    #: Lease requests queued at the asking raylet right now.
    local_queue: int = 0


@message(111)
class SpillbackReply:
    """Reply to ``RequestWorkerLease``: ask the raylet at ``retry_at`` instead."""

    retry_at: Address
    node_id: bytes


@message(112)
class RequestSpilledLease:
    """Owner -> the raylet a spillback named: queue this request here, do not forward it again."""

    request: RequestWorkerLease
    #: How many times the request was forwarded already.
    hops: int


@message(113)
class PullObject:
    """Worker -> its raylet: make a local copy of an object held by ``from_node`` (blocks until sealed)."""

    object_id: bytes
    #: The node whose store holds the object.
    from_node: bytes
    #: Object size in bytes when known (0: ask the holder).
    size: int
    #: The owner's worker id (the local copy's accounting owner).
    owner_worker_id: bytes


@message(114)
class ReadObjectChunk:
    """Raylet -> raylet: ``length`` bytes at ``offset`` of a sealed object (reply: bytes or None)."""

    object_id: bytes
    offset: int
    length: int


@message(115)
class GetObjectSize:
    """Raylet -> raylet: size of a sealed local object (reply: int, or -1 when not here)."""

    object_id: bytes


@message(116)
class FreeObjectCopies:
    """Raylet -> raylet: an owner freed these objects; drop local copies (not forwarded again)."""

    object_ids: list[bytes]


# --------------------------------------------------------------------------- placement groups (117-139)
# GCS placement-group table (gcs/placement_groups.py) and bundle reservation on raylets.


@message(117)
class ReserveBundles:
    """GCS -> raylet: reserve these bundles of a placement group now, all or none.

    Replies ``[ok, reason, [[bundle index, [GPU index, ...]], ...]]``: the node GPUs each
    requested bundle holds (an older raylet replies ``[ok, reason]`` only).
    """

    pg_id: bytes
    #: ``[[bundle index, {resource: amount}], ...]``.
    bundles: list[Any]


@message(118)
class ReleaseBundles:
    """GCS -> raylet: free bundles of a placement group (workers running in them are stopped)."""

    pg_id: bytes
    #: Bundle indices; None for every bundle of the group on that node.
    indices: list[int] | None = None


@message(119)
class PlacementGroupInfo:
    pg_id: bytes
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
    job_id: bytes
    detached: bool
    creation_time: float
    #: Why it is still pending, or what happened to it.
    detail: str = ""
    #: Bumped on every change (published on the "placement_groups" channel).
    version: int = 0
    #: The node GPU indices each bundle holds (``[]`` while unplaced or without GPUs;
    #: the whole list is empty from a GCS that predates it).
    bundle_gpu_ids: list[list[int]] = dataclasses.field(default_factory=list)


@message(120)
class CreatePlacementGroup:
    """Driver -> GCS: add a placement group (reply: ``PlacementGroupInfo``); bundles are reserved async."""

    pg_id: bytes
    bundles: list[dict[str, float]]
    strategy: str
    name: str
    namespace: str
    job_id: bytes
    detached: bool


@message(121)
class RemovePlacementGroup:
    """Driver -> GCS: free a placement group's bundles (reply: False when it was removed already)."""

    pg_id: bytes


@message(122)
class GetPlacementGroup:
    """Driver -> GCS: a group by id, or by name in a namespace (reply: ``PlacementGroupInfo`` or None)."""

    pg_id: bytes | None
    name: str = ""
    namespace: str = ""


@message(123)
class ListPlacementGroups:
    """Reply: every ``PlacementGroupInfo`` (removed ones too, bounded)."""

    job_id: bytes | None = None


@message(124)
class WaitPlacementGroupReady:
    """Driver -> GCS: reply True once every bundle is reserved, False after ``timeout_s``.

    Raises ValueError when the group was removed (or never existed).
    """

    pg_id: bytes
    timeout_s: float


@message(125)
class GetNodeLog:
    """State client -> GCS -> that node's raylet: the end of one of the node's log files.

    The raylet builds the path from ids only (``<session>/logs/raylet-<node id[:12]>.<suffix>``
    or ``worker-<worker id[:12]>.<suffix>``). Reply: ``NodeLog``. Raises ``LookupError``
    (no such alive node, or no such file) or ``ValueError`` (bad arguments).
    """

    node_id: bytes
    #: A worker of that node, or None for the raylet's own log.
    worker_id: bytes | None
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
