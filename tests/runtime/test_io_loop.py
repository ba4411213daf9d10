"""IoLoop (the lumos-io thread, its inbox, run_sync) and the shared spawn helper, without sockets."""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import weakref
from typing import Any

import pytest

from lumos import exceptions as exc
from lumos._private.core_worker.io_loop import Claim, IoLoop, spawn
from tests.conftest import wait_for


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


async def refused() -> None:
    raise ValueError("no")


def test_a_claim_gives_back_what_a_left_call_makes_whenever_the_caller_left() -> None:
    """``Claim``: the caller leaving (its exception path calls ``left()``) after the call
    returned, or while it still runs, gives its result back (now, or when it comes); a
    call that failed first, or that the caller kept, gives nothing back; one cancelled
    after the caller left goes to ``on_error`` as None."""
    io = started()
    try:
        back: list[Any] = []

        def claim() -> Claim:
            return Claim(lambda r: back.append(("result", r)), lambda e: back.append(("error", e)))

        async def answer(x: int) -> int:
            await asyncio.sleep(0)
            return x

        kept = claim()
        assert io.run_sync(answer(1), 5, kept) == 1 and back == []  # kept: nothing back
        returned = claim()
        assert io.run_sync(answer(2), 5, returned) == 2
        assert returned.left() and back == [("result", 2)]  # left after it returned: at once
        assert returned.left() and back == [("result", 2)]  # (once)

        failed = claim()
        with pytest.raises(ValueError):
            io.run_sync(refused(), 5, failed)
        assert not failed.left() and back == [("result", 2)]  # its own failure: the caller's to settle

        go = threading.Event()

        async def later(x: int) -> int:
            await asyncio.get_running_loop().run_in_executor(None, go.wait, 10)
            return x

        waiting = claim()
        with pytest.raises(TimeoutError):
            io.run_sync(later(3), 0.05, waiting)  # (the wait left; the call cancelled)
        assert waiting.left()
        wait_for(lambda: len(back) == 2, 10)
        assert back[1] == ("error", None)  # cancelled after the caller left
        running = claim()
        fut = asyncio.run_coroutine_threadsafe(running.run(later(4)), io.loop)  # type: ignore[arg-type]
        assert running.left() and len(back) == 2  # left while it runs: given back when it ends
        go.set()
        assert fut.result(10) == 4
        wait_for(lambda: len(back) == 3, 10)
        assert back[2] == ("result", 4)
    finally:
        io.closed = True
        io.stop()


def test_a_claim_keeps_no_caller_frame_alive_after_a_failed_call() -> None:
    """A call that failed, settled by its caller (``left()`` False), leaves no cycle from
    the claim through the error's traceback to the caller's frame: the caller's locals
    (a task's arguments) go with the frame, not at the next garbage collection."""
    io = started()

    class Arg:
        pass

    def caller(arg: Arg) -> None:
        claim = Claim(lambda _r: None)
        try:
            io.run_sync(refused(), 5, claim)
        except ValueError:
            if claim.left():
                raise AssertionError("a failed call was taken as left") from None
            raise

    gc.collect()
    gc.disable()
    try:
        arg = Arg()
        alive = weakref.ref(arg)
        with pytest.raises(ValueError):
            caller(arg)
        del arg
        assert alive() is None
    finally:
        gc.enable()
        io.closed = True
        io.stop()


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


class _StallingConn:
    """``write_now`` that stays inside the write until told (the writer lost its core)."""

    def __init__(self, result: bool) -> None:
        self.result = result
        self.entered = threading.Event()
        self.go_on = threading.Event()

    def write_now(self, body: Any, went: list[Any] | None = None) -> bool:
        self.entered.set()
        assert self.go_on.wait(10)
        return self.result


@pytest.mark.parametrize("went_out", [True, False])
def test_a_booking_whose_write_is_under_way_waits_without_holding_up_the_io_thread(went_out: bool) -> None:
    """A drain that reaches a ``write_then_book`` booking while its writer is still inside
    the write puts the booking aside: the io thread goes on with other work, is not idle,
    and the booking runs once the writer is back, with whether the write went out."""
    io = started()
    try:
        conn = _StallingConn(went_out)
        booked: list[tuple[str, bool, bool]] = []
        done = threading.Event()

        def book(tag: str, sent: bool) -> None:
            booked.append((tag, sent, io.in_io_thread()))
            done.set()

        writer = threading.Thread(target=io.write_then_book, args=(conn, "push", b"t1", book, "t1"))
        writer.start()
        assert conn.entered.wait(10)
        ran = threading.Event()
        io.post(ran.set)  # a drain that reaches the booking mid-write
        assert ran.wait(10)

        async def answer() -> int:
            return 7

        assert io.run_sync(answer(), 5) == 7  # the io thread is not stuck behind the writer
        assert booked == [] and b"t1" in io.deferred and not io.idle()
        conn.go_on.set()
        writer.join(10)
        assert done.wait(10)
        assert booked == [("t1", went_out, True)]
        assert not io.deferred
    finally:
        conn.go_on.set()
        io.closed = True
        io.stop()


