"""Executing side of an actor: the instance, its concurrency, and its checkpoints.

A worker hosts at most one actor. The creation task builds the instance (and restores
the last checkpoint after a restart); method calls then run:

- one at a time on the worker's main thread, in arrival order (the default), or
- on a thread pool of ``max_concurrency`` threads (threaded actors), or
- as coroutines on one event loop thread, at most ``max_concurrency`` at once (async
  actors: any ``async def`` method makes the actor async; default limit 1000).

Checkpointing (opt-in): when the class defines ``__lumos_checkpoint__()`` and
``__lumos_restore__(state)``, the state is taken after every ``checkpoint_interval``
calls, or sooner when no call is waiting, and stored in the GCS before the replies of
those calls are released. A restarted actor therefore never forgets a call whose
result its caller has seen.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import concurrent.futures
import inspect
import logging
import os
import sys
import threading
import time
import traceback
from typing import TYPE_CHECKING, Any

from lumos._private import serialization as ser
from lumos._private import worker_context
from lumos._private.gcs.actor_manager import CHECKPOINT_NS
from lumos._private.protocol import messages as m
from lumos._private.transport.connection import Connection, ConnectionLost, RemoteError
from lumos._private.ids import ActorID, TaskID

if TYPE_CHECKING:
    from lumos._private.core_worker.executor import Executor

logger = logging.getLogger(__name__)


def is_async_class(cls: type) -> bool:
    return any(inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn)
               for _, fn in inspect.getmembers(cls, predicate=inspect.isfunction))


class ActorHost:
    def __init__(self, executor: "Executor", spec: m.TaskSpec, instance: Any,
                 resource_ids: dict[str, list[Any]]) -> None:
        self.ex = executor
        self.cw = executor.cw
        self.actor_id: ActorID = spec.actor_id or b""
        self.instance = instance
        self.resource_ids = resource_ids
        #: What the actor holds for its life (its calls ask for nothing of their own).
        self.resources: dict[str, float] = dict(spec.resources)
        opts: dict[str, Any] = spec.actor_options or {}
        self.class_name: str = opts.get("class_name", spec.function_name)
        self.name: str = opts.get("name") or ""
        cls = type(instance)
        #: The actor's own ``__repr__``, when its class defines one: its output's prefix
        #: names it so, as in Ray (actors of one class told apart: ``(Rollout(rank=3) pid=N)``).
        #: Set by ``name_output`` once ``__init__`` has run.
        self.log_name = ""
        self.is_async = is_async_class(cls)
        limit = opts.get("max_concurrency")
        self.max_concurrency = int(limit) if limit else (1000 if self.is_async else 1)
        #: Named groups of calls: name -> how many of its calls run at once (Ray's
        #: concurrency groups); other calls share the default group, max_concurrency.
        self.groups: dict[str, int] = dict(opts.get("concurrency_groups") or {})
        self.concurrent = self.is_async or self.max_concurrency > 1 or bool(self.groups)
        self.checkpointing = (callable(getattr(instance, "__lumos_checkpoint__", None))
                              and callable(getattr(instance, "__lumos_restore__", None)))
        self.checkpoint_interval = max(1, int(opts.get("checkpoint_interval") or 1))
        #: The creation task's scheduling strategy (its placement group, if any).
        self.strategy = spec.strategy
        self._since_checkpoint = 0
        self._held: list[tuple[Connection, m.TaskReply]] = []
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sem: asyncio.Semaphore | None = None
        self._group_sems: dict[str, asyncio.Semaphore] = {}
        self._group_pools: dict[str, concurrent.futures.ThreadPoolExecutor] = {}
        #: Threaded actors: the call each pool thread runs (thread id -> task id), and the
        #: running calls cancel() was asked for (they run on; is_canceled() says so).
        self._thread_calls: dict[int, bytes] = {}
        self._cancelled_running: set[bytes] = set()
        #: Task id -> the asyncio task running (or waiting to run) that call (async actors).
        self._async_calls: dict[bytes, asyncio.Task[Any]] = {}
        #: Async actors: calls the main thread dispatched that the loop has not yet started
        #: (``_take_calls``), and whether a wake-up of the loop for them is pending.
        self._inbox: collections.deque[tuple[Any, ...]] = collections.deque()
        self._inbox_woken = False
        self.inbox_wakes = 0  # (how many times; tests read it)
        #: Async actors: replies of calls finished in this turn of the loop, sent together
        #: at its next turn (``_send_finished``).
        self._finished: list[tuple[Connection, m.TaskReply]] = []
        if self.is_async:
            self._start_loop()
        elif self.concurrent:
            self._pool = concurrent.futures.ThreadPoolExecutor(self.max_concurrency,
                                                               thread_name_prefix="lumos-actor")
            self._group_pools = {name: concurrent.futures.ThreadPoolExecutor(n, thread_name_prefix=f"lumos-{name}")
                                 for name, n in self.groups.items()}

    # ------------------------------------------------------------------ checkpoints

    def restore(self) -> None:
        """Load the last checkpoint into a freshly built instance (after a restart)."""
        if not self.checkpointing:
            return
        blob = self.cw.call_gcs(m.KvGet(CHECKPOINT_NS, self.actor_id, 0.0))
        if blob:
            _kind, state = ser.deserialize(blob)
            self.instance.__lumos_restore__(state)
            logger.info("actor %s restored from its checkpoint", self.actor_id.hex()[:8])

    def after_call(self, conn: Connection, reply: m.TaskReply, hold: int) -> None:
        """Main thread, sync actors: release the reply, after a checkpoint when one is due.
        ``hold``: more calls wait (``CoreWorker.send_reply``)."""
        if not self.checkpointing:
            self.cw.send_reply(conn, reply, hold)
            return
        self._held.append((conn, reply))
        self._since_checkpoint += 1
        if self._since_checkpoint >= self.checkpoint_interval or not hold:
            self.checkpoint()

    def checkpoint(self) -> None:
        held, self._held = self._held, []
        self._since_checkpoint = 0
        try:
            state = self.instance.__lumos_checkpoint__()
            blob = ser.serialize(state).to_bytes()
            self.cw.call_gcs(m.KvPut(CHECKPOINT_NS, self.actor_id, blob, True))
        except (ConnectionLost, TimeoutError, RemoteError) as e:
            logger.error("actor checkpoint could not be stored: %s", e)
        except Exception:
            logger.exception("__lumos_checkpoint__ failed; replies are released without a checkpoint")
        for conn, reply in held:
            self.cw.send_reply(conn, reply)

    # ------------------------------------------------------------------ concurrent calls

    def _start_loop(self) -> None:
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            self._loop = loop
            self._sem = asyncio.Semaphore(self.max_concurrency)
            self._group_sems = {name: asyncio.Semaphore(n) for name, n in self.groups.items()}
            ready.set()
            loop.run_forever()

        threading.Thread(target=run, name="lumos-actor-loop", daemon=True).start()
        ready.wait(10)

    def name_output(self) -> None:
        """After ``__init__``: the actor's ``__repr__`` names its output, when its class has one."""
        if type(self.instance).__repr__ is not object.__repr__:
            try:
                self.log_name = repr(self.instance)[:120]
            except Exception:  # (a __repr__ that fails: the class.method name stays)
                pass

    def run_on_loop(self, coro: Any) -> Any:
        """Main thread: run ``coro`` on the actor's event loop and wait for its result (an
        ``async def __init__``)."""
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def dispatch(self, conn: Connection, msg: m.PushTask) -> None:
        """Main thread: resolve the arguments, then run the call concurrently."""
        spec = msg.spec
        ex = self.ex
        start = time.time()
        early = ex.cancelled_before_start(spec)
        if early is not None:
            self.cw.send_reply(conn, early)
            return
        try:
            method = ex._function(spec)
            group = spec.actor_options  # a call's concurrency group, when it names one
            if group is not None and (type(group) is not str or group not in self.groups):
                raise ValueError(f"concurrency group {group!r} is not defined for {self.class_name} "
                                 f"(it has {sorted(self.groups) or 'none'})")
            args, kwargs = ex._resolve_args(spec)
        except Exception as e:
            failed = ex._failed_reply(spec, e, start)
        else:
            failed = None
        if failed is not None:
            if spec.deps:
                ex.pin_kept_args(spec, failed)  # (arguments resolved before the failure)
            self.cw.send_reply(conn, failed)
            return
        if self._loop is not None:
            sem = self._group_sems[group] if group is not None else self._sem
            # One wake-up of the loop for all the calls dispatched until it looks: in a
            # burst, a ``run_coroutine_threadsafe`` per call cost a write to the loop's
            # self-pipe and a concurrent Future each (about a quarter of the call's CPU).
            self._inbox.append((conn, spec, method, args, kwargs, sem))
            if not self._inbox_woken:
                self._inbox_woken = True
                self.inbox_wakes += 1
                try:
                    self._loop.call_soon_threadsafe(self._take_calls)
                except RuntimeError:  # the loop is closed: the process is ending
                    self._inbox_woken = False
        else:
            pool = self._group_pools[group] if group is not None else self._pool
            assert pool is not None
            # (in a list the call empties: the pool's work item would hold them to its end)
            pool.submit(self._run_threaded, conn, spec, method, [args, kwargs])

    def _take_calls(self) -> None:
        """Loop thread: start a task for each call in the inbox (after the flag is down,
        so that a call appended meanwhile wakes the loop again or is taken here)."""
        self._inbox_woken = False
        inbox = self._inbox
        create = self._loop.create_task  # type: ignore[union-attr]
        run = self._run_async
        while inbox:
            create(run(*inbox.popleft()))

    def _reply_soon(self, conn: Connection, reply: m.TaskReply) -> None:
        """Loop thread: send ``reply`` at the loop's next turn, with the other replies of
        calls that finish in this one (one write for them all, not one each)."""
        finished = self._finished
        finished.append((conn, reply))
        if len(finished) == 1:
            self._loop.call_soon(self._send_finished)  # type: ignore[union-attr]

    def _send_finished(self) -> None:
        finished, self._finished = self._finished, []
        conn = finished[0][0]
        if all(c is conn for c, _ in finished):
            self.cw.send_replies(conn, [r for _, r in finished])
            return
        by_conn: dict[Connection, list[m.TaskReply]] = {}
        for c, r in finished:
            by_conn.setdefault(c, []).append(r)
        for c, replies in by_conn.items():
            self.cw.send_replies(c, replies)

    async def _run_async(self, conn: Connection, spec: m.TaskSpec, method: Any, args: Any, kwargs: Any,
                         sem: asyncio.Semaphore | None) -> None:
        assert sem is not None
        me = asyncio.current_task()
        assert me is not None
        early = self.ex.cancelled_before_start(spec)  # cancelled between dispatch and now
        if early is not None:
            self.cw.send_reply(conn, early)
            return
        self._async_calls[spec.task_id] = me
        start = time.time()
        worker_context.current_call.set(spec)  # (this asyncio task's own context)
        try:
            async with sem:
                start = time.time()
                if spec.enable_task_events:
                    self.cw.record_running(spec.task_id, spec.attempt, start)
                result = method(*args, **kwargs)
                if spec.num_returns == -1:
                    reply = await self._stream_async(conn, spec, result, start)
                else:
                    # Only an async method's coroutine: a plain method may return an awaitable
                    # value (an ObjectRef) that the caller wants as it is.
                    if asyncio.iscoroutine(result):
                        result = await result
                    if me.cancelling():  # it caught the cancel and returned: cancelled still (as in Ray)
                        raise asyncio.CancelledError
                    reply = self.ex._success_reply(spec, result, start)
        except asyncio.CancelledError:
            reply = self.ex._system_reply(spec, "cancelled while running", m.ErrorKind.CANCELLED, start)
        except SystemExit as e:
            reply = self._exit_reply(spec, e, start)
            self.cw.send_reply(conn, reply)  # now: the process is leaving
            return
        except BaseException as e:  # KeyboardInterrupt too: it must not end the loop with the reply unsent
            reply = (self.ex._system_reply(spec, "cancelled while running", m.ErrorKind.CANCELLED, start)
                     if me.cancelling() else self.ex._failed_reply(spec, e, start))
        finally:
            self._async_calls.pop(spec.task_id, None)
        if spec.deps:
            args = kwargs = result = None  # (the call's own references to its arguments)
            self.ex.pin_kept_args(spec, reply)
        self._reply_soon(conn, reply)

    async def _stream_async(self, conn: Connection, spec: m.TaskSpec, result: Any, start: float) -> m.TaskReply:
        """A generator method of an async actor (``async def`` with ``yield``, or a plain
        generator): send each value as it comes, on the actor's loop."""
        if not hasattr(result, "__anext__"):
            return self._stream_sync(conn, spec, result, start)
        sent = 0
        try:
            async for value in result:
                self.ex.send_stream_item(conn, spec, sent, value)
                sent += 1
        except (Exception, KeyboardInterrupt) as e:
            return self.ex._failed_reply(spec, e, start, sent)
        return m.TaskReply(spec.task_id, [], False, False, self.ex._still_borrowed(), self.cw.worker_id,
                           start, time.time())

    def _stream_sync(self, conn: Connection, spec: m.TaskSpec, result: Any, start: float) -> m.TaskReply:
        """A plain generator method of a threaded or async actor: send each value as it comes."""
        sent = 0
        try:
            for value in result:
                self.ex.send_stream_item(conn, spec, sent, value)
                sent += 1
        except (Exception, KeyboardInterrupt) as e:
            return self.ex._failed_reply(spec, e, start, sent)
        return m.TaskReply(spec.task_id, [], False, False, self.ex._still_borrowed(), self.cw.worker_id,
                           start, time.time())

    def cancel_call(self, task_id: TaskID) -> bool:
        """Cancel a call running, or waiting its turn, on the event loop (any thread).
        False when this actor runs no such call."""
        task = self._async_calls.get(task_id)
        if task is None or self._loop is None:
            return False
        self._loop.call_soon_threadsafe(task.cancel)
        return True

    def _run_threaded(self, conn: Connection, spec: m.TaskSpec, method: Any, call_args: list[Any]) -> None:
        args, kwargs = call_args
        call_args.clear()
        result = None
        start = time.time()
        early = self.ex.cancelled_before_start(spec)  # cancelled while it waited for a thread
        if early is not None:
            self.cw.send_reply(conn, early)
            return
        me = threading.get_ident()
        self._thread_calls[me] = spec.task_id
        if spec.enable_task_events:
            self.cw.record_running(spec.task_id, spec.attempt, start)
        call = worker_context.current_call.set(spec)
        try:
            result = method(*args, **kwargs)
            if spec.num_returns == -1:
                reply = self._stream_sync(conn, spec, result, start)
            else:
                reply = self.ex._success_reply(spec, result, start)
        except SystemExit as e:
            reply = self._exit_reply(spec, e, start)
        except BaseException as e:  # KeyboardInterrupt too: the caller waits for this reply
            reply = self.ex._failed_reply(spec, e, start)
        finally:
            worker_context.current_call.reset(call)
            self._thread_calls.pop(me, None)
            self._cancelled_running.discard(spec.task_id)
        if spec.deps:
            args = kwargs = result = None  # (the call's own references to its arguments)
            self.ex.pin_kept_args(spec, reply)
        self.cw.send_reply(conn, reply)

    def cancel_threaded(self, task_id: TaskID) -> bool:
        """A threaded actor's running call: flag it, as Ray does (not interrupted). False
        when no pool thread runs it."""
        if task_id not in self._thread_calls.values():
            return False
        self._cancelled_running.add(task_id)
        return True

    def thread_call_canceled(self) -> bool | None:
        """For the calling pool thread: was its call cancelled? None off a pool thread."""
        task_id = self._thread_calls.get(threading.get_ident())
        return None if task_id is None else task_id in self._cancelled_running

    def _exit_reply(self, spec: m.TaskSpec, e: SystemExit, start: float) -> m.TaskReply:
        from lumos import exceptions as exc
        why = str(e) if isinstance(e, exc.ActorExitRequest) else "the actor called sys.exit()"
        self.exiting(why)
        return self.ex._system_reply(spec, why, m.ErrorKind.ACTOR_DIED, start)

    def exiting(self, reason: str) -> None:
        """Tell the GCS the actor ends on purpose (no restart), run the instance's
        ``__del__`` and the process's ``atexit`` handlers (the user's clean-up, as in Ray
        and a Python exit), then let the process go.

        What the actor printed and its task events leave before the GCS hears of it: the
        GCS then gives the worker's lease back, and its raylet kills the worker at once.
        Sent after, its last lines (a goodbye, what ``__del__`` printed) were lost."""
        _run_exit_handlers(EXIT_HANDLERS_TIMEOUT_S, self.instance)
        self._flush_and_wait(5.0)
        try:
            self.cw.call_gcs(m.ActorExiting(self.actor_id, reason), 5.0)
        except (ConnectionLost, TimeoutError, RemoteError) as e:
            logger.warning("could not tell the GCS the actor is exiting: %s", e)

        self._leave()

    def _flush_and_wait(self, timeout_s: float) -> None:
        """Send the buffered output and task events (io thread) and wait until they are
        handed to their connections, ahead of anything posted after this call."""
        done = threading.Event()

        def flush() -> None:
            try:
                self.cw._flush_events()
                self.ex.flush_output()
            finally:
                done.set()
        try:
            self.cw._post(flush)
        except RuntimeError:  # no io loop any more
            return
        done.wait(timeout_s)

    def stopped(self, reason: str) -> None:
        """Every handle went out of scope (the raylet's ``ExitWorker``; the GCS has marked
        the actor dead): run the same clean-up as ``exiting``, off the io thread, then go.
        The raylet kills the process if it is still there after its grace period."""
        def run() -> None:
            logger.info("actor exits: %s", reason)
            _run_exit_handlers(EXIT_HANDLERS_TIMEOUT_S, self.instance)
            self._leave()
        threading.Thread(target=run, name="lumos-actor-exit", daemon=True).start()

    def _leave(self) -> None:
        def leave() -> None:
            assert self.cw.loop is not None
            self.cw._flush_events()
            self.ex.flush_output()
            self.cw.loop.call_later(0.05, os._exit, 0)
        self.cw._post(leave)


