"""One task-row schema (``protocol/task_row.py``) for the GCS task log, the state API and
the dashboard: each shows exactly the schema's fields."""

from __future__ import annotations

import asyncio

import pytest

import lumos
from lumos._private.gcs.task_log import TaskEventTable
from lumos._private.protocol import messages as m
from lumos._private.protocol import task_row
from lumos.dashboard.source import ClusterSource, Task

from ..conftest import wait_for

pytestmark = pytest.mark.timeout(120)

TID = b"\x01" * 16
JOB = b"\x02" * 4


def _table(tmp_path) -> TaskEventTable:
    table = TaskEventTable(100, str(tmp_path / "archive.jsonl"))
    table.add([
        m.TaskEvent(TID, 0, m.TaskState.SUBMITTED, 1.0, JOB, {
            "name": "f", "function_name": "mod.f", "type": "ACTOR_TASK", "parent": b"\x03" * 16,
            "actor_id": b"\x04" * 16, "caller_id": b"\x05" * 16, "args": [b"\x06" * 20],
            "returns": [TID + b"\0\0\0\1"], "resources": {"CPU": 1.0}}),
        m.TaskEvent(TID, 0, m.TaskState.RUNNING, 2.0, JOB, None, b"\x07" * 16, b"\x08" * 16),
        m.TaskEvent(TID, 0, m.TaskState.FINISHED, 3.0, JOB)])
    return table


def test_schema_names_are_unique_and_line_up():
    assert len(set(task_row.ROW_FIELDS)) == len(task_row.ROW_FIELDS) == len(task_row.PUBLIC_FIELDS)
    assert len(set(task_row.PUBLIC_FIELDS)) == len(task_row.PUBLIC_FIELDS)
    assert lumos.state.TASK_ROW_FIELDS == task_row.ROW_FIELDS
    assert lumos.state.TASK_FIELDS == task_row.PUBLIC_FIELDS


def test_task_log_rows_and_dicts_have_exactly_the_schema_fields(tmp_path):
    table = _table(tmp_path)
    (rec,) = table.records.values()
    row = rec.to_row()
    assert len(row) == len(task_row.ROW_FIELDS)
    public = rec.to_dict()
    assert tuple(public) == task_row.PUBLIC_FIELDS
    assert public["task_id"] == TID.hex() and public["caller_id"] == "05" * 16
    assert public["func_or_class_name"] == "mod.f" and public["state"] == "FINISHED"
    assert (public["submitted_time"], public["start_time"], public["end_time"]) == (1.0, 2.0, 3.0)
    assert public["events"] == [["SUBMITTED", 1.0, 0], ["RUNNING", 2.0, 0], ["FINISHED", 3.0, 0]]
    assert table.list(None, 10) == [public]
    # A task without a parent: "" (Ray's form), other absent ids None.
    assert task_row.to_public([None] * len(task_row.ROW_FIELDS))["parent_task_id"] == ""
    assert task_row.to_public([None] * len(task_row.ROW_FIELDS))["actor_id"] is None


def test_dashboard_task_has_exactly_the_schema_fields(tmp_path):
    (rec,) = _table(tmp_path).records.values()
    task = Task(rec.to_row(), 1)
    assert tuple(Task.__slots__) == task_row.ROW_FIELDS + ("first_seen",)
    assert tuple(task.as_dict()) == task_row.ROW_FIELDS
    assert set(Task.__annotations__) == set(task_row.ROW_FIELDS) | {"first_seen"}
    assert task.parent == "03" * 16 and task.caller_id == "05" * 16 and task.args == ["06" * 20]
    # The same values as the state API's row, field by field.
    public = rec.to_dict()
    for f in task_row.TASK_ROW:
        want = public[f.public]
        if f.kind is task_row.FieldKind.ID_OR_EMPTY:
            want = want or None
        assert getattr(task, f.name) == want, f.name


@lumos.remote
def _square(x: int) -> int:
    return x * x


def test_state_api_and_dashboard_rows_from_a_cluster_share_the_schema(cluster):
    assert lumos.get(_square.remote(4), timeout=60) == 16

    def finished() -> list[dict]:
        return [t for t in lumos.state.list_tasks() if t["name"] == "_square" and t["state"] == "FINISHED"]

    (row,) = wait_for(finished, 30)
    assert tuple(row) == lumos.state.TASK_FIELDS

    async def dashboard_tasks() -> dict[str, Task]:
        client = lumos.state.StateClient.for_current_cluster(name="test->gcs")
        await client.connect(timeout_s=30)
        try:
            source = ClusterSource(client)
            more, seq = True, 0
            while more:
                seq, rows, more = await client.task_updates(seq)
                assert all(len(r) == len(lumos.state.TASK_ROW_FIELDS) for r in rows)
                source._apply_rows(rows)
            return source.tasks
        finally:
            client.close()

    task = asyncio.run(dashboard_tasks())[row["task_id"]]
    assert tuple(task.as_dict()) == lumos.state.TASK_ROW_FIELDS
    assert (task.name, task.state, task.function_name) == (row["name"], row["state"], row["func_or_class_name"])
    assert task.returns == row["return_object_ids"] and task.events == row["events"]
