"""Task replies and results on the owner's side (io thread).

A ``TaskReply`` from the worker that ran a task (or from an actor) is checked against
the task's current attempt, settles the lease's accounting (``TaskSubmitterState``),
and then either records the values (owned entries become ready, waiters wake, nested
refs are counted, lineage is kept when the task can run again), or retries the task, or
fails it (an error value for every return). Arguments are released last, after the
executor's borrowed refs are registered with their owners.

```
 worker ── TaskReply ─► _handle_task_reply ─► stale attempt? drop (free orphan store copies)
                            │ requeue (worker blocked in get) ─► TaskSubmitterState.task_requeued
                            ├─ system error ─► _fail_task ─► entries FAILED, waiters wake
                            ├─ retryable app error, retries left ─► _retry ─► new attempt queued
                            └─ else ─► _finish_task ─► entries READY, OwnerState.keep_lineage
                                          └─► _task_done ─► FINISHED (a packed row), borrowers, _release_args
```
"""

from __future__ import annotations

import logging
import time
from typing import Any, Iterable

from lumos import exceptions as exc
from lumos._private import serialization as ser
from lumos._private.process import yield_cpu
from lumos._private.core_worker.objects import error_blob
from lumos._private.core_worker.references import FAILED, READY, Waiter, unhandled_error
from lumos._private.core_worker.tasks import DONE, PUSHED, PendingTask
from lumos._private.ids import WorkerID, short
from lumos._private.protocol import messages as m
from lumos._private.protocol.vocab import APP_ERROR_TYPE
from lumos._private.transport.connection import Connection, ConnectionLost, RemoteError

logger = logging.getLogger(__name__)