#: How long an actor that exits on purpose gives its ``atexit`` handlers.
EXIT_HANDLERS_TIMEOUT_S = 10.0


def _run_exit_handlers(timeout_s: float, instance: Any = None) -> None:
    """Run the actor instance's ``__ray_shutdown__`` (as Ray does when an actor ends
    gracefully; ``__lumos_shutdown__`` too) and ``__del__``, then the ``atexit`` handlers,
    within ``timeout_s`` (the process then ends with ``os._exit``, which skips them; one
    that hangs must not keep the actor up). ``__del__`` is called here, once: the instance
    is still referenced (by the frames of the call that ended the actor), and ``os._exit``
    never finalizes it."""
    def run() -> None:
        for name in ("__ray_shutdown__", "__lumos_shutdown__"):
            shutdown = getattr(instance, name, None) if instance is not None else None
            if callable(shutdown):
                try:
                    out = shutdown()
                    if inspect.iscoroutine(out):
                        asyncio.run(out)
                except Exception:
                    sys.stderr.write(f"Exception ignored in: {shutdown!r}\n")
                    traceback.print_exc()
                break
        finalize = getattr(type(instance), "__del__", None) if instance is not None else None
        if finalize is not None:
            try:
                finalize(instance)
            except Exception:
                # As Python reports an error in __del__: printed, not raised.
                sys.stderr.write(f"Exception ignored in: {finalize!r}\n")
                traceback.print_exc()
        atexit._run_exitfuncs()

    t = threading.Thread(target=run, name="lumos-atexit", daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        logger.warning("atexit handlers still running after %gs; exiting without them", timeout_s)


__all__ = ["ActorHost", "is_async_class"]
