"""Owner-side scheduling of normal tasks: queues, leases, pipelining, retries (pure).

``TaskSubmitterState`` decides; ``CoreWorker`` (io thread) feeds it what happened and
runs the actions it returns. It never touches a socket, a timer or the object table:
a lease's connection and raylet are opaque handles it hands back in actions.

```
 CoreWorker (io thread)                          TaskSubmitterState
 args ready ───────────── enqueue(task) ───────► queue of the task's key ─► pump
 RequestLease ◄──────────────────────────────── more tasks than usable leases
 raylet grant ─────────── lease_granted/connected ► LeasedWorker ─► pump
 PushTask ◄───────────────────────────────────── least-loaded lease under the depth
 TaskReply ────────────── reply_done ────────────► mean run time, idle, pump
 connection closed ────── worker_failed ─────────► requeue (exiting) / AwaitWorkerExit
 cause known ──────────── worker_died ───────────► RetryTask / FailTask per max_retries
 ReturnLease, StartIdleTimer ◄────────────────── idle or surplus workers
```

Pipelining: tasks of one key go up to ``max_tasks_in_flight_per_worker`` deep per
leased worker once their mean run time is below ``pipeline_below_ms``; long or unknown
ones go one per worker, so a slow task never holds others back while a worker idles.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from itertools import islice
from typing import Any, Union

from lumos import exceptions as exc
from lumos._private.core_worker.tasks import DONE, PUSHED, QUEUED, LeasedWorker, PendingTask, SchedulingQueue
from lumos._private.ids import NodeID, TaskID, short
from lumos._private.protocol.vocab import (LEASE_REFUSALS, PG_REMOVED_STOP_REASON, PlacementGroupRemoved,
                                           TaskUnschedulable)
from lumos._private.raylet.memory_monitor import OOM_KILL_REASON

#: Why a leased worker died when the GCS declared its node dead: its tasks fail with
#: ``NodeDiedError`` once their retries are used up.
NODE_DIED_CAUSE = "its node was declared dead by the GCS"
#: ... or when the worker's raylet is gone too (the GCS has not declared the node dead yet).
NODE_GONE_CAUSE = "its node's raylet is gone too: the node died"

#: Recalls of leases not granted yet kept for their grant (``early_recalls``).
EARLY_RECALLS = 256

#: A lease refusal (``LEASE_REFUSALS``) -> the error its waiting tasks fail with, and how
#: the message says it.
_REFUSED: dict[Any, tuple[type[Exception], str]] = {
    PlacementGroupRemoved: (exc.TaskPlacementGroupRemoved, "cannot run"),
    TaskUnschedulable: (exc.TaskUnschedulableError, "cannot be scheduled"),
}


# ---------------------------------------------------------------------------- actions

@dataclass(slots=True)
class PushTask:
    """Send ``task`` to the worker of ``lease`` (its idle timer, if any, is cancelled)."""
    task: PendingTask
    lease: LeasedWorker


@dataclass(slots=True)
class RequestLease:
    """Ask the local raylet for a worker for ``queue``'s shape (``queue.requesting`` counts it)."""
    queue: SchedulingQueue


@dataclass(slots=True)
class PumpLater:
    """Pump ``queue`` again after ``delay_s`` (a lease request at another node failed)."""
    queue: SchedulingQueue
    delay_s: float


@dataclass(slots=True)
class CancelIdleTimer:
    """``lease`` is busy again: its idle timer, if running, must not return it."""
    lease: LeasedWorker


@dataclass(slots=True)
class ReturnLease:
    """Give the worker back to the raylet that granted it (cancel its idle timer)."""
    lease: LeasedWorker
    disconnect: bool


@dataclass(slots=True)
class StartIdleTimer:
    """The lease has nothing to run from now: call ``idle_expired(lease)`` once it has
    stayed so for the idle timeout."""
    lease: LeasedWorker


@dataclass(slots=True)
class AwaitWorkerExit:
    """A leased worker's connection dropped with ``tasks`` in flight: find out why (ask
    its raylet), then call ``worker_died``."""
    lease: LeasedWorker
    tasks: list[PendingTask]


@dataclass(slots=True)
class RetryTask:
    """Run ``task`` again (a new attempt) after ``delay_s``; 0: now."""
    task: PendingTask
    why: str
    delay_s: float = 0.0


