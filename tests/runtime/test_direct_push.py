"""Actor calls and tasks a user thread writes straight to the worker's connection
(``ActorSubmitter.send_direct``, ``CoreWorker.push_direct``): order, results, and failures
in flight are as for those the io thread sends."""

from __future__ import annotations

import os
import signal
import time

import pytest

import lumos
from lumos._private import worker_context
from lumos.exceptions import ActorDiedError, TaskCancelledError, WorkerCrashedError
from tests.conftest import wait_for


pytestmark = pytest.mark.timeout(120)


@lumos.remote
class Counter:
    def __init__(self) -> None:
        self.n = 0

    def incr(self) -> int:
        self.n += 1
        return self.n

    def pid(self) -> int:
        return os.getpid()

    def slow_pid(self) -> int:
        time.sleep(1.0)
        return os.getpid()

    def sleep(self) -> None:
        time.sleep(60)


def _direct_sent() -> int:
    return worker_context.require().actor_submitter.direct_sent  # type: ignore[no-any-return]


def test_sync_calls_go_straight_to_the_actor_and_keep_their_order(cluster: lumos.LumosContext) -> None:
    c = Counter.remote()
    assert lumos.get(c.incr.remote(), timeout=60) == 1
    before = _direct_sent()
    seen = []
    for i in range(300):
        if i % 50 == 0:  # a burst the io thread sends, between calls sent straight
            seen += lumos.get([c.incr.remote() for _ in range(20)], timeout=60)
        seen.append(lumos.get(c.incr.remote(), timeout=60))
    assert seen == list(range(2, 2 + len(seen)))
    assert _direct_sent() - before >= 150  # most sync calls skipped the io thread's turn
    rows = [t for t in lumos.state.list_tasks(limit=100_000) if t["name"] == "Counter.incr"]
    assert rows  # their task events still reach the GCS


def test_a_call_sent_straight_fails_when_its_actor_is_killed(cluster: lumos.LumosContext) -> None:
    c = Counter.remote()
    lumos.get(c.pid.remote(), timeout=60)
    before = _direct_sent()
    ref = c.sleep.remote()
    assert _direct_sent() == before + 1
    time.sleep(0.3)
    lumos.kill(c)
    with pytest.raises(ActorDiedError):
        lumos.get(ref, timeout=30)


def test_a_call_sent_straight_is_retried_on_the_restarted_actor(cluster: lumos.LumosContext) -> None:
    c = Counter.options(max_restarts=1, max_task_retries=1).remote()
    first = lumos.get(c.pid.remote(), timeout=60)
    before = _direct_sent()
    ref = c.slow_pid.remote()
    assert _direct_sent() == before + 1
    time.sleep(0.3)
    os.kill(first, signal.SIGKILL)
    assert lumos.get(ref, timeout=60) != first
    assert lumos.get(c.incr.remote(), timeout=60) == 1  # the restarted instance


def test_a_sync_fan_out_to_several_actors_goes_straight_to_each(cluster: lumos.LumosContext) -> None:
    """``[a.f.remote() for a in actors]`` then a get of them all: every call is written by
    the user thread, not only the first (the others waited for the io thread's turn), and
    each actor sees its calls in order."""
    counters = [Counter.remote() for _ in range(3)]
    assert lumos.get([c.incr.remote() for c in counters], timeout=60) == [1, 1, 1]
    before = _direct_sent()
    rounds = 40
    for i in range(rounds):
        assert lumos.get([c.incr.remote() for c in counters], timeout=60) == [i + 2] * 3
    assert _direct_sent() - before >= 2 * rounds  # (the first call of each round alone was)


def test_a_fan_out_sent_straight_fails_only_the_call_of_the_killed_actor(cluster: lumos.LumosContext) -> None:
    counters = [Counter.remote() for _ in range(3)]
    lumos.get([c.pid.remote() for c in counters], timeout=60)
    before = _direct_sent()
    refs = [c.slow_pid.remote() for c in counters]
    assert _direct_sent() - before >= 2  # (a post from elsewhere meanwhile sends the rest through the io thread)
    time.sleep(0.3)
    lumos.kill(counters[1])
    assert isinstance(lumos.get(refs[0], timeout=30), int) and isinstance(lumos.get(refs[2], timeout=30), int)
    with pytest.raises(ActorDiedError):
        lumos.get(refs[1], timeout=30)
    assert lumos.get([counters[0].incr.remote(), counters[2].incr.remote()], timeout=30) == [1, 1]


@lumos.remote
def _where(marker: str = "", sleep_s: float = 0.0) -> int:
    if marker:
        if not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(1)  # the first attempt's worker dies mid-task
    time.sleep(sleep_s)
    return os.getpid()


def _direct_tasks() -> int:
    return worker_context.require().direct_tasks  # type: ignore[no-any-return]


