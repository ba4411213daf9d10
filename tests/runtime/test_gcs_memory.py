"""The GCS's task-event log stays bounded in records and bytes, and so does its Redis stream."""

from __future__ import annotations

import asyncio
import gc
import os
import time
import tracemalloc
from typing import Any

import msgpack
import pytest

import lumos
from lumos._private.gcs.storage import Op, StorageUnavailable, StorageWriter, unpack_value
from lumos._private.gcs.storage.memory import InMemoryStorage
from lumos._private.gcs.task_log import StreamTrim, TaskEventTable, read_archive, record_bytes
from lumos._private.protocol import messages as m
from lumos._private.protocol.vocab import TaskState
from lumos.testing import Cluster

from tests.conftest import TEST_CONFIG, RedisServer, check_no_leaks

JOB = b"\x01\x00\x00\x00"


def _decoded(ev: m.TaskEvent) -> m.TaskEvent:
    """``ev`` as the GCS holds it: decoded from a frame, every field a fresh object."""
    return m.decode(m.encode(m.NOTIFY, 0, ev))[2]  # type: ignore[no-any-return]


def _info(tid: bytes, args: int) -> dict[str, Any]:
    return {"name": "f", "function_name": "__main__.f", "parent": os.urandom(24),
            "args": [os.urandom(28) for _ in range(args)], "returns": [tid + b"\0\0\0\1"],
            "resources": {"CPU": 1.0}, "type": "NORMAL_TASK"}


def _task_events(n: int, args: int = 0, error: int = 0) -> list[m.TaskEvent]:
    node, worker = os.urandom(28), os.urandom(28)
    out = []
    for _ in range(n):
        tid = os.urandom(24)
        out.append(_decoded(m.TaskEvent(tid, 0, "SUBMITTED", time.time(), JOB, _info(tid, args))))
        out.append(_decoded(m.TaskEvent(tid, 0, "RUNNING", time.time(), JOB, None, node, worker)))
        out.append(_decoded(m.TaskEvent(tid, 0, "FAILED" if error else "FINISHED", time.time(), JOB, None,
                                        node, worker, "x" * error if error else None)))
    return out


def _packed_rows(n: int, args: int = 0, error: int = 0) -> list[m.PackedTaskRow]:
    """Whole attempts as an owner packs them (``AddTaskEvents.packed``), as the GCS decodes them."""
    node, worker = os.urandom(28), os.urandom(28)
    out = []
    for _ in range(n):
        tid, t = os.urandom(24), time.time()
        end = "FAILED" if error else "FINISHED"
        row = msgpack.packb([tid, 0, "SUBMITTED", t, _info(tid, args), node, worker, "x" * error if error else None,
                             [["SCHEDULED", t], ["RUNNING", t], [end, t]]])
        out.append(_decoded(m.PackedTaskRow(tid, 0, TaskState(end), JOB, row)))
    return out


@pytest.mark.parametrize("args,error,packed", [(0, 0, False), (10, 0, False), (0, 4000, False),
                                               (0, 0, True), (10, 0, True)])
def test_record_bytes_tracks_the_memory_records_really_take(tmp_path: Any, args: int, error: int,
                                                           packed: bool) -> None:
    """Decoded records and packed ones (a whole attempt kept as its owner's bytes)."""
    table = TaskEventTable(10**9, str(tmp_path / "archive.jsonl"), 0)
    make = _packed_rows if packed else _task_events
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        batches = [make(500, args, error) for _ in range(4)]
        for batch in batches:
            table.add(batch)
        del batches, batch
        gc.collect()
        # The events themselves are gone; what is left is the table.
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert all((r.packed is not None) == packed for r in table.records.values())
    estimate = sum(record_bytes(r) for r in table.records.values())
    assert estimate == table.bytes
    assert 0.75 * held < estimate < 1.33 * held, (estimate, held)


def test_the_table_is_bounded_by_bytes_and_archives_the_rest(tmp_path: Any) -> None:
    archive = tmp_path / "archive.jsonl"
    table = TaskEventTable(100_000, str(archive), 1_000_000)
    created = 0
    for _ in range(20):
        created += table.add(_task_events(100, error=2000))
    assert created == 2000
    # ~4 KB a record: about 250 fit; down to 90% of the bound at each flush.
    assert table.bytes <= 1_000_000 and len(table.records) < 260
    assert table.bytes == sum(record_bytes(r) for r in table.records.values())
    assert table.num_archived == 2000 - len(table.records)
    archived = list(read_archive(str(archive)))
    assert len(archived) == table.num_archived
    assert all(r["state"] == "FAILED" and len(r["error_message"]) == 2000 for r in archived)
    # Newest kept.
    assert list(table.records)[-1] == next(reversed(table.records))
    table.close()


