"""Read-only views of cluster state (Ray's ``ray.util.state`` shape): tasks, objects,
workers, nodes, jobs.

Tasks come from the GCS task-event log; objects from every live core worker's
reference table; workers, nodes and jobs from the GCS tables. Every function returns
plain dicts (JSON-ready, ids in hex) and never changes anything. They need
``lumos.init()`` and block the calling thread until the answer comes, also when that
thread runs an event loop (a notebook cell, a coroutine): the work runs on lumos's
own I/O thread.

``StateClient`` is the asynchronous side, for front ends with their own event loop
(the dashboard, a Jupyter server, ``await`` in a cell): snapshots of the GCS tables,
the task-event log paged by sequence number, and a subscription to node, job,
worker, actor and placement-group changes; it needs only the GCS address and token.
The notebook extension and the dashboard read the cluster through this module only.

The GCS-backed queries take ``timeout`` (seconds, like Ray's state API): without it
they wait for a GCS being restarted (Redis storage) and then the cluster's RPC timeout;
with it they raise ``GetTimeoutError`` (a ``TimeoutError``) once it is up, also while
the GCS is stopped or down.

Example:
    >>> lumos.state.list_tasks(filters=[("state", "=", "FAILED")])
"""

from __future__ import annotations

import asyncio
import os
from typing import Any, Callable, Iterable, Iterator, NamedTuple

from lumos._private import worker_context
from lumos._private.node import NODE_ID_LABEL
from lumos._private.protocol import messages as m
from lumos._private.protocol import task_row
from lumos._private.protocol.vocab import PENDING_TASK_STATES, TERMINAL_TASK_STATES, TaskKind, TaskState
from lumos._private.transport.connection import ConnectionLost
#: A request failed in the GCS's handler (``type_name`` and message); the connection stays up.
from lumos._private.transport.connection import RemoteError as RemoteError

Filter = tuple[str, str, Any]


def _check_timeout(timeout: float | None) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0:
        raise ValueError(f"timeout must be None or a number of seconds >= 0, got {timeout!r}")
    return float(timeout)


class _Deadline:
    """GCS calls of one query, within one caller ``timeout`` in all (None: each waits as it does)."""

    def __init__(self, cw: Any, timeout: float | None) -> None:
        import time
        self.cw = cw
        self._clock = time.monotonic
        self._end = None if timeout is None else self._clock() + _check_timeout(timeout)  # type: ignore[operator]

    def call(self, msg: Any) -> Any:
        if self._end is None:
            return self.cw.call_gcs(msg)
        return self.cw.call_gcs(msg, max(0.0, self._end - self._clock()))

__all__ = ["list_tasks", "list_objects", "list_workers", "list_nodes", "list_jobs", "get_task", "get_log",
           "summarize_tasks", "list_actors", "spill_stats", "metrics", "prometheus_text", "ended_session_of",
           "StateClient", "TaskUpdates", "CHANNELS",
           "TASK_ROW_FIELDS", "TASK_ROW_ID_FIELDS", "TASK_ROW_ID_LIST_FIELDS", "TASK_FIELDS", "TaskState", "TaskKind",
           "PENDING_TASK_STATES", "TERMINAL_TASK_STATES", "NodeInfo", "NodeResources", "JobInfo", "WorkerInfo", "ActorInfo",
           "PlacementGroupInfo", "RemoteError"]


def _same(have: Any, value: Any) -> bool:
    """A filter's value matches a field's: equal, or equal as text ignoring case
    (``("state", "=", "alive")`` matches ALIVE, as in Ray)."""
    return have == value or str(have).casefold() == str(value).casefold()


def _match(row: dict[str, Any], filters: Iterable[Filter] | None) -> bool:
    for key, op, value in filters or ():
        have = row.get(key)
        if op in ("=", "=="):
            if not _same(have, value):
                return False
        elif op == "!=":
            if _same(have, value):
                return False
        else:
            raise ValueError(f"unsupported filter operator {op!r}; use '=' or '!='")
    return True


#: The fields of each kind of row, which filters may name.
NODE_FIELDS = ("node_id", "state", "node_ip", "hostname", "is_head_node", "resources_total",
               "resources_available", "object_store_used_bytes", "object_store_capacity_bytes",
               "num_workers", "pending_leases", "infeasible", "labels", "start_time", "end_time",
               "death_reason", "dashboard_url", "memory_total_bytes", "memory_available_bytes",
               "memory_used_bytes", "lumos_rss_bytes", "cpu_percent", "object_store_pooled_bytes")
WORKER_FIELDS = ("worker_id", "node_id", "pid", "job_id", "is_driver", "state", "start_time", "end_time",
                 "exit_detail", "exit_type")