def test_sync_tasks_go_straight_to_an_idle_leased_worker(cluster: lumos.LumosContext) -> None:
    lumos.get(_where.remote(), timeout=60)  # a lease for the shape, idle after it
    before = _direct_tasks()
    pids = [lumos.get(_where.remote(), timeout=60) for _ in range(50)]
    assert _direct_tasks() - before >= 25
    assert all(isinstance(p, int) for p in pids)
    bursts = lumos.get([_where.remote() for _ in range(100)], timeout=60)  # the io thread's path between
    assert len(bursts) == 100 and lumos.get(_where.remote(), timeout=60) in set(pids) | set(bursts)


def test_a_sync_fan_out_of_tasks_goes_straight_to_each_idle_leased_worker(cluster: lumos.LumosContext) -> None:
    """Two tasks, then a get of both, on a 2-CPU node: with two idle leases of their shape
    both are written by the user thread."""
    lumos.get([_where.remote("", 0.2) for _ in range(2)], timeout=60)  # two leases, idle after
    before = _direct_tasks()
    rounds = 40
    for _ in range(rounds):
        assert len(set(lumos.get([_where.remote() for _ in range(2)], timeout=60))) >= 1
    assert _direct_tasks() - before >= rounds * 3 // 2  # (the first task of each round alone was)


def test_a_task_sent_straight_is_retried_when_its_worker_dies(cluster: lumos.LumosContext, tmp_path) -> None:
    lumos.get(_where.options(max_retries=1).remote(), timeout=60)
    before = _direct_tasks()
    marker = str(tmp_path / "died")
    ref = _where.options(max_retries=1).remote(marker)
    assert _direct_tasks() == before + 1
    assert isinstance(lumos.get(ref, timeout=60), int) and os.path.exists(marker)


def test_a_task_sent_straight_fails_when_its_worker_dies_and_no_retry_is_left(
        cluster: lumos.LumosContext, tmp_path) -> None:
    lumos.get(_where.options(max_retries=0).remote(), timeout=60)
    before = _direct_tasks()
    ref = _where.options(max_retries=0).remote(str(tmp_path / "died"))
    assert _direct_tasks() == before + 1
    with pytest.raises(WorkerCrashedError):
        lumos.get(ref, timeout=60)


def test_a_task_sent_straight_can_be_cancelled(cluster: lumos.LumosContext) -> None:
    lumos.get(_where.remote(), timeout=60)
    before = _direct_tasks()
    ref = _where.remote("", 30.0)
    assert _direct_tasks() == before + 1
    time.sleep(0.3)
    lumos.cancel(ref)
    with pytest.raises(TaskCancelledError):
        lumos.get(ref, timeout=30)


@lumos.remote
def _seven() -> int:
    return 7


def test_a_reply_is_handled_while_the_thread_that_wrote_its_task_has_not_run_since(
        cluster: lumos.LumosContext, monkeypatch: pytest.MonkeyPatch) -> None:
    """On 2 cores the worker a user thread's write wakes often takes that thread's core:
    the task's reply comes back before the writer has run again. The io thread books and
    settles it without waiting for the writer (its reply proves the write went out), for
    a task and for an actor call alike, also when a drain for something else met the
    booking first (it used to wait there for the writer's lock)."""
    from lumos._private.core_worker.references import PENDING
    from lumos._private.ids import return_object_id
    from lumos._private.protocol import messages as m
    from lumos._private.transport.connection import Connection

    cw = worker_context.require()
    c = Counter.remote()
    assert lumos.get(c.incr.remote(), timeout=60) == 1
    assert lumos.get(_seven.remote(), timeout=60) == 7  # a lease held, idle
    real = Connection.write_now
    settled: list[bool] = []

    def write_then_stall(conn: Connection, body: object, went: list[object] | None = None) -> bool:
        ok = real(conn, body, went)
        if ok and type(body) is m.PushTask:
            # The writer "loses its core" until the reply is settled (or 10 s pass), and
            # meanwhile the io thread drains its inbox for something else (an idle timer,
            # another thread's post), meeting the booking of this very write.
            cw.io.post(lambda: None)
            oid = return_object_id(body.spec.task_id, 1)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                e = cw.objects.entries.get(oid)
                if e is not None and e.state != PENDING:
                    break
                time.sleep(0.005)
            e = cw.objects.entries.get(oid)
            settled.append(e is not None and e.state != PENDING)
        return ok

    def settle() -> None:
        # The writer, back, posts the booking it saw put aside (run already by the reply:
        # a no-op); until the io thread has had that turn a call is not written straight.
        deadline = time.monotonic() + 10
        while not cw.io.idle() and time.monotonic() < deadline:
            time.sleep(0.002)

    monkeypatch.setattr(Connection, "write_now", write_then_stall)
    tasks_before, calls_before = cw.direct_tasks, _direct_sent()
    for _ in range(3):
        settle()
        assert lumos.get(_seven.remote(), timeout=60) == 7
        settle()
        assert lumos.get(c.incr.remote(), timeout=60) >= 2
    monkeypatch.setattr(Connection, "write_now", real)
    assert cw.direct_tasks > tasks_before and _direct_sent() > calls_before  # written straight
    assert settled and all(settled)