def test_each_record_keeps_its_size_up_to_date_through_merges_duplicates_and_errors(tmp_path: Any) -> None:
    table = TaskEventTable(10**9, str(tmp_path / "a.msgpack"), 0)
    tid = b"\x07" * 24
    table.add([m.TaskEvent(tid, 0, "RUNNING", 1.0, JOB, None, b"n" * 16, b"w" * 16)])  # before SUBMITTED
    table.add([m.TaskEvent(tid, 0, "SUBMITTED", 0.5, JOB, {"name": "f", "args": [b"a" * 28] * 3}),
               m.TaskEvent(tid, 0, "RUNNING", 1.0, JOB, None, b"n" * 16, b"w" * 16)])  # a duplicate
    table.add([m.TaskEvent(tid, 0, "RUNNING", 1.0, JOB, {"resource_ids": {"GPU": [0]}, "name": "longer"})])
    table.add([m.TaskEvent(tid, 0, "FAILED", 2.0, JOB, None, None, None, "e" * 300),
               m.TaskEvent(tid, 1, "FAILED", 3.0, JOB, None, None, None, "short")])
    rec = table.records[tid]
    assert rec.size == record_bytes(rec) == table.bytes
    assert len(rec.events) == 4 and rec.error == "short"


def test_a_task_is_not_archived_before_its_owner_s_submitted_arrives(tmp_path: Any) -> None:
    path = str(tmp_path / "a.msgpack")
    table = TaskEventTable(10, path, 0)
    early = b"\x09" * 24
    table.add([m.TaskEvent(early, 0, "FINISHED", 2.0, JOB, None, b"n" * 16, b"w" * 16)])  # executor first
    for i in range(15):
        tid = i.to_bytes(24, "big")
        table.add([m.TaskEvent(tid, 0, "SUBMITTED", 1.0, JOB, {"name": "f"}),
                   m.TaskEvent(tid, 0, "FINISHED", 2.0, JOB)])
    assert early in table.records and table.num_archived > 0
    table.add([m.TaskEvent(early, 0, "SUBMITTED", 1.0, JOB, {"name": "late"})])
    rec = table.records[early]
    assert (rec.info["name"], rec.state, len(rec.events)) == ("late", "FINISHED", 2)
    # Far over the bound (twice it), unfinished records go too, oldest first.
    for i in range(100, 125):
        table.add([m.TaskEvent(i.to_bytes(24, "big"), 0, "RUNNING", 1.0, JOB)])
    assert len(table.records) <= 20
    table.close()
    assert all(r["name"] in ("f", "late", "") for r in read_archive(path))


def test_later_states_riding_in_more_apply_in_order_and_bad_ones_are_skipped(
        tmp_path: Any, caplog: pytest.LogCaptureFixture) -> None:
    table = TaskEventTable(100, str(tmp_path / "a.msgpack"), 0)
    tid = b"\x05" * 24
    table.add([_decoded(m.TaskEvent(tid, 0, "SUBMITTED", 1.0, JOB, {"name": "f"}, None, b"w" * 16, None,
                                    [["SCHEDULED", 1.5], ["BOGUS", 1.6], [["x"], 1.7], ["RUNNING", "soon"],
                                     "junk", ["RUNNING", 2.0], ["FINISHED", 3.0]]))])
    rec = table.records[tid]
    assert [e[0] for e in rec.events] == ["SUBMITTED", "SCHEDULED", "RUNNING", "FINISHED"]
    assert rec.state == "FINISHED" and rec.size == record_bytes(rec)
    assert sum("malformed TaskEvent.more" in r.message for r in caplog.records) == 4


def test_the_table_is_bounded_by_records_too(tmp_path: Any) -> None:
    table = TaskEventTable(300, str(tmp_path / "a.jsonl"), 10**9)
    for _ in range(10):
        table.add(_task_events(100))
    assert len(table.records) <= 300
    table.close()


def test_stream_trim_keeps_the_batches_of_the_records_held() -> None:
    trim = StreamTrim()
    # 10 batches of 100 new records, the table holding 300: the last 3 batches.
    lens = [trim.appended(100, min(300, 100 * (i + 1))) for i in range(10)]
    assert lens[:3] == [1, 2, 3] and lens[-1] == 3
    # Batches that only update records (FINISHED of earlier tasks) are kept with them.
    assert trim.appended(0, 300) == 4
    assert trim.appended(50, 300) == 5  # 50 + 0 + 100 + 100 < 300: the oldest batch stays
    assert trim.appended(300, 300) == 1


