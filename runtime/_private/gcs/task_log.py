"""The GCS task-event log: every task's state changes, folded into one record per task.

Core workers send ``TaskEvent``s in batches. A SUBMITTED event carries the task's
static facts (name, parent, argument and return ids, actor); later events carry a
state and a time. Beyond ``max_records`` the oldest finished records are flushed to an
archive file in the session's log directory and dropped from memory (the paper's GCS
flushing), so the GCS stays bounded under millions of tasks. The archive is a sequence
of msgpack arrays, one per task holding its record's fields: in a long run every task
passes through it, and a record costs ~2 us to write this way against ~16 us as a JSON
object, on the GCS's one thread. ``read_archive`` turns it back into ``list_tasks`` rows.
The archive is bounded too (``max_archive_bytes``): past half of it the file is rotated
to ``<archive>.1`` (replacing the previous one), so a long-lived cluster keeps the most
recent history on disk and never fills it.

Every applied event gives its record a new sequence number, so a reader that polls
(the dashboard) asks only for what changed since its last look (``updates``) instead
of the whole table: with 100,000 records a full ``list`` costs the GCS about a second.

Two bounds keep the GCS's memory flat however many tasks run: ``max_records`` and
``max_bytes`` (an estimate of the records' Python memory, ``record_bytes``: about 2 KB
for a no-op task). Past either, the oldest finished records go to the archive until the
table is back under 90% of both. With Redis the table is also written to a stream, one
entry per event batch; ``StreamTrim`` says how many entries to keep so the stream holds
the batches of the records the table holds, not a count of batches.
"""

from __future__ import annotations

import bisect
import logging
import os
from collections import OrderedDict, deque
from operator import itemgetter
from typing import IO, Any, Iterator

import msgpack

from lumos._private.ids import JobID, NodeID, TaskID, WorkerID
from lumos._private.protocol import messages as m
from lumos._private.protocol.task_row import ROW_FIELDS, to_public
from lumos._private.protocol.vocab import TASK_STATE_RANK, TERMINAL_TASK_STATES, TaskKind, TaskState

logger = logging.getLogger(__name__)

TERMINAL = TERMINAL_TASK_STATES
_event_time = itemgetter(1)  # an event is [state, time, attempt]
# A late event never moves a task back (states rank in the order a task passes them).
_ORDER = TASK_STATE_RANK
__all__ = ["ROW_FIELDS", "TERMINAL", "TaskEventTable", "TaskRecord"]


#: Wire value -> state (the states in ``TaskEvent.more`` are checked here, not by the codec).
_STATE_OF: dict[Any, TaskState] = {s.value: s for s in TaskState}

#: States whose latest time counts (a retried attempt runs and ends again).
_LAST_TIME_STATES = frozenset((TaskState.RUNNING, TaskState.FINISHED, TaskState.FAILED))


