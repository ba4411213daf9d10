"""How an owner folds a task's buffered events into one ``AddTaskEvents`` row per attempt
(``SubmissionMixin._flush_events``), checked against the GCS's reading of it (``events_of``)."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import msgpack

from lumos._private.core_worker.submission import SubmissionMixin
from lumos._private.core_worker.tasks import PendingTask
from lumos._private.gcs.task_log import TaskEventTable, events_of, read_archive, record_bytes
from lumos._private.protocol import codec
from lumos._private.protocol import messages as m

TID = b"t" * 16
JOB = b"j" * 4
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
        self.job_id = JOB
        self._events: list[tuple[Any, ...]] = []
        self._running_events: dict[bytes, tuple[Any, ...]] = {}
        self._held_events: dict[Any, list[Any]] = {}
        self._fresh: dict[bytes, Any] = {}
        self._fresh_lock = threading.Lock()
        self._event_holds = 1
        self._packed_rows: list[Any] = []
        self._event_packer = msgpack.Packer(use_bin_type=True, autoreset=True)
        self._flush_idle = False
        self.executor = None
        self.objects = SimpleNamespace(decrements=[])
        self._pin_changes: dict[Any, Any] = {}
        self._lineage_drops: list[Any] = []

    def report_metrics(self) -> None:
        """(Application metrics go with a flush too: ``test_metrics.py`` follows them.)"""


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
    # The first attempt is whole (SUBMITTED with its facts ... its end): packed; the
    # second goes as a row.
    assert msg.rows == [[TID, 1, m.TaskState.RUNNING, 5.0, None, None, WORKER, None, [[m.TaskState.FINISHED, 6.0]]]]
    ((tid, attempt, end, row),) = msg.packed
    assert (tid, attempt, end) == (TID, 0, m.TaskState.FAILED)
    assert msgpack.unpackb(row) == [TID, 0, "SUBMITTED", 1.0, {"name": "f"}, NODE, WORKER, "ValueError: no",
                                    [["SCHEDULED", 2.0], ["RUNNING", 3.0], ["FAILED", 4.0]]]
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


def _whole(tid: bytes, t: float = 1.0, end: m.TaskState = m.TaskState.FINISHED,
           info: dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
    """What an owner buffers for a short task: SUBMITTED with its facts, SCHEDULED, and
    its RUNNING with its end."""
    return [(tid, 0, m.TaskState.SUBMITTED, t, info or {"name": "f", "args": (b"a" * 20,)}, None, None, None),
            (tid, 0, m.TaskState.SCHEDULED, t + 0.1, None, NODE, WORKER, None),
            (tid, 0, m.TaskState.RUNNING, t + 0.2, None, None, WORKER, None, (end, t + 0.3))]


def _gcs_reads(msg: m.AddTaskEvents) -> list[Any]:
    events, bad = events_of(codec.decode(codec.encode(0, 0, msg))[2])
    assert bad == 0
    return events


def test_the_flush_loop_holds_a_task_submitted_since_the_last_flush_until_the_next_once() -> None:
    """A task not ended at the flush after its submission waits for the next one, where a
    short task has ended: its whole attempt is then one packed row, not two rows. It waits
    once; a flush that is not the loop's (``list_tasks``, shutdown) sends everything."""
    owner = _Owner()
    early, late, done = b"e" * 16, b"l" * 16, b"d" * 16
    owner._buffer_event(_whole(early)[0])
    owner._buffer_event(_whole(late)[0])
    for ev in _whole(done):
        owner._buffer_event(ev)
    owner._flush_events(hold=True)
    (first,) = owner.gcs.sent
    assert first.rows == [] and [p[0] for p in first.packed] == [done]
    assert set(owner._held_events) == {early, late}
    assert owner._flush_pending()  # the loop flushes again, with nothing new buffered
    for ev in _whole(early)[1:]:  # ``early`` ends before the next flush; ``late`` does not
        owner._buffer_event(ev)
    owner._flush_events(hold=True)
    second = owner.gcs.sent[1]
    assert [p[0] for p in second.packed] == [early]
    assert [r[0] for r in second.rows] == [late] and second.rows[0][2] == m.TaskState.SUBMITTED
    assert not owner._held_events and not owner._flush_pending()
    owner._buffer_event(_whole(b"x" * 16)[0])
    owner._flush_events()  # not the loop's: nothing held
    assert [r[0] for r in owner.gcs.sent[2].rows] == [b"x" * 16] and not owner._held_events


