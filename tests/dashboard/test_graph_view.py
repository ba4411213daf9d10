"""The task graph's incremental updates, without a browser: what the page sends to the
Bokeh document as task records fill in."""

from __future__ import annotations

from typing import Any

import pytest

from lumos.dashboard.components.task_graph import GraphView
from lumos.dashboard.source import Task
from lumos.state import TASK_ROW_FIELDS as ROW_FIELDS

pytestmark = pytest.mark.timeout(30)


def row(task_id: bytes, **fields: Any) -> list[Any]:
    base: dict[str, Any] = {f: None for f in ROW_FIELDS}
    base.update(task_id=task_id, job_id=b"\x01", name="", function_name="", type="NORMAL_TASK",
                state="SUBMITTED", attempt=0, retries=0, args=[], returns=[], resources={})
    base.update(fields)
    return [base[f] for f in ROW_FIELDS]


def test_a_name_that_arrives_after_the_worker_events_is_drawn() -> None:
    # The worker's RUNNING event can reach the GCS before the submitter's SUBMITTED
    # event (each process flushes on its own timer): the dashboard first sees a task
    # with no name, and must show the name once it arrives.
    view = GraphView("g", "g", 500)
    a = Task(row(b"\xaa", name="first", function_name="f", state="FINISHED", returns=[b"\xa0"]), 1)
    view.show([a], {"a0": "aa"})
    b = Task(row(b"\xbb", state="RUNNING", worker_id=b"\x05"), 2)
    view.show([a, b], {"a0": "aa"})
    assert view.node_source.data["name"][-1] == ""
    b.update(row(b"\xbb", name="live_2", function_name="square", state="FINISHED", returns=[b"\xb0"]))
    view.show([a, b], {"a0": "aa", "b0": "bb"})
    names = list(view.node_source.data["name"])
    assert "live_2" in names
    assert names.count("first") == 1


def test_positions_stay_where_they_were_placed() -> None:
    view = GraphView("g", "g", 500)
    a = Task(row(b"\xaa", name="a", state="RUNNING"), 1)
    view.show([a], {})
    before = (list(view.node_source.data["x"]), list(view.node_source.data["y"]))
    a.update(row(b"\xaa", name="a", state="FINISHED"))
    view.show([a], {})
    assert (list(view.node_source.data["x"]), list(view.node_source.data["y"])) == before
    assert view.node_source.data["state"] == ["FINISHED"]