JOB_FIELDS = ("job_id", "driver_pid", "namespace", "entrypoint", "state", "start_time", "end_time",
              "driver_node_id", "driver_ip", "metadata")
OBJECT_FIELDS = ("object_id", "owned", "state", "size_bytes", "local_refs", "submitted_refs", "contained_refs",
                 "borrowers", "in_store", "node_id", "reporter_worker_id", "owner_worker_id", "task_status",
                 "attempt_number")
ACTOR_FIELDS = ("actor_id", "class_name", "state", "name", "namespace", "job_id", "node_id", "pid",
                "num_restarts", "max_restarts", "is_detached", "death_cause", "required_resources",
                "start_time", "end_time", "pending_calls", "placement_group_id")


def _check_filters(filters: Iterable[Filter] | None, fields: Iterable[str] | None = None,
                   what: str = "rows") -> list[Filter]:
    """``filters`` as a list of (key, op, value), each checked: a filter on a field the rows
    do not have (a typo) would match nothing, silently."""
    out = []
    for f in filters or ():
        if not (isinstance(f, (tuple, list)) and len(f) == 3 and isinstance(f[0], str)):
            raise TypeError(f"a filter is a (key, op, value) tuple, got {f!r}")
        if f[1] not in ("=", "==", "!="):
            raise ValueError(f"unsupported filter operator {f[1]!r}; use '=' or '!='")
        key = f[0]
        if fields is not None and key not in fields:
            key = key.lower()  # (Ray's keys are read without case)
            if key not in fields:
                raise ValueError(f"{what} have no field {f[0]!r} to filter on; their fields: {', '.join(fields)}")
        out.append((key, f[1], f[2]))
    return out


def _check_limit(limit: Any) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(f"limit must be an int, got {limit!r}")
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    return limit


def list_tasks(filters: Iterable[Filter] | None = None, limit: int = 10_000,
               all_jobs: bool = False, timeout: float | None = None) -> list[dict[str, Any]]:
    """The newest ``limit`` tasks of this job (or all jobs) that match ``filters``, oldest first,
    from the GCS task-event log.

    Each row has exactly the keys of ``TASK_FIELDS`` (Ray's names, ids in hex):
    task_id, job_id, name, func_or_class_name, type, state (a ``TaskState``),
    attempt_number, retries, parent_task_id, actor_id, caller_id, prev_call_task_id,
    arg_object_ids, return_object_ids, node_id, worker_id, error_message,
    submitted_time, start_time, end_time, required_resources, resource_ids, events,
    error_type (Ray's ``ErrorType`` name of why a failed task failed: TASK_EXECUTION_EXCEPTION,
    WORKER_DIED, ACTOR_DIED, TASK_CANCELLED, ...; None otherwise), placement_group_id (the
    placement group it was scheduled into, or None).
    """
    flt = _check_filters(filters, TASK_FIELDS, "tasks")
    _check_limit(limit)
    _check_timeout(timeout)
    cw = worker_context.require()
    cw._post(cw._flush_events)  # include what this process has not sent yet
    # With filters, matches may be older than the newest ``limit`` records: scan the whole log.
    fetch = max(limit, cw.config.task_event_max_records) if flt else max(limit, 1)
    rows = _Deadline(cw, timeout).call(m.GetTasks(None if all_jobs else cw.job_id or None, fetch))
    matches = [r for r in rows if _match(r, flt)]
    return matches[-limit:] if limit > 0 else []


def get_task(task_id: str) -> dict[str, Any] | None:
    for row in list_tasks(all_jobs=True, limit=1_000_000):
        if row["task_id"] == task_id:
            return row
    return None


def summarize_tasks() -> dict[str, dict[str, int]]:
    """Counts by function name and state: ``{"f": {"FINISHED": 10, "RUNNING": 2}}``."""
    out: dict[str, dict[str, int]] = {}
    for row in list_tasks(limit=1_000_000):
        by_state = out.setdefault(row["name"], {})
        by_state[row["state"]] = by_state.get(row["state"], 0) + 1
    return out


def read_task_archive(path: str) -> Iterator[dict[str, Any]]:
    """Rows of a task archive, oldest first, as ``list_tasks`` returns them.

    Past its bounds (``task_event_max_records``, ``task_event_max_bytes``) the GCS moves
    the oldest finished tasks from memory to ``logs/task_events.msgpack`` in the session
    directory (rotated to ``task_events.msgpack.1`` past half of
    ``task_event_archive_max_bytes``, 1 GiB, so the newest history is kept); this reads
    both, oldest first (no cluster needed), e.g.
    ``read_task_archive(os.path.join(session_dir, "logs", "task_events.msgpack"))``.
    """
    from lumos._private.gcs.task_log import read_archive

    return read_archive(path)