def test_a_packed_task_reads_as_its_rows_would(tmp_path) -> None:
    """The GCS keeps a whole attempt's packed row as it came and decodes it when read: the
    record reads the same as from plain rows, in the table, its updates and its archive,
    and takes later events (an executor's RUNNING) as a plain record would."""
    owner = _Owner()
    tids = [bytes([i]) * 16 for i in range(1, 6)]
    for i, tid in enumerate(tids):
        for ev in _whole(tid, float(i), m.TaskState.FAILED if i == 2 else m.TaskState.FINISHED):
            owner._buffer_event(ev)
    owner._flush_events()
    (msg,) = owner.gcs.sent
    assert len(msg.packed) == 5 and not msg.rows
    plain = m.AddTaskEvents(msg.job_id, [msgpack.unpackb(p[3]) for p in msg.packed], [])
    as_rows = TaskEventTable(100, str(tmp_path / "rows"))
    as_rows.add(_gcs_reads(plain))
    packed = TaskEventTable(100, str(tmp_path / "packed"))
    packed.add(_gcs_reads(msg))
    assert all(r.packed is not None for r in packed.records.values())
    assert packed.bytes == sum(record_bytes(r) for r in packed.records.values()) < as_rows.bytes / 2
    assert packed.list(None, 100) == as_rows.list(None, 100)
    assert packed.updates(0, 100)[1] == as_rows.updates(0, 100)[1]
    assert packed.records[tids[2]].state == m.TaskState.FAILED
    # A later event: decoded, then applied as to any record.
    packed.add([m.TaskEvent(tids[0], 0, m.TaskState.RUNNING, 0.2, JOB, None, NODE, WORKER)])
    rec = packed.records[tids[0]]
    assert rec.packed is None and rec.info["name"] == "f" and len(rec.events) == 4
    assert rec.size == record_bytes(rec) and packed.bytes == sum(record_bytes(r) for r in packed.records.values())
    # Archived as it came, read back whole.
    small = TaskEventTable(2, str(tmp_path / "small"))
    small.add(_gcs_reads(msg))
    small.close()
    archived = list(read_archive(str(tmp_path / "small")))
    assert archived and archived == as_rows.list(None, 100)[:len(archived)]


def test_a_malformed_packed_row_costs_that_row_and_a_garbled_one_reads_as_its_state(tmp_path, caplog) -> None:
    rows = [[TID, 0, "FINISHED", b"\x99" + b"\xc1" * 8],  # garbage inside: found when read
            [TID, 0, "NOT_A_STATE", b""], [TID, "0", "FINISHED", b""], [TID, 0, "FINISHED"], "x",
            [b"q" * 16, 0, "FINISHED", msgpack.packb([b"other" * 3, 0, "SUBMITTED", 1.0, {}, None, None, None,
                                                     [["FINISHED", 2.0]]])]]
    events, bad = events_of(m.AddTaskEvents(JOB, [], rows))
    assert bad == 4 and len(events) == 2
    table = TaskEventTable(100, str(tmp_path / "a"))
    table.add(events)
    with caplog.at_level("ERROR"):
        out = table.list(None, 10)
    assert [(r["state"], r["error_message"]) for r in out] == [
        ("FINISHED", "lumos: the task's events could not be read")] * 2
    assert "unreadable" in caplog.text
    assert events_of(m.AddTaskEvents(JOB, [], "x"))[1] == 1


def test_a_whole_attempt_msgpack_cannot_take_goes_as_a_row_and_the_rest_stay_packed() -> None:
    from lumos._private.core_worker.submission import _pack_whole_attempts
    rows = []
    for i, info in enumerate(({"name": "f"}, {"name": "g", "odd": object()}, {"name": "h"})):
        tid = bytes([i + 1]) * 16
        rows.append([tid, 0, m.TaskState.SUBMITTED, 1.0, info, NODE, WORKER, None, [[m.TaskState.FINISHED, 2.0]]])
    plain, packed = _pack_whole_attempts(rows)
    assert [r[4]["name"] for r in plain] == ["g"]
    assert [msgpack.unpackb(p[3])[4] for p in packed] == [{"name": "f"}, {"name": "h"}]


