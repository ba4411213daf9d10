"""The executing side of a worker: runs pushed tasks on the main thread.

The io thread hands each ``PushTask`` to ``push`` (a lock-free queue put); the main
thread takes it, loads the function (from the GCS, once per function), resolves the
arguments (inline values, zero-copy views of the local store, or a fetch from the
owner), runs the user's code, stores the results (inline or in the store), and hands
the ``TaskReply`` back to the io thread. User code runs on the main thread so that
signals (cancel) reach it and so that it may block freely.

A sync task's round trip skips the hand-off: while the main thread is idle it reads the
next task from the connection the last ones came on itself (``_read_task``, through the
connection's ``SharedReader``) and gives the reading back to the io thread before it runs
the task, so a cancel, a borrower's message or an owner's request that arrives meanwhile
is handled at once, as before. Only tasks and a sync actor's calls come this way; a
burst (several frames in one read), a task on another connection, a threaded or async
actor's calls take the queue::

 owner ──PushTask──► socket ──► main thread (idle, reading) ─► run ─► reply ─► owner
                        └─────► io thread (while a task runs) ─► push ─► queue ─► main thread

Argument resolution and return values live in ``arguments.py`` (``ArgumentsMixin``).

Worker output (``print``, stderr) is captured per line, tagged with the running task,
and sent to the raylet in batches; the driver prints it with a ``(name pid=N)`` prefix.
"""

from __future__ import annotations

import functools
import inspect
import io
import json
import logging
import os
import pickle
import queue
import select
import signal
import sys
import threading
import time
import traceback
import zipfile
from typing import Any

from lumos import exceptions as exc
from lumos._private import interrupts, process, worker_context
from lumos._private import serialization as ser
from lumos._private import thread_limits
from lumos._private.core_worker.actor_host import ActorHost
from lumos._private.core_worker.core_worker import CoreWorker, well_formed_push
from lumos._private.core_worker.driver import code_env
from lumos._private.core_worker.arguments import ArgumentsMixin, _TaskFailed
from lumos._private.object_store.client import SPARE_IDLE_S  # an idle worker keeps spares this long
from lumos._private.process import yield_cpu
from lumos._private.protocol import messages as m
from lumos._private.transport.connection import Connection, ConnectionLost, RemoteError, SharedReader
from lumos._private.worker import CREATION_PRELOAD
from lumos._private.ids import JobID, TaskID

logger = logging.getLogger(__name__)

#: A task's error larger than this, pickled, is cut (``_task_error_blob``).
MAX_ERROR_BYTES = 4 * 1024 * 1024
_ERROR_KEPT_CHARS = 64 * 1024


class _Cancelled(Exception):
    pass


#: Tasks in a row pushed on other connections after which the main thread reads its
#: next task from the newest one instead of the lead's (``Executor._maybe_lead``).
LEAD_SWITCH_AFTER = 16
#: Replies of a sync actor's calls that may be held while more calls wait: they leave
#: with the next one (``CoreWorker.send_reply``).
ACTOR_REPLY_HOLD = 16


#: Bytes the main thread reads at a time from its lead connection where malloc's heap
#: serves a buffer that large (``tune_malloc``): a call with a 64 KiB argument is one
#: read, not two and a join, and a burst of them fewer reads (serving's large requests,
#: 16 in flight: ~5,700 -> ~6,200/s).
LEAD_READ_BYTES = 256 * 1024


def _lead_read_bytes() -> int:
    return LEAD_READ_BYTES if process.malloc_mmap_threshold() >= 2 * LEAD_READ_BYTES else 0


