"""A worker's main thread, idle between tasks, reads its next task from its owner's
connection itself (``Executor._read_task``, ``SharedReader``): what arrives while that
task runs is still handled at once by the io thread, and nothing is lost or reordered."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

import lumos
from lumos._private import worker_context
from lumos.exceptions import TaskCancelledError

pytestmark = pytest.mark.timeout(120)


def _read_itself() -> bool:
    """In a task: did the main thread read this task from the connection itself?"""
    return bool(worker_context.require().executor.read_itself)


@lumos.remote
def probe() -> tuple[int, bool]:
    return os.getpid(), _read_itself()


@lumos.remote
def sleep_marked(path: str) -> None:
    Path(path).write_text(f"{os.getpid()} {int(_read_itself())}")
    time.sleep(60)


@lumos.remote
class Box:
    def __init__(self) -> None:
        self.item: Any = None

    def put(self, item: Any) -> None:
        self.item = item

    def get(self) -> Any:
        return self.item


@lumos.remote
def publish_then_wait(box: Any, path: str) -> tuple[bool, bool]:
    """Put a value this worker owns where the driver finds it, then wait for the file the
    driver writes once it has read the value from this worker."""
    read_itself = _read_itself()
    lumos.get(box.put.remote([lumos.put("owned by the worker")]), timeout=30)
    deadline = time.monotonic() + 15
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            return read_itself, False
        time.sleep(0.01)
    return read_itself, True


@lumos.remote
def leaf(x: int) -> int:
    return x


@lumos.remote
def blocks_in_get(x: int) -> tuple[int, bool]:
    read_itself = _read_itself()
    return lumos.get(leaf.remote(x), timeout=60), read_itself


def _warm() -> int:
    """Sync calls until one is read by the main thread itself; its worker's pid."""
    for _ in range(200):
        pid, read_itself = lumos.get(probe.remote(), timeout=60)
        if read_itself:
            return pid  # type: ignore[no-any-return]
    pytest.fail("no sync task was read by its worker's main thread")


def test_cancel_reaches_a_task_the_main_thread_read_itself(cluster: lumos.LumosContext, tmp_path: Path) -> None:
    for attempt in range(10):
        _warm()
        mark = tmp_path / f"started-{attempt}"
        ref = sleep_marked.remote(str(mark))
        deadline = time.monotonic() + 30
        while not mark.exists() or not mark.read_text():
            assert time.monotonic() < deadline, "the task never started"
            time.sleep(0.01)
        read_itself = mark.read_text().split()[1] == "1"
        lumos.cancel(ref)  # the io thread must read this while the task runs
        with pytest.raises(TaskCancelledError):
            lumos.get(ref, timeout=30)
        if read_itself:
            break
    else:
        pytest.fail("the sleeping task never came through the main thread's own read")
    _warm()  # the worker serves on


def test_frames_for_the_worker_are_handled_while_its_task_runs(cluster: lumos.LumosContext, tmp_path: Path) -> None:
    """The driver asks a worker for an object the worker owns while the worker's main
    thread runs a task it read itself: the io thread answers, or the task never sees the
    file the driver writes once it has the value."""
    for attempt in range(10):
        box = Box.remote()
        _warm()
        flag = tmp_path / f"flag-{attempt}"
        ref = publish_then_wait.remote(box, str(flag))
        deadline = time.monotonic() + 30
        while (item := lumos.get(box.get.remote(), timeout=30)) is None:
            assert time.monotonic() < deadline, "the task never published its value"
            time.sleep(0.01)
        assert lumos.get(item[0], timeout=60) == "owned by the worker"
        flag.write_text("x")
        read_itself, seen = lumos.get(ref, timeout=60)
        assert seen, "the driver's request waited for the running task"
        if read_itself:
            return
    pytest.fail("the waiting task never came through the main thread's own read")


def test_tasks_that_block_in_get_requeue_what_waits_behind_them(cluster: lumos.LumosContext) -> None:
    _warm()
    seen_read_itself = False
    for i in range(10):
        value, read_itself = lumos.get(blocks_in_get.remote(i), timeout=60)
        assert value == i
        seen_read_itself |= read_itself
        # A burst: the worker blocked in get() hands the queued ones back to the driver.
        assert [v for v, _ in lumos.get([blocks_in_get.remote(k) for k in range(6)], timeout=60)] == list(range(6))
    assert seen_read_itself


@lumos.remote
class Log:
    def __init__(self) -> None:
        self.items: list[int] = []

    def add(self, i: int) -> tuple[int, bool]:
        self.items.append(i)
        return i, _read_itself()

    def all(self) -> list[int]:
        return self.items


def test_actor_calls_keep_their_order_between_own_reads_and_bursts(cluster: lumos.LumosContext) -> None:
    log = Log.remote()
    n = 0
    own = 0
    for round_ in range(40):
        if round_ % 4 == 0:
            refs = [log.add.remote(n + k) for k in range(25)]  # several frames in one read
            n += 25
            lumos.get(refs, timeout=60)
        else:
            i, read_itself = lumos.get(log.add.remote(n), timeout=60)
            assert i == n
            n += 1
            own += read_itself
    assert lumos.get(log.all.remote(), timeout=60) == list(range(n))
    assert own > 0  # single calls came through the main thread's own read


@lumos.remote(max_calls=2)
def limited() -> tuple[int, bool]:
    return os.getpid(), _read_itself()


def test_max_calls_ends_a_worker_that_reads_its_tasks_itself(cluster: lumos.LumosContext) -> None:
    pids = [lumos.get(limited.remote(), timeout=60)[0] for _ in range(8)]
    for a in range(0, 8, 2):
        assert pids[a] not in pids[a + 2:], pids  # no worker ran more than two


def test_sigint_to_a_worker_reading_its_next_task_leaves_it_serving(cluster: lumos.LumosContext) -> None:
    """A cancel's SIGINT can land after its task ended, while the main thread waits in its
    own read: the worker drops it and serves the next task on the same connection."""
    pid = _warm()
    for _ in range(5):
        os.kill(pid, signal.SIGINT)
        time.sleep(0.05)
    for _ in range(20):
        assert lumos.get(probe.remote(), timeout=60)[0] > 0
    os.kill(pid, 0)  # (still alive)


@lumos.remote
def lead_reads(blob: bytes) -> tuple[bool, int, int, int]:
    """The main thread's read size on its lead connection, and this task's argument."""
    ex = worker_context.require().executor
    lead = ex._lead
    return _read_itself(), lead.read_bytes if lead is not None else 0, len(blob), blob.count(b"z")


def test_a_task_with_a_large_inline_argument_comes_in_one_read_of_the_main_thread(
        cluster: lumos.LumosContext) -> None:
    # Inline arguments go up to ~100 KiB: with malloc's heap serving 256 KiB buffers (a
    # worker fixes its thresholds), the main thread reads that much at a time, so such a
    # task is one read rather than two and a join; every byte still arrives.
    blob = b"z" * (90 * 1024)
    _warm()
    for _ in range(50):
        read_itself, read_bytes, n, zs = lumos.get(lead_reads.remote(blob), timeout=60)
        assert (n, zs) == (len(blob), len(blob))
        if read_itself:
            assert read_bytes == 256 * 1024
            return
    pytest.fail("no task with a large argument came through the main thread's own read")
