"""Messages to and from the GCS: nodes, jobs, workers, KV, the task-event log, pub/sub,
actors and the state API's task pages (codes 10-39, 70-99).

```
core worker --RegisterJob/Kv*/AddTaskEvents/Subscribe/RegisterActor--> GCS
raylet      --RegisterNode/NodeHeartbeat/LogBatch--> GCS
state API, dashboard --GetAll*/ListActors/GetTaskUpdates--> GCS
```
"""

from __future__ import annotations

import dataclasses
from typing import Any

from lumos._private.ids import ActorID, JobID, NodeID, TaskID, WorkerID
from lumos._private.protocol.codec import message
from lumos._private.protocol.task_messages import Address, TaskSpec
from lumos._private.protocol.vocab import TaskState, WorkerExitType


# --------------------------------------------------------------------------- GCS


@message(10)
class NodeInfo:
    node_id: NodeID
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
    node_id: NodeID
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
    #: Store files of freed objects kept for reuse (``/dev/shm`` they hold; not in
    #: ``store_used_bytes``: a create takes them back at once).
    store_pooled_bytes: int = 0
    #: Reserved placement-group bundles under Ray's names (``node_report.group_resources``),
    #: total and available; kept out of ``resources_available``.
    group_total: dict[str, float] = dataclasses.field(default_factory=dict)
    group_available: dict[str, float] = dataclasses.field(default_factory=dict)


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
    job_id: JobID = JobID(b"")
    #: ``JobConfig(metadata=...)``: str -> str, at most ``MAX_JOB_METADATA_BYTES`` in all.
    metadata: dict[str, str] | None = None


@message(15)
class JobInfo:
    job_id: JobID
    driver: Address
    pid: int
    namespace: str
    entrypoint: str
    state: str
    start_time: float
    end_time: float
    #: Its driver's ``JobConfig(metadata=...)`` (None: none; rows stored before it too).
    metadata: dict[str, str] | None = None


#: The most a job's metadata may hold, keys and values together (bytes of UTF-8).
MAX_JOB_METADATA_BYTES = 64 * 1024


def check_job_metadata(metadata: Any) -> None:
    """Refuse a job's metadata (``JobConfig(metadata=...)``, a ``RegisterJob``'s) that is
    not str -> str or holds more than ``MAX_JOB_METADATA_BYTES``.

    Raises:
        TypeError: not a dict of str to str.
        ValueError: too large.
    """
    if not isinstance(metadata, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                 for k, v in metadata.items()):
        import reprlib
        raise TypeError(f"job metadata must map str to str, got {reprlib.repr(metadata)}")
    if sum(len(k.encode()) + len(v.encode()) for k, v in metadata.items()) > MAX_JOB_METADATA_BYTES:
        raise ValueError(f"a job's metadata holds at most {MAX_JOB_METADATA_BYTES} bytes")


@message(16)
class MarkJobFinished:
    job_id: JobID


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
    task_id: TaskID
    attempt: int
    state: TaskState
    time: float
    job_id: JobID
    #: Static facts, sent with SUBMITTED only (None otherwise).
    info: Any = None
    node_id: NodeID | None = None
    worker_id: WorkerID | None = None
    error: str | None = None
    #: Later states of the same attempt, ``[[state, time], ...]`` in order: an owner sends a
    #: task's SUBMITTED ... FINISHED as one event when they fall in one flush.
    more: list[list[Any]] | None = None


@message(23)
class AddTaskEvents:
    """A core worker's task events since its last flush, all of one job.

    Each row is a ``TaskEvent``'s fields after ``job_id`` as a plain list: ``[task_id,
    attempt, state, time, info, node_id, worker_id, error, more]``. Plain lists encode
    and decode in msgpack's C code; one extension type per event cost the sender ~1.5 us
    and the GCS as much again. The GCS checks each row (``task_log.events_of``).
    """

    job_id: JobID
    rows: list[list[Any]]
    #: Tasks whose whole attempt (SUBMITTED with its facts ... an end) is in this flush:
    #: ``[task_id, attempt, end_state, row]``, ``row`` the msgpack of the row as in
    #: ``rows``. The GCS keeps those bytes as the record and decodes them only when the
    #: record is read or gets another event (``task_log.TaskRecord.packed``): a no-op
    #: task's row costs it one small list to decode instead of ~30 objects.
    packed: list[list[Any]] = dataclasses.field(default_factory=list)