class Executor(ArgumentsMixin):
    def __init__(self, cw: CoreWorker) -> None:
        self.cw = cw
        self.queue: queue.SimpleQueue[tuple[Connection, m.PushTask] | None] = queue.SimpleQueue()
        #: Function id -> the user's function (or class).
        self.functions: dict[bytes, Any] = {}
        self._jobs_bound: set[bytes] = set()
        #: What the GCS sent along with an actor's creation task (``CREATION_PRELOAD``):
        #: job id -> job config, function id -> pickled class; each used once, instead
        #: of a request to the GCS.
        self._preloaded_jobs: dict[bytes, bytes] = {}
        self._preloaded_functions: dict[bytes, bytes] = {}
        #: Job id -> the job's environment variables (``init(runtime_env=...)``).
        self._job_env: dict[bytes, dict[str, str]] = {}
        #: Per job: its working_dir and py_modules URIs (``runtime_context.runtime_env``).
        self._job_code_env: dict[bytes, dict[str, Any]] = {}
        #: The running task's native thread-pool sizes to restore (when its env sets them).
        self._thread_limits: thread_limits.Limits | None = None
        #: Task ids cancelled before they started.
        self._cancelled: set[bytes] = set()
        self._running: m.TaskSpec | None = None
        self._running_root: bytes | None = None
        self._cancel_requested: bytes | None = None
        #: Guards the start of a task (``_running`` set, ``_cancelled`` checked) against
        #: ``cancel`` on the io thread: a cancel between the two would otherwise be lost.
        self._start_lock = threading.Lock()
        #: The task id ``cancel`` last sent SIGINT for; the task the handler raised in.
        self._signalled: bytes | None = None
        self._interrupted: bytes | None = None
        #: The main thread runs the task's own part (its arguments, its code, its returns):
        #: only there does SIGINT raise. Landing in lumos's part around it (the task set up
        #: or taken down), it is held in ``_held_sigint`` and raised as the task's part
        #: begins; raised there, the ``KeyboardInterrupt`` escaped ``execute`` and the
        #: task's reply was never sent (its ``get`` waited for ever).
        self._armed = False
        self._held_sigint: bytes | None = None
        self._in_args = False
        #: Borrowed refs deserialized from this task's arguments.
        self._arg_borrowed: list[tuple[bytes, m.Address]] = []
        self._main_ident = threading.get_ident()
        self._output: list[list[Any]] = []
        self._output_lock = threading.Lock()
        #: The write end of the pipe forked children print to (``open_child_output``).
        self.child_output_fd = -1
        #: Its read end (a child closes it: were the worker gone, a child holding it would
        #: block on a full pipe instead of getting EPIPE).
        self.child_output_read_fd = -1
        #: The io thread's unfinished record from the read end.
        self._child_partial = b""
        #: Child pid -> ``[job id, task id, task name, root task id]`` of the task running
        #: when it was forked (its first record says): its lines are that task's.
        self._child_tasks: dict[int, list[Any]] = {}
        #: (child pid, stderr) -> the start of a line longer than a record, until its end.
        self._child_long: dict[tuple[int, bool], bytes] = {}
        self._gpu_ids_visible = _visible_gpus()
        self._original_cuda = os.environ.get("CUDA_VISIBLE_DEVICES")
        #: The actor this worker hosts, once its creation task ran.
        self.actor: ActorHost | None = None
        #: This actor was restarted (its creation is not the first): Ray's was_current_actor_reconstructed.
        self.actor_restarted = False
        #: The namespace of the job that created the actor hosted here: the actor's, whichever
        #: job's call it runs (as in Ray).
        self._actor_namespace: str | None = None
        self._actor_job: JobID | None = None  # (the job that created this worker's actor, once it is made)
        #: The connection the running task came on (streaming items go back on it).
        self._conn: Connection | None = None
        #: Items the running streaming generator task has sent so far.
        self._streamed = 0
        #: Function id -> tasks of it run here, for functions with ``max_calls``.
        self._calls: dict[bytes, int] = {}
        #: The connection whose next ``PushTask`` the main thread reads itself while idle
        #: (``_read_task``): the one tasks came on last; None when there is none.
        self._lead: SharedReader | None = None
        #: Tasks pushed in a row on other connections than the lead's (``_maybe_lead``).
        self._elsewhere = 0
        #: The main thread waits in ``_read_task``: ``push`` wakes it through the pipe.
        self._parked = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        #: ``select.poll`` over the wake pipe and ``_poller_lead``'s socket (``_read_task``).
        self._poller: Any = None
        self._poller_lead: SharedReader | None = None
        #: How long ``_read_task`` reads without sleeping after a reply (``worker_spin_us``),
        #: and whether it does this time: the last spin caught a task, or the last task
        #: came within that time of the reply before it (a spin would have caught it).
        self._spin_s = cw.config.worker_spin_us / 1e6
        self._spin_pays = True
        #: The lead whose reading this thread took before its last reply (``_take_lead_early``).
        self._holding: SharedReader | None = None
        #: The running task came through this thread's own read (``_read_task``).
        self.read_itself = False
        #: The running task's unmaps are deferred (it has store arguments): the main loop
        #: unmaps after its reply.
        self._deferred = False
        #: ``run`` ended for a function's ``max_calls``: ``drain_owned`` before exiting.
        self.drain_before_exit = False
        #: This worker exits after its current task (a function's ``max_calls`` reached, or
        #: the task called ``sys.exit()``): it answers what is queued with "requeue".
        self._exiting = False
        #: The pending look at the queue (``_watch_queue``), and how long a task may run
        #: with others queued behind it before they go back to their owners: ten times the
        #: run time below which owners pipeline tasks at all.
        self._queue_check: Any = None
        self._requeue_after_s = max(0.02, 10 * cw.config.pipeline_below_ms / 1000)
        #: Replies held while more tasks are queued (``CoreWorker.send_reply``): they leave
        #: with the next one, half the owner's pipeline depth in all, which is when the
        #: owner sends more (``TaskSubmitterState.pump``), while half of it still waits
        #: here (holding half the depth, the owner sent more only once this queue ran
        #: dry). An actor's caller does not wait for replies before sending more calls:
        #: ``ACTOR_REPLY_HOLD``.
        self._reply_hold = max(1, cw.config.max_tasks_in_flight_per_worker // 2 - 1)

    def close_wake_pipe(self) -> None:
        """Close the wake pipe of an executor that will never run (the fork server's
        rehearsal, ``worker.main.rehearse``)."""
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass

    # ------------------------------------------------------------------ io thread side

    def push(self, conn: Connection, msg: m.PushTask) -> None:
        if self._exiting:
            conn.notify(self._system_reply(msg.spec, "requeued: the worker is exiting",
                                           m.ErrorKind.REQUEUE))
            return
        if self.cw._blocked_depth > 0 and self.actor is None and msg.spec.kind == m.TaskKind.NORMAL_TASK:
            # The running task waits in get(): this one would wait behind it, maybe for ever.
            conn.notify(self._system_reply(msg.spec, "requeued: the worker blocked", m.ErrorKind.REQUEUE))
            return
        self.queue.put((conn, msg))
        if self._parked:
            self._wake()
        if self._queue_check is None and self.actor is None:
            self._watch_queue()
        lead = self._lead
        if lead is not None and lead.conn is conn:
            self._elsewhere = 0
        else:
            self._maybe_lead(conn, msg.spec)

    def _wake(self) -> None:
        """Any thread: end the main thread's wait in ``_read_task``."""
        try:
            os.write(self._wake_w, b"\0")
        except BlockingIOError:
            pass  # a wake-up is pending already

    def _maybe_lead(self, conn: Connection, spec: m.TaskSpec) -> None:
        """Io thread: let the main thread read its next task from ``conn`` itself while
        idle (sync tasks and a sync actor's calls; a threaded or async actor's main thread
        only dispatches). A lead that goes quiet gives way after ``LEAD_SWITCH_AFTER``
        tasks in a row came on other connections (an actor with several callers keeps one)."""
        actor = self.actor
        if not (spec.kind == m.TaskKind.NORMAL_TASK and actor is None
                or spec.kind == m.TaskKind.ACTOR_TASK and actor is not None and not actor.concurrent) \
                or not conn.direct_writes:
            return
        lead = self._lead
        if lead is not None and not lead.detached:
            self._elsewhere += 1
            if self._elsewhere < LEAD_SWITCH_AFTER:
                return
            lead.detach()
        self._elsewhere = 0
        self._lead = conn.share_reading(self._wake, _lead_read_bytes())

    def cancel(self, task_id: TaskID, force: bool, recursive: bool) -> None:
        with self._start_lock:
            running = self._running
            if running is not None and running.task_id == task_id:
                self._cancel_requested = task_id
                if running.kind == m.TaskKind.NORMAL_TASK:
                    self._signal(task_id)
                # An actor's running method is not interrupted (as in Ray: it would leave the
                # actor's state half-changed); it can poll get_runtime_context().is_canceled().
            elif self.actor is not None and (self.actor.cancel_call(task_id) or self.actor.cancel_threaded(task_id)):
                pass
            else:
                self._cancelled.add(task_id)
                return
        if recursive:
            self.cw.cancel_children(task_id, force)

    def interrupt_cancels_awaited(self) -> bool:
        """Whether the interrupt now raised in the running task's get() or wait() cancels the
        tasks it waits for: yes for a SIGINT, not for a cancel, whose ``recursive`` decides
        for the task's children (``cancel`` above cancels them, or, as Ray, lets them run)."""
        running = self._running
        return not (running is not None and self._cancel_requested == running.task_id)

    def _watch_queue(self) -> None:
        """io thread: look again in ``_requeue_after_s`` at the tasks queued here
        (``_requeue_if_stuck``), noting the task running now."""
        running = self._running
        loop = self.cw.loop
        if loop is not None:
            self._queue_check = loop.call_later(self._requeue_after_s, self._requeue_if_stuck,
                                                running.task_id if running is not None else None)

    def _requeue_if_stuck(self, task_id: TaskID | None) -> None:
        """io thread: when the task that ran at the last look runs still, the tasks its
        owner pipelined behind it have waited all that time: hand them back (owners run
        them on other workers; 399 short tasks queued with one 5 s task all waited the 5 s).
        Otherwise look again while any wait."""
        self._queue_check = None
        if self.queue.empty() or self.actor is not None:
            return
        running = self._running
        if task_id is not None and running is not None and running.task_id == task_id:
            self.requeue_waiting("requeued: queued behind a long task")
        else:
            self._watch_queue()

    def requeue_waiting(self, why: str = "requeued: the worker blocked") -> None:
        """The running task blocks in get() (or runs long): hand the tasks queued behind
        it back to their owners, which run them elsewhere (one of them may be what the
        running task waits for). Actor calls stay: their order matters and the actor is
        theirs alone."""
        if self.actor is not None:
            return
        keep: list[Any] = []
        while True:
            try:
                item = self.queue.get_nowait()
            except queue.Empty:
                break
            if item is None or item[1].spec.kind != m.TaskKind.NORMAL_TASK:
                keep.append(item)
                continue
            conn, msg = item
            self.cw.send_reply(conn, self._system_reply(msg.spec, why, m.ErrorKind.REQUEUE))
        for item in keep:
            self.queue.put(item)

    def cancelled_before_start(self, spec: m.TaskSpec) -> m.TaskReply | None:
        """The reply for a task or call that cancel() reached before it started (it never
        runs), or None (any thread that is about to start it)."""
        if spec.task_id not in self._cancelled:
            return None
        self._cancelled.discard(spec.task_id)
        return self._system_reply(spec, "cancelled before it started", m.ErrorKind.CANCELLED)

    def running_task(self) -> bool:
        return self._running is not None

    def busy(self) -> bool:
        """A task runs or waits in the queue (what the raylet asks before it takes back the
        worker of a frozen owner's lease)."""
        return self._running is not None or not self.queue.empty()

    def task_owner_conn(self) -> Connection | None:
        """The connection the running task came on from its owner, when it is a task on
        a lease (not an actor's call); None otherwise."""
        running = self._running
        if running is None or running.kind != m.TaskKind.NORMAL_TASK or self.actor is not None:
            return None
        return self._conn

    def is_canceled(self) -> bool | None:
        """cancel() was called on the task or actor call this thread runs; None when this
        thread runs none (an async actor's loop, a thread of the user's)."""
        if threading.get_ident() == self._main_ident:
            running = self._running
            return None if running is None else self._cancel_requested == running.task_id
        return self.actor.thread_call_canceled() if self.actor is not None else None

    def current_root_task_id(self) -> bytes | None:
        return self._running_root

    def deserializing_args(self) -> bool:
        return self._in_args and threading.get_ident() == self._main_ident

    # ------------------------------------------------------------------ main loop

    def _on_sigint(self, signum: int, frame: Any) -> None:
        """SIGINT interrupts a running task only, and once: a signal that lands after its
        task ended would otherwise break the main thread out of reading the next task's
        frame or sending a reply, and a cancel's signal for a task that ended meanwhile
        must not interrupt the next one. A SIGINT nobody's ``cancel`` sent (``kill -INT``)
        interrupts the running task, which fails with a ``TaskCancelledError`` (as in Ray)."""
        interrupts.noted()
        running = self._running
        if running is None or self._interrupted == running.task_id:
            return
        target, self._signalled = self._signalled, None
        if target is not None and target != running.task_id:
            return
        if self._armed and not interrupts.held() and interrupts.in_finalizer(frame) \
                and interrupts.resend_later(functools.partial(self._send_sigint_again, running.task_id)):
            return  # (raised in a finalizer, it would only be printed: sent again after it)
        self._interrupted = running.task_id
        if not self._armed:
            self._held_sigint = running.task_id  # (raised by _arm, or moot: the task's part is over)
            return
        if interrupts.held():  # the task is inside a put or a .remote(): raised once that is whole
            interrupts.defer()
            return
        interrupts.leaving()
        raise KeyboardInterrupt

    def _send_sigint_again(self, task_id: bytes) -> bool:
        """(io thread) The SIGINT that landed in a finalizer during task ``task_id``,
        again, while that task still runs and was not interrupted since."""
        with self._start_lock:
            running = self._running
            if running is None or running.task_id != task_id or self._interrupted == task_id:
                return False
            self._signal(task_id)
            return True

    def _signal(self, task_id: bytes) -> None:
        """(under ``_start_lock``, ``task_id`` running) SIGINT to the main thread, marked
        as meant for ``task_id``."""
        self._signalled = task_id
        signal.pthread_kill(self._main_ident, signal.SIGINT)

    def _arm(self, task_id: bytes) -> None:
        """Main thread, as the task's own part begins: SIGINT raises from now on, and one
        that landed since the task was marked running raises now."""
        self._armed = True
        if self._held_sigint is not None:
            held, self._held_sigint = self._held_sigint, None
            if held == task_id:
                raise KeyboardInterrupt

    def run(self) -> None:
        current = signal.getsignal(signal.SIGINT)
        if threading.get_ident() == self._main_ident and (
                current is signal.default_int_handler or interrupts.is_ours(current)):  # (a hold installed it first)
            handler = self._on_sigint  # (one bound method: holds know it by identity)
            signal.signal(signal.SIGINT, handler)
            interrupts.cooperate(handler)
        while True:
            item = None  # (an error in _next_task must not answer the previous task again)
            try:
                item = self._next_task()
                if item is None:
                    return
                if not self._run_one(*item):
                    return
            except KeyboardInterrupt:
                continue  # a cancel that arrived after its task finished
            except Exception as e:
                # A malformed task from a peer (or a failure in lumos's own handling of one)
                # must not end this worker; the owner gets a system error for the task.
                logger.exception("could not run a pushed task")
                spec = getattr(item[1], "spec", None) if item is not None else None
                if isinstance(spec, m.TaskSpec) and isinstance(spec.task_id, bytes):
                    try:
                        text = f"the worker could not run this task: {type(e).__name__}: {e}"
                    except Exception:
                        text = f"the worker could not run this task: {type(e).__name__}"
                    try:
                        self.cw.send_reply(item[0], self._system_reply(spec, text, None))
                    except Exception:
                        logger.exception("could not answer a malformed task")
            finally:
                store = self.cw.store
                if self._deferred or store.has_spares():
                    self._deferred = False
                    store.unmap_deferred()  # after the reply: what the task's views left

    def _next_task(self) -> tuple[Connection, m.PushTask] | None:
        """The next pushed task; spare argument mappings (``StoreClient.keep_spare``) are
        dropped once this worker has waited ``SPARE_IDLE_S`` for one, so an idle worker
        holds no store pages and takes no further wake-ups."""
        lead = self._lead
        held, self._holding = self._holding, None
        if held is not None and (held is not lead or held.detached):
            held.release()
            held = None
        if lead is not None and lead.detached:
            self._lead = lead = None
        if lead is not None and held is None:
            actor = self.actor
            if (actor is None or not actor.concurrent) and not self._exiting and self.queue.empty() and lead.take():
                held = lead
        if held is not None:
            try:
                item = self._read_task(held)
            finally:
                held.release()  # the io thread reads what comes while the task runs
            if item is not None:
                self.read_itself = True
                return item
        self.read_itself = False
        store = self.cw.store
        if store.has_spares():
            try:
                return self.queue.get(timeout=SPARE_IDLE_S)
            except queue.Empty:
                store.drop_spares()
        return self.queue.get()

    def _read_task(self, lead: SharedReader) -> tuple[Connection, m.PushTask] | None:
        """Main thread, holding ``lead``'s reading: wait for the next frame and return it
        when it is one task this thread may run (no io-thread hand-off: wake-up 2 of a sync
        call is gone). None when something else needs the queue's path: a task pushed on
        another connection, several frames with a task among them (the io thread handles
        them, in order), the connection's end. Frames without a task go to the io thread
        while this thread reads on.

        The first ``worker_spin_us`` after a reply it reads without sleeping, yielding the
        CPU between reads (the spin). A caller in a loop of sync calls sends its next task
        within ~100 us of its last reply; caught awake, the write that sends it wakes no
        sleeping thread (on a virtual machine, waking a thread asleep on another core costs
        its writer ~10 us and the round trip ~20 us more) and this thread needs no wake-up:
        a sync round trip went from ~190 to ~120 us. After a spin that missed, it spins
        again only once a task comes within the spin's time after all (``_spin_pays``): a
        worker whose tasks come further apart (one of several a caller takes turns with)
        does not burn a core on spins that miss. Nor does it spin after a task that came
        through the queue (``read_itself`` False: it came while this thread ran the one
        before): its caller has several in flight and gathers their results before it
        sends more, and a spin there took a core from that caller (2-core serving burst,
        16 calls in flight: ~5,300 -> ~5,600 requests/s, the slow runs gone)."""
        poller = self._poller
        if self._poller_lead is not lead:
            poller = self._poller = select.poll()
            poller.register(self._wake_r, select.POLLIN)
            poller.register(lead.fd, select.POLLIN)
            self._poller_lead = lead
        self._parked = True
        started = time.monotonic()
        # (Only after a task this thread read itself: see above.)
        spin_until = started + self._spin_s if self._spin_pays and self._spin_s and self.read_itself else 0.0
        try:
            while True:
                if lead.detached or not self.queue.empty():
                    return None
                if spin_until and time.monotonic() >= spin_until:
                    spin_until = 0.0  # nothing came in time: sleep from now on
                    self._spin_pays = False
                if not spin_until and not self._wait_readable(poller):
                    continue
                frames = lead.read_frames()
                if frames is None:
                    return None
                if not frames:
                    if spin_until:
                        yield_cpu()
                    continue
                item = self._own_tasks(lead.conn, frames)
                if item is not None:
                    if not spin_until:  # (caught asleep: would a spin have caught it?)
                        self._spin_pays = time.monotonic() - started <= self._spin_s
                    return item
                lead.hand_to_loop(frames)
                if len(frames) > 1:
                    return None  # maybe tasks among them: they come through the queue
        finally:
            self._parked = False

    def _wait_readable(self, poller: Any) -> bool:
        """``_read_task`` asleep: wait in ``poll`` for the lead's socket or the wake pipe
        (emptied here); True when the socket is readable. Spare argument mappings are
        dropped once it has waited ``SPARE_IDLE_S``."""
        store = self.cw.store
        events = poller.poll(SPARE_IDLE_S * 1000 if store.has_spares() else None)
        if not events:
            store.drop_spares()
            return False
        readable = False
        for fd, _ in events:
            if fd == self._wake_r:
                try:
                    os.read(self._wake_r, 4096)
                except BlockingIOError:
                    pass
            else:
                readable = True
        return readable

    def _own_tasks(self, conn: Connection, frames: list[bytes]) -> tuple[Connection, m.PushTask] | None:
        """The first of the tasks ``frames`` are, when every one is a task this thread may
        run; the others it queues itself (``_queue_read``). None when any frame is not:
        then the io thread handles them all, in order, as it does what it reads."""
        if self._exiting:
            return None
        tasks = []
        for frame in frames:
            task = self._runnable(frame)
            if task is None:
                return None
            tasks.append((conn, task))
        self._elsewhere = 0
        if len(tasks) > 1:
            self._queue_read(tasks[1:])
        return tasks[0]

    def _runnable(self, frame: bytes) -> m.PushTask | None:
        """The task ``frame`` is, when it is one this thread may run."""
        try:
            kind, _rid, body = m.decode(frame)
        except Exception:  # malformed: the io thread decodes it again, logs and drops the connection
            return None
        if kind != m.NOTIFY or type(body) is not m.PushTask or not well_formed_push(body):
            return None
        actor = self.actor
        task_kind = body.spec.kind
        if actor is None:
            if task_kind != m.TaskKind.NORMAL_TASK:
                return None
        elif task_kind != m.TaskKind.ACTOR_TASK or actor.concurrent:
            return None
        return body

    def _queue_read(self, items: list[tuple[Connection, m.PushTask]]) -> None:
        """Main thread: queue tasks it read behind the one it runs now, as ``push`` does
        for the io thread's. A burst comes a few pushes to a write; handed to the io
        thread, each write cost two wake-ups across threads (the io thread's, then this
        thread's in ``queue.get``). The queue's watch (``_watch_queue``) is armed on the io
        thread, woken for it only while none is pending (straight to the loop: through
        the inbox the io thread would look busy, and replies would take its path)."""
        put = self.queue.put
        for item in items:
            put(item)
        # (after the puts: a look that found the queue empty and ended sees them)
        if self._queue_check is None and self.actor is None:
            try:
                self.cw.loop.call_soon_threadsafe(self._arm_queue_watch)  # type: ignore[union-attr]
            except (AttributeError, RuntimeError):  # no loop any more: the process is ending
                pass

    def _arm_queue_watch(self) -> None:
        if self._queue_check is None and not self.queue.empty():
            self._watch_queue()

    def _run_one(self, conn: Connection, msg: m.PushTask) -> bool:
        """Run one pushed task and send its reply; False once this worker must exit. Store
        mappings whose last view goes meanwhile (the arguments', as ``execute`` returns) are
        unmapped by the caller after the reply went out: unmapping 16 MiB takes 2.5 ms."""
        actor = self.actor
        if actor is not None and msg.spec.kind == m.TaskKind.ACTOR_TASK:
            if actor.concurrent:
                actor.dispatch(conn, msg)
                return True
            self._conn = conn
            deps = self._deferred = bool(msg.spec.deps)
            if deps:
                self._hold_arg_pins()
            reply = self.execute(msg)
            if deps:
                self._pin_escaped_args()
                self.note_kept(msg.spec, reply)
            if self.actor is actor:
                self._take_lead_early(conn)
                actor.after_call(conn, reply, ACTOR_REPLY_HOLD if not self.queue.empty() else 0)
            else:
                self.cw.send_reply(conn, reply)
        else:
            self._conn = conn
            # Only store arguments (deps) make views to hold pins for and unmaps to defer:
            # a task with inline arguments skips both (two locked calls per task).
            deps = self._deferred = bool(msg.spec.deps)
            if deps:
                self._hold_arg_pins()
            reply = self.execute(msg)
            if deps:
                self._pin_escaped_args()
                self.note_kept(msg.spec, reply)
            if reply.error_kind == m.ErrorKind.EXITING or (
                    msg.spec.max_calls > 0 and self.actor is None and self._count_call(msg.spec)):
                # (max_calls: the objects it made and others still hold outlive the task)
                self.drain_before_exit = reply.error_kind != m.ErrorKind.EXITING
                reply.error_kind = m.ErrorKind.EXITING
                self.cw.send_reply(conn, reply)
                self._exit_after_this_task()
                return False
            self._take_lead_early(conn)
            self.cw.send_reply(conn, reply, self._reply_hold if not self.queue.empty() else 0)
        self.flush_output_soon()
        return True

    def _take_lead_early(self, conn: Connection) -> None:
        """Before a reply on the lead's connection: take its reading now, so that the next
        task, which the owner may send the moment the reply lands, finds this thread
        reading (taken after the reply, a third of them found the io thread still holding
        it: this thread is often preempted by the very wake-up its reply causes)."""
        lead = self._lead
        if lead is not None and lead.conn is conn and not self._exiting and self.queue.empty():
            actor = self.actor
            # (not before a checkpoint: the io thread must read what comes meanwhile)
            if (actor is None or not (actor.concurrent or actor.checkpointing)) and lead.take():
                self._holding = lead

    def _count_call(self, spec: m.TaskSpec) -> bool:
        """Count a run of a ``max_calls`` function; True once this worker must exit."""
        n = self._calls.get(spec.function_id, 0) + 1
        self._calls[spec.function_id] = n
        return n >= spec.max_calls

    def drain_owned(self, poll_s: float = 0.05) -> None:
        """Main thread, ``run`` ended after a function's ``max_calls``: wait while this
        process owns objects that others still reference (a ``put`` inside the task whose
        ref it returned, a dynamic generator's values, subtasks' results), as Ray's workers
        drain before they exit. Ending now would lose them (``OwnerDiedError`` at their
        readers'): a GPU task's ``max_calls`` is 1 by default. The worker takes no more
        tasks, and its lease, with its CPUs and GPUs, went back to the node with the
        reply (``TaskSubmitterState.after_reply``); it leaves when the last reference
        goes, or when its job ends or the raylet asks."""
        if not self.drain_before_exit:
            return
        cw = self.cw
        cw.drain_refs()
        owned = cw.objects.stats()["owned"]
        if owned:
            logger.info("exiting after max_calls once the %d object(s) this worker owns are out of scope", owned)
        while owned:
            time.sleep(poll_s)
            cw.drain_refs()
            owned = cw.objects.stats()["owned"]

    def _exit_after_this_task(self) -> None:
        """Main thread: stop taking tasks; the caller returns from ``run`` and the process
        exits once the io thread has handed the queued tasks back."""
        self.flush_output_soon()
        self.cw._post(self._refuse_queued)

    def _refuse_queued(self) -> None:
        """Io thread (where ``push`` runs, so none slips past): answer every queued task
        "requeue"; their owners run them elsewhere without using a retry."""
        self._exiting = True
        while True:
            try:
                item = self.queue.get_nowait()
            except queue.Empty:
                return
            if item is not None:
                conn, msg = item
                conn.notify(self._system_reply(msg.spec, "requeued: the worker is exiting",
                                               m.ErrorKind.REQUEUE))

    def flush_output_soon(self) -> None:
        if self._output:
            self.cw._post(self.flush_output)

    def execute(self, msg: m.PushTask) -> m.TaskReply:
        spec = msg.spec
        cw = self.cw
        start = time.time()
        if spec.kind == m.TaskKind.ACTOR_CREATION_TASK and isinstance(spec.actor_options, dict):
            self._take_preload(spec)
        try:
            self._bind_job(spec.job_id if self._actor_job is None else self._actor_job)
        except (exc.LumosSystemError, exc.RuntimeEnvSetupError) as e:
            return m.TaskReply(spec.task_id, self._error_returns(spec, self._task_error_blob(spec, e)), True, False,
                               [], cw.worker_id, start, time.time())
        with self._start_lock:
            early = self.cancelled_before_start(spec)
            if early is not None:
                return early
            self._cancel_requested = None
            self._interrupted = self._held_sigint = None  # (a retry runs under the same task id)
            self._running = spec
        self._running_root = spec.root_task_id
        cw.current_task_id = spec.task_id
        strategy = self.actor.strategy if self.actor is not None else spec.strategy
        cw.capture_strategy = None if strategy is None else captured_strategy(strategy)
        cw.current_task_name = spec.name
        cw.current_resource_ids = msg.resource_ids if self.actor is None else self.actor.resource_ids
        cw._put_counter = 0
        if spec.enable_task_events:
            cw.record_running(spec.task_id, spec.attempt, start)
        if msg.resource_ids:
            self._set_gpus(msg.resource_ids)
        self._arg_borrowed = []
        app_error = False
        retryable = False
        saved_env = None
        try:
            try:
                self._arm(spec.task_id)
                if spec.kind != m.TaskKind.ACTOR_TASK and (spec.runtime_env or spec.job_id in self._job_env
                                                           or thread_limits.for_task(spec.resources)):
                    saved_env = self._apply_env(spec)
                fn = self._function(spec)
                args, kwargs = self._resolve_args(spec)
                self._streamed = 0
                if spec.kind == m.TaskKind.ACTOR_CREATION_TASK:
                    result = self._create_actor(spec, fn, args, kwargs, msg.resource_ids)
                else:
                    result = fn(*args, **kwargs)
                if spec.num_returns == -1:
                    returns = self._stream_returns(spec, result)
                if self._cancel_requested == spec.task_id and spec.kind == m.TaskKind.NORMAL_TASK:
                    raise KeyboardInterrupt  # (an actor's call that finished despite a cancel counts)
                if spec.num_returns != -1:
                    returns = self._store_returns(spec, result)
            except KeyboardInterrupt as ki:
                if self._cancel_requested == spec.task_id:
                    return self._system_reply(spec, "cancelled while running", m.ErrorKind.CANCELLED, start)
                # Not a cancel: the task raised it, or someone sent the worker SIGINT. It fails
                # like any task that raised (below: its reply must go out, the owner waits for
                # it), as a TaskCancelledError, as in Ray: a KeyboardInterrupt reaching the
                # driver would read as its own Ctrl-C (an `except KeyboardInterrupt` loop guard
                # there, or the notebook, would take it for the user's stop).
                cancelled = exc.TaskCancelledError(spec.task_id.hex(), "it raised KeyboardInterrupt (its own "
                                                   "raise, or a SIGINT sent to its worker)")
                raise _TaskFailed(self._task_error_blob(spec, ki, cause=cancelled), None) from None
            finally:
                self._armed = False
        except _NotHere as e:
            return self._system_reply(spec, str(e), m.ErrorKind.ACTOR_DIED, start)
        except SystemExit as e:
            if spec.kind == m.TaskKind.NORMAL_TASK and self.actor is None:
                # The task ends its worker on purpose: say so (the raylet's report would
                # only show the kill that follows a worker's disconnect), and do not run it
                # again, since it would end another worker each time.
                return self._system_reply(
                    spec, f"the task called sys.exit({e.code!r}), which ends the worker that runs it "
                    "(not retried: it would end a worker each time)", m.ErrorKind.EXITING, start)
            if spec.kind != m.TaskKind.ACTOR_TASK or self.actor is None:
                raise
            why = str(e) if isinstance(e, exc.ActorExitRequest) else "the actor called sys.exit()"
            self.actor.exiting(why)
            return self._system_reply(spec, why, m.ErrorKind.ACTOR_DIED, start)
        except _TaskFailed as failed:
            app_error = True
            retryable = self._is_retryable(spec, failed.cause)
            returns = self._error_returns(spec, failed.blob, first=failed.stored)
        except BaseException as e:  # KeyboardInterrupt and a user's own BaseException subclasses too
            app_error = True
            retryable = self._is_retryable(spec, e)
            returns = self._error_returns(spec, self._task_error_blob(spec, e))
        finally:
            self._running = None
            self._running_root = None
            self._restore_gpus()
            if self.actor is None:
                cw.capture_strategy = None
                if saved_env is not None:  # an actor keeps its environment for its lifetime
                    cw.inherited_env = None
                    self._restore_task_env(saved_env)
        borrowed = self._still_borrowed()
        end = time.time()
        return m.TaskReply(spec.task_id, returns, app_error, retryable, borrowed, cw.worker_id, start, end)

    def _success_reply(self, spec: m.TaskSpec, result: Any, start: float) -> m.TaskReply:
        """A concurrent actor call's reply (any thread)."""
        try:
            returns = self._store_returns(spec, result)
        except Exception as e:
            return self._failed_reply(spec, e, start)
        return m.TaskReply(spec.task_id, returns, False, False, self._still_borrowed(), self.cw.worker_id,
                           start, time.time())

    def _failed_reply(self, spec: m.TaskSpec, e: BaseException, start: float, streamed: int = 0) -> m.TaskReply:
        """A concurrent actor call's error reply (any thread); ``streamed``: values a
        streaming call sent before it failed."""
        if isinstance(e, _NotHere):
            return self._system_reply(spec, str(e), m.ErrorKind.ACTOR_DIED, start)
        blob = e.blob if isinstance(e, _TaskFailed) else self._task_error_blob(spec, e)
        first = e.stored if isinstance(e, _TaskFailed) else []
        return m.TaskReply(spec.task_id, self._error_returns(spec, blob, streamed, first), True, False,
                           self._still_borrowed(), self.cw.worker_id, start, time.time())

    def _create_actor(self, spec: m.TaskSpec, cls: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                      resource_ids: dict[str, list[Any]]) -> None:
        if self.actor is not None:
            raise exc.LumosSystemError("this worker already hosts an actor")
        if not isinstance(cls, type):
            raise TypeError(f"{spec.function_name} is not a class")
        init = getattr(cls, "__init__", None)
        self.cw.current_actor_id = spec.actor_id  # (get_runtime_context() in __init__ knows its actor)
        try:
            if inspect.iscoroutinefunction(init):
                # ``async def __init__`` (as Ray allows): awaited on the actor's own event loop,
                # where its methods will run.
                instance = cls.__new__(cls)
                host = ActorHost(self, spec, instance, resource_ids)
                host.run_on_loop(init(instance, *args, **kwargs))
            else:
                instance = cls(*args, **kwargs)
                host = ActorHost(self, spec, instance, resource_ids)
        except BaseException:
            self.cw.current_actor_id = None
            raise
        host.restore()
        host.name_output()
        self.actor = host
        self.actor_restarted = spec.attempt > 0  # (the creation's attempt: the actor's restarts so far)
        cw = self.cw
        self._actor_namespace = cw.namespace = cw.namespace or f"anonymous-{cw.job_id.hex()}"
        self._actor_job = cw.job_id
        if resource_ids.get("GPU"):
            self._original_cuda = os.environ.get("CUDA_VISIBLE_DEVICES")  # the actor keeps its GPUs
        return None

    def _system_reply(self, spec: m.TaskSpec, text: str, kind: m.ErrorKind | None,
                      start: float = 0.0) -> m.TaskReply:
        return m.TaskReply(spec.task_id, [], False, False, self._still_borrowed(), self.cw.worker_id,
                           start, time.time(), text, kind)

    # ------------------------------------------------------------------ functions, jobs

    def _take_preload(self, spec: m.TaskSpec) -> None:
        preload = spec.actor_options.pop(CREATION_PRELOAD, None)
        if not isinstance(preload, list) or len(preload) != 2:
            return
        job, fn = preload
        if isinstance(job, bytes):
            self._preloaded_jobs[spec.job_id] = job
        if isinstance(fn, bytes):
            self._preloaded_functions[spec.function_id] = fn

    def _bind_job(self, job_id: JobID) -> None:
        """Run as job ``job_id``, its config loaded once. An actor runs every call as its
        creator's job, as Ray's actors do, whichever job calls it (a named or detached one):
        ``get_job_id()`` there, the tasks and actors it starts (their environment, their
        lifetime: a caller's exit does not end them) and its namespace, working_dir,
        sys.path, logging and setup hook are its creator's. Only what a call prints goes to
        the caller's driver (``write_output``)."""
        cw = self.cw
        if cw.job_id != job_id:
            cw.job_id = job_id
            cw._exported.clear()
        if self.actor is None:
            self._load_job(job_id)
        else:
            cw.namespace = self._actor_namespace or cw.namespace

    def _load_job(self, job_id: JobID) -> None:
        cw = self.cw
        if job_id in self._jobs_bound:
            return
        self._jobs_bound.add(job_id)
        raw = self._preloaded_jobs.pop(job_id, None)
        try:
            if raw is None:
                raw = cw.call_gcs(m.KvGet("job", job_id, 5.0), 10.0)
        except (TimeoutError, RemoteError, ConnectionLost) as e:
            logger.warning("could not load job %s config: %s", job_id.hex(), e)
            return
        if not raw:
            return
        conf = json.loads(raw)
        cw.namespace = conf.get("namespace") or ""
        env = conf.get("env_vars")
        if env and isinstance(env, dict):
            self._job_env[job_id] = {str(k): str(v) for k, v in env.items()}
        for path in reversed(conf.get("sys_path", [])):
            if path not in sys.path and os.path.isdir(path):
                sys.path.insert(0, path)
        cwd = conf.get("cwd")
        package = conf.get("working_dir")
        modules = conf.get("py_modules") or []
        try:
            # py_modules after the working_dir on sys.path, both before the driver's paths
            paths = [self._package_dir(str(p), "py_modules") for p in reversed(modules)]
            if package:
                cwd = self._package_dir(str(package), "working_dir")
                paths.append(cwd)
        except BaseException:
            self._jobs_bound.discard(job_id)  # the next task tries again
            raise
        for path in paths:
            if path in sys.path:
                sys.path.remove(path)
            sys.path.insert(0, path)
        if cwd and os.path.isdir(cwd):
            try:
                os.chdir(cwd)
            except OSError:
                pass
        self._job_code_env[job_id] = code_env(package, modules)
        logs = conf.get("logging_config")
        if isinstance(logs, dict):  # init(logging_config=...): before the hook, which may refine it
            from lumos.logging_config import LoggingConfig
            try:
                LoggingConfig.from_dict(logs)._apply()
            except (TypeError, ValueError) as e:
                logger.warning("could not apply the job's logging_config %r: %s", logs, e)
        hook = conf.get("setup_hook")
        if hook is not None:  # after the job's code is importable: the hook may live there
            from lumos._private import working_dir
            saved = _set_env(self._job_env.get(job_id) or {})  # the hook sees the job's env_vars, as its tasks do
            try:
                working_dir.run_setup_hook(hook)
            except exc.RuntimeEnvSetupError:
                self._jobs_bound.discard(job_id)  # the next task tries again
                raise
            finally:
                _restore_env(saved)

    def _package_dir(self, package: str, what: str) -> str:
        """A package of the job (its ``what``: working_dir or one of its py_modules) on
        this node: unpacked from the GCS once per node."""
        from lumos._private import working_dir
        if not package.isalnum():
            raise exc.LumosSystemError(f"malformed {what} package id {package!r}")
        target = working_dir.unpacked_dir(self.cw.session_dir, package)
        if os.path.isdir(target):
            return target
        try:
            data = self.cw.call_gcs(m.KvGet("pkg", package.encode(), 5.0), 60.0)
        except (TimeoutError, RemoteError, ConnectionLost) as e:
            raise exc.LumosSystemError(f"could not fetch the job's {what} from the GCS: {e}") from None
        if not data:
            raise exc.LumosSystemError(f"the job's {what} is not in the GCS (was its driver's upload lost?)")
        os.makedirs(os.path.dirname(target), exist_ok=True)
        try:
            return working_dir.unpack(data, target)
        except (OSError, ValueError, zipfile.BadZipFile) as e:
            raise exc.LumosSystemError(f"could not unpack the job's {what}: {e}") from None

    def _function(self, spec: m.TaskSpec) -> Any:
        if spec.kind == m.TaskKind.ACTOR_TASK:
            return self._method(spec)
        fn = self.functions.get(spec.function_id)
        if fn is not None:
            return fn
        pickled = self._preloaded_functions.pop(spec.function_id, None)
        try:
            if pickled is None:
                pickled = self.cw.call_gcs(m.KvGet("fn", spec.job_id + spec.function_id, 30.0), 35.0)
        except (TimeoutError, RemoteError, ConnectionLost) as e:
            raise exc.LumosSystemError(f"could not load {spec.function_name}: {e}") from None
        if pickled is None:
            raise exc.LumosSystemError(f"function {spec.function_name} was never exported by its driver")
        try:
            fn = pickle.loads(pickled)
        except Exception as e:
            raise _TaskFailed(self._task_error_blob(spec, e, prefix=(
                f"could not load {spec.function_name} in the worker (is its module importable "
                f"there?)")), e) from None
        self.functions[spec.function_id] = fn
        return fn

    def _method(self, spec: m.TaskSpec) -> Any:
        actor = self.actor
        if actor is None or actor.actor_id != spec.actor_id:
            raise _NotHere(f"this worker does not host actor {(spec.actor_id or b'').hex()[:16]} "
                           "(it was restarted or never created here)")
        name = spec.function_name
        if name in ("__lumos_terminate__", "__ray_terminate__"):
            return _terminate
        if name in ("__lumos_ready__", "__ray_ready__"):
            return _ready
        try:
            return getattr(actor.instance, name)
        except AttributeError:
            raise AttributeError(f"actor class {actor.class_name} has no method {name!r}") from None

    # ------------------------------------------------------------------ arguments

    # ------------------------------------------------------------------ results

    def _task_error_blob(self, spec: m.TaskSpec, e: BaseException, prefix: str = "",
                         cause: BaseException | None = None) -> bytes:
        """The error value of ``spec`` failing with ``e``: its traceback (the user's frames),
        and ``cause`` (default: ``e``) as the exception it is also an instance of."""
        tb = e.__traceback__
        # Drop this module's frames: the user's traceback starts at their function.
        while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
            tb = tb.tb_next
        text = "".join(traceback.format_exception(type(e), e, tb))
        if prefix:
            text = prefix + "\n" + text
        # A child's error re-raised here keeps the user's exception as its cause, not the
        # child's TaskError (as in Ray: ``e.cause`` of a nested failure is the ValueError).
        if cause is None:
            cause = e.cause if isinstance(e, exc.TaskError) and isinstance(e.cause, BaseException) else e
        err = exc.TaskError(spec.name, text, cause, pid=os.getpid(), node_ip=self.cw.node_ip,
                            task_id_hex=spec.task_id.hex())
        try:
            blob = ser.serialize(err, ser.KIND_ERROR).to_bytes()
        except ser.SerializationError:
            err = exc.TaskError(spec.name, text, None, exc._cause_text(e), os.getpid(),
                                self.cw.node_ip, spec.task_id.hex())
            blob = ser.serialize(err, ser.KIND_ERROR).to_bytes()
        if len(blob) <= MAX_ERROR_BYTES:
            return blob
        # An error too large to travel (it goes inline in the reply, once per return): its
        # text is cut, and its class kept where a bare instance of it can be made.
        note = f"\n... (the error was {len(blob) / 2**20:.1f} MiB; cut to its first {_ERROR_KEPT_CHARS:,} characters)"
        cut = text[:_ERROR_KEPT_CHARS] + note
        small: BaseException | None = None
        try:
            small = type(e).__new__(type(e))
            small.args = (exc._cause_text(e)[:_ERROR_KEPT_CHARS] + note,)
            err = exc.TaskError(spec.name, cut, small, pid=os.getpid(), node_ip=self.cw.node_ip,
                                task_id_hex=spec.task_id.hex())
            blob = ser.serialize(err, ser.KIND_ERROR).to_bytes()
        except Exception:
            small = None
        if small is None or len(blob) > MAX_ERROR_BYTES:
            err = exc.TaskError(spec.name, cut, None, exc._cause_text(e)[:_ERROR_KEPT_CHARS] + note, os.getpid(),
                                self.cw.node_ip, spec.task_id.hex())
            blob = ser.serialize(err, ser.KIND_ERROR).to_bytes()
        return blob

    def _is_retryable(self, spec: m.TaskSpec, e: BaseException | None) -> bool:
        if spec.retry_exceptions == m.RetryPolicy.NEVER or e is None or isinstance(e, exc.TaskCancelledError):
            return False
        if spec.retry_exceptions == m.RetryPolicy.ANY_EXCEPTION:
            return isinstance(e, Exception)
        try:
            classes = tuple(ser.deserialize_code(spec.retry_exception_types or b""))
        except Exception as load_error:
            print(f"lumos: {spec.name}'s retry_exceptions list could not be loaded here ({load_error}); "
                  "the task is not retried", file=sys.stderr)
            return False
        return isinstance(e, classes)

    # ------------------------------------------------------------------ runtime_env

    def _apply_env(self, spec: m.TaskSpec) -> dict[str, str | None]:
        """Set the task's environment variables (the job's, under the task's own); returns
        the previous values. The task's own are inherited by the tasks it submits."""
        own = spec.runtime_env
        if own is not None and (type(own) is not dict
                                or not all(type(k) is str and type(v) is str for k, v in own.items())):
            raise TypeError("malformed runtime_env in the task's spec")
        job_env = self._job_env.get(spec.job_id)
        env = {**job_env, **own} if job_env and own else (own or job_env or {})
        if "OMP_NUM_THREADS" not in env:
            threads = thread_limits.for_task(spec.resources)
            if threads is not None:
                env = {**env, **threads}
        saved = _set_env(env)
        self.cw.inherited_env = own or None
        if not thread_limits.NAMES.isdisjoint(env):
            # Native pools (numpy's BLAS, loaded before the task in a forked worker) read
            # these variables only at load: size them now; an actor keeps them.
            self._thread_limits = thread_limits.apply()
        return saved

    def _restore_task_env(self, saved: dict[str, str | None]) -> None:
        _restore_env(saved)
        limits, self._thread_limits = self._thread_limits, None
        if limits is not None:
            limits.restore()

    # ------------------------------------------------------------------ GPUs

    def _set_gpus(self, resource_ids: dict[str, list[Any]]) -> None:
        gpus = resource_ids.get("GPU")
        if gpus:
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(self.physical_gpu(int(i))) for i, _ in gpus)

    def _restore_gpus(self) -> None:
        # Compare first, on the raw mapping: writing os.environ costs a putenv and two
        # encodes per task, and os.environ.get of an unset name raises and catches a
        # KeyError inside (4.6 us per task on a worker with no GPU).
        original = self._original_cuda
        raw = _environ_raw.get(b"CUDA_VISIBLE_DEVICES") if _environ_raw is not None \
            else os.environ.get("CUDA_VISIBLE_DEVICES")
        if raw is None if original is None else (raw is not None and os.fsdecode(raw) == original):
            return
        if original is None:
            del os.environ["CUDA_VISIBLE_DEVICES"]
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = original

    def physical_gpu(self, index: int) -> Any:
        visible = self._gpu_ids_visible
        if visible is not None and index < len(visible):
            v = visible[index]
            return int(v) if v.isdigit() else v
        return index

    # ------------------------------------------------------------------ output

    def write_output(self, text: str, is_stderr: bool, pid: int = 0, task: list[Any] | None = None) -> None:
        """Buffer a line the running task printed (``pid``, ``task``: a forked child's, and
        the task that forked it)."""
        if task is not None:
            rec = [task[0] or self.cw.job_id or None, task[1], task[2], pid, is_stderr, text, task[3]]
        else:
            spec = worker_context.current_call.get() or self._running  # (a threaded or async actor's call)
            name = spec.name if spec else ""
            if spec and self.actor is not None and self.actor.log_name:
                name = self.actor.log_name  # (its class's __repr__)
            rec = [(spec.job_id if spec else None) or self.cw.job_id or None, spec.task_id if spec else None, name,
                   pid or os.getpid(), is_stderr, text, spec.root_task_id if spec else None]
        with self._output_lock:
            self._output.append(rec)
        if self.cw._flush_idle:
            self.cw.wake_flush()

    def open_child_output(self) -> None:
        """Worker start: a pipe for the output of processes a task forks without exec
        (``multiprocessing``'s default start method). Such a child inherits this worker's
        capture but no io thread to send what it holds, so what it printed was lost; its
        ``sys.stdout``/``sys.stderr`` become ``ChildOutput`` (at the fork), whose records
        the io thread reads here and sends on like the worker's own, under the child's pid."""
        r, w = os.pipe()  # (close-on-exec: a child that execs prints to the worker's log)
        os.set_blocking(r, False)
        self.child_output_fd = w
        self.child_output_read_fd = r

        def watch() -> None:
            loop = self.cw.loop
            if loop is not None:
                loop.add_reader(r, self._read_child_output, r)
        self.cw._post(watch)

    def _read_child_output(self, fd: int) -> None:
        """Io thread: records from forked children, ``O<pid> text`` or ``E<pid> text`` a line
        each (written whole: each is shorter than the pipe's atomic write size; ``o``/``e``:
        the start of a longer line, continued by the next), after an
        ``H<pid> [job, task, name, root]`` (hex ids, JSON) naming the task that forked it."""
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            loop = self.cw.loop
            if loop is not None:
                loop.remove_reader(fd)
            os.close(fd)
            return
        *records, self._child_partial = (self._child_partial + data).split(b"\n")
        tasks = self._child_tasks
        for rec in records:
            head, _, body = rec.partition(b" ")
            pid = int(head[1:]) if head[1:].isdigit() else 0
            if head[:1] == b"H":
                try:
                    job, task_id, name, root = json.loads(body)
                    tasks[pid] = [bytes.fromhex(job) or None, bytes.fromhex(task_id) or None, str(name),
                                  bytes.fromhex(root) or None]
                except (ValueError, TypeError):
                    continue
                if len(tasks) > 1024:
                    del tasks[next(iter(tasks))]
                continue
            tag = head[:1]
            is_err = tag in (b"E", b"e")
            if tag in (b"o", b"e"):
                key = (pid, is_err)
                body = self._child_long.pop(key, b"") + body
                if len(body) < _CHILD_LINE_MAX:  # (a longer one goes out in parts)
                    self._child_long[key] = body
                    continue
            if self._child_long:
                body = self._child_long.pop((pid, is_err), b"") + body
            self.write_output(body.decode("utf-8", "replace"), is_err, pid, tasks.get(pid))

    def flush_output(self) -> None:
        if not self._output:
            return
        with self._output_lock:
            lines, self._output = self._output, []
        raylet = self.cw.raylet
        if raylet is not None and self.cw.config.log_to_driver:
            raylet.notify(m.LogBatch(lines))