def _live_task(tid: bytes, submitted: float = 1.0, **info: Any) -> PendingTask:
    """A submitted task whose events ride on it, as ``submit_task`` leaves it."""
    spec = SimpleNamespace(task_id=tid, attempt=0, name="f", function_name="m.f", parent_task_id=b"p" * 16,
                           resources={"CPU": 1.0}, kind=m.TaskKind.NORMAL_TASK, actor_id=None, caller_id=None,
                           strategy=None)
    template: Any = SimpleNamespace(max_retries=0)
    task = PendingTask(spec, template, (tid + b"\0\0\0\1",), (b"a" * 20,), (), submitted)
    task.ev_live = True
    return task


def _submit(owner: _Owner, task: PendingTask) -> None:
    owner.record_scheduled(task, task.submit_time + 1, NODE, WORKER, {"GPU": [[0, 1.0]]})
    owner._fresh[task.spec.task_id] = task


def test_a_task_s_events_ride_on_it_until_it_ends_or_its_second_flush(tmp_path) -> None:
    """Nothing is buffered for a task while its events ride on it: its end packs its whole
    attempt (exactly the row its buffered events made), a task not ended at the loop's
    flush is left once and reported at the next as a row, and its later events are then
    buffered and folded into that row at the GCS."""
    owner = _Owner()
    done, slow = _live_task(b"d" * 16), _live_task(b"s" * 16)
    for task in (done, slow):
        _submit(owner, task)
    owner._pack_ended(done, m.TaskState.FAILED, 4.0, 3.0, None, "ValueError: no", {"error_type": "X"})
    assert not owner._events and not owner._held_events and list(owner._fresh) == [b"s" * 16]
    owner._flush_events(hold=True)
    (first,) = owner.gcs.sent
    assert first.rows == [] and [p[:3] for p in first.packed] == [(b"d" * 16, 0, m.TaskState.FAILED)]
    facts = {"name": "f", "function_name": "m.f", "parent": b"p" * 16, "args": [b"a" * 20],
             "returns": [b"d" * 16 + b"\0\0\0\1"], "resources": {"CPU": 1.0}, "type": "NORMAL_TASK",
             "resource_ids": {"GPU": [[0, 1.0]]}}
    assert msgpack.unpackb(first.packed[0][3]) == [
        b"d" * 16, 0, "SUBMITTED", 1.0, {**facts, "error_type": "X"}, NODE, WORKER, "ValueError: no",
        [["SCHEDULED", 2.0], ["RUNNING", 3.0], ["FAILED", 4.0]]]
    assert slow.ev_live and slow.ev_held and list(owner._fresh) == [b"s" * 16] and owner._flush_pending()
    owner._flush_events(hold=True)
    second = owner.gcs.sent[1]
    assert second.packed == [] and not slow.ev_live and not owner._fresh
    (row,) = second.rows
    assert msgpack.unpackb(msgpack.packb(row)) == [b"s" * 16, 0, "SUBMITTED", 1.0,
                                                   {**facts, "returns": [b"s" * 16 + b"\0\0\0\1"]},
                                                   NODE, WORKER, None, [["SCHEDULED", 2.0]]]
    # Its end, now buffered as an event (``ResultsMixin._task_done`` with ``ev_live`` off).
    owner._buffer_event((b"s" * 16, 0, m.TaskState.RUNNING, 3.0, None, None, WORKER, None, (m.TaskState.FINISHED, 5.0)))
    owner._flush_events(hold=True)
    table = TaskEventTable(100, str(tmp_path / "archive"))
    for msg in owner.gcs.sent:
        table.add(_gcs_reads(msg))
    rec = table.records[b"s" * 16]
    assert rec.state == m.TaskState.FINISHED and rec.node_id == NODE and rec.worker_id == WORKER
    assert [e[:2] for e in rec.events] == [[m.TaskState.SUBMITTED, 1.0], [m.TaskState.SCHEDULED, 2.0],
                                           [m.TaskState.RUNNING, 3.0], [m.TaskState.FINISHED, 5.0]]
    assert table.records[b"d" * 16].state == m.TaskState.FAILED