def list_nodes(filters: Iterable[Filter] | None = None, timeout: float | None = None) -> list[dict[str, Any]]:
    """Nodes with their resources (total and available), object-store use
    (``object_store_used_bytes``; ``object_store_pooled_bytes``: files of freed objects kept
    for reuse, which a create takes back at once), and real use as their raylets last
    reported it: ``memory_total_bytes``, ``memory_available_bytes``,
    ``memory_used_bytes``, ``lumos_rss_bytes`` (raylet and workers) and ``cpu_percent``
    (None until a node's first report)."""
    flt = _check_filters(filters, NODE_FIELDS, "nodes")
    cw = worker_context.require()
    gcs = _Deadline(cw, timeout)
    status = {n.node_id: n for n in gcs.call(m.GetClusterStatus())}
    rows = []
    for n in gcs.call(m.GetAllNodes()):
        st = status.get(n.node_id)
        rows.append({
            "node_id": n.node_id.hex(), "state": n.state, "node_ip": n.address.host,
            "hostname": n.hostname, "is_head_node": n.is_head, "resources_total": dict(n.resources_total),
            "resources_available": dict(st.available) if st else {},
            "object_store_used_bytes": st.store_used_bytes if st else 0,
            "object_store_pooled_bytes": st.store_pooled_bytes if st else 0,
            "object_store_capacity_bytes": n.object_store_bytes, "num_workers": st.num_workers if st else 0,
            "pending_leases": st.queue_length if st else 0,
            "infeasible": list(st.infeasible) if st else [], "labels": dict(n.labels),
            "start_time": n.start_time, "end_time": n.end_time or None,
            "death_reason": n.death_reason or None, "dashboard_url": n.dashboard_url or None,
            **node_memory(st),
        })
    return [r for r in rows if _match(r, flt)]


def labels_text(labels: dict[str, str]) -> str:
    """A node's labels as ``lumos status`` and the dashboard show them: ``k=v, ...``,
    sorted, without Ray's ``ray.io/node-id`` (the node's id is shown beside them)."""
    return ", ".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != NODE_ID_LABEL)


def node_memory(st: m.NodeResources | None) -> dict[str, int | None]:
    """A node's real memory figures as its raylet last reported them (None: not reported yet):
    the machine's total, available and used (total - available) bytes, the resident
    memory of the node's raylet and workers, and the machine's CPU load (percent)."""
    if st is None or not st.memory_total_bytes:
        return {"memory_total_bytes": None, "memory_available_bytes": None, "memory_used_bytes": None,
                "lumos_rss_bytes": None, "cpu_percent": None}
    return {"memory_total_bytes": st.memory_total_bytes, "memory_available_bytes": st.memory_available_bytes,
            "memory_used_bytes": st.memory_total_bytes - st.memory_available_bytes,
            "lumos_rss_bytes": st.lumos_rss_bytes, "cpu_percent": st.cpu_percent}


#: Most lines one log request returns (the raylet reads at most 64 KiB of the file's end).
MAX_LOG_LINES = 200
_LOG_SUFFIXES = ("log", "out")
#: A log request crosses the GCS to the node's raylet: its deadline.
_LOG_TIMEOUT_S = 30.0


def _log_request(node_id: str, worker_id: str | None, tail: int, suffix: str) -> m.GetNodeLog:
    def hex_id(name: str, value: Any, size: int) -> bytes:
        try:
            raw = bytes.fromhex(value) if isinstance(value, str) else b""
        except ValueError:
            raw = b""
        if len(raw) != size:
            raise ValueError(f"{name} must be a {2 * size}-character hex id (see lumos.state.list_nodes() / "
                             f"list_workers()), got {value!r:.80}")
        return raw
    if isinstance(tail, bool) or not isinstance(tail, int) or not 1 <= tail <= MAX_LOG_LINES:
        raise ValueError(f"tail must be a number of lines from 1 to {MAX_LOG_LINES}, got {tail!r}")
    if suffix not in _LOG_SUFFIXES:
        raise ValueError(f"suffix must be one of {', '.join(_LOG_SUFFIXES)}, got {suffix!r}")
    return m.GetNodeLog(hex_id("node_id", node_id, 16),
                        None if worker_id is None else hex_id("worker_id", worker_id, 16), tail, suffix)


def _log_error(e: RemoteError) -> Exception:
    kind = {"LookupError": LookupError, "ValueError": ValueError, "TimeoutError": TimeoutError,
            "PermissionError": PermissionError}.get(e.type_name)
    return kind(e.text) if kind is not None else e