class _NotHere(Exception):
    """A call reached a worker that does not host its actor."""


def _ready() -> bool:
    return True


def _terminate() -> None:
    raise exc.ActorExitRequest("the actor was terminated by __lumos_terminate__()")


#: ``os.environ``'s own dict of encoded names to encoded values (POSIX CPython), read
#: without the encode and KeyError of ``os.environ.get``; None where it is not there.
_environ_raw: dict[bytes, bytes] | None = getattr(os.environ, "_data", None)
if not isinstance(_environ_raw, dict) or not all(type(k) is bytes for k in list(_environ_raw)[:1]):
    _environ_raw = None


def _set_env(env: dict[str, str]) -> dict[str, str | None]:
    """Set ``env`` in this process's environment; returns the previous values (for ``_restore_env``)."""
    environ = os.environ
    saved = {k: environ.get(k) for k in env}
    environ.update(env)
    return saved


def _restore_env(saved: dict[str, str | None]) -> None:
    environ = os.environ
    for k, v in saved.items():
        if v is None:
            environ.pop(k, None)
        else:
            environ[k] = v


def captured_strategy(strategy: Any) -> list[Any] | None:
    """The strategy child tasks inherit from a task (or actor) scheduled with
    ``PlacementGroupSchedulingStrategy(..., placement_group_capture_child_tasks=True)``:
    the same group, any bundle. None when children schedule on their own."""
    if isinstance(strategy, (list, tuple)) and len(strategy) >= 4 and strategy[0] == "PG" and strategy[3]:
        return ["PG", strategy[1], -1, True]
    return None