@message(35)
class ReportMetrics:
    """A process's application metrics (``lumos.util.metrics``) since its last report.

    Each row is ``[name, kind, description, tag_keys, boundaries, series]``: ``kind``
    "counter", "gauge" or "histogram"; ``boundaries`` the histogram's bucket bounds (None
    otherwise); ``series`` ``[[tag_values, value], ...]``, a counter's value the increase
    since the last report, a gauge's the last value set, a histogram's
    ``[bucket_counts, sum]`` (one count per bound and one above the last). The GCS checks
    each row (``gcs.metrics.MetricsTable``).
    """

    rows: list[list[Any]]


@message(36)
class GetMetrics:
    """The cluster's application metrics: ``[rows, dropped]``, rows as
    ``ReportMetrics``'s (a counter's and a histogram's values their totals), ``dropped``
    ``[[name, the first reason, count], ...]`` of records the GCS refused."""


@message(34)
class PackedTaskRow:
    """One entry of ``AddTaskEvents.packed`` as the GCS keeps it in its batches (the Redis
    stream replays these): the task, its attempt and end, and the packed row."""

    task_id: TaskID
    attempt: int
    state: TaskState
    job_id: JobID
    row: bytes


@message(24)
class GetTasks:
    job_id: JobID | None
    limit: int


@message(25)
class Subscribe:
    #: "nodes", "workers", "worker_deaths" (DEAD workers only), "jobs", "logs", "actors", "errors",
    #: "packages" (working_dir packages the GCS dropped: key the content hash)
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
    worker_id: WorkerID
    node_id: NodeID
    pid: int
    address: Address
    job_id: JobID | None
    is_driver: bool
    state: str
    start_time: float
    end_time: float = 0.0
    exit_detail: str = ""
    #: Why it ended, once dead (None while alive, and in a row from before the field).
    exit_type: WorkerExitType | None = None


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


@message(37)
class FlushLogs:
    """A driver's shutdown → GCS → each alive raylet: answered once every raylet has
    forwarded the worker output it had read before (each answers after one more turn of
    its loop, on the connection its output goes on) and the GCS has published it, so the
    lines a job's tasks printed before their replies reach its driver before it leaves."""

    job_id: JobID | None = None


@message(31)
class PublishError:
    job_id: JobID | None
    kind: str
    text: str


@message(32)
class GetClusterStatus:
    pass


@message(33)
class NodeResources:
    node_id: NodeID
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
    store_pooled_bytes: int = 0
    group_total: dict[str, float] = dataclasses.field(default_factory=dict)
    group_available: dict[str, float] = dataclasses.field(default_factory=dict)

# --------------------------------------------------------------------------- actors (70-89)


@message(70)
class ActorInfo:
    """One row of the GCS actor table, as published on the "actors" channel."""

    actor_id: ActorID
    job_id: JobID
    #: PENDING_CREATION, ALIVE, RESTARTING, DEAD
    state: str
    class_name: str
    name: str
    namespace: str
    detached: bool
    #: The worker hosting the actor while ALIVE.
    address: Address | None
    node_id: NodeID | None
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
    owner_worker_id: WorkerID
    #: Calls not yet answered, as last reported (dashboard only).
    pending_calls: int = 0
    #: The placement group its creation was scheduled into (None: none); records written
    #: before this field decode with None, filled from their spec when restored.
    placement_group_id: bytes | None = None


@message(71)
class RegisterActor:
    """Create an actor from its creation task (an ``ACTOR_CREATION_TASK``); returns ``ActorInfo``.

    ``spec.actor_options`` holds name, namespace, detached, max_restarts, get_if_exists,
    max_concurrency, concurrency_groups, checkpoint_interval, class_name and handle_meta.
    """

    spec: TaskSpec


@message(72)
class GetActorInfo:
    actor_id: ActorID


@message(73)
class GetNamedActor:
    name: str
    namespace: str


@message(74)
class KillActor:
    actor_id: ActorID
    no_restart: bool
    reason: str
    #: Let it run its clean-up (``__ray_shutdown__``, ``__del__``, ``atexit``) before it
    #: is stopped: every handle went out of scope. ``lumos.kill`` is not graceful.
    graceful: bool = False


@message(75)
class ListActors:
    #: Only this job's actors, or all when None.
    job_id: JobID | None


@message(76)
class ActorExiting:
    """The actor's worker is ending the actor on purpose (``exit_actor()``); no restart."""

    actor_id: ActorID
    reason: str

# --------------------------------------------------------------------------- dashboard / state (90-99)


@message(90)
class GetTaskUpdates:
    """Task records changed after ``since`` (a GCS task-log sequence number), oldest change first.

    Replies ``[last_seq, rows, more]``: ``rows`` are compact lists (see
    ``task_row.ROW_FIELDS``), ``last_seq`` is what to pass as ``since`` next time, and
    ``more`` is true when ``limit`` cut the answer short.
    """

    since: int
    limit: int