class TaskRecord:
    __slots__ = ("task_id", "job_id", "info", "state", "attempt", "events", "node_id",
                 "worker_id", "error", "retries", "seq", "size", "packed")

    def __init__(self, task_id: TaskID, job_id: JobID) -> None:
        self.task_id = task_id
        self.job_id = job_id
        #: Sequence number of the last event applied (see ``TaskEventTable.updates``).
        self.seq = 0
        #: The owner's packed row of the whole attempt (``m.PackedTaskRow``) while nothing
        #: else came for the task: then only ``task_id``, ``job_id``, ``state``,
        #: ``attempt``, ``seq`` and ``size`` are set, and the row is decoded when the
        #: record is read (``to_row``) or gets another event (``apply``).
        self.packed: bytes | None = None
        self._clear()

    def _clear(self) -> None:
        """The fields events fill, as before the first."""
        #: Static facts from SUBMITTED (name, parent, args, returns, ...).
        self.info: dict[str, Any] = {}
        self.state: str = TaskState.SUBMITTED
        self.attempt = 0
        #: [state, time, attempt] in arrival order.
        self.events: list[list[Any]] = []
        self.node_id: NodeID | None = None
        self.worker_id: WorkerID | None = None
        self.error: str | None = None
        self.retries = 0
        #: ``record_bytes(self)``, kept up to date by ``apply`` (not recomputed per event).
        self.size = _RECORD_BYTES

    @classmethod
    def from_packed(cls, p: m.PackedTaskRow) -> TaskRecord:
        """The record of a task first heard of in a packed row: kept packed."""
        rec = _new_record(cls)
        rec.task_id, rec.job_id, rec.state, rec.attempt, rec.packed = p.task_id, p.job_id, p.state, p.attempt, p.row
        rec.info = rec.events = rec.node_id = rec.worker_id = rec.error = None
        rec.retries = rec.seq = 0
        rec.size = _PACKED_RECORD_BYTES + len(p.row)
        return rec

    def unpacked(self) -> TaskRecord:
        """This record with its packed row decoded: itself when it is not packed, else a
        new record (this one stays packed)."""
        if self.packed is None:
            return self
        rec = TaskRecord(self.task_id, self.job_id)
        rec.seq = self.seq
        rec._apply_packed(self.packed, self.state, self.attempt)
        return rec

    def _apply_packed(self, packed: bytes, state: TaskState, attempt: int) -> None:
        ev = _packed_event(packed, self.job_id)
        if ev is None or ev.task_id != self.task_id:
            # (Checked at arrival only for its outline: not decoding it is what packing saves.)
            logger.error("task %s: its owner's packed task row is unreadable; keeping its state only",
                         self.task_id.hex())
            ev = m.TaskEvent(self.task_id, attempt, state, 0.0, self.job_id, {"name": ""}, None, None,
                             "lumos: the task's events could not be read")
        self.apply(ev)

    def _unpack(self) -> None:
        """Decode the packed row into this record, before another event is applied."""
        packed, state, attempt = self.packed, self.state, self.attempt
        assert packed is not None
        self.packed = None
        self._clear()
        self._apply_packed(packed, state, attempt)

    def apply(self, ev: m.TaskEvent) -> None:
        if self.packed is not None:
            self._unpack()
        if ev.info:
            # SUBMITTED carries the static facts; a later event may add some (the GPU ids
            # of its lease): merge, so neither hides the other.
            if self.info:
                old = _info_bytes(self.info)
                self.info = {**self.info, **ev.info}
                self.size += _info_bytes(self.info) - old
            else:
                self.info = ev.info
                self.size += _info_bytes(ev.info)
        self._add(ev.state, ev.time, ev.attempt)
        if ev.more:
            for pair in ev.more:
                state = _STATE_OF.get(pair[0]) if type(pair) is list and len(pair) == 2 and isinstance(pair[0], str) \
                    else None
                if state is None or type(pair[1]) not in (float, int):
                    logger.error("task %s: ignored a malformed TaskEvent.more entry %.60r (want [state, time])",
                                 self.task_id.hex() if isinstance(self.task_id, bytes) else self.task_id, pair)
                    continue
                self._add(state, pair[1], ev.attempt)
        if ev.node_id:
            self.node_id = ev.node_id
        if ev.worker_id:
            self.worker_id = ev.worker_id
        if ev.error:
            self.size += len(ev.error) - len(self.error or "")
            self.error = ev.error

    def _add(self, state: TaskState, t: float, attempt: int) -> None:
        event = [state, t, attempt]
        events = self.events
        if event in events:
            return  # sent by both the owner and the executor (RUNNING)
        if events and t < events[-1][1]:
            # Events come from the owner and the executor on their own flushes: kept in time
            # order (an executor's RUNNING can arrive before its owner's SUBMITTED).
            bisect.insort(events, event, key=_event_time)
        else:
            events.append(event)
        self.size += _EVENT_BYTES
        if state == TaskState.RETRIED:
            self.retries += 1
        if attempt > self.attempt or (attempt == self.attempt and _ORDER.get(state, 0) >= _ORDER.get(self.state, 0)):
            self.attempt = attempt
            self.state = state

    def _times(self) -> dict[str, float]:
        times: dict[str, float] = {}
        for state, t, _attempt in self.events:
            times.setdefault(state, t)
            if state in _LAST_TIME_STATES:
                times[state] = t
        return times

    def to_row(self) -> list[Any]:
        """The compact form sent to pollers: values in ``ROW_FIELDS`` order, ids as bytes."""
        if self.packed is not None:
            return self.unpacked().to_row()
        info = self.info
        times = self._times()
        end = times.get(TaskState.FINISHED) or times.get(TaskState.FAILED) or times.get(TaskState.CANCELLED)
        # Events arrive from the owner and the executor in separate batches: by time.
        events = sorted(([s, t, a] for s, t, a in self.events), key=lambda e: (e[2], e[1]))
        return [self.task_id, self.job_id, info.get("name", ""), info.get("function_name", ""),
                info.get("type", TaskKind.NORMAL_TASK.name), self.state, self.attempt, self.retries,
                info.get("parent") or None, info.get("actor_id") or None, info.get("caller_id") or None,
                info.get("prev_call") or None, list(info.get("args", ())), list(info.get("returns", ())),
                self.node_id, self.worker_id, self.error, times.get(TaskState.SUBMITTED),
                times.get(TaskState.RUNNING), end, info.get("resources") or {}, info.get("resource_ids") or None,
                events, info.get("error_type"), info.get("placement_group_id") or None]

    def to_dict(self) -> dict[str, Any]:
        """The row as ``lumos.state.list_tasks`` returns it (``PUBLIC_FIELDS``, ids in hex)."""
        return to_public(self.to_row())