def _visible_gpus() -> list[str] | None:
    raw = os.environ.get("CUDA_VISIBLE_DEVICES")
    if raw is None or raw.strip() == "":
        return None
    return [x.strip() for x in raw.split(",") if x.strip()]


class _LineStream(io.TextIOBase):
    """A text stream that hands complete lines (or 8 KiB without a newline) to ``_emit``
    and writes everything to ``passthrough`` (the worker's log) as well."""

    def __init__(self, passthrough: Any) -> None:
        self._passthrough = passthrough
        self._partial = ""
        # Re-entrant: a write can run a flush on its own thread (the garbage collector,
        # run by an allocation inside the write, finalizes a stream wrapping this one, and
        # IOBase's finalizer flushes it). That nested flush leaves the line to the write.
        self._lock = threading.RLock()
        self._writing = False

    def _emit(self, text: str) -> None:
        raise NotImplementedError

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        with self._lock:
            self._writing = True
            try:
                data = self._partial + text
                if "\n" in data:
                    complete, _, self._partial = data.rpartition("\n")
                    self._emit(complete)
                else:
                    self._partial = data
                    if len(data) > 8192:
                        self._emit(data)
                        self._partial = ""
            finally:
                self._writing = False
        try:
            self._passthrough.write(text)
        except (ValueError, OSError):
            pass
        return len(text)

    def flush(self) -> None:
        with self._lock:
            if self._writing:
                return  # inside this thread's own write (see __init__)
            if self._partial:
                self._emit(self._partial)
                self._partial = ""
        try:
            self._passthrough.flush()
        except (ValueError, OSError):
            pass

    def isatty(self) -> bool:
        return False

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"

    def fileno(self) -> int:
        return int(self._passthrough.fileno())