class ResultsMixin:
    """``CoreWorker``'s reply handling, result recording, retries and failures (io thread)."""

    tasks: dict[bytes, PendingTask]
    objects: Any
    owner: Any
    submitter: Any
    actor_submitter: Any
    io: Any
    raylet: Any
    config: Any
    worker_id: WorkerID
    _events: list[tuple[Any, ...]]
    _lineage_drops: Any
    _spin_s: float
    _spin_until: float
    _spinning: bool
    _last_release_at: float
    spins: int
    spin_catches: int

    def _handle_task_reply(self, conn: Connection, reply: m.TaskReply) -> None:
        released = Waiter.single_releases
        if self._spinning:
            self.spin_catches += 1
        self._handle_reply(conn, reply)
        if self._spin_s and Waiter.single_releases != released:
            self._spin_after_reply()

    def _handle_reply(self, conn: Connection, reply: m.TaskReply) -> None:
        if self._lineage_drops:
            self.drop_deferred_lineage()
        task = self.tasks.get(reply.task_id)
        if task is None and (self.io.inbox or self.io.deferred):
            self.io.drain_pending(reply.task_id)  # a call sent straight from a user thread is registered there
            task = self.tasks.get(reply.task_id)
        if reply.kept:  # (a reply refused below included: its worker still views them)
            self._kept_by_executor(reply.kept)
        if task is None or task.state == DONE:
            self._free_orphan_returns(reply)
            return
        if task.state != PUSHED or reply.worker_id != self._executor_of(task):
            # From an attempt given up on (its worker's node was declared dead, or the task
            # was put back): the current attempt's reply is the one that counts.
            logger.info("refused a reply for %s from worker %s, which does not run its current attempt",
                        short(reply.task_id), short(reply.worker_id or b""))
            return
        lease = task.lease
        submitter = self.submitter
        if lease is not None:
            if reply.error_kind == m.ErrorKind.REQUEUE and task.spec.kind == m.TaskKind.NORMAL_TASK:
                self._run(submitter.task_requeued(task))
                return
            # The lease is settled (and topped up or idled) before the task: one event, one
            # take of the submitter's lock per reply (the pushes it decides leave at the end
            # of this io turn, with the rest of what the turn sends).
            self._run(submitter.reply_done(lease, reply.task_id, reply.end_time - reply.start_time,
                                           _exit_type(reply) if reply.error_kind == m.ErrorKind.EXITING else None))
        if task.spec.kind == m.TaskKind.ACTOR_TASK:
            self.actor_submitter.on_reply(task, reply)
        if reply.system_error is not None:
            if reply.error_kind == m.ErrorKind.CANCELLED or task.cancelled:
                self._fail_task(task, exc.TaskCancelledError(task.spec.task_id.hex(), reply.system_error))
            elif reply.error_kind == m.ErrorKind.EXITING and task.spec.kind == m.TaskKind.NORMAL_TASK:
                self._fail_task(task, exc.WorkerCrashedError(
                    f"worker {short(reply.worker_id or b'')} exited while running {task.spec.name}(): "
                    f"{reply.system_error}"))
            elif reply.error_kind == m.ErrorKind.ACTOR_DIED:
                self._fail_task(task, exc.ActorDiedError((task.spec.actor_id or b"").hex(), reply.system_error))
            else:
                self._fail_task(task, exc.LumosSystemError(reply.system_error))
        elif task.cancelled and task.spec.kind == m.TaskKind.ACTOR_TASK:
            # A sync or threaded actor's method is not interrupted: it ran to its end, and its
            # result is dropped, as Ray does (get() raises, the caller asked it to stop).
            self._free_orphan_returns(reply)
            self._fail_task(task, exc.TaskCancelledError(
                task.spec.task_id.hex(), f"{task.spec.name}() was cancelled while it ran (the actor's method "
                "ran to its end, not interrupted; its result is dropped)"))
        elif reply.app_error and reply.retryable and submitter.use_retry(task):
            self._free_orphan_returns(reply)
            self._retry(task, "the task raised a retryable exception")
        else:
            self._finish_task(task, reply)

    def _spin_after_reply(self) -> None:
        """A reply released a user thread's wait for one object (a sync call's get): keep
        the io thread awake for ``owner_spin_us``, polling its sockets between yields of
        the CPU instead of sleeping in ``epoll``. The reply to that thread's next call
        then wakes no thread: on a virtual machine, waking one asleep on another core cost
        the worker's ``write`` ~15 us and the reply ~30 us more before this thread read it;
        a sync round trip went from ~120 to ~70 us here. Only while such replies come
        within a spin's length of each other (a caller that takes longer between calls
        gets no spin that would miss), and never for replies that released no such wait
        (a burst's, or others' while a thread waits for a long task)."""
        now = time.monotonic()
        close = now - self._last_release_at <= self._spin_s
        self._last_release_at = now
        if not close:
            return
        self._spin_until = now + self._spin_s
        self.spins += 1
        if not self._spinning:
            self._spinning = True
            self.io.loop.call_soon(self._spin)

    def _spin(self) -> None:
        """io thread: one turn of the spin (a loop turn that polls without waiting)."""
        if time.monotonic() < self._spin_until and not self.io.closed:
            yield_cpu()
            self.io.loop.call_soon(self._spin)
        else:
            self._spinning = False

    def _kept_by_executor(self, object_ids: list[bytes]) -> None:
        """The executor still views these lent arguments: their slots are not written
        again (``_release`` makes them objects and frees them instead)."""
        entries = self.objects.entries
        for oid in object_ids:
            e = entries.get(oid)
            if e is not None and e.owned and e.lent >= 0:
                e.kept = True

    def _executor_of(self, task: PendingTask) -> bytes | None:
        """The worker running ``task``'s current attempt (None: unknown)."""
        if task.spec.kind == m.TaskKind.ACTOR_TASK:
            return self.actor_submitter.worker_of(task)
        return task.lease.worker_id if task.lease is not None else None

    def _retry(self, task: PendingTask, why: str) -> None:
        self._next_attempt(task, why)
        if task.spec.kind == m.TaskKind.NORMAL_TASK:
            self._enqueue(task, front=True)
        else:
            self._enqueue(task)

    def _next_attempt(self, task: PendingTask, why: str) -> None:
        """Record that ``task`` runs again (a retry or a rebuild) and start its next attempt."""
        spec = task.spec
        logger.info("running %s (%s) again: %s", spec.name, short(spec.task_id), why)
        if spec.enable_task_events:
            self.spill_events(task)
            self._buffer_event((spec.task_id, spec.attempt, m.TaskState.RETRIED, time.time(), None, None, None, why))
        spec.attempt += 1
        task.lease = None
    def _finish_task(self, task: PendingTask, reply: m.TaskReply) -> None:
        if task.spec.num_returns == -1:
            self._finish_stream(task, reply)
            return
        task.state = DONE
        self.tasks.pop(task.spec.task_id, None)
        spec = task.spec
        objects = self.objects
        orphans: list[bytes] = []
        gone = 0  # returns whose refs were all dropped
        for ret in reply.returns:
            nested = [(r[0], r[1]) for r in ret.nested_refs] if ret.nested_refs else None
            if nested:
                objects.add_contained(nested, registered=True)
            e = objects.complete(ret.object_id, READY, ret.data, ret.node_id, ret.size, nested)
            if e is None:
                gone += 1
                if ret.data is None and ret.node_id is not None:
                    orphans.append(ret.object_id)
                if nested:
                    freed = objects.release_nested(nested)
                    if freed:
                        self._release(freed)
            else:
                e.shared = True
                self._run_callbacks(ret.object_id, e)
        if reply.app_error and gone and gone == len(reply.returns) and reply.returns[0].data is not None:
            unhandled_error(reply.returns[0].data)  # every ref to its results was dropped: nobody will see it
        if len(reply.returns) < len(task.return_ids):
            self._fail_missing_returns(task, reply)
        if orphans and self.raylet is not None:
            self.raylet.notify(m.FreeObjects(orphans, [False] * len(orphans)))
        if spec.kind == m.TaskKind.NORMAL_TASK and not reply.app_error and task.retries_left != 0:
            self._keep_lineage(task)
        self._task_done(task, reply)

    def _fail_missing_returns(self, task: PendingTask, reply: m.TaskReply) -> None:
        """A reply without a value for each of the task's returns (an executor's mistake):
        the missing ones fail rather than leave their callers waiting forever."""
        got = {ret.object_id for ret in reply.returns}
        error = exc.LumosSystemError(f"{task.spec.name} finished, but its worker sent {len(reply.returns)} of "
                                     f"its {len(task.return_ids)} return values")
        logger.error("%s", error)
        self._fail_returns([oid for oid in task.return_ids if oid not in got], error_blob(error))

    def _fail_returns(self, object_ids: Iterable[bytes], blob: bytes) -> int:
        """Record the error ``blob`` as the value of each of ``object_ids``; how many of
        them nobody referenced any more (their entries gone)."""
        gone = 0
        for oid in object_ids:
            e = self.objects.complete(oid, FAILED, blob, None, len(blob), None)
            if e is None:
                gone += 1
            self._run_callbacks(oid, e)
        return gone

    def _task_done(self, task: PendingTask, reply: m.TaskReply, info: dict[str, Any] | None = None) -> None:
        """A task finished (its values recorded): its event, then its arguments' release
        (after the executor's borrowed refs are registered with their owners)."""
        spec = task.spec
        if spec.enable_task_events:
            state = m.TaskState.FAILED if reply.app_error else m.TaskState.FINISHED
            end = reply.end_time or time.time()
            error = _error_text(reply) if reply.app_error else None
            if reply.app_error:
                info = {**info, **_APP_ERROR} if info else _APP_ERROR
            if task.ev_live:
                self._pack_ended(task, state, end, reply.start_time, reply.worker_id, error, info)
            elif reply.start_time:
                # The executor sends its own RUNNING event in its next batch, which a reader may
                # not see yet (or ever, if it exits first): the finished row has its start time.
                # One buffered row carries both (its 9th field: the state after RUNNING).
                self._buffer_event((spec.task_id, spec.attempt, m.TaskState.RUNNING, reply.start_time, info, None,
                                    reply.worker_id, error, (state, end)))
            else:
                self._buffer_event((spec.task_id, spec.attempt, state, end, info, None, reply.worker_id, error))
        if reply.borrowed:
            executor = (task.lease.address if task.lease is not None
                        else self.actor_submitter.address_of(spec.actor_id or b""))
            self._spawn(self._register_borrowers(task, reply.borrowed, executor), "borrowers")
        else:
            self._release_args(task)

    async def _register_borrowers(self, task: PendingTask, borrowed: list[Any],
                                  executor: m.Address | None) -> None:
        """The executor kept refs from the arguments: make their owners know, then let go."""
        if executor is not None:
            by_owner: dict[bytes, tuple[m.Address, list[bytes]]] = {}
            for oid, owner in borrowed:
                if owner.worker_id == self.worker_id:
                    self.objects.add_borrower(oid, executor)
                else:
                    by_owner.setdefault(owner.worker_id, (owner, []))[1].append(oid)
            for owner, ids in by_owner.values():
                try:
                    conn = await self._peer(owner)
                    await conn.call(m.AddBorrowers(ids, executor), self.config.rpc_timeout_s)
                except (OSError, ConnectionLost, TimeoutError, RemoteError) as e:
                    logger.debug("could not register borrower at %s: %s", short(owner.worker_id), e)
        self._release_args(task)

    def _release_args(self, task: PendingTask) -> None:
        if self.owner.pins_args(task):
            return  # pinned while the task may run again; _drop_lineage lets them go
        ids = task.dep_ids + task.nested_ids
        if ids:
            freed = self.objects.remove_submitted(ids)
            if freed:
                self._release(freed)

    def _free_orphan_returns(self, reply: m.TaskReply) -> None:
        ids = [r.object_id for r in reply.returns if r.data is None and r.node_id is not None]
        if ids and self.raylet is not None:
            self.raylet.notify(m.FreeObjects(ids, [False] * len(ids)))

    def _fail_task(self, task: PendingTask, error: BaseException) -> None:
        self._fail_task_with_blob(task, error_blob(error), str(error), error_type_of(error))

    def _fail_task_with_blob(self, task: PendingTask, blob: bytes, text: str = "",
                             error_type: str = "DEPENDENCY_RESOLUTION_FAILED") -> None:
        """Fail ``task`` with the error ``blob`` (``error_type``: Ray's name for why; by
        default an argument's error became the task's)."""
        if task.state == DONE:
            return
        task.state = DONE
        self.tasks.pop(task.spec.task_id, None)
        self.submitter.task_gone(task)
        dropped = self._fail_returns(task.return_ids, blob)
        if task.return_ids and dropped == len(task.return_ids) and task.spec.num_returns != -1:
            unhandled_error(blob)  # every ref to its results was dropped: nobody will see it
        if task.spec.num_returns == -1:
            self._end_stream(task, blob)
        spec = task.spec
        if spec.enable_task_events:
            self.spill_events(task)
            state = m.TaskState.CANCELLED if task.cancelled else m.TaskState.FAILED
            self._buffer_event((spec.task_id, spec.attempt, state, time.time(), {"error_type": error_type}, None,
                                None, text or "failed"))
        if spec.kind == m.TaskKind.ACTOR_TASK:
            self.actor_submitter.on_failed(task)
        self._release_args(task)


