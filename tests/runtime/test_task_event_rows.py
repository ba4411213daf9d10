"""How an owner folds a task's buffered events into one ``AddTaskEvents`` row per attempt
(``SubmissionMixin._flush_events``), checked against the GCS's reading of it (``events_of``)."""

from __future__ import annotations

from typing import Any

from lumos._private.core_worker.submission import SubmissionMixin
from lumos._private.gcs.task_log import TaskEventTable, events_of
from lumos._private.protocol import codec
from lumos._private.protocol import messages as m

TID = b"t" * 16
NODE, WORKER = b"n" * 16, b"w" * 16


class _Gcs:
    is_closed = False

    def __init__(self) -> None:
        self.sent: list[Any] = []

    def notify(self, msg: Any) -> None:
        self.sent.append(msg)


class _Owner(SubmissionMixin):
    def __init__(self) -> None:
        self.gcs = _Gcs()
        self.job_id = b"j" * 4
        self._events: list[tuple[Any, ...]] = []
        self._running_events: dict[bytes, tuple[Any, ...]] = {}
        self._flush_idle = False


def test_a_finished_task_s_running_and_end_ride_in_one_buffered_row(tmp_path) -> None:
    owner = _Owner()
    owner._buffer_event((TID, 0, m.TaskState.SUBMITTED, 1.0, {"name": "f"}, None, None, None))
    owner._buffer_event((TID, 0, m.TaskState.SCHEDULED, 2.0, None, NODE, WORKER, None))
    # What ResultsMixin._task_done buffers for a failed task whose reply had its start time.
    owner._buffer_event((TID, 0, m.TaskState.RUNNING, 3.0, None, None, WORKER, "ValueError: no",
                         (m.TaskState.FAILED, 4.0)))
    owner._buffer_event((TID, 1, m.TaskState.RUNNING, 5.0, None, None, WORKER, None, (m.TaskState.FINISHED, 6.0)))
    owner._flush_events()
    (msg,) = owner.gcs.sent
    assert msg.rows == [
        [TID, 0, m.TaskState.SUBMITTED, 1.0, {"name": "f"}, NODE, WORKER, "ValueError: no",
         [[m.TaskState.SCHEDULED, 2.0], [m.TaskState.RUNNING, 3.0], [m.TaskState.FAILED, 4.0]]],
        [TID, 1, m.TaskState.RUNNING, 5.0, None, None, WORKER, None, [[m.TaskState.FINISHED, 6.0]]],
    ]
    _kind, _rid, wire = codec.decode(codec.encode(0, 0, msg))  # as the GCS reads it
    events, bad = events_of(wire)
    assert bad == 0
    table = TaskEventTable(100, str(tmp_path / "archive"))
    table.add(events)
    record = table.records[TID]
    assert (record.state, record.attempt, record.error) == (m.TaskState.FINISHED, 1, "ValueError: no")
    assert [e[:2] for e in record.events] == [[m.TaskState.SUBMITTED, 1.0], [m.TaskState.SCHEDULED, 2.0],
                                              [m.TaskState.RUNNING, 3.0], [m.TaskState.FAILED, 4.0],
                                              [m.TaskState.RUNNING, 5.0], [m.TaskState.FINISHED, 6.0]]
