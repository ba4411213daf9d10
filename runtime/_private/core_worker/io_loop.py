"""The ``lumos-io`` thread: one asyncio loop per process, and the hand-over to it.

Owns the I/O thread and its loop, the inbox user threads post work into, ``run_sync``
(run a coroutine on the loop and wait for it from a user thread) and ``spawn``, the one
helper that starts a tracked background task (the core worker, the GCS and the raylet
all use it: every task has an owner, and a failure is logged, never lost).

```
 user threads                          lumos-io thread
 post(fn, *args) ─► inbox ──(one call_soon_threadsafe per burst)──► drain_inbox: fn(*args)...
 run_sync(coro) ─► run_coroutine_threadsafe ──────────────────────► coro ─► result
```

Created and started by ``CoreWorker``; ``post`` is the hot path of every submission, so
it costs an append and, only when the loop is not already due to drain, one wake-up.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import threading
from typing import Any, Awaitable, Callable, Coroutine

from lumos import exceptions as exc
from lumos._private.process import name_os_thread
from lumos._private.transport import eventloop
from lumos._private.transport.connection import batch

logger = logging.getLogger(__name__)

#: ``clear_for``: the most bookings of straight writes left waiting for the io thread's
#: next turn before a user thread's next write goes through it (a fan-out to more
#: workers than this has the io thread send the rest).
MAX_QUIET_BOOKINGS = 8


#: ``Claim._outcome`` once the caller has settled a failure, or once the outcome went back.
_FAILED: tuple[bool, Any] = (False, None)
_GIVEN_BACK: tuple[bool, Any] = (True, None)


class Claim:
    """What a call that the stop button may take from its caller gives back when the
    caller never gets it (a store slot the raylet granted, an actor the GCS registered):
    ``run_sync(coro, claim=Claim(on_result, on_error))``. The io thread records the
    call's outcome here as the coroutine ends; the caller's exception path calls
    ``left()``, held off the stop button, and the outcome, now or once it comes, goes
    to ``on_result(result)`` or ``on_error(error)`` (None: cancelled). A press may land
    anywhere from before the call is sent to after ``run_sync`` returned and before the
    caller holds the result: caught only inside ``run_sync``'s wait, the later ones lost
    the grant, and the store kept an object no one would seal or free."""

    __slots__ = ("_lock", "_outcome", "_left", "on_result", "on_error")

    def __init__(self, on_result: Callable[[Any], None],
                 on_error: Callable[[BaseException | None], None] | None = None) -> None:
        self._lock = threading.Lock()
        self._outcome: tuple[bool, Any] | None = None
        self._left = False
        self.on_result = on_result
        self.on_error = on_error

    async def run(self, coro: Awaitable[Any]) -> Any:
        """(io thread) ``coro``, its outcome recorded."""
        try:
            result = await coro
        except BaseException as e:
            self._settle((False, e))
            raise
        self._settle((True, result))
        return result

    def _settle(self, outcome: tuple[bool, Any]) -> None:
        with self._lock:
            left = self._left
            self._outcome = _GIVEN_BACK if left else outcome
        if left:
            self._give_back(outcome)

    def left(self) -> bool:
        """The caller leaves without the result (its exception path). False where the
        call itself failed first (the caller's exception comes from that failure, and
        the caller settles it as such); True otherwise: what the call makes is given
        back, now or when it ends."""
        with self._lock:
            outcome = self._outcome
            if outcome is not None and not outcome[0]:
                self._outcome = _FAILED  # (the error's traceback holds the caller's frame: no cycle)
                return False
            if self._left:
                return True
            self._left = True
            if outcome is not None:
                self._outcome = _GIVEN_BACK
        if outcome is not None:
            self._give_back(outcome)
        return True

    def _give_back(self, outcome: tuple[bool, Any]) -> None:
        ok, value = outcome
        try:
            if ok:
                self.on_result(value)
            elif self.on_error is not None:
                self.on_error(None if isinstance(value, asyncio.CancelledError) else value)
        except Exception:
            logger.exception("could not give back what an interrupted call got")


def spawn(tasks: set[asyncio.Task[Any]], coro: Coroutine[Any, Any, Any], name: str,
          loop: asyncio.AbstractEventLoop | None = None) -> asyncio.Task[Any]:
    """Start ``coro`` as a background task named ``name``, tracked in ``tasks`` until it
    ends (its owner cancels what is left there when it closes); a failure is logged.
    ``loop``: the loop to run it on (default: the running one)."""
    task = (loop or asyncio.get_running_loop()).create_task(coro, name=name)
    tasks.add(task)

    def done(t: asyncio.Task[Any]) -> None:
        tasks.discard(t)
        if not t.cancelled() and t.exception() is not None:
            logger.error("%s failed", name, exc_info=t.exception())
    task.add_done_callback(done)
    return task


class IoLoop:
    """The process's ``lumos-io`` thread and loop, with the inbox from user threads."""

    def __init__(self) -> None:
        #: The loop (set by the io thread once it runs; None before and after).
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread: threading.Thread | None = None
        #: Jobs posted by user threads, run in order on the io thread.
        self.inbox: collections.deque[tuple[Callable[..., Any], tuple[Any, ...]]] = collections.deque()
        #: While ``drain_pending`` runs for a task's reply: that task's id.
        self.replying_to: bytes | None = None
        #: Bookings of ``write_then_book`` whose writer had not come back from its write
        #: when their turn came, by task id: run when it does (it posts them) or when the
        #: task's reply comes, whichever is first (``book_deferred``).
        self.deferred: dict[bytes, tuple[Callable[..., Any], tuple[Any, ...], list[Any]]] = {}
        #: A drain of the inbox is already scheduled: posting needs no wake-up.
        self._wake_pending = False
        #: The io thread is running posted jobs (the inbox may be empty meanwhile).
        self._draining = False
        #: Background tasks (``spawn``), cancelled at close.
        self.tasks: set[asyncio.Task[Any]] = set()
        self.closed = False

    # ------------------------------------------------------------------ lifecycle

    def start(self, boot: Callable[[], Awaitable[None]], clean_up: Callable[[asyncio.AbstractEventLoop], None],
              timeout_s: float) -> None:
        """Start the thread, run ``boot()`` on its loop and wait for it (raising its
        error); the loop then runs until ``stop()``. ``clean_up(loop)`` runs on the io
        thread after the loop stops, before it closes."""
        ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        self.thread = threading.Thread(target=self._run, args=(ready, boot, clean_up), name="lumos-io",
                                       daemon=True)
        self.thread.start()
        try:
            ready.result(timeout_s)
        except BaseException:
            self.stop()
            raise

    def _run(self, ready: concurrent.futures.Future[None], boot: Callable[[], Awaitable[None]],
             clean_up: Callable[[asyncio.AbstractEventLoop], None]) -> None:
        name_os_thread("lumos-io")
        loop = eventloop.new_event_loop()
        self.loop = loop
        asyncio.set_event_loop(loop)

        async def run_boot() -> None:
            try:
                await boot()
            except BaseException as e:
                ready.set_exception(e)
                return
            ready.set_result(None)

        loop.run_until_complete(run_boot())
        if ready.exception() is None:
            loop.run_forever()
        try:
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for t in pending:
                t.cancel()
            if pending:
                loop.run_until_complete(asyncio.wait(pending, timeout=1.0))
            clean_up(loop)
            loop.run_until_complete(asyncio.sleep(0.01))
            loop.run_until_complete(loop.shutdown_asyncgens())
        except Exception as e:
            logger.debug("io loop clean-up: %s", e)
        finally:
            try:
                loop.close()
            except OSError as e:  # a handle libuv still counts as active
                logger.debug("io loop close: %s", e)

    def stop(self) -> None:
        """Stop the loop and join the thread (from any thread but the io thread's own join)."""
        loop = self.loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(loop.stop)
            except RuntimeError:
                pass
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(5.0)

    def cancel_tasks(self) -> None:
        for t in list(self.tasks):
            t.cancel()

    def in_io_thread(self) -> bool:
        return threading.current_thread() is self.thread

    def is_alive(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    # ------------------------------------------------------------------ hand-over

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        """A tracked background task on the io loop (io thread)."""
        assert self.loop is not None
        return spawn(self.tasks, coro, name, self.loop)

    def post(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the io thread; batched: one wake-up per burst."""
        self.inbox.append((fn, args))
        if not self._wake_pending:
            self._wake_pending = True
            loop = self.loop
            if loop is None or loop.is_closed():
                raise exc.LumosSystemError("lumos is shut down")
            loop.call_soon_threadsafe(self._drain_inbox)

    def append_quiet(self, fn: Callable[..., Any], *args: Any) -> None:
        """Queue ``fn(*args)`` for the io thread without waking it: it runs at the next
        drain, which the next ``post``, a ``wake`` or ``drain_pending`` brings."""
        self.inbox.append((fn, args))

    def write_then_book(self, conn: Any, body: Any, key: bytes, book: Callable[..., Any], *args: Any) -> bool:
        """User thread: write ``body`` (the push of task ``key``) straight to ``conn``
        (``Connection.write_now``) and have the io thread run ``book(*args, sent)`` at its
        next turn, ``sent`` saying whether the write went out. The booking is queued first
        (without a wake-up), so it is there before any answer to the write; if the write
        could not go, the io thread is woken and ``book`` sends the message the usual way.

        The io thread never waits for the writer: a booking whose turn comes while the
        write is under way (the writer lost its core inside it: on 2 cores the worker it
        woke often takes it) is put aside (``deferred``) and run when the writer comes back,
        which posts it, or when the task's reply comes (it proves the write went out),
        whichever is first. Meanwhile ``idle()`` is False, so nothing else is written
        straight past it. Returns whether the write went out."""
        # [the write went out, its booking was put aside, the connection] (``clear_for``)
        sent: list[Any] = [None, False, conn]
        try:
            self.append_quiet(self._book, key, book, args, sent)
            sent[0] = conn.write_now(body, sent)  # (it sets sent[0] the moment it writes)
        finally:
            # Also when the stop button's KeyboardInterrupt is raised in this thread
            # anywhere in here: whether the message went out is known (``write_now``
            # marked it as it wrote); if it did not, its booking sends it the usual way,
            # as for a write that could not go. Left unknown, the booking waited for ever
            # (a task's lease with it).
            if sent[0] is None:
                sent[0] = False
            if sent[1]:
                self.post(self.book_deferred, key)
            elif sent[0] is False:
                self.wake()
        return sent[0]  # type: ignore[no-any-return]

    def _book(self, key: bytes, book: Callable[..., Any], args: tuple[Any, ...], sent: list[Any]) -> None:
        """io thread: a ``write_then_book`` booking's turn (see there)."""
        ok = sent[0]
        if ok is None and self.replying_to != key:
            sent[1] = True  # (before the second look: a writer done after it sees this)
            ok = sent[0]
            if ok is None:
                self.deferred[key] = (book, args, sent)
                return
        book(*args, ok is not False)  # (None: its reply is being handled, so it went out)

    def book_deferred(self, key: bytes) -> None:
        """io thread: run the booking of task ``key`` put aside by ``_book``, if it is
        still waiting (its writer is back, or its reply came)."""
        item = self.deferred.pop(key, None)
        if item is not None:
            book, args, sent = item
            book(*args, sent[0] is not False)

    def wake(self) -> None:
        """Have the io thread drain its inbox soon (any thread)."""
        if not self._wake_pending:
            self._wake_pending = True
            loop = self.loop
            if loop is not None and not loop.is_closed():
                loop.call_soon_threadsafe(self._drain_inbox)

    def drain_pending(self, replying_to: bytes | None = None) -> None:
        """io thread: run what waits in the inbox now (before handling a message that may
        concern it: a reply to a call sent straight from a user thread). ``replying_to``:
        the id of the task whose reply is being handled; its booking then knows its write
        went out without waiting for the user thread that wrote it to say so (that thread,
        back from the ``write`` that woke the worker, may not have run since), and runs
        even if it was put aside."""
        drain = bool(self.inbox) and not self._draining
        if not drain and replying_to not in self.deferred:
            return
        before, self.replying_to = self.replying_to, replying_to
        try:
            if drain:
                self._drain_inbox()
            if replying_to is not None:
                self.book_deferred(replying_to)
        finally:
            self.replying_to = before

    def idle(self) -> bool:
        """Every job posted so far has run, and what it sent is handed to its connection."""
        return not self.inbox and not self._wake_pending and not self._draining and not self.deferred

    def clear_for(self, conn: Any) -> bool:
        """``idle()``, except that bookings of straight writes to other connections than
        ``conn`` that went out may wait in the inbox: nothing posted has yet to be sent,
        so a user thread may write to ``conn`` itself. A sync fan-out (a call to each of
        several actors, then a get of them all) writes every call itself: with only the
        first written so, the others waited for the io thread's wake-up, on 2 cores often
        until the first worker's task was done. A second write to the same connection
        goes through the io thread, which sends a burst's calls to one worker in one write.
        At most ``MAX_QUIET_BOOKINGS`` bookings wait so."""
        if self._wake_pending or self._draining or self.deferred:
            return False
        inbox = self.inbox
        if not inbox:
            return True
        if len(inbox) >= MAX_QUIET_BOOKINGS:
            return False
        try:
            jobs = tuple(inbox)  # (the io thread may pop meanwhile)
        except RuntimeError:
            return False
        for fn, args in jobs:
            if getattr(fn, "__func__", None) is not IoLoop._book:
                return False
            sent = args[3]
            if sent[0] is not True or sent[2] is conn:
                return False
        return True

    def _drain_inbox(self) -> None:
        self._draining = True
        self._wake_pending = False
        inbox = self.inbox
        try:
            with batch():  # what the jobs send leaves at the end, without another loop turn
                while inbox:
                    fn, args = inbox.popleft()
                    try:
                        fn(*args)
                    except Exception:
                        logger.exception("io-thread job %s failed", getattr(fn, "__name__", fn))
        finally:
            self._draining = False

    def run_sync(self, coro: Coroutine[Any, Any, Any], timeout_s: float | None = None,
                 claim: Claim | None = None) -> Any:
        """Run a coroutine on the io thread and wait for it (from a user thread).
        ``claim``: what the coroutine makes is given back if the caller leaves without
        it (``Claim``; the caller calls its ``left()`` on its way out)."""
        if threading.current_thread() is self.thread:
            coro.close()
            raise RuntimeError("a blocking lumos call was made from the lumos-io thread; "
                               "use 'await ref' in async code instead")
        if self.loop is None or self.closed:
            coro.close()
            raise exc.LumosSystemError("lumos is shut down")
        if claim is not None:
            coro = claim.run(coro)  # type: ignore[assignment]
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result(timeout_s)
        except concurrent.futures.TimeoutError:
            if fut.done() and not fut.cancelled():
                raise  # the coroutine's own timeout (a GetTimeoutError, say), not this wait's
            fut.cancel()
            raise TimeoutError(f"lumos control call timed out after {timeout_s}s") from None
        finally:
            # A raised error's traceback holds this frame; the future holds the error. Left
            # alone, that cycle keeps every caller's frame (and the ObjectRefs in them)
            # alive until the garbage collector runs.
            del fut
