"""The one schema of a task row: what the GCS task log sends, the state API returns and
the dashboard keeps.

The GCS task log (``gcs/task_log.py``) folds each task's events into a record and sends
it as a compact list in ``ROW_FIELDS`` order (ids as bytes) in reply to
``GetTaskUpdates``; ``lumos.state.list_tasks`` returns the same record as a dict keyed by
``PUBLIC_FIELDS`` (Ray's names, ids in hex), made from the compact row by ``to_public``;
the dashboard keeps one ``Task`` per task with an attribute per ``ROW_FIELDS`` name
(ids in hex). Adding a field here adds it to all three.

```
gcs/task_log.py TaskRecord.to_row() ──GetTaskUpdates──► dashboard/source.py Task (ROW_FIELDS)
                TaskRecord.to_dict() = to_public(to_row())
                    ──GetTasks──► lumos.state.list_tasks (PUBLIC_FIELDS)
```
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any


class FieldKind(Enum):
    """How a field's value is shown outside the GCS."""

    #: Plain value (text, number, dict, list of lists).
    VALUE = "value"
    #: An id: bytes in the compact row, hex (None when absent) in public rows and the dashboard.
    ID = "id"
    #: An id shown as "" rather than None when absent (Ray's ``parent_task_id``).
    ID_OR_EMPTY = "id_or_empty"
    #: A list of ids.
    IDS = "ids"


@dataclass(frozen=True, slots=True)
class RowField:
    #: Name in the compact row and on the dashboard's ``Task``.
    name: str
    #: Key in ``lumos.state.list_tasks`` rows (Ray's name where Ray has one).
    public: str
    kind: FieldKind = FieldKind.VALUE


_V, _ID, _IDE, _IDS = FieldKind.VALUE, FieldKind.ID, FieldKind.ID_OR_EMPTY, FieldKind.IDS

#: Every field of a task row, in compact-row order.
TASK_ROW: tuple[RowField, ...] = (
    RowField("task_id", "task_id", _ID),
    RowField("job_id", "job_id", _ID),
    RowField("name", "name"),
    RowField("function_name", "func_or_class_name"),
    #: ``TaskKind`` name: NORMAL_TASK, ACTOR_CREATION_TASK or ACTOR_TASK.
    RowField("type", "type"),
    #: ``TaskState`` of the latest attempt.
    RowField("state", "state"),
    RowField("attempt", "attempt_number"),
    RowField("retries", "retries"),
    RowField("parent", "parent_task_id", _IDE),
    RowField("actor_id", "actor_id", _ID),
    #: The worker (or driver) that called an actor method.
    RowField("caller_id", "caller_id", _ID),
    #: The same caller's previous call on the same actor (the actor's state flows through it).
    RowField("prev_call", "prev_call_task_id", _ID),
    RowField("args", "arg_object_ids", _IDS),
    RowField("returns", "return_object_ids", _IDS),
    RowField("node_id", "node_id", _ID),
    RowField("worker_id", "worker_id", _ID),
    RowField("error", "error_message"),
    #: UNIX seconds, or None.
    RowField("submitted_time", "submitted_time"),
    RowField("start_time", "start_time"),
    RowField("end_time", "end_time"),
    RowField("resources", "required_resources"),
    #: ``{"GPU": [[index, fraction], ...]}`` of its lease, or None.
    RowField("resource_ids", "resource_ids"),
    #: ``[state, time, attempt]`` per event, by attempt then time.
    RowField("events", "events"),
    #: Why a failed task failed, in Ray's ``ErrorType`` names (TASK_EXECUTION_EXCEPTION,
    #: WORKER_DIED, ACTOR_DIED, TASK_CANCELLED, ...), or None. Its owner says so in the
    #: failure's event info.
    RowField("error_type", "error_type"),
    #: The placement group the task (or actor) was scheduled into, or None.
    RowField("placement_group_id", "placement_group_id", _ID),
)

#: Names of the compact row's values, in order (the dashboard's ``Task`` attributes).
ROW_FIELDS: tuple[str, ...] = tuple(f.name for f in TASK_ROW)
#: Keys of a ``lumos.state.list_tasks`` row, in the same order.
PUBLIC_FIELDS: tuple[str, ...] = tuple(f.public for f in TASK_ROW)
#: Position of each field in the compact row.
ROW_INDEX: dict[str, int] = {name: i for i, name in enumerate(ROW_FIELDS)}
#: Compact names of the id fields (bytes in the compact row, hex elsewhere).
ID_FIELDS: frozenset[str] = frozenset(f.name for f in TASK_ROW if f.kind in (_ID, _IDE))
#: Compact names of the id-list fields.
ID_LIST_FIELDS: frozenset[str] = frozenset(f.name for f in TASK_ROW if f.kind is _IDS)


def hex_value(kind: FieldKind, value: Any) -> Any:
    """A compact row's value as shown outside the GCS (ids in hex)."""
    if kind is _V:
        return value
    if kind is _IDS:
        return [v.hex() for v in value or () if isinstance(v, bytes)]
    if isinstance(value, bytes) and value:
        return value.hex()
    return "" if kind is _IDE else None


def to_public(row: list[Any]) -> dict[str, Any]:
    """A compact row as a ``lumos.state.list_tasks`` row (``PUBLIC_FIELDS``, ids in hex)."""
    return {f.public: hex_value(f.kind, value) for f, value in zip(TASK_ROW, row)}
