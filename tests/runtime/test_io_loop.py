"""IoLoop (the lumos-io thread, its inbox, run_sync) and the shared spawn helper, without sockets."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import pytest

from lumos import exceptions as exc
from lumos._private.core_worker.io_loop import IoLoop, spawn


def started() -> IoLoop:
    io = IoLoop()

    async def boot() -> None:
        return None

    io.start(boot, lambda loop: None, timeout_s=10)
    return io


def test_posted_jobs_run_in_order_on_the_io_thread_with_one_wake_up_per_burst() -> None:
    io = started()
    try:
        ran: list[tuple[int, bool]] = []
        done = threading.Event()
        wakeups = 0
        loop = io.loop
        assert loop is not None
        real = loop.call_soon_threadsafe

        def counting(cb: Any, *args: Any) -> Any:
            nonlocal wakeups
            wakeups += 1
            return real(cb, *args)

        loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
        hold, busy = threading.Event(), threading.Event()

        def block() -> None:
            busy.set()
            hold.wait(10)

        io.post(block)  # keeps the io thread busy while the burst is posted
        assert busy.wait(10)
        wakeups = 0
        for i in range(100):
            io.post(lambda i=i: ran.append((i, io.in_io_thread())))
        io.post(done.set)
        hold.set()
        assert done.wait(10)
        assert ran == [(i, True) for i in range(100)]
        assert wakeups == 1
    finally:
        io.closed = True
        io.stop()
    assert not io.is_alive()


def test_run_sync_returns_the_result_and_refuses_the_io_thread() -> None:
    io = started()
    try:
        async def answer() -> int:
            await asyncio.sleep(0)
            return 42

        assert io.run_sync(answer(), 5) == 42
        errors: list[BaseException] = []
        done = threading.Event()

        def from_io_thread() -> None:
            try:
                io.run_sync(answer(), 5)
            except RuntimeError as e:
                errors.append(e)
            done.set()

        io.post(from_io_thread)
        assert done.wait(10)
        assert len(errors) == 1 and "lumos-io thread" in str(errors[0])

        async def slow() -> None:
            await asyncio.sleep(10)

        with pytest.raises(TimeoutError, match="timed out after 0.05s"):
            io.run_sync(slow(), 0.05)
    finally:
        io.closed = True
        io.stop()
    with pytest.raises(exc.LumosSystemError, match="shut down"):
        io.run_sync(answer(), 1)


def test_spawn_tracks_tasks_until_they_end_and_logs_failures(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> set[asyncio.Task[Any]]:
        tasks: set[asyncio.Task[Any]] = set()

        async def fail() -> None:
            raise ValueError("boom")

        blocked = asyncio.Event()
        t1 = spawn(tasks, fail(), "test.fail")
        t2 = spawn(tasks, blocked.wait(), "test.wait")
        assert tasks == {t1, t2}
        await asyncio.sleep(0.01)
        assert tasks == {t2}
        t2.cancel()
        await asyncio.sleep(0.01)
        return tasks

    with caplog.at_level(logging.ERROR, logger="lumos._private.core_worker.io_loop"):
        assert asyncio.run(main()) == set()
    failed = [r for r in caplog.records if r.getMessage() == "test.fail failed"]
    assert len(failed) == 1 and failed[0].exc_info is not None
    assert not any("test.wait" in r.getMessage() for r in caplog.records)  # a cancel is no failure
