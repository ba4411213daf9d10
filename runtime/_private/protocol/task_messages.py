"""Messages of a task's path: the spec an owner pushes, the executor's reply and streamed
items, and what owners and borrowers ask each other about objects (codes 1-9, 60-69).

```
owner --PushTask(TaskSpec)/CancelTask--> executing worker
executing worker --GeneratorItem (streaming), TaskReply--> owner
borrower --GetObjectStatus/AddBorrowers/RemoveBorrowers--> owner
reader on another node --ObjectCopied--> owner (it pulled a copy into its node's store)
```
"""

from __future__ import annotations

from typing import Any

from lumos._private.ids import ActorID, JobID, NodeID, ObjectID, TaskID, WorkerID
from lumos._private.protocol.codec import message
from lumos._private.protocol.vocab import ErrorKind, ObjectState, RetryPolicy, TaskKind


# --------------------------------------------------------------------------- common


@message(1)
class Address:
    """Where a process listens: a Unix socket on its node, TCP from elsewhere."""

    node_id: NodeID
    worker_id: WorkerID
    unix_path: str
    host: str
    port: int


@message(2)
class Dep:
    """A task argument passed by reference, as the owner knows it at push time."""

    object_id: ObjectID
    owner: Address
    #: The serialized value when the owner holds it inline, else None.
    data: bytes | None
    #: Node whose store holds the value (None when inline or unknown).
    node_id: NodeID | None
    #: A by-value argument the owner lent in its reserved slot's file on ``node_id``
    #: (``lent-<slot>`` in that node's store; not an object the raylet knows); -1: none.
    slot: int = -1


def placement_group_of(strategy: Any) -> bytes | None:
    """The placement group a spec's strategy schedules it into (``["PG", id, ...]``), or None."""
    return strategy[1] if strategy and strategy[0] == "PG" else None


def label_conditions_of(strategy: Any) -> Any:
    """The node-label conditions of a spec's strategy, or None: ``["LABELS", hard, soft,
    fallbacks, spread]`` (all but ``hard`` optional), each condition ``[key, negated,
    values]`` (``values`` None: "the label exists"), from ``label_selector`` (with
    ``fallback_strategy``) or a ``NodeLabelSchedulingStrategy``. This is ``hard``: the
    conditions a node must meet unless a fallback is taken."""
    return strategy[1] if strategy and strategy[0] == "LABELS" else None


def label_choices_of(strategy: Any) -> Any:
    """The condition lists of a ``["LABELS", ...]`` strategy in the order they are tried
    (``hard``, then each fallback), or None for another strategy."""
    if not strategy or strategy[0] != "LABELS":
        return None
    return [strategy[1]] + (list(strategy[3]) if len(strategy) > 3 and strategy[3] else [])


def label_soft_of(strategy: Any) -> Any:
    """The soft conditions of a ``["LABELS", ...]`` strategy (preferred, not required), or []."""
    return strategy[2] if strategy and strategy[0] == "LABELS" and len(strategy) > 2 and strategy[2] else []


def label_spread_of(strategy: Any) -> bool:
    """A ``["LABELS", ...]`` strategy whose fifth element is true: spread over the nodes
    the conditions allow (``label_selector`` with ``scheduling_strategy="SPREAD"``)."""
    return bool(strategy and strategy[0] == "LABELS" and len(strategy) > 4 and strategy[4])


def labels_match(labels: dict[str, str], conditions: Any) -> bool:
    """Whether a node with ``labels`` meets every condition: its label ``key`` is one of
    ``values`` (``values`` None: it has the label). A negated condition is met by a node
    whose label is none of ``values`` or that lacks the label (``values`` None: that lacks it)."""
    for key, negated, values in conditions:
        met = key in labels if values is None else labels.get(key) in values
        if met == bool(negated):
            return False
    return True


def describe_label_conditions(conditions: Any) -> str:
    """Conditions as a user reads them: ``zone in (a, b), gpu exists, tier not in (x)``."""
    parts = []
    for key, negated, values in conditions:
        if values is None:
            parts.append(f"{key} {'does not exist' if negated else 'exists'}")
        else:
            parts.append(f"{key} {'not in' if negated else 'in'} ({', '.join(values)})")
    return ", ".join(parts) or "any labels"