def get_log(node_id: str, worker_id: str | None = None, tail: int = 100, suffix: str = "out") -> str:
    """The last ``tail`` lines of a node's raylet log or of one of its workers' log files,
    read by that node's raylet and passed on by the GCS (so any node of the cluster works).

    Args:
        node_id: the node (hex id, as in ``list_nodes()``).
        worker_id: one of that node's workers (hex id, as in ``list_workers()``), or None
            for the node's raylet.
        tail: how many lines, 1 to 200 (at most the file's last 64 KiB).
        suffix: ``"out"`` (a worker's printed output, stdout and stderr) or ``"log"``
            (the process's own log). The raylet's printed output is in its ``"log"``.

    Returns:
        The lines, joined with newlines ("" for an empty file).

    Raises:
        ValueError: a malformed id, ``tail`` or ``suffix``.
        LookupError: no such alive node, or no such log file on it.

    Example:
        >>> node = lumos.state.list_nodes()[0]["node_id"]
        >>> print(lumos.state.get_log(node, tail=20, suffix="log"))
    """
    msg = _log_request(node_id, worker_id, tail, suffix)
    cw = worker_context.require()
    try:
        reply = cw.call_gcs(msg, _LOG_TIMEOUT_S)
    except RemoteError as e:
        raise _log_error(e) from None
    return reply.text  # type: ignore[no-any-return]


def list_workers(filters: Iterable[Filter] | None = None, timeout: float | None = None) -> list[dict[str, Any]]:
    """Worker and driver processes the GCS knows, alive and dead. A dead one's
    ``exit_type`` says why it ended, as Ray's rows do: SYSTEM_ERROR (it crashed, was killed
    from outside, or its node died), INTENDED_SYSTEM_EXIT (lumos stopped it: idle, its job
    or actor ended), USER_ERROR (its actor's ``__init__`` raised), INTENDED_USER_EXIT
    (``kill``, ``exit_actor``, ``sys.exit()``, a forced ``cancel``, a driver's ``shutdown``)
    or NODE_OUT_OF_MEMORY (the memory monitor killed it)."""
    flt = _check_filters(filters, WORKER_FIELDS, "workers")
    cw = worker_context.require()
    rows = []
    for w in _Deadline(cw, timeout).call(m.GetAllWorkers()):
        rows.append({
            "worker_id": w.worker_id.hex(), "node_id": w.node_id.hex(), "pid": w.pid,
            "job_id": w.job_id.hex() if w.job_id else None, "is_driver": w.is_driver,
            "state": w.state, "start_time": w.start_time, "end_time": w.end_time or None,
            "exit_detail": w.exit_detail or None,
            "exit_type": str(w.exit_type) if w.exit_type is not None else None,
        })
    return [r for r in rows if _match(r, flt)]


def list_jobs(timeout: float | None = None) -> list[dict[str, Any]]:
    """Jobs the GCS knows, one per driver: job_id, driver_pid, namespace, entrypoint,
    state (RUNNING, FINISHED), start_time, end_time, driver_node_id, driver_ip, and the
    driver's ``JobConfig(metadata=...)`` ({} without)."""
    cw = worker_context.require()
    return [{"job_id": j.job_id.hex(), "driver_pid": j.pid, "namespace": j.namespace,
             "entrypoint": j.entrypoint, "state": j.state, "start_time": j.start_time,
             "end_time": j.end_time or None, "driver_node_id": j.driver.node_id.hex(),
             "driver_ip": j.driver.host, "metadata": dict(j.metadata or {})}
            for j in _Deadline(cw, timeout).call(m.GetAllJobs())]


def list_objects(filters: Iterable[Filter] | None = None, limit: int = 10_000) -> list[dict[str, Any]]:
    """Objects referenced anywhere: asks every live driver and worker for its table.

    Each row: object_id, owner_worker_id, reporter_worker_id, owned, state, size_bytes,
    local_refs, submitted_refs, contained_refs, borrowers, in_store, node_id, and Ray's
    task_status (where the task that creates it stands, as its owner sees it:
    PENDING_ARGS_AVAIL, PENDING_NODE_ASSIGNMENT, SUBMITTED_TO_WORKER, FINISHED, FAILED;
    NIL for a ``put``, a borrowed object, or a value whose task its owner has forgotten)
    and attempt_number (that task's attempt while its owner knows the task: pending, or
    kept to rebuild a value in the store; else 0).
    """
    flt = _check_filters(filters, OBJECT_FIELDS, "objects")
    if not _check_limit(limit):
        return []
    cw = worker_context.require()
    workers = [w for w in cw.call_gcs(m.GetAllWorkers()) if w.state == "ALIVE"]
    if cw.worker_id not in {w.worker_id for w in workers}:
        workers.append(m.WorkerInfo(cw.worker_id, cw.node_id, 0, cw.address, cw.job_id, True, "ALIVE", 0.0))

    async def ask(w: m.WorkerInfo) -> dict[str, Any] | None:
        if w.worker_id == cw.worker_id:
            return cw.stats()
        try:
            conn = await cw._peer(w.address)
            return await conn.call(m.GetCoreWorkerStats(), 5.0)  # type: ignore[no-any-return]
        except (OSError, ConnectionLost, TimeoutError, RemoteError):
            return None

    async def gather() -> list[dict[str, Any] | None]:
        return await asyncio.gather(*(ask(w) for w in workers))

    rows: list[dict[str, Any]] = []
    for stats in cw.run_sync(gather(), 30.0):
        if not stats:
            continue
        for obj in stats["objects"]:
            row = dict(obj)
            row["reporter_worker_id"] = stats["worker_id"]
            row["owner_worker_id"] = stats["worker_id"] if obj["owned"] else None
            if _match(row, flt):
                rows.append(row)
                if len(rows) >= limit:
                    return rows
    return rows