#: Estimated Python memory of one record without its events, ids and strings (the record,
#: its info dict and resources, two table entries), of one event, and of one object id:
#: calibrated with tracemalloc against decoded ``AddTaskEvents`` (tests/runtime/test_gcs_memory.py).
_RECORD_BYTES = 1400
_EVENT_BYTES = 165
_ID_BYTES = 70
#: Of a packed record without its packed row's bytes (the record, its task id, two table
#: entries): calibrated the same way.
_PACKED_RECORD_BYTES = 560

_new_record = object.__new__


def record_bytes(rec: TaskRecord) -> int:
    """About how much memory ``rec`` holds in the GCS (what ``max_bytes`` counts; a
    record keeps it as ``rec.size``)."""
    if rec.packed is not None:
        return _PACKED_RECORD_BYTES + len(rec.packed)
    size = _RECORD_BYTES + _EVENT_BYTES * len(rec.events) + _info_bytes(rec.info)
    if rec.error:
        size += len(rec.error)
    return size


def _info_bytes(info: dict[str, Any]) -> int:
    if not info:
        return 0
    return (_ID_BYTES * (len(info.get("args") or ()) + len(info.get("returns") or ()))
            + len(info.get("name") or "") + len(info.get("function_name") or ""))


def events_of(msg: m.AddTaskEvents) -> tuple[list[Any], int]:
    """The events of a batch as ``TaskEvent``s (``rows``) and ``PackedTaskRow``s
    (``packed``), and how many entries were malformed (left out: one bad row from a peer
    costs that row, not the batch). A packed row is checked for its outline here and
    decoded when its record is read (``TaskRecord.unpacked``)."""
    job, rows, packed = msg.job_id, msg.rows, msg.packed
    events: list[Any] = []
    if type(rows) is not list or type(packed) is not list:
        return events, 1
    if type(job) is not bytes:
        return events, len(rows) + len(packed)
    bad = 0
    for row in rows:
        ev = _row_event(row, job)
        if ev is None:
            bad += 1
        else:
            events.append(ev)
    for p in packed:
        if type(p) is not list or len(p) != 4:
            bad += 1
            continue
        entry = _packed_entry(p[0], p[1], p[2], job, p[3])
        if entry is None:
            bad += 1
        else:
            events.append(entry)
    return events, bad


#: A packed row longer than this is refused (a row is ~200 bytes; a failed task's holds
#: its error text).
MAX_PACKED_ROW_BYTES = 1 << 20


def _packed_entry(tid: Any, attempt: Any, state: Any, job: bytes, row: Any) -> m.PackedTaskRow | None:
    """A packed row's outline, from the wire or the archive, as a ``PackedTaskRow``, or
    None when it is malformed (its inside is checked when it is read)."""
    state = _STATE_OF.get(state) if type(state) is str else None
    if (state is None or type(tid) is not bytes or type(attempt) is not int or type(job) is not bytes
            or type(row) is not bytes or len(row) > MAX_PACKED_ROW_BYTES):
        return None
    return m.PackedTaskRow(tid, attempt, state, job, row)


