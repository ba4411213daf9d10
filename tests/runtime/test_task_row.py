"""One task-row schema (``protocol/task_row.py``) for the GCS task log, the state API and
the dashboard: each shows exactly the schema's fields."""

from __future__ import annotations

import asyncio
import time

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


@lumos.remote
def _noop() -> None:
    return None


@lumos.remote
class _Echo:
    def echo(self, x: int) -> int:
        return x


def _log_seq() -> int:
    """The GCS task log's sequence number: it counts the task events it applied."""
    async def seq() -> int:
        client = lumos.state.StateClient.for_current_cluster(name="test->gcs")
        await client.connect(timeout_s=30)
        try:
            return (await client.task_updates(0, 1_000_000)).last_seq
        finally:
            client.close()
    return asyncio.run(seq())


def test_a_short_task_costs_the_gcs_about_one_event(cluster):
    """The owner sends a task's SUBMITTED ... FINISHED as one event when they fall in one
    flush, and the executor's RUNNING is dropped once the reply carries the start time (it
    was five events a task: four from the owner, one from the executor)."""
    echo = _Echo.remote()
    lumos.get(echo.echo.remote(0), timeout=60)
    lumos.get([_noop.remote() for _ in range(20)], timeout=60)

    def settled(n: int):
        def check() -> bool:
            rows = lumos.state.list_tasks(limit=100_000)
            return sum(r["state"] == "FINISHED" for r in rows) >= n
        return check

    wait_for(settled(22), 30)
    time.sleep(0.5)  # the executors' last flushes
    before = _log_seq()
    lumos.get([_noop.remote() for _ in range(200)], timeout=60)
    lumos.get([echo.echo.remote(i) for i in range(200)], timeout=60)
    wait_for(settled(422), 30)
    time.sleep(0.5)
    applied = _log_seq() - before
    assert applied < 2.5 * 400, applied  # (a flush boundary splits a task's events in two)
    rows = [r for r in lumos.state.list_tasks(limit=100_000) if r["name"] in ("_noop", "_Echo.echo")]
    assert all(r["start_time"] and r["end_time"] and r["state"] == "FINISHED" for r in rows)
    odd = [r["events"] for r in rows if [e[0] for e in r["events"]][-2:] != ["RUNNING", "FINISHED"]]
    assert not odd, odd[:3]