#: A task's own exception, in the failed event's info.
_APP_ERROR = {"error_type": APP_ERROR_TYPE}

#: Ray's ``ErrorType`` name of each error a task fails with (most specific class first).
_ERROR_TYPES: tuple[tuple[type[BaseException], str], ...] = (
    (exc.TaskCancelledError, "TASK_CANCELLED"),
    (exc.ActorUnavailableError, "ACTOR_UNAVAILABLE"),
    (exc.ActorUnschedulableError, "ACTOR_UNSCHEDULABLE_ERROR"),
    (exc.ActorDiedError, "ACTOR_DIED"),
    (exc.NodeDiedError, "NODE_DIED"),
    (exc.WorkerCrashedError, "WORKER_DIED"),
    (exc.OutOfMemoryError, "OUT_OF_MEMORY"),
    (exc.OutOfDiskError, "OUT_OF_DISK_ERROR"),
    (exc.TaskUnschedulableError, "TASK_UNSCHEDULABLE_ERROR"),
    (exc.TaskPlacementGroupRemoved, "TASK_PLACEMENT_GROUP_REMOVED"),
    (exc.OwnerDiedError, "OWNER_DIED"),
    (exc.ObjectLostError, "OBJECT_LOST"),
    (exc.RuntimeEnvSetupError, "RUNTIME_ENV_SETUP_FAILED"),
    (exc.LocalRayletDiedError, "LOCAL_RAYLET_DIED"),
    (exc.TaskError, APP_ERROR_TYPE),
)