def list_actors(filters: Iterable[Filter] | None = None, all_jobs: bool = True,
                timeout: float | None = None) -> list[dict[str, Any]]:
    """Actors the GCS knows: state, class, name, node, pid, restarts, death cause, and the
    placement group its creation was scheduled into (placement_group_id, None if none)."""
    flt = _check_filters(filters, ACTOR_FIELDS, "actors")
    cw = worker_context.require()
    infos = _Deadline(cw, timeout).call(m.ListActors(None if all_jobs else cw.job_id))
    rows = []
    for a in infos:
        rows.append({
            "actor_id": a.actor_id.hex(), "class_name": a.class_name, "state": a.state,
            "name": a.name, "namespace": a.namespace, "job_id": a.job_id.hex(),
            "node_id": a.node_id.hex() if a.node_id else None, "pid": a.pid or None,
            "num_restarts": a.num_restarts, "max_restarts": a.max_restarts,
            "is_detached": a.detached, "death_cause": a.death_cause or None,
            "required_resources": dict(a.resources), "start_time": a.start_time,
            "end_time": a.end_time or None,
            "pending_calls": cw.actor_submitter.pending_calls(a.actor_id),
            "placement_group_id": a.placement_group_id.hex() if a.placement_group_id else None,
        })
    return [r for r in rows if _match(r, flt)]


def ended_session_of(ref: Any) -> str:
    """Why ``ref``'s value is gone from this process for good: it belongs to a lumos
    session this process ended with ``shutdown()`` (the text says so); "" otherwise.
    Needs no cluster."""
    return worker_context.earlier_session(getattr(ref, "_owner", None))


def metrics(timeout: float | None = None) -> list[dict[str, Any]]:
    """The application metrics (``lumos.util.metrics``) the cluster's processes reported,
    this process's recorded so far included, one dict per metric: name, kind ("counter",
    "gauge", "histogram"), description, tag_keys, boundaries (a histogram's, else None) and
    series, one per tag set: ``{"tags": {...}, "value": x}`` (a counter's total, a gauge's
    last value) or, for a histogram, ``{"tags": {...}, "count": n, "sum": s, "buckets":
    [(bound, count of values <= bound), ..., (inf, n)]}``. Other processes' records arrive
    within ``metrics_report_interval_ms`` (1 s).

    Example:
        >>> [s["value"] for s in lumos.state.metrics()[0]["series"]]
    """
    cw = worker_context.require()
    cw._post(cw.report_metrics)  # include what this process has not sent yet
    rows, dropped = _metrics_answer(_Deadline(cw, timeout).call(m.GetMetrics()))
    _warn_dropped(dropped)
    return [_metric_dict(row) for row in rows]


def prometheus_text(timeout: float | None = None) -> str:
    """The cluster's metrics in Prometheus's text format (0.0.4), as the dashboard's
    ``/metrics`` serves them: its own (``lumos_nodes``, ``lumos_node_resources_total``
    and ``..._available``, ``lumos_object_store_used_bytes``, ``lumos_actors``,
    ``lumos_jobs``, ...) and the application's (a counter as ``<name>_total``)."""
    from lumos._private.metrics import render_prometheus
    cw = worker_context.require()
    cw._post(cw.report_metrics)
    call = _Deadline(cw, timeout).call
    rows, dropped = _metrics_answer(call(m.GetMetrics()))
    _warn_dropped(dropped)
    return render_prometheus(rows, call(m.GetAllNodes()), call(m.GetClusterStatus()),
                             [a for a in call(m.ListActors(None)) if isinstance(a, m.ActorInfo)],
                             call(m.GetAllJobs()), dropped)


#: Metric names whose dropped records this process has warned about.
_warned_dropped: set[str] = set()