class TaskOutput(_LineStream):
    """``sys.stdout``/``sys.stderr`` of a worker: lines go to the driver, tagged."""

    def __init__(self, executor: Executor, is_stderr: bool, passthrough: Any) -> None:
        super().__init__(passthrough)
        self._executor = executor
        self._is_stderr = is_stderr

    def _emit(self, text: str) -> None:
        self._executor.write_output(text, self._is_stderr)


#: A forked child's line longer than this reaches the driver in parts (bytes).
_CHILD_LINE_MAX = 1 << 20


class ChildOutput(_LineStream):
    """``sys.stdout``/``sys.stderr`` of a process a worker's task forked (without exec):
    complete lines go to the worker's io thread through its child-output pipe, as records
    of at most ``_RECORD`` bytes (a pipe write that size is atomic, so children's records
    never interleave), and to the worker's log as before."""

    _RECORD = 3800

    def __init__(self, fd: int, is_stderr: bool, passthrough: Any) -> None:
        super().__init__(passthrough)
        self._fd = fd
        pid = str(os.getpid()).encode() + b" "
        self._head = (b"E" if is_stderr else b"O") + pid
        self._head_more = (b"e" if is_stderr else b"o") + pid  # (a piece of a longer line)

    def _emit(self, text: str) -> None:
        room = self._RECORD - len(self._head) - 1
        for line in text.split("\n"):
            payload = line.encode("utf-8", "replace")
            for i in range(0, max(len(payload), 1), room):
                head = self._head if i + room >= len(payload) else self._head_more
                try:
                    os.write(self._fd, head + payload[i:i + room] + b"\n")
                except OSError:  # the worker is gone: the log has it
                    return


def _child_output_after_fork() -> None:
    """In a process forked by a worker's task: print through the worker's child-output pipe
    (the inherited ``TaskOutput`` holds what it is given for an io thread the child does
    not have)."""
    executor = None
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if isinstance(stream, TaskOutput) and stream._executor.child_output_fd >= 0:
            executor = stream._executor
            setattr(sys, name, ChildOutput(executor.child_output_fd, name == "stderr", stream._passthrough))
    if executor is not None and executor.child_output_read_fd >= 0:
        try:
            os.close(executor.child_output_read_fd)
        except OSError:
            pass
        executor.child_output_read_fd = -1
    spec = executor._running if executor is not None else None
    if spec is not None:
        assert executor is not None
        job = spec.job_id or executor.cw.job_id or b""
        head = json.dumps([job.hex(), spec.task_id.hex(), spec.name, (spec.root_task_id or b"").hex()])
        try:
            os.write(executor.child_output_fd, b"H%d %s\n" % (os.getpid(), head.encode()))
        except OSError:
            pass


os.register_at_fork(after_in_child=_child_output_after_fork)