def error_type_of(error: BaseException) -> str:
    """Ray's ``ErrorType`` name for why a task failed with ``error`` (``list_tasks``'s
    error_type); lumos's own failures without a Ray name are SYSTEM_ERROR."""
    for cls, name in _ERROR_TYPES:
        if isinstance(error, cls):
            return name
    return "SYSTEM_ERROR"


def _error_text(reply: m.TaskReply) -> str:
    """The last line of a failed task's error (for the task-event log), at most 500 chars."""
    blob = reply.returns[0].data if reply.returns else None
    if not blob:
        return "application error"
    try:
        _kind, err = ser.deserialize(blob)
        lines = [ln for ln in str(err).splitlines() if ln.strip()]
        return (lines[-1] if lines else type(err).__name__)[:500]
    except Exception:
        return "application error"


def _exit_type(reply: m.TaskReply) -> m.WorkerExitType:
    """What the row of a worker that exits after ``reply`` (``ErrorKind.EXITING``) is to
    say: the user's exit when its task called ``sys.exit()`` (a system error says so),
    else lumos's (the function's ``max_calls`` was reached)."""
    return (m.WorkerExitType.INTENDED_USER_EXIT if reply.system_error is not None
            else m.WorkerExitType.INTENDED_SYSTEM_EXIT)
