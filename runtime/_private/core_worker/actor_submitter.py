"""Caller side of actor calls: ordering, connection to the actor, restarts (io thread).

Each actor this process calls has an ``_ActorQueue``. Calls enter it in submission
order when submitted; a call is sent once its arguments are ready and every earlier
call has been sent (head of line), so one caller's calls reach the actor in order over
one connection. The actor's address comes from the GCS (the "actors" channel). When
the connection drops, calls in flight are put back in order if ``max_task_retries``
allows, otherwise they wait for the GCS to say why (restart or death) and fail with
``ActorDiedError``. Unsent calls wait for the restarted actor.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from typing import TYPE_CHECKING, Any

from lumos import exceptions as exc
from lumos._private.core_worker.tasks import DONE, PUSHED, QUEUED, PendingTask
from lumos._private.ids import ActorID, NodeID, short
from lumos._private.protocol import messages as m
from lumos._private.protocol.vocab import ACTOR_UNSCHEDULABLE_CAUSE
from lumos._private.transport.connection import Connection, ConnectionLost, RemoteError

if TYPE_CHECKING:
    from lumos._private.core_worker.core_worker import CoreWorker  # its public methods only, see ActorSubmitter

logger = logging.getLogger(__name__)

ALIVE, DEAD = "ALIVE", "DEAD"


class _ActorQueue:
    __slots__ = ("actor_id", "info", "conn", "conn_worker", "connecting", "queue", "ready", "inflight",
                 "lost", "subscribed", "pinned", "check_timer", "released", "lost_since", "registering",
                 "failed")

    def __init__(self, actor_id: ActorID) -> None:
        self.actor_id = actor_id
        self.info: m.ActorInfo | None = None
        self.conn: Connection | None = None
        #: The worker the connection goes to (a restart means a new one).
        self.conn_worker: bytes | None = None
        self.connecting = False
        #: Calls not sent yet, in submission order.
        self.queue: deque[PendingTask] = deque()
        #: Task ids whose arguments are ready.
        self.ready: set[bytes] = set()
        #: Sent, not answered, in send order.
        self.inflight: OrderedDict[bytes, PendingTask] = OrderedDict()
        #: In flight when the connection dropped and not retryable: waiting for the GCS's verdict.
        self.lost: list[PendingTask] = []
        self.lost_since = 0.0
        self.subscribed = False
        #: Arguments of the creation task, held while the actor may restart (owner only).
        self.pinned: list[bytes] = []
        self.check_timer: Any = None
        #: Created by this process and its RegisterActor not answered yet: calls queue, the
        #: GCS is neither asked about it nor told to end it until the answer comes.
        self.registering = False
        #: Its registration failed: every call raises this.
        self.failed: BaseException | None = None
        #: The owner's handles are all gone: end the actor once its calls are answered.
        self.released = False


class ActorSubmitter:
    """Actor calls of one process. Uses only the core worker's public surface: ``spawn``,
    ``peer``, ``fail_task``, ``unpin``, ``record_event``, ``record_scheduled``,
    ``unrecord_scheduled``, ``spill_events``, ``allow_direct_writes``, and the attributes
    ``loop``, ``gcs``, ``config``, ``dead_nodes``, ``extra_publish_handlers``."""

    def __init__(self, cw: "CoreWorker") -> None:
        self.cw = cw
        self.actors: dict[bytes, _ActorQueue] = {}
        cw.extra_publish_handlers["actors"] = self._on_publish
        #: Calls not yet answered, for actors with ``max_pending_calls`` (any thread).
        self._counted: dict[bytes, int] = {}
        self._count_lock = threading.Lock()
        #: Held while a call is written to an actor's connection, from the io thread
        #: (``_send``) or straight from a user thread (``send_direct``): one order per actor.
        self._direct_lock = threading.Lock()
        #: Calls ``send_direct`` wrote (a statistic: not exact with several user threads).
        self.direct_sent = 0

    # ------------------------------------------------------------------ tracking

    def track(self, actor_id: ActorID, info: m.ActorInfo | None = None) -> _ActorQueue:
        """Start following an actor (io thread)."""
        q = self.actors.get(actor_id)
        if q is None:
            q = self.actors[actor_id] = _ActorQueue(actor_id)
        if info is not None:
            self._apply(q, info)
        if not q.subscribed and not q.registering:
            q.subscribed = True
            gcs = self.cw.gcs
            if gcs is not None and not gcs.is_closed:
                gcs.notify(m.Subscribe("actors", actor_id))
                self.cw.spawn(self._refresh(q), "actor.info")
        return q

    def registering(self, actor_id: ActorID) -> None:
        """This process sent (or is about to send) the actor's RegisterActor (io thread)."""
        q = self.actors.get(actor_id)
        if q is None:
            q = self.actors[actor_id] = _ActorQueue(actor_id)
        q.registering = True

    def registered(self, actor_id: ActorID, info: m.ActorInfo) -> None:
        """The GCS answered the actor's RegisterActor: follow it as any actor (io thread)."""
        q = self.actors.get(actor_id)
        if q is not None:
            q.registering = False
        self.track(actor_id, info)
        if q is not None and q.released:
            self._maybe_release(q)

    def registration_failed(self, actor_id: ActorID, error: BaseException) -> None:
        """The actor's RegisterActor failed: its calls, queued and future, raise ``error``."""
        q = self.actors.get(actor_id)
        if q is None:
            q = self.actors[actor_id] = _ActorQueue(actor_id)
        q.registering = False
        q.failed = error
        self._fail_all(q, error)
        if q.pinned:
            ids, q.pinned = q.pinned, []
            self.cw.unpin(ids)

    def pin_creation_args(self, actor_id: ActorID, ids: list[bytes]) -> None:
        self.track(actor_id).pinned.extend(ids)

    async def _refresh(self, q: _ActorQueue) -> None:
        gcs = self.cw.gcs
        if gcs is None:
            return
        try:
            info = await gcs.call(m.GetActorInfo(q.actor_id), self.cw.config.rpc_timeout_s)
        except (ConnectionLost, TimeoutError, RemoteError) as e:
            logger.debug("actor info for %s: %s", short(q.actor_id), e)
            return
        if info is not None:
            self._apply(q, info)
        elif q.info is None:
            self._fail_all(q, exc.ActorDiedError(q.actor_id.hex(), (
                "the GCS does not know this actor: it died long ago and was forgotten (the GCS keeps "
                "the last maximum_gcs_destroyed_actor_cached_count dead actors), or the handle is from "
                "an earlier lumos session of this process, ended by lumos.shutdown(), or from another cluster")))

    def _on_publish(self, msg: m.Publish) -> None:
        info = msg.data
        if not isinstance(info, m.ActorInfo):
            return
        self.cw.io.drain_pending()  # calls sent straight from user threads are booked first
        q = self.actors.get(info.actor_id)
        if q is not None:
            self._apply(q, info)

    def _apply(self, q: _ActorQueue, info: m.ActorInfo) -> None:
        if q.info is not None and info.version <= q.info.version:
            return
        q.info = info
        if info.state == DEAD:
            self._fail_all(q, self._death_error(q))
            if q.pinned:
                ids, q.pinned = q.pinned, []
                self.cw.unpin(ids)
            return
        if info.state != ALIVE:
            # Restarting or not created yet: calls that were lost without retries fail now.
            if q.lost:
                lost, q.lost = q.lost, []
                for task in lost:
                    allowed = task.template.max_retries
                    retries = ("max_task_retries=0" if allowed == 0
                               else f"its max_task_retries={allowed} were used up")
                    self.cw.fail_task(task, exc.ActorUnavailableError(
                        q.actor_id.hex(), f"the actor's process failed while this call was sent or running "
                        f"({info.death_cause or 'cause unknown'}); it is being restarted, and the call was not "
                        f"retried ({retries}): it may or may not have run"))
            return
        if q.lost:  # the same actor is alive again without our connection: those calls are gone
            lost, q.lost = q.lost, []
            err = exc.ActorDiedError(q.actor_id.hex(), "the connection to the actor dropped while this "
                                     f"call ran ({info.death_cause or 'cause unknown'})")
            for task in lost:
                self.cw.fail_task(task, err)
        assert info.address is not None
        if info.address.node_id in self.cw.dead_nodes:
            return  # an address from before its node was declared dead: the restart comes next
        if q.conn_worker != info.address.worker_id or q.conn is None or q.conn.is_closed:
            if not q.connecting:
                q.connecting = True
                self.cw.spawn(self._connect(q, info), "actor.connect")
        else:
            self._send(q)

    def _death_error(self, q: _ActorQueue) -> BaseException:
        info = q.info
        if info is not None and info.death_error:
            from lumos._private import serialization as ser
            try:
                _kind, err = ser.deserialize(info.death_error)
                if isinstance(err, exc.TaskError):
                    # As in Ray: every call raises ActorDiedError (RayActorError), whose
                    # message carries the constructor's exception and traceback.
                    return exc.ActorDiedError(q.actor_id.hex(), "the actor died because of an error raised "
                                              f"in its creation task, {err}", err.as_instanceof_cause())
                if isinstance(err, BaseException):
                    return err
            except Exception as e:  # the class of the error may not load here
                return exc.ActorDiedError(q.actor_id.hex(), f"{info.death_cause} (error not loadable: {e})")
        cause = info.death_cause if info is not None else "unknown"
        name = info.class_name if info is not None else "actor"
        if cause.startswith(ACTOR_UNSCHEDULABLE_CAUSE):  # as in Ray
            return exc.ActorUnschedulableError(q.actor_id.hex(), f"the actor {name} {cause}")
        return exc.ActorDiedError(q.actor_id.hex(), f"the actor {name} is dead: {cause}")

    async def _connect(self, q: _ActorQueue, info: m.ActorInfo) -> None:
        try:
            assert info.address is not None
            conn = await self.cw.peer(info.address)
        except (OSError, ConnectionLost, TimeoutError) as e:
            q.connecting = False
            logger.info("cannot reach actor %s at %s: %s", short(q.actor_id), short(info.address.worker_id), e)
            self._schedule_check(q)
            return
        q.connecting = False
        if q.info is not info and q.info is not None and q.info.state != ALIVE:
            return
        self.cw.allow_direct_writes(conn)
        q.conn = conn
        q.conn_worker = info.address.worker_id
        self._send(q)

    def _schedule_check(self, q: _ActorQueue, delay_s: float = 0.5) -> None:
        """Ask the GCS again later: a connection dropped and no verdict arrived yet."""
        loop = self.cw.loop
        if loop is None or q.check_timer is not None:
            return

        def fire() -> None:
            q.check_timer = None
            if q.lost or (q.queue and q.conn is None and not q.connecting):
                self.cw.spawn(self._refresh_then_recheck(q), "actor.recheck")

        q.check_timer = loop.call_later(delay_s, fire)

    async def _refresh_then_recheck(self, q: _ActorQueue) -> None:
        await self._refresh(q)
        grace = self.cw.config.node_death_timeout_ms / 1000 + 5.0
        if q.lost and time.monotonic() - q.lost_since > grace:
            # The GCS still reports the same instance alive: the connection, not the actor,
            # broke. Those calls' fate is unknown; say so rather than wait for ever.
            lost, q.lost = q.lost, []
            err = exc.ActorDiedError(q.actor_id.hex(), "the connection to the actor dropped while this call "
                                     "ran, and the actor did not fail; the call may or may not have run")
            for task in lost:
                self.cw.fail_task(task, err)
        if q.lost or (q.queue and (q.conn is None or q.conn.is_closed) and not q.connecting):
            if q.info is not None and q.info.state == ALIVE and not q.lost:
                self._apply_force(q)
            self._schedule_check(q, 1.0)

    def _apply_force(self, q: _ActorQueue) -> None:
        info = q.info
        if info is not None and info.state == ALIVE and not q.connecting:
            q.connecting = True
            self.cw.spawn(self._connect(q, info), "actor.connect")

    # ------------------------------------------------------------------ calls

    def add(self, task: PendingTask) -> None:
        """A call was submitted (before its arguments are ready): take its place in line."""
        q = self.actors.get(task.spec.actor_id or b"")
        if q is None:
            q = self.track(task.spec.actor_id or b"")
        if q.failed is not None:
            self.cw.fail_task(task, q.failed)
            return
        if q.info is not None and q.info.state == DEAD:
            self.cw.fail_task(task, self._death_error(q))
            return
        task.state = QUEUED
        q.queue.append(task)

    def enqueue(self, task: PendingTask) -> None:
        """The call's arguments are ready (or it is being retried)."""
        q = self.actors.get(task.spec.actor_id or b"")
        if q is None or task.state == DONE:
            return
        q.ready.add(task.spec.task_id)
        if task not in q.queue:  # a retry put back by the core worker
            q.queue.appendleft(task)
        self._send(q)

    def send_direct(self, task: PendingTask) -> bool:
        """User thread: write a call without arguments to wait for straight to its actor's
        connection, saving the io thread's wake-up (a sync call's round trip has one hop
        fewer). Only when nothing is ahead of it: the io thread has nothing in hand but
        bookings of such writes to other actors (``IoLoop.clear_for``: a fan-out goes
        straight to each), the actor is alive and connected and none of its calls wait to
        be sent. The io thread books the call at its next turn, before any reply is
        handled (``_on_direct``). False: not sent this way; post it as usual."""
        cw = self.cw
        io = cw.io
        q = self.actors.get(task.spec.actor_id or b"")
        if q is None or q.queue or q.lost or q.connecting:
            return False
        conn, info = q.conn, q.info
        if conn is None or not conn.direct_writes or info is None or info.state != ALIVE:
            return False
        if not io.clear_for(conn):
            return False
        spec = task.spec
        if spec.deps:
            cw.keep_lent_local(spec, info.node_id)
        with self._direct_lock:
            if q.queue or q.conn is not conn:
                return False
            if spec.enable_task_events:  # (before the write: the call may run and end before it returns)
                cw.record_scheduled(task, time.time(), info.node_id, q.conn_worker)
            sent = io.write_then_book(conn, m.PushTask(spec, {}), spec.task_id, self._on_direct, task, q, conn)
        if sent:
            self.direct_sent += 1
        return True

    def _on_direct(self, task: PendingTask, q: _ActorQueue, conn: Connection, was_sent: bool) -> None:
        """io thread: book a call ``send_direct`` took (or send it, if it could not)."""
        if not self.cw.register_call(task):
            return
        if not was_sent:
            self.cw.unrecord_scheduled(task)
            self.add(task)
            if task.state != DONE:
                self.enqueue(task)
            return
        task.state = PUSHED
        info = q.info
        if info is not None and info.state == DEAD and not q.inflight and not q.queue:
            self.cw.fail_task(task, self._death_error(q))  # it died meanwhile: calls failed already
        elif q.conn is not conn:
            # Its connection was given up on between the write and now (a close handled
            # while the user thread wrote): as a call lost in flight, in its place in line.
            self._lost_calls(q, [task], "the actor's connection dropped")
            if task in q.queue:
                q.queue.remove(task)
                seq = task.spec.sequence_no
                at = next((i for i, t in enumerate(q.queue) if t.spec.sequence_no > seq), len(q.queue))
                q.queue.insert(at, task)
            self._send(q)
        else:
            q.inflight[task.spec.task_id] = task  # (a close on its way finds it there)

    def _send(self, q: _ActorQueue) -> None:
        conn = q.conn
        if q.info is None or q.info.state != ALIVE:
            return
        if conn is None or conn.is_closed:
            # The connection dropped while the actor lives on (and the calls it carried are
            # settled): calls made since connect again (they waited for ever).
            if q.queue and not q.lost:
                self._apply_force(q)
            return
        with self._direct_lock:
            self._send_locked(q, conn)

    def _send_locked(self, q: _ActorQueue, conn: Connection) -> None:
        queue = q.queue
        cw = self.cw
        while queue and queue[0].spec.task_id in q.ready:
            task = queue.popleft()
            q.ready.discard(task.spec.task_id)
            if task.state == DONE:
                continue
            task.state = PUSHED
            q.inflight[task.spec.task_id] = task
            spec = task.spec
            if task.retry_why is not None:
                if spec.enable_task_events:
                    cw.spill_events(task)
                    cw.record_event(spec.task_id, spec.attempt, m.TaskState.RETRIED, time.time(), None, None,
                                    task.retry_why)
                spec.attempt += 1
                task.retry_why = None
            if spec.enable_task_events:
                cw.record_scheduled(task, time.time(), q.info.node_id, q.conn_worker)
            if spec.deps:
                cw.keep_lent_local(spec, q.info.node_id)
            conn.notify(m.PushTask(spec, {}))

    def on_reply(self, task: PendingTask, reply: m.TaskReply) -> None:
        if reply.system_error is None:  # otherwise the task fails and on_failed counts it
            self._uncount(task.spec.actor_id or b"")
        q = self.actors.get(task.spec.actor_id or b"")
        if q is not None:
            q.inflight.pop(task.spec.task_id, None)
            if q.released:
                self._maybe_release(q)

    def release_handle(self, actor_id: ActorID) -> None:
        q = self.actors.get(actor_id)
        if q is not None:
            q.released = True
            self._maybe_release(q)

    def _maybe_release(self, q: _ActorQueue) -> None:
        if q.queue or q.inflight or q.lost or q.registering or q.failed is not None or (
                q.info is not None and q.info.state == DEAD):
            return
        q.released = False
        gcs = self.cw.gcs
        if gcs is not None and not gcs.is_closed:
            gcs.notify(m.KillActor(q.actor_id, True, "every handle to the actor went out of scope", graceful=True))

    def on_failed(self, task: PendingTask) -> None:
        self._uncount(task.spec.actor_id or b"")
        q = self.actors.get(task.spec.actor_id or b"")
        if q is None:
            return
        q.inflight.pop(task.spec.task_id, None)
        q.ready.discard(task.spec.task_id)
        try:
            q.queue.remove(task)
        except ValueError:
            pass
        else:
            self._send(q)
        if q.released:
            self._maybe_release(q)  # a failed head of line must not block the calls behind it

    def connection_lost(self, conn: Connection, why: str = "the actor's connection dropped") -> None:
        self.cw.io.drain_pending()  # calls sent straight from user threads are booked first
        for q in self.actors.values():
            if q.conn is conn:
                self._lost_connection(q, why)

    def _lost_connection(self, q: _ActorQueue, why: str) -> None:
        """The connection to ``q``'s actor is gone: calls in flight are sent again (to the
        restarted actor) when ``max_task_retries`` allows, else they wait for the verdict."""
        q.conn = None
        inflight = list(q.inflight.values())
        q.inflight.clear()
        self._lost_calls(q, inflight, why)

    def _lost_calls(self, q: _ActorQueue, inflight: list[PendingTask], why: str) -> None:
        """Calls sent on a connection that dropped: sent again when ``max_task_retries``
        allows, else kept until the GCS says whether the actor died."""
        for task in inflight:
            q.inflight.pop(task.spec.task_id, None)
        retry: list[PendingTask] = []
        for task in inflight:
            if task.state == DONE:
                continue
            if task.retries_left != 0:
                if task.retries_left > 0:
                    task.retries_left -= 1
                task.retry_why = why
                task.state = QUEUED
                retry.append(task)
            else:
                if not q.lost:
                    q.lost_since = time.monotonic()
                q.lost.append(task)
        for task in reversed(retry):
            q.queue.appendleft(task)
            q.ready.add(task.spec.task_id)
        self._schedule_check(q)

    def _fail_all(self, q: _ActorQueue, error: BaseException) -> None:
        tasks = list(q.inflight.values()) + list(q.queue) + q.lost
        q.inflight.clear()
        q.queue.clear()
        q.ready.clear()
        q.lost = []
        for task in tasks:
            self.cw.fail_task(task, error)

    def node_died(self, node_id: NodeID) -> None:
        """The GCS declared ``node_id`` dead: calls to actors there fail over as if their
        connection had closed (the core worker severs it; its close then finds nothing)."""
        self.cw.io.drain_pending()
        for q in self.actors.values():
            info = q.info
            if info is None or info.address is None or info.address.node_id != node_id:
                continue
            self._lost_connection(q, f"its node {short(node_id)} was declared dead")

    def worker_of(self, task: PendingTask) -> bytes | None:
        """The worker the call's current attempt was sent to."""
        q = self.actors.get(task.spec.actor_id or b"")
        if q is None or task.spec.task_id not in q.inflight:
            return None
        return q.conn_worker

    def address_of(self, actor_id: ActorID) -> m.Address | None:
        q = self.actors.get(actor_id)
        return q.info.address if q is not None and q.info is not None else None

    def connection_of(self, actor_id: ActorID) -> Connection | None:
        q = self.actors.get(actor_id)
        return q.conn if q is not None else None

    def reserve_call(self, actor_id: ActorID, limit: int) -> bool:
        """User thread: count one more call, unless ``limit`` calls are pending already."""
        with self._count_lock:
            n = self._counted.get(actor_id, 0)
            if n >= limit:
                return False
            self._counted[actor_id] = n + 1
            return True

    def unreserve_call(self, actor_id: ActorID) -> None:
        """User thread: a call ``reserve_call`` counted was not made after all."""
        self._uncount(actor_id)

    def _uncount(self, actor_id: ActorID) -> None:
        if actor_id in self._counted:
            with self._count_lock:
                n = self._counted.get(actor_id, 0)
                if n > 0:
                    self._counted[actor_id] = n - 1

    def pending_calls(self, actor_id: ActorID) -> int:
        q = self.actors.get(actor_id)
        return 0 if q is None else len(q.queue) + len(q.inflight)


__all__ = ["ActorSubmitter"]