def _row_event(row: Any, job: bytes) -> m.TaskEvent | None:
    """A row of ``AddTaskEvents`` as a ``TaskEvent``, or None when it is malformed."""
    if type(row) is not list or len(row) != 9:
        return None
    tid, attempt, state, t, info, node, worker, err, more = row
    state = _STATE_OF.get(state) if type(state) is str else None
    if (state is None or type(tid) is not bytes or type(attempt) is not int or type(t) not in (float, int)
            or not (info is None or type(info) is dict) or not (node is None or type(node) is bytes)
            or not (worker is None or type(worker) is bytes) or not (err is None or type(err) is str)
            or not (more is None or type(more) is list)):
        return None
    return m.TaskEvent(tid, attempt, state, t, job, info, node, worker, err, more)


def _packed_event(packed: bytes, job: bytes) -> m.TaskEvent | None:
    """A packed row (``AddTaskEvents.packed``) as a ``TaskEvent``; None if unreadable."""
    try:
        row = msgpack.unpackb(packed, raw=False, strict_map_key=False)
    except Exception:  # msgpack raises several unrelated types on garbage
        return None
    return _row_event(row, job)


class TaskEventTable:
    """Task records by id, bounded in count and bytes, with overflow flushed to an archive."""

    def __init__(self, max_records: int, archive_path: str, max_bytes: int = 0,
                 max_archive_bytes: int = 1 << 30) -> None:
        self.max_records = max_records
        #: Bound on the archive's two files together (``archive_path`` and its ``.1``).
        self.max_archive_bytes = max_archive_bytes
        #: Bound on the sum of ``record_bytes`` (0: none).
        self.max_bytes = max_bytes
        #: The sum of ``record_bytes`` over the records held.
        self.bytes = 0
        self.archive_path = archive_path
        #: Task id -> record, oldest first.
        self.records: OrderedDict[TaskID, TaskRecord] = OrderedDict()
        self.num_archived = 0
        self._archive: IO[bytes] | None = None
        #: Bytes in the current archive file.
        self._archive_size = 0
        #: Sequence number of the last applied event.
        self.seq = 0
        #: Task ids in the order of their last change (the oldest change first).
        self._changed: OrderedDict[TaskID, None] = OrderedDict()

    def add(self, events: list[Any]) -> int:
        """Apply ``events`` (``TaskEvent``s and ``PackedTaskRow``s); returns how many
        records they created."""
        records = self.records
        changed = self._changed
        seq = self.seq
        size = self.bytes
        created = 0
        packed_row = m.PackedTaskRow
        for ev in events:
            rec = records.get(ev.task_id)
            if ev.__class__ is packed_row:
                if rec is None:  # nearly always: the task's whole attempt, kept as it came
                    rec = records[ev.task_id] = TaskRecord.from_packed(ev)
                    created += 1
                    size += rec.size
                else:  # the executor's RUNNING came first, or an earlier attempt
                    before = rec.size
                    rec._apply_packed(ev.row, ev.state, ev.attempt)
                    size += rec.size - before
                seq += 1
                rec.seq = seq
                changed[ev.task_id] = None
                changed.move_to_end(ev.task_id)
                continue
            if rec is None:
                rec = records[ev.task_id] = TaskRecord(ev.task_id, ev.job_id)
                created += 1
                before = 0
            else:
                before = rec.size
            rec.apply(ev)
            size += rec.size - before
            seq += 1
            rec.seq = seq
            changed[ev.task_id] = None
            changed.move_to_end(ev.task_id)
        self.seq = seq
        self.bytes = size
        if len(records) > self.max_records or (self.max_bytes and size > self.max_bytes):
            # Down to 90% of the bounds at once: the archive is written in chunks, not one
            # record per event batch.
            self._flush_oldest(len(records) - self.max_records + self.max_records // 10,
                               size - self.max_bytes + self.max_bytes // 10 if self.max_bytes else 0)
        return created

    def _flush_oldest(self, n: int, nbytes: int = 0) -> None:
        """Archive and drop the oldest finished records: at least ``n`` of them, and at least ``nbytes``."""
        if self._archive is None:
            try:
                self._archive = open(self.archive_path, "ab")
                self._archive_size = self._archive.tell()
            except OSError as e:
                logger.error("cannot open task archive %s: %s; dropping old task records", self.archive_path, e)
        records = self.records
        far_over = len(records) > 2 * self.max_records or (self.max_bytes and self.bytes > 2 * self.max_bytes)
        victims: list[TaskRecord] = []
        live: list[TaskID] = []
        freed = 0
        # Oldest first, stopping once enough are found (no copy of the whole table per call).
        # A task is done with when it ended and its owner's SUBMITTED (the ``info``) came:
        # the executor's events can arrive first, and archiving then would split the task.
        for task_id, rec in records.items():
            if len(victims) >= n and freed >= nbytes:
                break
            if rec.state not in TERMINAL or not (rec.info or rec.packed):
                live.append(task_id)  # kept, and moved behind so it is not scanned again
                continue
            victims.append(rec)
            freed += rec.size
        if far_over and (len(victims) < n or freed < nbytes):
            # Still far over the bounds with only unfinished tasks left: the oldest of them go too.
            taken = 0
            for task_id in live:
                if len(victims) >= n and freed >= nbytes:
                    break
                rec = records[task_id]
                victims.append(rec)
                freed += rec.size
                taken += 1
            live = live[taken:]
        for task_id in live:
            records.move_to_end(task_id)
        archive = self._archive
        packer = msgpack.Packer()
        chunks = []
        changed = self._changed
        for rec in victims:
            if archive is None:
                pass
            elif rec.packed is not None:  # as it came: (task_id, job_id, state, attempt, packed row)
                chunks.append(packer.pack((rec.task_id, rec.job_id, rec.state, rec.attempt, rec.packed)))
            else:  # the record's own fields: no row built here (read_archive does)
                chunks.append(packer.pack((rec.task_id, rec.job_id, rec.info, rec.state, rec.attempt, rec.events,
                                           rec.node_id, rec.worker_id, rec.error, rec.retries)))
            del records[rec.task_id]
            changed.pop(rec.task_id, None)
        self.num_archived += len(victims)
        self.bytes -= freed
        if archive is not None and chunks:
            data = b"".join(chunks)
            try:
                archive.write(data)
                archive.flush()
                self._archive_size += len(data)
                if self._archive_size > self.max_archive_bytes // 2:
                    self._rotate()
            except OSError as e:  # a full disk loses archived history, never the GCS
                logger.error("cannot write task archive %s: %s; dropping old task records", self.archive_path, e)

    def _rotate(self) -> None:
        """The current archive becomes ``<archive>.1`` (the one before is dropped); later
        records go to a new file."""
        assert self._archive is not None
        self._archive.close()
        self._archive = None
        self._archive_size = 0
        os.replace(self.archive_path, self.archive_path + ".1")
        self._archive = open(self.archive_path, "ab")

    def orphans_failed(self, job_id: JobID, now: float, error: str, live_actors: set[bytes]) -> list[m.TaskEvent]:
        """The FAILED events of job ``job_id``'s unfinished tasks whose owner ended with the
        job (its driver, its task workers): nothing else will ever report their end (Ray
        marks them failed likewise). A task an actor that lives on (``live_actors``: a
        detached one, say) submitted is left to that actor."""
        records = self.records
        out = []
        creation = TaskKind.ACTOR_CREATION_TASK.name
        for rec in records.values():
            if rec.job_id != job_id or rec.state in TERMINAL or rec.packed is not None:
                continue
            info = rec.info or {}
            if info.get("type") == creation and info.get("actor_id") in live_actors:
                continue  # a detached actor still being created: the GCS reports its end
            parent = records.get(info.get("parent") or b"")
            if parent is not None and (parent.unpacked().info or {}).get("actor_id") in live_actors:
                continue
            out.append(m.TaskEvent(rec.task_id, rec.attempt, TaskState.FAILED, now, job_id,
                                   {"error_type": "WORKER_DIED"}, None, None, error))
        return out

    def list(self, job_id: JobID | None, limit: int) -> list[dict[str, Any]]:
        out = []
        for rec in reversed(self.records.values()):
            if job_id is None or rec.job_id == job_id:
                out.append(rec.to_dict())
                if len(out) >= limit:
                    break
        out.reverse()
        # A record is created by whichever event arrives first (a worker's RUNNING may come
        # before its owner's SUBMITTED): rows go out in submission order.
        out.sort(key=lambda r: r["submitted_time"] or r["start_time"] or r["end_time"] or 0.0)
        return out

    def updates(self, since: int, limit: int) -> list[Any]:
        """Records changed after sequence number ``since``: ``[last_seq, rows, more]``.

        Costs O(records changed since then), not O(table). A ``since`` from before a GCS
        restart (larger than anything here) starts over from the beginning.
        """
        if since > self.seq:
            since = 0
        limit = max(1, limit)
        recent: list[TaskRecord] = []
        records = self.records
        for task_id in reversed(self._changed):
            rec = records[task_id]
            if rec.seq <= since:
                break
            recent.append(rec)
        recent.reverse()
        more = len(recent) > limit
        if more:
            recent = recent[:limit]
            last = recent[-1].seq
        else:
            last = self.seq
        return [last, [rec.to_row() for rec in recent], more]

    def close(self) -> None:
        if self._archive is not None:
            self._archive.close()
            self._archive = None


#: An archived record: task_id, job_id, info, state, attempt, events, node_id, worker_id,
#: error, retries; or, one archived packed: task_id, job_id, state, attempt, packed row.
_ARCHIVED_FIELDS = 10
_ARCHIVED_PACKED_FIELDS = 5


def read_archive(path: str) -> Iterator[dict[str, Any]]:
    """The rows of a task archive written by ``TaskEventTable``, oldest first, as
    ``lumos.state.list_tasks`` returns them: those of the rotated ``<path>.1`` first, when
    there is one, then ``path``'s. A row cut short at the end (the GCS was killed
    mid-write) is skipped."""
    if os.path.exists(path + ".1"):
        yield from _read_archive_file(path + ".1")
    yield from _read_archive_file(path)


def _read_archive_file(path: str) -> Iterator[dict[str, Any]]:
    with open(path, "rb") as f:
        unpacker = msgpack.Unpacker(f, raw=False, strict_map_key=False)
        while True:
            try:
                row = unpacker.unpack()
            except msgpack.OutOfData:
                return
            if isinstance(row, list) and len(row) == _ARCHIVED_PACKED_FIELDS:
                tid, job, state, attempt, packed = row
                entry = _packed_entry(tid, attempt, state, job, packed)
                if entry is not None:
                    yield TaskRecord.from_packed(entry).to_dict()
                continue
            if not (isinstance(row, list) and len(row) == _ARCHIVED_FIELDS):
                continue
            rec = TaskRecord(row[0], row[1])
            (rec.info, rec.state, rec.attempt, rec.events, rec.node_id, rec.worker_id, rec.error,
             rec.retries) = row[2:]
            yield rec.to_dict()


class StreamTrim:
    """Pure: how many entries of the task-event stream to keep so it covers the table's records.

    Each stream entry is one batch of events. The GCS tells this, per batch appended, how
    many records the batch created (``appended``), and gets back the ``MAXLEN`` for that
    ``XADD``: the fewest newest batches that together created at least ``keep_records``
    records (the records the table holds now). A restarted GCS replays the stream into
    its table, so the stream needs what the table has, and no more.
    """

    def __init__(self) -> None:
        #: Records created by each batch still in the stream, oldest first.
        self._created: deque[int] = deque()
        #: Their sum.
        self._total = 0

    def appended(self, created: int, keep_records: int) -> int:
        """A batch that created ``created`` records was appended: the stream's length to keep."""
        self._created.append(created)
        self._total += created
        window = self._created
        while len(window) > 1 and self._total - window[0] >= keep_records:
            self._total -= window.popleft()
        return len(window)