def _metrics_answer(answer: Any) -> tuple[list[list[Any]], list[dict[str, Any]]]:
    """``GetMetrics``'s ``[rows, dropped]`` as rows and dicts of name, reason, count."""
    rows, dropped = answer
    return rows, [{"name": name, "reason": why, "count": n} for name, why, n in dropped]


def _warn_dropped(dropped: list[dict[str, Any]]) -> None:
    import warnings
    for d in dropped:
        if d["name"] not in _warned_dropped:
            _warned_dropped.add(d["name"])
            warnings.warn(f"the GCS dropped {d['count']} record(s) of metric {d['name']!r}: {d['reason']}",
                          UserWarning, stacklevel=3)


def _metric_dict(row: list[Any]) -> dict[str, Any]:
    name, kind, description, tag_keys, boundaries, series = row
    out = []
    for values, value in series:
        tags = dict(zip(tag_keys, values))
        if kind != "histogram":
            out.append({"tags": tags, "value": value})
            continue
        counts, total = value
        running, buckets = 0, []
        for bound, n in zip(list(boundaries) + [float("inf")], counts):
            running += n
            buckets.append((bound, running))
        out.append({"tags": tags, "count": running, "sum": total, "buckets": buckets})
    return {"name": name, "kind": kind, "description": description, "tag_keys": tuple(tag_keys),
            "boundaries": boundaries, "series": out}


def spill_stats() -> list[dict[str, Any]]:
    """Object spilling per alive node: what went to disk and came back.

    Each row: node_id, spilled_bytes, spilled_objects, restored_bytes, restored_objects,
    restored_from_disk (reads served by mapping the spill file), fallback_objects
    (creates written to disk because no room could be made in the store), spill_mib_s,
    restore_mib_s (copy throughput), disk_bytes (in the spill directory now),
    spilling_bytes (in flight), out_of_disk (an out-of-disk episode is on),
    out_of_disk_rejects, spill_dir.

    Example:
        >>> sum(row["spilled_bytes"] for row in lumos.state.spill_stats())
    """
    cw = worker_context.require()
    nodes = [n for n in cw.call_gcs(m.GetAllNodes()) if n.state == "ALIVE"]

    async def gather() -> list[dict[str, Any] | None]:
        return await asyncio.gather(*(_node_spill_stats(n, cw.token, cw.config,
                                                        cw.raylet if n.node_id == cw.node_id else None)
                                      for n in nodes))

    return [row for row in cw.run_sync(gather(), 30.0) if row is not None]


async def _node_spill_stats(n: m.NodeInfo, token: bytes, config: Any, conn: Any = None) -> dict[str, Any] | None:
    """``spill_stats``'s row for node ``n``, asked of its raylet (over ``conn`` when given);
    None when the raylet does not answer."""
    from lumos._private.transport.connection import connect
    try:
        if conn is not None:
            stats = await conn.call(m.GetNodeStats(), 10.0)
        else:
            conn = await connect(n.address, token=token, config=config, name="state->raylet",
                                 use_unix=False, timeout_s=10.0)
            try:
                stats = await conn.call(m.GetNodeStats(), 10.0)
            finally:
                conn.close()
    except (OSError, ConnectionLost, TimeoutError, RemoteError):
        return None
    return {"node_id": n.node_id.hex(), **stats.get("spill", {})}


# --------------------------------------------------------------------------- async client

#: Records the ``StateClient`` hands out (dataclasses with typed attributes; ids are bytes).
NodeInfo = m.NodeInfo
NodeResources = m.NodeResources
JobInfo = m.JobInfo
WorkerInfo = m.WorkerInfo
ActorInfo = m.ActorInfo
PlacementGroupInfo = m.PlacementGroupInfo

#: Field names of a task record as ``StateClient.task_updates`` sends it (ids as bytes);
#: the one task-row schema of the GCS task log, this module and the dashboard.
TASK_ROW_FIELDS = task_row.ROW_FIELDS
#: Names in ``TASK_ROW_FIELDS`` whose values are ids (bytes, or None), and lists of ids.
TASK_ROW_ID_FIELDS = task_row.ID_FIELDS
TASK_ROW_ID_LIST_FIELDS = task_row.ID_LIST_FIELDS
#: Keys of a ``list_tasks`` row: ``TASK_ROW_FIELDS`` under Ray's names, in the same order.
TASK_FIELDS = task_row.PUBLIC_FIELDS


class TaskUpdates(NamedTuple):
    """One answer of ``StateClient.task_updates``."""

    #: Pass as ``since`` next time. Smaller than the ``since`` asked with: the GCS restarted
    #: and its log started over (drop what you kept).
    last_seq: int
    #: Changed task records, oldest change first; each a list in ``TASK_ROW_FIELDS`` order
    #: (ids as bytes, times as UNIX seconds or None).
    rows: list[list[Any]]
    #: True when ``limit`` cut the answer short: ask again at once.
    more: bool