def test_a_task_scheduled_twice_or_retried_shows_every_event_and_any_flush_but_the_loop_s_reports_it() -> None:
    owner = _Owner()
    again, retried = _live_task(b"a" * 16), _live_task(b"r" * 16)
    for task in (again, retried):
        _submit(owner, task)
    owner.record_scheduled(again, 2.5, NODE, b"v" * 16)  # put back and sent again: both show
    assert not again.ev_live and again.spec.task_id not in owner._fresh
    owner.spill_events(retried)  # what a retry does before its RETRIED (``ResultsMixin._next_attempt``)
    owner._buffer_event((b"r" * 16, 0, m.TaskState.RETRIED, 2.5, None, None, None, "it raised"))
    lone = _live_task(b"l" * 16)
    _submit(owner, lone)
    owner._flush_events()  # list_tasks, shutdown: nothing left for later
    (msg,) = owner.gcs.sent
    assert not msg.packed and not owner._fresh and not owner._held_events and not lone.ev_live
    more = {r[0]: r[8] for r in msg.rows}
    assert more == {b"a" * 16: [[m.TaskState.SCHEDULED, 2.0], [m.TaskState.SCHEDULED, 2.5]],
                    b"r" * 16: [[m.TaskState.SCHEDULED, 2.0], [m.TaskState.RETRIED, 2.5]],
                    b"l" * 16: [[m.TaskState.SCHEDULED, 2.0]]}
    assert {r[0]: r[6] for r in msg.rows}[b"a" * 16] == b"v" * 16


def test_the_flush_loop_leaves_a_fresh_task_for_as_many_flushes_as_the_hold_spans() -> None:
    """``task_event_hold_ms`` of four flush intervals: a task not ended is left by the loop's
    first four flushes and reported by the fifth; one that ends before goes as one packed
    row; any flush that is not the loop's reports it at once."""
    owner = _Owner()
    owner._event_holds = 4
    slow, quick = _live_task(b"s" * 16), _live_task(b"q" * 16)
    for task in (slow, quick):
        _submit(owner, task)
    for _ in range(3):
        owner._flush_events(hold=True)
    assert not owner.gcs.sent and set(owner._fresh) == {b"s" * 16, b"q" * 16}
    owner._pack_ended(quick, m.TaskState.FINISHED, 4.0, 3.0, None, None, None)
    owner._flush_events(hold=True)
    (first,) = owner.gcs.sent
    assert first.rows == [] and [p[0] for p in first.packed] == [b"q" * 16]
    assert slow.ev_live and slow.ev_held == 4 and list(owner._fresh) == [b"s" * 16]
    owner._flush_events(hold=True)
    assert [r[0] for r in owner.gcs.sent[1].rows] == [b"s" * 16] and not slow.ev_live and not owner._fresh
    late = _live_task(b"l" * 16)
    _submit(owner, late)
    owner._flush_events()  # (``list_tasks``'s, shutdown's)
    assert [r[0] for r in owner.gcs.sent[2].rows] == [b"l" * 16] and not owner._fresh


def test_the_hold_spans_the_configured_time_in_flushes() -> None:
    from lumos._private.core_worker.submission import flushes_held
    for hold_ms, interval_ms, holds in ((400, 100, 4), (450, 100, 5), (100, 100, 1), (50, 100, 1), (0, 100, 0),
                                        (-1, 100, 0), (400, 60_000, 1)):
        assert flushes_held(hold_ms, interval_ms) == holds, (hold_ms, interval_ms)


def test_an_ended_task_msgpack_cannot_pack_goes_as_a_row() -> None:
    owner = _Owner()
    task = _live_task(b"o" * 16)
    _submit(owner, task)
    owner._pack_ended(task, m.TaskState.FINISHED, 4.0, 3.0, WORKER, None, {"odd": object()})
    assert not owner._packed_rows and list(owner._held_events) == [b"o" * 16]
    owner._flush_events(hold=True)
    (msg,) = owner.gcs.sent
    assert not msg.packed and [r[0] for r in msg.rows] == [b"o" * 16]
    assert owner._event_packer.pack([1]) == msgpack.packb([1])  # (a fresh packer after the failure)