@lumos.remote
def noop() -> None:
    return None


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_redis_stream_holds_about_the_tasks_the_gcs_keeps(redis_server: RedisServer) -> None:
    """MAXLEN counts the batches of the records kept, not batches: 2,000 tasks in a few
    dozen batches are trimmed to about the 300 records the GCS holds."""
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "_system_config": {
        **TEST_CONFIG, "gcs_storage": redis_server.url, "task_event_max_records": 300}})
    try:
        cluster.connect()
        for _ in range(40):
            lumos.get([noop.remote() for _ in range(50)], timeout=60)
        time.sleep(0.5)  # the last flush of task events reaches the GCS and Redis
        kept = len(lumos.state.list_tasks(limit=10_000))
        assert kept <= 300
        with redis_server.client() as c:
            entries = c.xrange("lumos:stream:task_events")
        batches = [{ev.task_id for ev in unpack_value(fields[b"v"])} for _, fields in entries]
        in_stream = set().union(*batches)
        # Every record the GCS holds can be rebuilt from the stream, and not many more are kept:
        # one batch of slack (the oldest batch kept also holds older tasks' events; under load
        # one flush can carry hundreds of tasks), never the whole run.
        assert len(in_stream) >= kept
        assert len(in_stream) <= 300 + max(map(len, batches)), (len(in_stream), [len(b) for b in batches])
        assert len(in_stream) < 2000
        # What left the GCS's memory is in the session's archive, in list_tasks's shape.
        archived = list(lumos.state.read_task_archive(
            os.path.join(cluster.session_dir, "logs", "task_events.msgpack")))
        assert len(archived) + kept >= 2000
        assert all(tuple(r) == lumos.state.TASK_FIELDS for r in archived)
        # (Far over the bound, which 300 records are under this burst, the oldest unfinished
        # records go too: an executor's RUNNING can arrive before its owner's SUBMITTED.)
        assert {r["name"] for r in archived} <= {"noop", ""}
        assert sum(r["state"] == "FINISHED" for r in archived if r["name"]) > 500
        # A restarted GCS rebuilds about the same window from the stream, within the bound.
        cluster.kill_gcs()
        cluster.restart_gcs()
        recovered = len(lumos.state.list_tasks(limit=10_000, timeout=30))
        assert min(kept, 270) <= recovered <= 300, (kept, recovered)
    finally:
        cluster.shutdown()
        check_no_leaks(cluster.session_dir)


class _DownStorage(InMemoryStorage):
    """Refuses every write while ``down``."""

    def __init__(self) -> None:
        super().__init__()
        self.down = True

    async def write_batch(self, ops: list[Op]) -> None:
        if self.down:
            raise StorageUnavailable("down")
        await super().write_batch(ops)


def test_stream_appends_waiting_through_an_outage_are_bounded(caplog: pytest.LogCaptureFixture) -> None:
    """A long storage outage keeps the newest task-event batches up to the bound, not all."""
    async def body() -> None:
        st = _DownStorage()
        w = StorageWriter(st, retry_max_s=0.02, max_pending_append_bytes=10_000)
        w.start()
        try:
            seq = w.put_nowait("kv", b"k", b"v")  # a table write is never dropped
            for i in range(100):
                w.append_nowait("task_events", b"%03d" % i + b"x" * 997, 1000)
                await asyncio.sleep(0)  # the writer takes a batch and retries it meanwhile
            assert w.dropped_appends >= 80
            st.down = False
            await w.wait_written(seq)
            await w.flush()
            for _ in range(50):  # the appends after the first batch follow in the next one
                if (await st.read_stream("task_events"))[-1:] == [b"099" + b"x" * 997]:
                    break
                await asyncio.sleep(0.02)
            kept = await st.read_stream("task_events")
            assert kept[-1].startswith(b"099") and len(kept) <= 20
            assert await st.get("kv", b"k") == b"v"
        finally:
            await w.aclose()
    asyncio.run(body())
    assert caplog.text.count("dropping the oldest waiting stream entries") == 1


def test_event_rows_from_a_peer_are_checked_one_by_one(tmp_path: Any) -> None:
    from lumos._private.gcs.task_log import events_of
    good = [b"\x01" * 24, 0, "SUBMITTED", 1.0, {"name": "f"}, None, None, None, [["FINISHED", 2.0]]]
    rows = [good, "junk", [b"\x02" * 24, 0, "NOPE", 1.0, None, None, None, None, None],
            [b"\x03" * 24, "0", "RUNNING", 1.0, None, None, None, None, None],
            [b"\x04" * 24, 0, "RUNNING", 1.0, None, 7, None, None, None], good[:8],
            [b"\x05" * 24, 1, "FAILED", 3, None, b"n" * 16, b"w" * 16, "boom", None]]
    msg = _decoded_msg(m.AddTaskEvents(JOB, rows))
    events, bad = events_of(msg)
    assert bad == 5 and [e.task_id for e in events] == [b"\x01" * 24, b"\x05" * 24]
    assert events[0].state is TaskState.SUBMITTED and events[0].more == [["FINISHED", 2.0]]
    assert events[1].error == "boom" and events[1].job_id == JOB
    table = TaskEventTable(100, str(tmp_path / "a.msgpack"), 0)
    table.add(events)
    assert table.records[b"\x01" * 24].state == "FINISHED"
    assert events_of(_decoded_msg(m.AddTaskEvents(JOB, "junk"))) == ([], 1)
    assert events_of(_decoded_msg(m.AddTaskEvents(None, [good, good]))) == ([], 2)  # type: ignore[arg-type]


def _decoded_msg(msg: Any) -> Any:
    return m.decode(m.encode(m.NOTIFY, 0, msg))[2]