#: Channels ``StateClient.subscribe`` takes -> the record type each delivers (None: as sent).
CHANNELS: dict[str, type | None] = {
    "nodes": m.NodeInfo, "jobs": m.JobInfo, "workers": m.WorkerInfo, "actors": m.ActorInfo,
    "placement_groups": m.PlacementGroupInfo,
    "task_events": None,  # the number of task events the GCS just took: a hint to call task_updates
}


class StateClient:
    """Read access to one cluster's control state from any asyncio loop.

    For front ends that run their own loop (a dashboard's tornado loop, a Jupyter
    server's, a notebook cell with ``await``): every request is a coroutine on the
    caller's loop, bounded by the cluster's RPC timeout; nothing blocks and no
    ``lumos.init()`` is needed (the GCS treats it as a plain subscriber, not a job).
    The snapshot methods return the GCS tables as records (``NodeInfo``, ``JobInfo``,
    ``WorkerInfo``, ``ActorInfo``, ``NodeResources``, ``PlacementGroupInfo``);
    ``subscribe`` delivers each change of a table as it happens; ``task_updates`` pages
    through the task-event log from a sequence number.

    ```
    your loop ──connect / nodes() / task_updates(seq) ...──► GCS
              ◄──subscribe("nodes" | "jobs" | "workers" | "actors" | ...)──┘
    ```

    Args:
        address: the GCS: ``"HOST:PORT"``, ``"unix:/path/gcs.sock"``, a Unix socket
            path, or ``(host, port)``.
        token: the cluster token (``lumos start --head`` prints it; a session
            directory keeps it in ``token``).
        name: names the connection in logs.

    Raises (every coroutine): ``OSError`` (the GCS is unreachable; a
    ``ConnectionError`` when it refused the token or the connection dropped:
    ``connect()`` again), ``TimeoutError`` (no answer in time), ``RemoteError`` (the
    GCS's handler failed on this request; the connection stays up).

    Example:
        >>> client = lumos.state.StateClient.for_current_cluster()
        >>> await client.connect()
        >>> [n.hostname for n in await client.nodes()]
        >>> client.close()
    """

    def __init__(self, address: str | tuple[str, int], token: bytes | str, *, name: str = "state->gcs") -> None:
        from lumos._private.gcs.client import GcsClient
        if isinstance(token, str):
            token = token.encode()
        if not isinstance(token, bytes):
            raise TypeError(f"token must be bytes or str, not {type(token).__name__}")
        self._client = GcsClient(address, token, name=name)
        #: Application-metric records the GCS refused, as of the last ``metrics()`` or
        #: ``prometheus_text()``: dicts of name, reason (the first), count.
        self.dropped_metrics: list[dict[str, Any]] = []

    @classmethod
    def for_session(cls, session_dir: str, *, name: str = "state->gcs") -> "StateClient":
        """The cluster whose head node keeps ``session_dir`` on this machine (its GCS
        socket and token file).

        Raises:
            OSError: the token file cannot be read.
        """
        from lumos._private.process import read_token
        token = read_token(os.path.join(session_dir, "token"))
        return cls(os.path.join(session_dir, "sockets", "gcs.sock"), token, name=name)

    @classmethod
    def for_current_cluster(cls, *, name: str = "state->gcs") -> "StateClient":
        """The cluster this process joined with ``lumos.init()`` (over its head node's
        Unix socket when that is on this machine).

        Raises:
            RuntimeError: lumos is not initialized in this process.
        """
        cw = worker_context.require()
        ctx = worker_context.context
        info = getattr(ctx, "address_info", None) or {}
        address: Any = cw.gcs_address
        session_dir = info.get("session_dir")
        if session_dir:
            sock = os.path.join(session_dir, "sockets", "gcs.sock")
            if os.path.exists(sock):
                address = sock
        return cls(address, cw.token, name=name)

    @property
    def address(self) -> str | tuple[str, int]:
        """The GCS this client connects to, as given."""
        return self._client.address  # type: ignore[no-any-return]

    @property
    def connected(self) -> bool:
        """True while the connection is up."""
        return self._client.connected

    async def connect(self, timeout_s: float | None = None) -> None:
        """Connect and authenticate (again, after the connection dropped), retrying
        until ``timeout_s`` (the cluster's connect timeout by default); channels
        subscribed before are subscribed again."""
        await self._client.connect(timeout_s=timeout_s)

    def close(self) -> None:
        """Drop the connection (``connect()`` may open it again); subscriptions are kept."""
        self._client.close()

    def subscribe(self, channel: str, callback: Callable[[Any], None]) -> None:
        """Call ``callback(record)`` on this loop for each change the GCS publishes on
        ``channel`` (see ``CHANNELS``), across reconnects. Changes made while
        disconnected are not replayed: read the snapshot again after ``connect()``.

        Raises:
            ValueError: ``channel`` is not one of ``CHANNELS``.
        """
        if channel not in CHANNELS:
            raise ValueError(f"unknown state channel {channel!r}; channels: {', '.join(CHANNELS)}")
        kind = CHANNELS[channel]

        def deliver(msg: m.Publish) -> None:
            if kind is None or isinstance(msg.data, kind):
                callback(msg.data)
        self._client.subscribe(channel, deliver)

    async def nodes(self) -> list[m.NodeInfo]:
        """Every node the GCS knows, alive and dead."""
        return await self._client.call(m.GetAllNodes())  # type: ignore[no-any-return]

    async def node_resources(self) -> list[m.NodeResources]:
        """Each alive node's resources and load as of its last heartbeat."""
        return await self._client.call(m.GetClusterStatus())  # type: ignore[no-any-return]

    async def node_log(self, node_id: str, worker_id: str | None = None, tail: int = 100,
                       suffix: str = "out") -> m.NodeLog:
        """The end of a node's raylet or worker log, as ``get_log`` (with the file's name)."""
        msg = _log_request(node_id, worker_id, tail, suffix)
        try:
            return await self._client.call(msg, _LOG_TIMEOUT_S)  # type: ignore[no-any-return]
        except RemoteError as e:
            raise _log_error(e) from None

    async def jobs(self) -> list[m.JobInfo]:
        """Every job (driver) the GCS knows, running and finished."""
        return await self._client.call(m.GetAllJobs())  # type: ignore[no-any-return]

    async def workers(self) -> list[m.WorkerInfo]:
        """Worker and driver processes the GCS knows, alive and dead. A dead one's
    ``exit_type`` says why it ended, as Ray's rows do: SYSTEM_ERROR (it crashed, was killed
    from outside, or its node died), INTENDED_SYSTEM_EXIT (lumos stopped it: idle, its job
    or actor ended), USER_ERROR (its actor's ``__init__`` raised), INTENDED_USER_EXIT
    (``kill``, ``exit_actor``, ``sys.exit()``, a forced ``cancel``, a driver's ``shutdown``)
    or NODE_OUT_OF_MEMORY (the memory monitor killed it)."""
        return await self._client.call(m.GetAllWorkers())  # type: ignore[no-any-return]

    async def actors(self) -> list[m.ActorInfo]:
        """The actor table, every job's."""
        rows = await self._client.call(m.ListActors(None))
        return [a for a in rows if isinstance(a, m.ActorInfo)]

    async def placement_groups(self) -> list[m.PlacementGroupInfo]:
        """Placement groups, removed ones too (bounded by the GCS)."""
        return await self._client.call(m.ListPlacementGroups())  # type: ignore[no-any-return]

    async def spill_stats(self) -> list[dict[str, Any]]:
        """Object spilling per alive node, as ``lumos.state.spill_stats()`` gives it (each
        node's raylet is asked directly; a node that does not answer is left out)."""
        client = self._client
        nodes = [n for n in await self.nodes() if n.state == "ALIVE"]
        rows = await asyncio.gather(*(_node_spill_stats(n, client._token, client.config) for n in nodes))
        return [row for row in rows if row is not None]

    async def metrics(self) -> list[dict[str, Any]]:
        """The application metrics, as ``lumos.state.metrics()`` gives them; what the GCS
        refused (a name reported as two kinds, malformed or past its bounds) is in
        ``dropped_metrics`` afterwards (name, reason, count)."""
        rows, self.dropped_metrics = _metrics_answer(await self._client.call(m.GetMetrics()))
        return [_metric_dict(row) for row in rows]

    async def prometheus_text(self) -> str:
        """The cluster's metrics in Prometheus's text format, as ``lumos.state.prometheus_text()``."""
        from lumos._private.metrics import render_prometheus
        call = self._client.call
        answer, nodes, status, actors, jobs = await asyncio.gather(
            call(m.GetMetrics()), call(m.GetAllNodes()), call(m.GetClusterStatus()), call(m.ListActors(None)),
            call(m.GetAllJobs()))
        rows, self.dropped_metrics = _metrics_answer(answer)
        return render_prometheus(rows, nodes, status, [a for a in actors if isinstance(a, m.ActorInfo)], jobs,
                                 self.dropped_metrics)

    async def task_updates(self, since: int, limit: int = 5000) -> TaskUpdates:
        """Task records that changed after sequence number ``since`` (0: from the
        start of the log), at most ``limit`` of them."""
        last, rows, more = await self._client.call(m.GetTaskUpdates(since, limit))
        return TaskUpdates(last, rows, more)