@lumos.remote
def _mark(path: str) -> int:
    with open(path, "a") as f:
        f.write("ran\n")
    return os.getpid()


@lumos.remote
class _Marker:
    def mark(self, path: str) -> int:
        with open(path, "a") as f:
            f.write("ran\n")
        return os.getpid()


def _ran_once_and_settled(cw: object, path: str) -> None:
    """The interrupted call ran, once, and the io thread has nothing left in hand (no
    booking waiting or put aside)."""
    wait_for(lambda: os.path.exists(path) and cw.io.idle(), 30)  # type: ignore[attr-defined]
    time.sleep(0.3)  # (a second run would have written by now)
    with open(path) as f:
        assert f.read() == "ran\n"


@pytest.mark.parametrize("kind", ["task", "actor call"])
@pytest.mark.parametrize("when", ["before the write", "after the write"])
def test_the_stop_button_inside_a_straight_write_loses_nothing(
        cluster: lumos.LumosContext, monkeypatch: pytest.MonkeyPatch, tmp_path, kind: str, when: str) -> None:
    """A KeyboardInterrupt (the stop button) raised in the user thread while it writes a
    task or call straight to the worker leaves nothing waiting for ever: the io thread
    learns whether the message went out, sends it itself if not, and the call runs once
    either way; the lease goes back, and later calls are written straight again."""
    from lumos._private.protocol import messages as m
    from lumos._private.transport.connection import Connection

    cw = worker_context.require()
    marker = _Marker.remote()
    lumos.get(marker.mark.remote(str(tmp_path / "warm")), timeout=60)
    lumos.get(_mark.remote(str(tmp_path / "warm")), timeout=60)  # a lease of this shape, idle
    wait_for(cw.io.idle, 10)
    real = Connection.write_now
    armed = [True]

    def interrupted(conn: Connection, body: object, went: list[object] | None = None) -> bool:
        if armed[0] and type(body) is m.PushTask:
            armed[0] = False
            if when == "after the write":
                real(conn, body, went)
            raise KeyboardInterrupt
        return real(conn, body, went)

    path = str(tmp_path / "ran")
    monkeypatch.setattr(Connection, "write_now", interrupted)
    with pytest.raises(KeyboardInterrupt):
        if kind == "task":
            _mark.remote(path)
        else:
            marker.mark.remote(path)
    monkeypatch.setattr(Connection, "write_now", real)
    assert not armed[0]  # it was written straight (and interrupted)
    _ran_once_and_settled(cw, path)
    tasks, calls = cw.direct_tasks, _direct_sent()
    for _ in range(5):
        lumos.get(_mark.remote(str(tmp_path / "after")), timeout=30)
        lumos.get(marker.mark.remote(str(tmp_path / "after")), timeout=30)
    assert cw.direct_tasks > tasks and _direct_sent() > calls  # straight writes again
    # Both CPUs' worth of tasks run at once: no lease was left claimed.
    assert len(set(lumos.get([_where.remote("", 0.5) for _ in range(2)], timeout=30))) == 2


@pytest.mark.parametrize("where", ["record_scheduled", "write_then_book"])
def test_the_stop_button_between_a_lease_claim_and_the_booking_gives_the_lease_back(
        cluster: lumos.LumosContext, monkeypatch: pytest.MonkeyPatch, tmp_path, where: str) -> None:
    """A KeyboardInterrupt after ``push_direct`` claimed an idle worker's lease and before
    the task's booking was queued: the io thread books the task as not sent (it is queued
    the usual way and runs once) and the lease is free again."""
    from lumos._private.core_worker.core_worker import CoreWorker
    from lumos._private.core_worker.io_loop import IoLoop

    cw = worker_context.require()
    lumos.get(_mark.remote(str(tmp_path / "warm")), timeout=60)  # a lease of this shape, idle
    wait_for(cw.io.idle, 10)
    owner = CoreWorker if where == "record_scheduled" else IoLoop
    real = getattr(owner, where)
    armed = [True]

    def interrupted(*args: object, **kwargs: object) -> object:
        if armed[0]:
            armed[0] = False
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    path = str(tmp_path / "ran")
    monkeypatch.setattr(owner, where, interrupted)
    with pytest.raises(KeyboardInterrupt):
        _mark.remote(path)
    monkeypatch.setattr(owner, where, real)
    assert not armed[0]
    _ran_once_and_settled(cw, path)
    assert len(set(lumos.get([_where.remote("", 0.5) for _ in range(2)], timeout=30))) == 2
    tasks = cw.direct_tasks
    lumos.get(_mark.remote(str(tmp_path / "after")), timeout=30)
    assert cw.direct_tasks > tasks
