"""Ray's ``ray.util.state`` API (list, get, summarize) over ``lumos.state``.

Same names and parameters as Ray. Rows are dicts that also read as attributes
(``row["state"]`` or ``row.state``), as Ray's state objects do. They carry Ray's field
names beside lumos's where lumos has the value (an object's ``object_size``,
``reference_type``, ``pid``, ``ip`` and ``type``; a task's ``worker_pid``; a node's
``node_name``; ``*_time_ms``; …), and filters may name either. lumos's state API reads
the cluster this process is connected to: ``address`` must be None (or that cluster's
address); ``timeout`` and ``detail`` are accepted (rows always hold every field).

    from lumos.util.state import list_actors, summarize_tasks
    list_actors(filters=[("state", "=", "ALIVE")])
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator

from lumos import state as _state
from lumos._private.compat import missing_class, missing_function, not_implemented_error
from lumos._private.protocol.vocab import TaskKind

Filter = tuple[str, str, Any]


class StateRow(dict):  # type: ignore[type-arg]
    """A state row: a dict whose keys also read as attributes (a field that is itself a dict,
    such as a job's ``driver_info``, too: ``row.driver_info.pid``), as Ray's row objects."""

    def __getattr__(self, name: str) -> Any:
        try:
            value = self[name]
        except KeyError:
            raise AttributeError(f"state row has no field {name!r}; fields: {sorted(self)}") from None
        return StateRow(value) if type(value) is dict else value

    def asdict(self) -> dict[str, Any]:
        """The row as a plain dict (Ray's rows' ``asdict()``)."""
        return dict(self)


def _rows(rows: Iterable[dict[str, Any]], limit: int | None = None) -> list[StateRow]:
    out = [StateRow(r) for r in rows]
    return out[:limit] if limit is not None and limit >= 0 else out


def _check_address(address: str | None) -> None:
    if address in (None, "", "auto"):
        return
    from lumos._private import worker_context
    cw = worker_context.require()
    gcs = cw.gcs_address if isinstance(cw.gcs_address, str) else f"{cw.gcs_address[0]}:{cw.gcs_address[1]}"
    if str(address).split("://")[-1] != gcs:
        raise ValueError(f"lumos's state API reads the cluster this process is connected to ({gcs}), not "
                         f"{address!r}; call lumos.init(address=...) for that cluster first")


def _filter(rows: list[dict[str, Any]], filters: Iterable[Filter] | None, fields: Iterable[str] | None,
            what: str) -> list[dict[str, Any]]:
    flt = _state._check_filters(filters, fields, what)
    return [r for r in rows if _state._match(r, flt)]


def _ms(seconds: Any) -> int | None:
    return int(seconds * 1000) if seconds else None


# Ray's names for fields lumos's rows hold under their own names: each row gets both, and
# filters may name either. ``call_site`` is None, as in Ray unless it runs with
# RAY_record_task_actor_creation_sites (lumos records no creation sites): present so code
# that reads it works.
def _ray_actor(r: dict[str, Any]) -> dict[str, Any]:
    return {**r, "ray_namespace": r["namespace"], "start_time_ms": _ms(r["start_time"]),
            "end_time_ms": _ms(r["end_time"]), "call_site": None}


def _ray_task(r: dict[str, Any], workers: "_Workers") -> dict[str, Any]:
    return {**r, "creation_time_ms": _ms(r["submitted_time"]), "start_time_ms": _ms(r["start_time"]),
            "end_time_ms": _ms(r["end_time"]), "worker_pid": workers.get(r["worker_id"])[0], "language": "PYTHON",
            "call_site": None}


def _ray_worker(r: dict[str, Any], ips: dict[str, str]) -> dict[str, Any]:
    start_ms = _ms(r["start_time"])
    return {**r, "worker_type": "DRIVER" if r["is_driver"] else "WORKER", "is_alive": r["state"] == "ALIVE",
            "start_time_ms": start_ms, "end_time_ms": _ms(r["end_time"]), "ip": ips.get(r["node_id"], ""),
            "worker_launch_time_ms": start_ms, "worker_launched_time_ms": start_ms}


def _ray_job(r: dict[str, Any]) -> dict[str, Any]:
    # Ray's row of a driver's job: its status is SUCCEEDED once the driver is gone.
    # Its times in milliseconds, as Ray's job rows have them (lumos.state's are seconds).
    return {**r, "status": "SUCCEEDED" if r["state"] == "FINISHED" else r["state"],
            "start_time": _ms(r["start_time"]), "end_time": _ms(r["end_time"]),
            "start_time_ms": _ms(r["start_time"]), "end_time_ms": _ms(r["end_time"]), "type": "DRIVER",
            "submission_id": None, "driver_info": {"id": r["job_id"], "node_ip_address": r["driver_ip"],
                                                   "pid": str(r["driver_pid"])},
            "message": None, "error_type": None, "driver_exit_code": None}


def _ray_group(r: dict[str, Any]) -> dict[str, Any]:
    return {**r, "creator_job_id": r.get("job_id")}


#: The fields of ``list_placement_groups``' rows (placement_group_table's and Ray's creator_job_id).
_RAY_GROUP_FIELDS = ("placement_group_id", "name", "namespace", "bundles", "bundles_to_node_id",
                     "bundles_to_gpu_ids", "strategy", "state", "is_detached", "job_id", "stats", "creator_job_id")


def _ray_node(r: dict[str, Any]) -> dict[str, Any]:
    # (Ray names a node by its address unless started with another name.)
    # The store's capacity counts among the node's resources, as in Ray's rows (and nodes()).
    return {**r, "node_name": r["node_ip"], "state_message": r["death_reason"],
            "resources_total": {**r["resources_total"], "object_store_memory": float(r["object_store_capacity_bytes"])},
            "start_time_ms": _ms(r["start_time"]), "end_time_ms": _ms(r["end_time"])}


def _node_ips() -> dict[str, str]:
    return {n["node_id"]: n["node_ip"] for n in _state.list_nodes()}


class _Workers:
    """Each worker's pid, kind and address, for rows that name a worker by id: read once
    per listing, and only if a row names one."""

    def __init__(self) -> None:
        self._by_id: dict[str, tuple[int, bool, str]] | None = None

    def get(self, worker_id: str | None) -> tuple[int | None, bool | None, str | None]:
        if not worker_id:
            return None, None, None
        if self._by_id is None:
            ips = _node_ips()
            self._by_id = {w["worker_id"]: (w["pid"], w["is_driver"], ips.get(w["node_id"], ""))
                           for w in _state.list_workers()}
        return self._by_id.get(worker_id, (None, None, None))


def _ray_object(r: dict[str, Any], workers: _Workers) -> dict[str, Any]:
    pid, is_driver, ip = workers.get(r["reporter_worker_id"])
    # Ray's reference types, from what holds the reference in the reporting process.
    if r["local_refs"]:
        kind = "LOCAL_REFERENCE"
    elif r["submitted_refs"]:
        kind = "USED_BY_PENDING_TASK"
    elif r["contained_refs"]:
        kind = "CAPTURED_IN_OBJECT"
    elif r["in_store"]:
        kind = "PINNED_IN_MEMORY"
    else:
        kind = "UNKNOWN_STATUS"
    return {**r, "object_size": r["size_bytes"], "reference_type": kind, "pid": pid, "ip": ip,
            "type": None if is_driver is None else ("DRIVER" if is_driver else "WORKER")}


_RAY_ACTOR_FIELDS = (*_state.ACTOR_FIELDS, "ray_namespace", "start_time_ms", "end_time_ms")
_RAY_TASK_FIELDS = (*_state.TASK_FIELDS, "creation_time_ms", "start_time_ms", "end_time_ms", "worker_pid",
                    "language")
_RAY_WORKER_FIELDS = (*_state.WORKER_FIELDS, "worker_type", "is_alive", "start_time_ms", "end_time_ms", "ip",
                      "worker_launch_time_ms", "worker_launched_time_ms")
_RAY_JOB_FIELDS = (*_state.JOB_FIELDS, "status", "start_time_ms", "end_time_ms", "type", "submission_id",
                   "driver_info", "message", "error_type", "driver_exit_code")
_RAY_NODE_FIELDS = (*_state.NODE_FIELDS, "node_name", "state_message", "start_time_ms", "end_time_ms")
_RAY_OBJECT_FIELDS = (*_state.OBJECT_FIELDS, "object_size", "reference_type", "pid", "ip", "type")


def list_actors(address: str | None = None, filters: Iterable[Filter] | None = None, limit: int = 100,
                timeout: int = 30, detail: bool = False, raise_on_missing_output: bool = True,
                _explain: bool = False) -> list[StateRow]:
    """Actors of every job: state, class_name, name, node_id, pid, restarts (and Ray's
    ray_namespace, start_time_ms, end_time_ms)."""
    _check_address(address)
    return _rows(_filter([_ray_actor(r) for r in _state.list_actors()], filters, _RAY_ACTOR_FIELDS, "actors"),
                 limit)


def list_tasks(address: str | None = None, filters: Iterable[Filter] | None = None, limit: int = 100,
               timeout: int = 30, detail: bool = False, raise_on_missing_output: bool = True,
               _explain: bool = False) -> list[StateRow]:
    """Tasks of every job from the task-event log (the newest ``limit``), with Ray's
    creation_time_ms, start_time_ms and end_time_ms too."""
    _check_address(address)
    flt = _state._check_filters(filters, _RAY_TASK_FIELDS, "tasks")
    want = limit if limit >= 0 else 1_000_000
    workers = _Workers()
    rows = [_ray_task(r, workers) for r in _state.list_tasks(limit=1_000_000 if flt else want, all_jobs=True)]
    rows = [r for r in rows if _state._match(r, flt)]
    return _rows(rows[-want:] if want else [])


def list_nodes(address: str | None = None, filters: Iterable[Filter] | None = None, limit: int = 100,
               timeout: int = 30, detail: bool = False, raise_on_missing_output: bool = True,
               _explain: bool = False) -> list[StateRow]:
    _check_address(address)
    return _rows(_filter([_ray_node(r) for r in _state.list_nodes()], filters, _RAY_NODE_FIELDS, "nodes"), limit)


def list_workers(address: str | None = None, filters: Iterable[Filter] | None = None, limit: int = 100,
                 timeout: int = 30, detail: bool = False, raise_on_missing_output: bool = True,
                 _explain: bool = False) -> list[StateRow]:
    _check_address(address)
    ips = _node_ips()
    return _rows(_filter([_ray_worker(r, ips) for r in _state.list_workers()], filters, _RAY_WORKER_FIELDS,
                         "workers"), limit)


def list_jobs(address: str | None = None, filters: Iterable[Filter] | None = None, limit: int = 100,
              timeout: int = 30, detail: bool = False, raise_on_missing_output: bool = True,
              _explain: bool = False) -> list[StateRow]:
    _check_address(address)
    return _rows(_filter([_ray_job(r) for r in _state.list_jobs()], filters, _RAY_JOB_FIELDS, "jobs"), limit)


def list_objects(address: str | None = None, filters: Iterable[Filter] | None = None, limit: int = 100,
                 timeout: int = 30, detail: bool = False, raise_on_missing_output: bool = True,
                 _explain: bool = False) -> list[StateRow]:
    _check_address(address)
    flt = _state._check_filters(filters, _RAY_OBJECT_FIELDS, "objects")
    want = limit if limit >= 0 else 10_000
    workers = _Workers()
    rows = [_ray_object(r, workers) for r in _state.list_objects(limit=10_000 if flt else want)]
    return _rows([r for r in rows if _state._match(r, flt)], want)


def list_placement_groups(address: str | None = None, filters: Iterable[Filter] | None = None, limit: int = 100,
                          timeout: int = 30, detail: bool = False, raise_on_missing_output: bool = True,
                          _explain: bool = False) -> list[StateRow]:
    from lumos.util.placement_group import placement_group_table
    _check_address(address)
    return _rows(_filter([_ray_group(r) for r in placement_group_table().values()], filters, _RAY_GROUP_FIELDS,
                         "placement groups"), limit)


def _one(rows: list[StateRow], key: str, id: Any) -> StateRow | None:
    want = id.hex() if hasattr(id, "hex") and not isinstance(id, str) else str(id)
    return next((r for r in rows if r.get(key) == want), None)


def get_actor(id: str, address: str | None = None, timeout: int = 30, _explain: bool = False) -> StateRow | None:
    return _one(list_actors(address, limit=-1), "actor_id", id)


def get_task(id: Any, address: str | None = None, timeout: int = 30, _explain: bool = False) -> StateRow | None:
    """The task with this id (hex), or the task that makes this ``ObjectRef``."""
    _check_address(address)
    from lumos.object_ref import ObjectRef
    task_id = id.task_id().hex() if isinstance(id, ObjectRef) else str(id)
    row = _state.get_task(task_id)
    return StateRow(_ray_task(row, _Workers())) if row is not None else None


def get_node(id: str, address: str | None = None, timeout: int = 30, _explain: bool = False) -> StateRow | None:
    return _one(list_nodes(address, limit=-1), "node_id", id)


def get_worker(id: str, address: str | None = None, timeout: int = 30, _explain: bool = False) -> StateRow | None:
    return _one(list_workers(address, limit=-1), "worker_id", id)


def get_job(id: str, address: str | None = None, timeout: int = 30, _explain: bool = False) -> StateRow | None:
    return _one(list_jobs(address, limit=-1), "job_id", id)


def get_placement_group(id: str, address: str | None = None, timeout: int = 30,
                        _explain: bool = False) -> StateRow | None:
    return _one(list_placement_groups(address, limit=-1), "placement_group_id", id)


def get_objects(id: str, address: str | None = None, timeout: int = 30, _explain: bool = False) -> list[StateRow]:
    """Every process's record of the object ``id`` (owner and borrowers)."""
    return list_objects(address, filters=[("object_id", "=", id)], limit=-1)


def summarize_tasks(address: str | None = None, timeout: int = 30, raise_on_missing_output: bool = True,
                    _explain: bool = False) -> dict[str, Any]:
    """Task counts per function (or ``Class.method``) and state, in Ray's shape::

        {"cluster": {"summary": {"f": {"func_or_class_name": "f", "type": <TaskKind name>,
                                       "state_counts": {"FINISHED": 3}}, ...},
                     "total_tasks": 3, "total_actor_tasks": 1, "total_actor_scheduled": 1,
                     "summary_by": "func_name"}}

    Tasks are grouped by their name: the function's (``Class.method`` for an actor's),
    or the one given with ``.options(name=...)``, where Ray keeps grouping by the
    function. (``lumos.state.summarize_tasks`` gives the flat ``{name: {state: count}}``.)"""
    _check_address(address)
    summary: dict[str, dict[str, Any]] = {}
    totals = {kind.name: 0 for kind in TaskKind}
    for r in _state.list_tasks(limit=1_000_000, all_jobs=True):
        name = r["name"]
        entry = summary.setdefault(name, {"func_or_class_name": name, "type": r["type"], "state_counts": {}})
        entry["state_counts"][r["state"]] = entry["state_counts"].get(r["state"], 0) + 1
        totals[r["type"]] = totals.get(r["type"], 0) + 1
    return {"cluster": {"summary": summary, "total_tasks": totals[TaskKind.NORMAL_TASK.name],
                        "total_actor_tasks": totals[TaskKind.ACTOR_TASK.name],
                        "total_actor_scheduled": totals[TaskKind.ACTOR_CREATION_TASK.name], "summary_by": "func_name"}}


def summarize_actors(address: str | None = None, timeout: int = 30, raise_on_missing_output: bool = True,
                     _explain: bool = False) -> dict[str, Any]:
    """Actor counts per class and state, in Ray's shape::

        {"cluster": {"summary": {"A": {"class_name": "A", "state_counts": {"ALIVE": 1}}},
                     "total_actors": 1, "summary_by": "class"}}"""
    summary: dict[str, dict[str, Any]] = {}
    rows = list_actors(address, limit=-1)
    for a in rows:
        entry = summary.setdefault(a["class_name"], {"class_name": a["class_name"], "state_counts": {}})
        entry["state_counts"][a["state"]] = entry["state_counts"].get(a["state"], 0) + 1
    return {"cluster": {"summary": summary, "total_actors": len(rows), "summary_by": "class"}}


def summarize_objects(address: str | None = None, timeout: int = 30, raise_on_missing_output: bool = True,
                      _explain: bool = False) -> dict[str, Any]:
    """Object references in Ray's shape: lumos does not record call sites, so, as Ray with
    call sites off, every reference is in one group named ``"disabled"``::

        {"cluster": {"summary": {"disabled": {"total_objects": 2, "total_size_mb": 1.0,
                                              "total_num_workers": 1, "total_num_nodes": 1,
                                              "task_state_counts": {...}, "task_attempt_number_counts": {...},
                                              "ref_type_counts": {"LOCAL_REFERENCE": 2}}},
                     "total_objects": 2, "total_size_mb": 1.0, "callsite_enabled": False,
                     "summary_by": "callsite"}}

    A reference is counted once per process that holds it (as ``list_objects`` lists it)."""
    rows = list_objects(address, limit=-1)
    size_mb = sum(r.get("size_bytes") or 0 for r in rows) / (1 << 20)
    summary: dict[str, dict[str, Any]] = {}
    if rows:
        group: dict[str, Any] = {"total_objects": len(rows), "total_size_mb": size_mb,
                                 "total_num_workers": len({r["reporter_worker_id"] for r in rows}),
                                 "total_num_nodes": len({r["node_id"] for r in rows if r["node_id"]}),
                                 "task_state_counts": {}, "task_attempt_number_counts": {}, "ref_type_counts": {}}
        for r in rows:
            for key, value in (("task_state_counts", r["task_status"] or "NIL"),
                               ("task_attempt_number_counts", str(r["attempt_number"] or 0)),
                               ("ref_type_counts", r["reference_type"])):
                group[key][value] = group[key].get(value, 0) + 1
        summary["disabled"] = group
    return {"cluster": {"summary": summary, "total_objects": len(rows), "total_size_mb": size_mb,
                        "callsite_enabled": False, "summary_by": "callsite"}}


_LOGS = ("worker output reaches the driver as it is printed; every process's log file is in the "
         "session's logs directory (lumos.get_runtime_context().get_temp_dir() + '/logs')")
_GET_LOG = "name the process with node_id, pid, actor_id or task_id (lumos.state.get_log takes a worker id)"


def get_log(address: str | None = None, node_id: str | None = None, node_ip: str | None = None,
            filename: str | None = None, actor_id: str | None = None, task_id: str | None = None,
            pid: int | None = None, follow: bool = False, tail: int = -1, timeout: int = 30,
            suffix: str = "out", encoding: str | None = "utf-8", errors: str | None = "strict",
            submission_id: str | None = None, attempt_number: int = 0, _interval: float | None = None,
            filter_ansi_code: bool = False) -> Iterator[str]:
    """The end of a node's raylet log or of a worker's output, read by that node's raylet
    through the GCS (``lumos.state.get_log``), as Ray's generator of text chunks.

    Supported: ``node_id`` alone (the raylet's log), ``pid`` (with or without
    ``node_id``), ``actor_id`` and ``task_id`` (the worker that ran it); ``tail`` (at
    most 200 lines; -1 gives the last 200); ``suffix`` "out" or "err" (a worker's output:
    both go to one file) or "log" (the process's own log).

    Raises:
        NotImplementedError: ``filename``, ``node_ip``, ``follow``, ``submission_id``,
            ``attempt_number``, ``filter_ansi_code`` or an encoding other than utf-8.
        ValueError, LookupError: see ``lumos.state.get_log``.
    """
    for name, value, default in (("filename", filename, None), ("node_ip", node_ip, None), ("follow", follow, False),
                                 ("submission_id", submission_id, None), ("attempt_number", attempt_number, 0),
                                 ("filter_ansi_code", filter_ansi_code, False)):
        if value != default:
            raise not_implemented_error(f"get_log({name}=...)", _GET_LOG)
    if encoding not in (None, "utf-8", "utf8"):
        raise not_implemented_error(f"get_log(encoding={encoding!r})", "logs are read as utf-8 (undecodable "
                                    "bytes replaced)")
    _check_address(address)
    if suffix not in ("out", "err", "log"):
        raise ValueError(f"suffix must be 'out', 'err' or 'log', got {suffix!r}")
    lines = _state.MAX_LOG_LINES if tail is None or tail < 0 else tail
    worker_id: str | None = None
    if actor_id is not None:
        rows = [a for a in _state.list_actors() if a["actor_id"] == actor_id]
        if not rows or not rows[0].get("node_id") or not rows[0].get("pid"):
            raise LookupError(f"no actor {actor_id!r} with a running process; list_actors() lists them")
        node_id, pid = rows[0]["node_id"], rows[0]["pid"]
    elif task_id is not None:
        row = _state.get_task(task_id)
        if row is None or not row.get("worker_id"):
            raise LookupError(f"no task {task_id!r} that started on a worker; list_tasks() lists them")
        node_id, worker_id = row["node_id"], row["worker_id"]
    if pid is not None and worker_id is None:
        found = [w for w in _state.list_workers() if w["pid"] == pid and not w.get("is_driver")
                 and (node_id is None or w["node_id"] == node_id)]
        if len(found) > 1:  # a pid used again (or on two machines): the live one, else the newest
            alive = [w for w in found if w["state"] == "ALIVE"]
            found = alive or sorted(found, key=lambda w: w["start_time"])[-1:]
        if len(found) != 1:
            raise LookupError(f"{'no' if not found else 'more than one'} worker with pid {pid}"
                              f"{'' if node_id is None else f' on node {node_id}'}; pass node_id, or see "
                              "list_workers()")
        node_id, worker_id = found[0]["node_id"], found[0]["worker_id"]
    if node_id is None:
        raise ValueError("get_log needs node_id, pid, actor_id or task_id")
    # Checked and read now, not on first iteration, so a bad call fails where it is made.
    return iter([_state.get_log(node_id, worker_id, lines, "log" if suffix == "log" else "out") + "\n"])


list_logs = missing_function("ray.util.state.list_logs", _LOGS)
list_runtime_envs = missing_function("ray.util.state.list_runtime_envs",
                                     "lumos runtime_envs are env_vars and a job's working_dir, shown by "
                                     "lumos.get_runtime_context().runtime_env")
list_cluster_events = missing_function("ray.util.state.list_cluster_events",
                                       "node and actor changes are in list_nodes() and list_actors(); the "
                                       "GCS log is in the session's logs directory")
StateApiClient = missing_class("ray.util.state.StateApiClient",
                               "use the functions of lumos.util.state, which read the connected cluster")

__all__ = ["StateApiClient", "get_actor", "get_job", "get_log", "get_node", "get_objects", "get_placement_group",
           "get_task", "get_worker", "list_actors", "list_cluster_events", "list_jobs", "list_logs", "list_nodes",
           "list_objects", "list_placement_groups", "list_runtime_envs", "list_tasks", "list_workers",
           "summarize_actors", "summarize_objects", "summarize_tasks"]