@message(3)
class TaskSpec:
    task_id: TaskID
    job_id: JobID
    parent_task_id: TaskID
    kind: TaskKind
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
    #: Which exceptions of the user's code retry it (``LISTED_EXCEPTIONS``: those in
    #: ``retry_exception_types``).
    retry_exceptions: RetryPolicy
    retry_exception_types: bytes | None
    owner: Address
    attempt: int
    #: Scheduling strategy as a plain list (see options.py), or None for default.
    strategy: Any
    #: Actor fields: the actor, the caller's sequence number, the caller id.
    actor_id: ActorID | None = None
    sequence_no: int = 0
    caller_id: WorkerID | None = None
    #: Actor creation: extra options (max_concurrency, concurrency_groups, ...). Actor
    #: call: the name of its concurrency group, or None for the default group.
    actor_options: Any = None
    #: Root task of the driver call tree, used to route output to a notebook cell.
    #: (``num_returns`` is -1 for a streaming generator: see ``GeneratorItem``.)
    root_task_id: TaskID | None = None
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
    object_id: ObjectID
    #: The serialized value when small enough to travel inline, else None.
    data: bytes | None
    size: int
    #: Node whose store holds the value when ``data`` is None.
    node_id: NodeID | None
    #: Refs nested in the value: ``[object_id, owner Address]`` pairs.
    nested_refs: list[Any]


@message(6)
class GeneratorItem:
    """Executor -> owner: the next value of a streaming generator task, sent as soon as it
    is yielded (``num_returns=-1`` in the spec). Items of one task arrive in order, before
    its ``TaskReply``; a retried run sends them again from the first."""

    task_id: TaskID
    #: 0-based position in the stream; the value's id is ``return_object_id(task_id, index + 1)``.
    index: int
    item: ReturnObject


@message(5)
class TaskReply:
    task_id: TaskID
    returns: list[ReturnObject]
    #: The user's code raised; the returns hold the error.
    app_error: bool
    #: The error matches ``retry_exceptions``.
    retryable: bool
    #: Refs from the arguments the executor still holds: ``[object_id, owner Address]``.
    borrowed: list[Any]
    worker_id: WorkerID
    start_time: float
    end_time: float
    #: Set when the task never ran (cancelled before start, unknown function, ...).
    system_error: str | None = None
    #: Why it never ran or stopped (None for other errors).
    error_kind: ErrorKind | None = None
    #: Lent arguments (``Dep.slot``) the executor still views after the task: their
    #: owner must not write the next argument into those files.
    kept: list[ObjectID] | None = None

# --------------------------------------------------------------------------- core worker


@message(60)
class PushTask:
    spec: TaskSpec
    #: Instances granted with the lease, e.g. ``{"GPU": [[0, 1.0]]}``.
    resource_ids: dict[str, list[Any]]


@message(61)
class CancelTask:
    task_id: TaskID
    force: bool
    recursive: bool


@message(62)
class GetObjectStatus:
    object_id: ObjectID
    #: Wait until the object is ready (long poll) instead of answering at once.
    wait: bool
    #: The asker (registered as borrower while it waits).
    borrower: Address | None = None
    #: The asker could not read the value from this node (it died): rebuild the value
    #: from its lineage if it is still recorded there, then answer.
    lost_node: NodeID | None = None


@message(63)
class ObjectStatus:
    status: ObjectState
    data: bytes | None
    node_id: NodeID | None
    size: int
    error: str | None = None


@message(64)
class AddBorrowers:
    #: ``[object_id, ...]`` owned by the receiver.
    object_ids: list[ObjectID]
    borrower: Address


@message(65)
class RemoveBorrowers:
    object_ids: list[ObjectID]
    borrower_worker_id: WorkerID


@message(68)
class ObjectCopied:
    """A process that had these objects pulled into its node's store -> their owner
    (one way): ``node_id`` holds copies now. When the node holding an object dies, its
    owner makes a copy the object's new home (``KeepObjectCopies``) instead of rebuilding it."""

    object_ids: list[ObjectID]
    node_id: NodeID


@message(66)
class GetCoreWorkerStats:
    #: Only whether it runs or queues a task (``executing``) and its counts, without the
    #: object list (up to 10,000 rows): the raylet's idleness probe.
    brief: bool = False


@message(67)
class ExitWorker:
    reason: str
    #: An actor's worker runs its clean-up first (``__ray_shutdown__``, ``atexit``); False:
    #: it only sends what it holds (task events, output, metrics) and exits (its job ended).
    clean_up: bool = True