def test_a_reply_runs_the_booking_put_aside_as_sent_before_its_writer_is_back() -> None:
    io = started()
    try:
        conn = _StallingConn(True)
        booked: list[bool] = []

        writer = threading.Thread(target=io.write_then_book, args=(conn, "push", b"t2", booked.append))
        writer.start()
        assert conn.entered.wait(10)
        ran = threading.Event()
        io.post(ran.set)
        assert ran.wait(10)

        async def reply_comes() -> list[bool]:
            io.drain_pending(b"t2")  # what the reply's handler does first
            return list(booked)

        assert io.run_sync(reply_comes(), 5) == [True]
        conn.go_on.set()
        writer.join(10)
        again = threading.Event()
        io.post(again.set)
        assert again.wait(10)
        assert booked == [True]  # run once: the writer's post found it done
        assert io.idle()
    finally:
        conn.go_on.set()
        io.closed = True
        io.stop()


def _turn(io: IoLoop) -> None:
    """Have the io thread run what waits in its inbox, and wait until that turn is over."""
    io.wake()
    wait_for(io.idle, 10, 0.001)


class _Conn:
    """``write_now`` that returns at once with ``result``."""

    def __init__(self, result: bool = True) -> None:
        self.result = result
        self.written: list[Any] = []

    def write_now(self, body: Any, went: list[Any] | None = None) -> bool:
        self.written.append(body)
        if self.result and went is not None:
            went[0] = True
        return self.result


def test_a_user_thread_may_write_to_another_connection_past_bookings_of_writes_that_went_out() -> None:
    """``clear_for``: bookings of straight writes that went out leave nothing unsent, so a
    write to another connection may go straight too (a fan-out to several actors); one to
    the same connection, anything posted, a write that did not go out, or more than
    ``MAX_QUIET_BOOKINGS`` bookings waiting send it through the io thread. The bookings
    still run in order at the io thread's next turn."""
    from lumos._private.core_worker import io_loop

    io = started()
    try:
        booked: list[tuple[str, bool]] = []
        a, b, c = _Conn(), _Conn(), _Conn()
        assert io.clear_for(a) and io.idle()
        assert io.write_then_book(a, "push-1", b"t1", lambda sent: booked.append(("t1", sent)))
        assert not io.idle()  # (the booking waits, without a wake-up)
        assert io.clear_for(b) and io.clear_for(c) and io.clear_for(None)
        assert not io.clear_for(a)  # the same connection: through the io thread
        assert io.write_then_book(b, "push-2", b"t2", lambda sent: booked.append(("t2", sent)))
        assert io.clear_for(c) and not io.clear_for(b)
        assert booked == []

        quiet = [_Conn() for _ in range(io_loop.MAX_QUIET_BOOKINGS - 2)]
        for i, conn in enumerate(quiet):
            assert io.clear_for(conn)
            io.write_then_book(conn, "push", b"q%d" % i, lambda sent: None)
        assert len(io.inbox) == io_loop.MAX_QUIET_BOOKINGS and not io.clear_for(c)  # at most so many

        _turn(io)  # the io thread's next turn runs them all, in order
        assert booked == [("t1", True), ("t2", True)]
        assert io.clear_for(a)

        hold, busy = threading.Event(), threading.Event()

        def block() -> None:
            busy.set()
            hold.wait(10)

        io.write_then_book(a, "push-3", b"t3", lambda sent: None)
        io.post(block)  # something posted (not a booking): nothing is written past it
        assert busy.wait(10)
        assert not io.clear_for(b)
        hold.set()
        _turn(io)
        assert io.clear_for(b)

        failed: list[bool] = []
        loop = io.loop
        assert loop is not None
        real = loop.call_soon_threadsafe
        wakes: list[Any] = []
        loop.call_soon_threadsafe = lambda cb, *args: wakes.append((cb, args))  # type: ignore[method-assign]
        try:
            assert not io.write_then_book(_Conn(False), "push-4", b"t4", failed.append)
            assert len(wakes) == 1  # it woke the io thread: its booking sends the call the usual way
            assert not io.clear_for(b)  # and nothing is written straight before that
        finally:
            loop.call_soon_threadsafe = real  # type: ignore[method-assign]
        real(wakes[0][0], *wakes[0][1])
        _turn(io)
        assert failed == [False] and io.clear_for(b)
    finally:
        io.closed = True
        io.stop()
