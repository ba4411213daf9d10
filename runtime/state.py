"""Read-only views of cluster state (Ray's ``ray.util.state`` shape): tasks, objects,
workers, nodes, jobs.

Tasks come from the GCS task-event log; objects from every live core worker's
reference table; workers, nodes and jobs from the GCS tables. Every function returns
plain dicts (JSON-ready, ids in hex) and never changes anything.

Example:
    >>> lumos.state.list_tasks(filters=[("state", "=", "FAILED")])
"""

from __future__ import annotations

import asyncio
from typing import Any, Iterable

from lumos._private import worker_context
from lumos._private.protocol import messages as m
from lumos._private.transport.connection import ConnectionLost, RemoteError

Filter = tuple[str, str, Any]

__all__ = ["list_tasks", "list_objects", "list_workers", "list_nodes", "list_jobs", "get_task",
           "summarize_tasks", "list_actors", "spill_stats"]


def _match(row: dict[str, Any], filters: Iterable[Filter] | None) -> bool:
    for key, op, value in filters or ():
        have = row.get(key)
        if op in ("=", "=="):
            if str(have) != str(value) and have != value:
                return False
        elif op == "!=":
            if str(have) == str(value) or have == value:
                return False
        else:
            raise ValueError(f"unsupported filter operator {op!r}; use '=' or '!='")
    return True


def _check_filters(filters: Iterable[Filter] | None) -> list[Filter]:
    out = []
    for f in filters or ():
        if not (isinstance(f, (tuple, list)) and len(f) == 3 and isinstance(f[0], str)):
            raise TypeError(f"a filter is a (key, op, value) tuple, got {f!r}")
        out.append((f[0], f[1], f[2]))
    return out


def list_tasks(filters: Iterable[Filter] | None = None, limit: int = 10_000,
               all_jobs: bool = False) -> list[dict[str, Any]]:
    """The newest ``limit`` tasks of this job (or all jobs) that match ``filters``, oldest first,
    from the GCS task-event log.

    Each row: task_id, name, func_or_class_name, type, state, attempt_number, retries,
    parent_task_id, actor_id, arg_object_ids, return_object_ids, node_id, worker_id,
    error_message, submitted_time, start_time, end_time, events.
    """
    flt = _check_filters(filters)
    cw = worker_context.require()
    cw._post(cw._flush_events)  # include what this process has not sent yet
    # With filters, matches may be older than the newest ``limit`` records: scan the whole log.
    fetch = max(limit, cw.config.task_event_max_records) if flt else max(limit, 1)
    rows = cw.call_gcs(m.GetTasks(None if all_jobs else cw.job_id or None, fetch))
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


def list_nodes(filters: Iterable[Filter] | None = None) -> list[dict[str, Any]]:
    """Nodes with their resources (total and available) and object-store use."""
    flt = _check_filters(filters)
    cw = worker_context.require()
    status = {n.node_id: n for n in cw.call_gcs(m.GetClusterStatus())}
    rows = []
    for n in cw.call_gcs(m.GetAllNodes()):
        st = status.get(n.node_id)
        rows.append({
            "node_id": n.node_id.hex(), "state": n.state, "node_ip": n.address.host,
            "hostname": n.hostname, "is_head_node": n.is_head, "resources_total": dict(n.resources_total),
            "resources_available": dict(st.available) if st else {},
            "object_store_used_bytes": st.store_used_bytes if st else 0,
            "object_store_capacity_bytes": n.object_store_bytes, "num_workers": st.num_workers if st else 0,
            "pending_leases": st.queue_length if st else 0,
            "infeasible": list(st.infeasible) if st else [], "labels": dict(n.labels),
            "start_time": n.start_time, "end_time": n.end_time or None,
            "death_reason": n.death_reason or None, "dashboard_url": n.dashboard_url or None,
        })
    return [r for r in rows if _match(r, flt)]


def list_workers(filters: Iterable[Filter] | None = None) -> list[dict[str, Any]]:
    """Worker and driver processes the GCS knows, alive and dead."""
    flt = _check_filters(filters)
    cw = worker_context.require()
    rows = []
    for w in cw.call_gcs(m.GetAllWorkers()):
        rows.append({
            "worker_id": w.worker_id.hex(), "node_id": w.node_id.hex(), "pid": w.pid,
            "job_id": w.job_id.hex() if w.job_id else None, "is_driver": w.is_driver,
            "state": w.state, "start_time": w.start_time, "end_time": w.end_time or None,
            "exit_detail": w.exit_detail or None,
        })
    return [r for r in rows if _match(r, flt)]


def list_jobs() -> list[dict[str, Any]]:
    cw = worker_context.require()
    return [{"job_id": j.job_id.hex(), "driver_pid": j.pid, "namespace": j.namespace,
             "entrypoint": j.entrypoint, "state": j.state, "start_time": j.start_time,
             "end_time": j.end_time or None} for j in cw.call_gcs(m.GetAllJobs())]


def list_objects(filters: Iterable[Filter] | None = None, limit: int = 10_000) -> list[dict[str, Any]]:
    """Objects referenced anywhere: asks every live driver and worker for its table.

    Each row: object_id, owner_worker_id, reporter_worker_id, owned, state, size_bytes,
    local_refs, submitted_refs, contained_refs, borrowers, in_store, node_id.
    """
    flt = _check_filters(filters)
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


def list_actors(filters: Iterable[Filter] | None = None, all_jobs: bool = True) -> list[dict[str, Any]]:
    """Actors the GCS knows: state, class, name, node, pid, restarts, death cause."""
    flt = _check_filters(filters)
    cw = worker_context.require()
    infos = cw.call_gcs(m.ListActors(None if all_jobs else cw.job_id))
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
        })
    return [r for r in rows if _match(r, flt)]


def spill_stats() -> list[dict[str, Any]]:
    """Object spilling per alive node: what went to disk and came back.

    Each row: node_id, spilled_bytes, spilled_objects, restored_bytes, restored_objects,
    restored_from_disk (reads served by mapping the spill file), spill_mib_s,
    restore_mib_s (copy throughput), disk_bytes (in the spill directory now),
    spilling_bytes (in flight), out_of_disk (an out-of-disk episode is on),
    out_of_disk_rejects, spill_dir.

    Example:
        >>> sum(row["spilled_bytes"] for row in lumos.state.spill_stats())
    """
    from lumos._private.transport.connection import connect

    cw = worker_context.require()
    nodes = [n for n in cw.call_gcs(m.GetAllNodes()) if n.state == "ALIVE"]

    async def ask(n: m.NodeInfo) -> dict[str, Any] | None:
        try:
            if n.node_id == cw.node_id and cw.raylet is not None:
                stats = await cw.raylet.call(m.GetNodeStats(), 10.0)
            else:
                conn = await connect(n.address, token=cw.token, config=cw.config, name="state->raylet",
                                     use_unix=False, timeout_s=10.0)
                try:
                    stats = await conn.call(m.GetNodeStats(), 10.0)
                finally:
                    conn.close()
        except (OSError, ConnectionLost, TimeoutError, RemoteError):
            return None
        return {"node_id": n.node_id.hex(), **stats.get("spill", {})}

    async def gather() -> list[dict[str, Any] | None]:
        return await asyncio.gather(*(ask(n) for n in nodes))

    return [row for row in cw.run_sync(gather(), 30.0) if row is not None]