@dataclass(slots=True)
class FailTask:
    task: PendingTask
    error: BaseException


Action = Union[PushTask, RequestLease, PumpLater, ReturnLease, StartIdleTimer, AwaitWorkerExit, RetryTask,
               FailTask, CancelIdleTimer]


class TaskSubmitterState:
    """Scheduling queues per key (function, resource shape, strategy), the workers
    leased for them, pipelining depth and retry decisions. io thread only; pure."""

    def __init__(self, *, max_tasks_in_flight_per_worker: int, pipeline_below_ms: float,
                 max_pending_lease_requests: int, max_leases_per_scheduling_key: int,
                 task_oom_retry_delay_base_ms: float = 1000.0, validate: bool = False) -> None:
        self.max_in_flight = max_tasks_in_flight_per_worker
        self.pipeline_below_ms = pipeline_below_ms
        self.max_pending_lease_requests = max_pending_lease_requests
        self.max_leases_per_key = max_leases_per_scheduling_key
        self.oom_retry_delay_base_s = task_oom_retry_delay_base_ms / 1000
        #: Check the invariants of the queue an event touched (tests; ``validate()`` checks all).
        self.check = validate
        #: Scheduling key -> its queue (kept for the process's life: keys are few).
        self.queues: dict[Any, SchedulingQueue] = {}
        #: Leased workers with nothing to run, kept a moment for more of their key's tasks.
        self.idle_leases: set[LeasedWorker] = set()
        #: Queues whose tasks wait for lease requests in flight, oldest first (pruned when
        #: looked at): a worker that goes idle in a queue of the same shape moves to one.
        self.starving: dict[SchedulingQueue, None] = {}
        #: Recalls of leases not granted here yet, (raylet, lease id) -> None, oldest first
        #: (at most ``EARLY_RECALLS``): a raylet that grants a lease and recalls it at once
        #: (another job's request waits) may have its recall read before the grant, whose
        #: reply resumes the request's coroutine a turn later. Ignored, the lease was never
        #: given back and that request waited for ever (a second driver's task of two CPUs
        #: beside a looping driver, one run in eight under load).
        self.early_recalls: OrderedDict[tuple[Any, int], None] = OrderedDict()

    # ------------------------------------------------------------------ queueing

    def enqueue(self, task: PendingTask, front: bool = False) -> list[Action]:
        """``task``'s arguments are ready (or it runs again): queue it and pump."""
        key = task.template.key
        q = self.queues.get(key)
        if q is None:
            q = self.queues[key] = SchedulingQueue(key, task.template)
        task.state = QUEUED
        task.queue = q
        if front:
            q.tasks.appendleft(task)
        else:
            q.tasks.append(task)
        return self.pump(q)

    def pump(self, q: SchedulingQueue, after_reply: bool = False) -> list[Action]:
        """Push what the leases of ``q`` can take; ask for more workers if tasks are left.

        ``after_reply``: a pipelined worker is topped up only once half its depth has come
        back, and then to the full depth: one write carries several pushes (a top-up per
        reply cost a syscall per task on each side), and the worker has half the depth
        queued meanwhile. New tasks (``enqueue``) fill workers to the depth at once."""
        out: list[Action] = []
        tasks = q.tasks
        if not tasks:
            if self.check:
                self._check_queue(q, set(), 64)
            return out
        mean = q.mean_exec_s
        depth = self.max_in_flight if mean is not None and mean * 1000 < self.pipeline_below_ms else 1
        refill_at = depth // 2 if after_reply and depth > 2 else depth - 1
        open_leases = [lease for lease in q.leases
                       if len(lease.tasks) <= refill_at and lease.conn is not None and not lease.dead
                       and not lease.blocked and not lease.exiting and not lease.recalled]
        while tasks:
            best = None
            for lease in open_leases:
                n = len(lease.tasks)
                if n < depth and (best is None or n < len(best.tasks)):
                    best = lease
                    if not n:
                        break
            if best is None:
                break
            task = tasks.popleft()
            if task.cancelled:
                continue
            task.state = PUSHED
            task.lease = best
            best.tasks[task.spec.task_id] = task
            self.idle_leases.discard(best)
            out.append(PushTask(task, best))
        # (A burst queues many tasks behind full workers: each submit and each reply pumps,
        # so the common "enough requests in flight already" case costs no count of leases;
        # the leases of this queue are all busy then, so ``idle_leases`` is empty or holds
        # other queues' workers.)
        if tasks and self.idle_leases and self._adopt_idle(q):
            out.extend(self.pump(q))
            return out
        if tasks and q.requesting < min(len(tasks), self.max_pending_lease_requests):
            want = min(len(tasks), self.max_pending_lease_requests, self.max_leases_per_key - _usable(q))
            if q.requesting < want and self.idle_leases:
                # Workers this process holds idle for other functions (of other shapes:
                # ``_adopt_idle`` took those of this one) would keep this one's request
                # waiting until they time out (issue 14: after a burst of f, the first g
                # waited ~1.2 s): give them back first.
                for idle in [l for l in self.idle_leases if l.queue is not q and not l.claimed]:
                    out.extend(self.return_lease(idle, disconnect=False))
            while q.requesting < want:
                q.requesting += 1
                out.append(RequestLease(q))
        if tasks and q.requesting:
            self.starving[q] = None
        if self.check:  # per event: the queue it touched (its first queued tasks), cheaply
            self._check_queue(q, set(), 64)
        return out

    def _adopt_idle(self, q: SchedulingQueue) -> bool:
        """Move the connected idle workers of other queues of ``q``'s shape (resources,
        strategy, retriable or not) to ``q``, within its lease cap: they run its tasks as
        they are, with no round trip to the raylet (a function's first tasks, or one whose
        lease request waits at the raylet behind workers this process holds idle). True if
        any moved."""
        shape = q.key[1:]
        room = None
        moved = False
        first = q.tasks[0]
        for idle in [l for l in self.idle_leases if l.queue is not q and not l.claimed
                     and l.conn is not None and l.queue.key[1:] == shape and _fits(first, l)]:
            if room is None:
                room = self.max_leases_per_key - _usable(q)
            if room <= 0:
                break
            self._move(idle, q)
            room -= 1
            moved = True
        return moved

    def _move(self, lease: LeasedWorker, q: SchedulingQueue) -> None:
        """``lease``, with nothing in flight, serves ``q`` (a queue of the same shape) from now."""
        old = lease.queue
        if lease in old.leases:
            old.leases.remove(lease)
        lease.queue = q
        q.leases.append(lease)

    def _starving_like(self, lease: LeasedWorker) -> SchedulingQueue | None:
        """Another queue of the shape of ``lease``'s whose tasks wait for a lease request and
        can run on it, if any (queues no longer waiting leave ``starving`` here)."""
        q = lease.queue
        shape = q.key[1:]
        for s in list(self.starving):
            if not s.tasks or s.requesting <= 0:
                del self.starving[s]
            elif s is not q and s.key[1:] == shape and _fits(s.tasks[0], lease) and \
                    _usable(s) < self.max_leases_per_key:
                return s
        return None

    def task_gone(self, task: PendingTask) -> None:
        """``task`` ended (failed or cancelled) outside a reply: forget where it waited."""
        if task.lease is not None:
            task.lease.tasks.pop(task.spec.task_id, None)
        q = task.queue
        if q is not None and task in q.tasks:
            q.tasks.remove(task)

    # ------------------------------------------------------------------ leases

    def lease_granted(self, q: SchedulingQueue, lease: LeasedWorker) -> None:
        """A raylet granted ``lease`` for ``q``; its connection is being opened. A recall
        of it that came first (``early_recalls``) holds: it takes no task and goes back
        once connected."""
        q.requesting -= 1
        q.leases.append(lease)
        key = (lease.raylet, lease.lease_id)
        if self.early_recalls and key in self.early_recalls:
            del self.early_recalls[key]
            lease.recalled = True

    def lease_connected(self, lease: LeasedWorker, conn: Any) -> list[Action]:
        lease.conn = conn
        q = lease.queue
        if lease.recalled:
            return self.return_lease(lease, disconnect=False) + self.pump(q)
        if not q.tasks:
            hungry = self._starving_like(lease) if self.starving else None
            if hungry is not None:  # another function of this shape waits for a worker
                self._move(lease, hungry)
                return self.pump(hungry)
            # Granted after its tasks went to other workers: keeping it idle would hold a
            # worker (and a later request queued behind it at the raylet) for nothing.
            return self.return_lease(lease, disconnect=False)
        return self.pump(q)

    def lease_unreachable(self, lease: LeasedWorker) -> list[Action]:
        """The granted worker could not be reached: give it back, try others."""
        out = self.return_lease(lease, disconnect=True)
        out.extend(self.pump(lease.queue))
        return out

    def lease_request_failed(self, q: SchedulingQueue, error: BaseException, elsewhere: bool) -> list[Action]:
        """A lease request ended without a grant. ``elsewhere``: it failed at another
        node's raylet (that node went away), so asking again from here may succeed; else
        the queue's tasks fail."""
        q.requesting -= 1
        if elsewhere:
            return [PumpLater(q, 0.1)]
        out: list[Action] = []
        refused = LEASE_REFUSALS.get(getattr(error, "type_name", None) or "")
        refusal = _REFUSED.get(refused) if refused is not None else None
        for task in list(q.tasks):
            q.tasks.remove(task)
            if refusal is not None:
                cls, what = refusal
                out.append(FailTask(task, cls(f"{task.spec.name}() {what}: {getattr(error, 'text', error)}")))
            else:
                out.append(FailTask(task, exc.LumosSystemError(f"could not lease a worker: {error}")))
        return out

    def return_lease(self, lease: LeasedWorker, disconnect: bool) -> list[Action]:
        q = lease.queue
        if lease in q.leases:
            q.leases.remove(lease)
        self.idle_leases.discard(lease)
        if lease.dead:
            return []  # returned already (a worker that said it exits, then closed)
        lease.dead = True
        return [ReturnLease(lease, disconnect)]

    def recalled(self, raylet: Any, lease_id: int) -> list[Action]:
        """The raylet ``raylet`` recalls lease ``lease_id`` (an owner on its node needs the
        resources; the request had spilled there): push nothing more to the worker, and
        return the lease now if nothing is in flight on it, else after its last reply.
        The tasks still queued get other workers (a new lease request if need be)."""
        for q in self.queues.values():
            for lease in q.leases:
                if lease.lease_id == lease_id and lease.raylet is raylet and not lease.dead:
                    lease.recalled = True
                    self.idle_leases.discard(lease)
                    if lease.tasks or lease.claimed:
                        return self.pump(q)
                    return self.return_lease(lease, disconnect=False) + self.pump(q)
        # Not granted here yet (or given back already: such entries age out).
        self.early_recalls[(raylet, lease_id)] = None
        if len(self.early_recalls) > EARLY_RECALLS:
            self.early_recalls.popitem(last=False)
        return []

    def idle_expired(self, lease: LeasedWorker) -> list[Action]:
        lease.idle_timer = None
        self.idle_leases.discard(lease)
        if not lease.tasks and not lease.queue.tasks and not lease.claimed:
            return self.return_lease(lease, disconnect=False)
        return []

    # ------------------------------------------------------------------ direct pushes

    def claim_idle(self, q: SchedulingQueue, task: PendingTask | None = None) -> LeasedWorker | None:
        """A user thread is about to write a task straight to a worker of ``q`` (nothing
        queued, a connected worker idle): that worker's lease, marked claimed so nothing
        here returns it or counts it idle until ``direct_pushed`` books the task; None if
        there is no such worker. The caller holds the lock every event here runs under.
        ``task``: the task to write (an idle worker of another queue of this shape may take it)."""
        if q.tasks:
            return None
        for lease in q.leases:
            if lease.direct and not lease.tasks and not lease.claimed and lease.conn is not None \
                    and not lease.dead and not lease.blocked and not lease.exiting and not lease.recalled:
                lease.claimed = True
                lease.claimed_for = task
                return lease
        if self.idle_leases and task is not None:
            # An idle worker of another function of this shape (calls alternating between
            # functions): it moves here, as ``_adopt_idle`` would on the io thread.
            shape = q.key[1:]
            for lease in self.idle_leases:
                if lease.direct and lease.queue is not q and lease.queue.key[1:] == shape and \
                        not lease.tasks and not lease.claimed and lease.conn is not None and \
                        not lease.dead and not lease.blocked and not lease.exiting and not lease.recalled and \
                        _fits(task, lease):
                    if _usable(q) >= self.max_leases_per_key:
                        return None
                    self._move(lease, q)
                    lease.claimed = True
                    lease.claimed_for = task
                    return lease
        return None

    def direct_pushed(self, task: PendingTask, lease: LeasedWorker, sent: bool) -> list[Action]:
        """Book a task a user thread claimed ``lease`` for: in flight on it if the write went
        out, else queued as usual."""
        lease.claimed = False
        lease.claimed_for = None
        q = lease.queue
        task.queue = q
        if not sent:
            if lease.recalled and not lease.tasks and not lease.dead:
                # Recalled while claimed: nothing else gives it back now.
                return self.return_lease(lease, disconnect=False) + self.enqueue(task)
            return self.enqueue(task)
        if lease.dead:  # (claimed leases are never returned; a worker failure books first)
            task.state = QUEUED
            return self.enqueue(task, front=True)
        task.state = PUSHED
        task.lease = lease
        lease.tasks[task.spec.task_id] = task
        self.idle_leases.discard(lease)
        return [CancelIdleTimer(lease)]

    def return_all(self) -> list[Action]:
        """The process closes: give every lease back."""
        out: list[Action] = []
        for q in self.queues.values():
            for lease in list(q.leases):
                out.extend(self.return_lease(lease, disconnect=False))
        return out

    def leases_where(self, conn: Any = None, node_id: NodeID | None = None,
                     worker_id: bytes | None = None) -> list[LeasedWorker]:
        """Leases on connection ``conn``, of worker ``worker_id``, or on node ``node_id``
        whose connection is not open."""
        found = []
        for q in self.queues.values():
            for lease in q.leases:
                if conn is not None and lease.conn is conn:
                    found.append(lease)
                elif worker_id is not None and lease.worker_id == worker_id:
                    found.append(lease)
                elif node_id is not None and lease.node_id == node_id and (
                        lease.conn is None or lease.conn.is_closed):
                    found.append(lease)
        return found

    # ------------------------------------------------------------------ replies

    def task_requeued(self, task: PendingTask) -> list[Action]:
        """The worker blocked in get() with ``task`` queued behind, or is exiting: run it
        elsewhere."""
        lease = task.lease
        assert lease is not None
        lease.tasks.pop(task.spec.task_id, None)
        lease.blocked = True
        task.lease = None
        task.state = QUEUED
        lease.queue.tasks.appendleft(task)
        if lease.exiting and not lease.tasks and not lease.claimed:
            # (an exiting worker hands back what it had not run: the last one frees its
            # lease, which the worker may outlive while it drains what it owns)
            return self.return_lease(lease, disconnect=False) + self.pump(lease.queue)
        return self.pump(lease.queue)

    def worker_blocked(self, lease: LeasedWorker, blocked: bool) -> list[Action]:
        """The worker of ``lease`` waits in get() or wait() (``blocked``), or no longer
        does: while blocked the lease takes no tasks and does not count against
        ``max_leases_per_scheduling_key``, so what its task waits for gets workers."""
        if lease.dead or lease.blocked == blocked:
            return []
        lease.blocked = blocked
        return self.pump(lease.queue)

    def reply_arrived(self, lease: LeasedWorker, task_id: TaskID, took_s: float, exiting: str | None) -> None:
        """The worker of ``lease`` answered ``task_id`` after running it ``took_s``.
        ``exiting`` (the ``m.WorkerExitType`` its row is to say): it exits after this reply
        (max_calls, or the task called ``sys.exit()``): push nothing more to it (tasks
        already pushed come back requeued, or are requeued when it closes)."""
        lease.tasks.pop(task_id, None)
        lease.blocked = False
        q = lease.queue
        q.mean_exec_s = took_s if q.mean_exec_s is None else 0.8 * q.mean_exec_s + 0.2 * took_s
        if exiting:
            lease.exiting = exiting

    def reply_done(self, lease: LeasedWorker, task_id: TaskID, took_s: float, exiting: str | None) -> list[Action]:
        """``reply_arrived`` then ``after_reply``: one event (one take of the lock the io
        thread's events run under) per reply. The worker is kept busy (or idled) before the
        owner settles the reply's task: nothing here reads that task."""
        self.reply_arrived(lease, task_id, took_s, exiting)
        return self.after_reply(lease)

    def use_retry(self, task: PendingTask) -> bool:
        """The task raised a retryable exception: True when it runs again (a retry used)."""
        if task.retries_left != 0 and not task.cancelled:
            if task.retries_left > 0:
                task.retries_left -= 1
            return True
        return False

    def after_reply(self, lease: LeasedWorker) -> list[Action]:
        """The reply's task is settled: keep the worker busy, or let it idle."""
        if lease.dead:
            return []
        q = lease.queue
        if lease.recalled or lease.exiting:
            # Its raylet asked for it back, or the worker said it exits (max_calls,
            # sys.exit()): it takes nothing more, and goes back once it is done. (An exiting
            # worker may live on a while, for the objects it owns: its resources do not.)
            if lease.tasks or lease.claimed:
                return []
            return self.return_lease(lease, disconnect=False) + self.pump(q)
        if q.tasks and lease.tasks and not lease.exiting:
            # A burst: tasks wait while this worker still runs some. Every other usable worker
            # was filled by the pump that last changed it, so only this one could take more,
            # and only once it is down to the refill mark (``pump``): until then, nothing to
            # do, without a pump per reply.
            mean = q.mean_exec_s
            depth = self.max_in_flight if mean is not None and mean * 1000 < self.pipeline_below_ms else 1
            if len(lease.tasks) > (depth // 2 if depth > 2 else depth - 1):
                if self.check:
                    self._check_queue(q, set(), 64)
                return []
        out: list[Action] = []
        if not lease.tasks and not q.tasks and not lease.exiting \
                and lease not in self.idle_leases and not lease.claimed:
            hungry = self._starving_like(lease) if self.starving else None
            if hungry is not None:
                # Tasks of another function of this shape wait for a worker from the
                # raylet: this one takes them now (many functions submitted at once ran
                # one per idle timeout, ~100 ms each, where a worker had gone idle).
                self._move(lease, hungry)
                return self.pump(hungry)
            self.idle_leases.add(lease)
            out.append(StartIdleTimer(lease))
        out.extend(self.pump(q, after_reply=True))
        return out

    # ------------------------------------------------------------------ failures

    def worker_failed(self, lease: LeasedWorker) -> list[Action]:
        """The connection to a leased worker dropped: its in-flight tasks failed (or, from
        a worker that said it exits, never ran: they are queued again, using no retry)."""
        in_flight = list(lease.tasks.values())
        lease.tasks.clear()
        out = self.return_lease(lease, disconnect=True)
        if in_flight and lease.exiting:
            for task in reversed(in_flight):
                if task.state != DONE:
                    task.lease = None
                    task.state = QUEUED
                    lease.queue.tasks.appendleft(task)
        elif in_flight:
            out.append(AwaitWorkerExit(lease, in_flight))
        out.extend(self.pump(lease.queue))
        return out

    def worker_died(self, lease: LeasedWorker, tasks: list[PendingTask], cause: str | None) -> list[Action]:
        """Why the worker of ``lease`` died is known (``cause``, None: unknown): retry its
        tasks per ``max_retries`` (after a delay when it was killed for memory), or fail them."""
        out: list[Action] = []
        oom = cause is not None and OOM_KILL_REASON in cause
        group_removed = cause is not None and PG_REMOVED_STOP_REASON in cause
        failed = (exc.OutOfMemoryError if oom else exc.NodeDiedError if cause in (NODE_DIED_CAUSE, NODE_GONE_CAUSE)
                  else exc.WorkerCrashedError)
        for task in tasks:
            if task.state == DONE:
                continue
            if task.force_cancelled or task.cancelled:
                out.append(FailTask(task, exc.TaskCancelledError(task.spec.task_id.hex(), "force-cancelled")))
                continue
            text = (f"worker {short(lease.worker_id)} on node {short(lease.node_id)} died"
                    f" ({cause or 'cause unknown'}) while running {task.spec.name}()")
            if group_removed:
                # Stopped with its placement group: Ray's error, and no retry (the group is gone).
                out.append(FailTask(task, exc.TaskPlacementGroupRemoved(
                    f"{task.spec.name}() was stopped when its placement group was removed (worker "
                    f"{short(lease.worker_id)} on node {short(lease.node_id)}); not retried: the group is gone")))
                continue
            if task.retries_left != 0:
                if task.retries_left > 0:
                    task.retries_left -= 1
                # Memory is short now: give it time to recover before running again.
                delay = self.oom_retry_delay_base_s * 2 ** min(task.spec.attempt, 5) if oom else 0.0
                out.append(RetryTask(task, text, delay))
            else:
                tries = task.template.max_retries
                out.append(FailTask(task, failed(
                    f"{text}. " + (f"Retried {tries} times (max_retries={tries})." if tries > 0 else
                                   "Not retried (max_retries=0)."))))
        return out

    @staticmethod
    def retry_due(task: PendingTask, why: str) -> list[Action]:
        """A delayed retry's time came: run it, unless it ended or was cancelled meanwhile."""
        if task.state == DONE:
            return []
        if task.force_cancelled or task.cancelled:
            return [FailTask(task, exc.TaskCancelledError(task.spec.task_id.hex(), "cancelled"))]
        return [RetryTask(task, why)]

    # ------------------------------------------------------------------ invariants

    def validate(self) -> None:
        """Check every invariant; raise ``AssertionError`` naming the first one broken."""
        seen: set[int] = set()
        for key, q in self.queues.items():
            _check(q.key == key, f"queue {key!r} filed under another key")
            self._check_queue(q, seen, len(q.tasks))
        for lease in self.idle_leases:
            _check(lease in lease.queue.leases, f"idle lease {lease.lease_id} not held")
            _check(not lease.tasks, f"idle lease {lease.lease_id} runs tasks")

    def _check_queue(self, q: SchedulingQueue, seen: set[int], max_queued: int) -> None:
        """The invariants of one queue, its leases and (the first ``max_queued``) queued tasks."""
        _check(q.requesting >= 0, f"queue {q.key!r}: {q.requesting} lease requests in flight")
        for task in islice(q.tasks, max_queued):
            tid = short(task.spec.task_id)
            _check(task.state == QUEUED, f"task {tid} queued in state {task.state}")
            _check(task.queue is q, f"task {tid} in a queue not its own")
            _check(id(task) not in seen, f"task {tid} in two places")
            seen.add(id(task))
        for lease in q.leases:
            _check(lease.queue is q, f"lease {lease.lease_id} in a queue not its own")
            _check(not lease.dead, f"returned lease {lease.lease_id} still in its queue")
            _check(len(lease.tasks) <= max(self.max_in_flight, 1),
                   f"lease {lease.lease_id}: {len(lease.tasks)} tasks in flight")
            for tid_b, task in lease.tasks.items():
                tid = short(tid_b)
                _check(task.spec.task_id == tid_b and task.state == PUSHED and task.lease is lease,
                       f"task {tid} on lease {lease.lease_id} is not pushed there")
                _check(id(task) not in seen, f"task {tid} in two places")
                seen.add(id(task))
            _check(lease not in self.idle_leases or not lease.tasks, f"idle lease {lease.lease_id} runs tasks")


class Serialized:
    """A ``TaskSubmitterState`` whose every method runs under ``lock``: the io thread's
    events, and a user thread's ``claim_idle`` under the same lock, never interleave (an
    idle lease a user thread claimed is never returned as idle in the middle of it)."""

    def __init__(self, state: TaskSubmitterState, lock: Any) -> None:
        self.state = state
        self.lock = lock

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.state, name)
        if not callable(attr):
            return attr
        acquire, release = self.lock.acquire, self.lock.release  # (cheaper than ``with``)

        def call(*args: Any, **kwargs: Any) -> Any:
            acquire()
            try:
                return attr(*args, **kwargs)
            finally:
                release()

        call.__name__ = name
        setattr(self, name, call)  # found in the instance's dict from now on
        return call


def _usable(q: SchedulingQueue) -> int:
    """Leases of ``q`` that count against ``max_leases_per_scheduling_key`` (a blocked one's
    worker waits in get() or wait(), maybe for these very tasks: it does not count, or a
    chain of nested tasks would wait for ever at the cap)."""
    return sum(1 for lease in q.leases
               if not lease.dead and not lease.exiting and not lease.blocked and not lease.recalled)


def _fits(task: PendingTask, lease: LeasedWorker) -> bool:
    """``task`` may run on ``lease``'s worker, leased for another function of its shape:
    none of its arguments lives in the store of another node (a lease request for such a
    task tells the raylet where they are, and it is placed near them)."""
    node = lease.node_id
    for dep in task.spec.deps:
        if dep.data is None and dep.node_id is not None and dep.node_id != node:
            return False
    return True


def _check(ok: bool, what: str) -> None:
    if not ok:
        raise AssertionError(f"TaskSubmitterState: {what}")
