"""The GCS actor table: creation, placement, restarts, names, and death.

The GCS owns every actor's lifecycle. A caller registers the actor's creation task;
the manager picks a node, leases a dedicated worker from that node's raylet, pushes
the creation task to it and publishes the actor's address once ``__init__`` returns.
Callers then talk to the actor's worker directly.

```
PENDING_CREATION ──created──► ALIVE ──worker/node died, restarts left──► RESTARTING ──► ALIVE
        │                       │                                             │
        └──── __init__ raised, killed, out of restarts, owner gone ───────────┴──► DEAD
```

Every change bumps ``ActorInfo.version`` and is published on the "actors" channel
(key: the actor id).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import TYPE_CHECKING, Any

from lumos._private.gcs.global_scheduler import Unschedulable
from lumos._private.ids import short
from lumos._private.protocol import messages as m
from lumos._private.transport.connection import (Connection, ConnectionCache, ConnectionLost, RemoteError,
                                                 connect)

if TYPE_CHECKING:
    from lumos._private.gcs.server import GcsServer

logger = logging.getLogger(__name__)

PENDING, ALIVE, RESTARTING, DEAD = "PENDING_CREATION", "ALIVE", "RESTARTING", "DEAD"

#: KV namespace of actor checkpoints (``__lumos_checkpoint__`` state).
CHECKPOINT_NS = "actor_ckpt"


class _Actor:
    __slots__ = ("info", "spec", "worker_id", "lease_id", "lease_node", "creating", "intentional",
                 "schedule_task")

    def __init__(self, info: m.ActorInfo, spec: m.TaskSpec) -> None:
        self.info = info
        self.spec = spec
        #: The worker hosting (or being made to host) the actor.
        self.worker_id: bytes | None = None
        self.lease_id = 0
        self.lease_node: bytes | None = None
        self.creating = False
        #: Set when the actor is ending on purpose: no restart, this cause.
        self.intentional: str | None = None
        self.schedule_task: asyncio.Task[Any] | None = None


class ActorManager:
    def __init__(self, gcs: "GcsServer") -> None:
        self.gcs = gcs
        self.actors: dict[bytes, _Actor] = {}
        #: (namespace, name) -> actor id, for actors that are not dead.
        self.named: dict[tuple[str, str], bytes] = {}
        #: Worker id -> actor id, for workers hosting an actor.
        self._by_worker: dict[bytes, bytes] = {}
        self._raylets = ConnectionCache()
        self._nodes_changed = asyncio.Event()

    def handlers(self) -> dict[type, Any]:
        return {
            m.RegisterActor: self.register,
            m.GetActorInfo: lambda c, msg: self._info_of(msg.actor_id),
            m.GetNamedActor: self.get_named,
            m.KillActor: self.kill,
            m.ListActors: lambda c, msg: [a.info for a in self.actors.values()
                                          if msg.job_id is None or a.info.job_id == msg.job_id],
            m.ActorExiting: self.exiting,
        }

    # ------------------------------------------------------------------ queries

    def _info_of(self, actor_id: bytes) -> m.ActorInfo | None:
        a = self.actors.get(actor_id)
        return a.info if a is not None else None

    def get_named(self, conn: Connection, msg: m.GetNamedActor) -> m.ActorInfo | None:
        actor_id = self.named.get((msg.namespace, msg.name))
        return self._info_of(actor_id) if actor_id is not None else None

    # ------------------------------------------------------------------ registration

    def register(self, conn: Connection, msg: m.RegisterActor) -> m.ActorInfo:
        spec = msg.spec
        if spec.kind != 1 or not spec.actor_id:
            raise ValueError("RegisterActor needs an actor creation task")
        if type(spec.enable_task_events) is not bool:
            raise ValueError("RegisterActor's enable_task_events must be a bool")
        opts: dict[str, Any] = spec.actor_options or {}
        name = opts.get("name") or ""
        namespace = opts.get("namespace") or ""
        existing = self.actors.get(spec.actor_id)
        if existing is not None:
            return existing.info  # a retried registration
        if name:
            other = self.named.get((namespace, name))
            if other is not None:
                if opts.get("get_if_exists"):
                    return self.actors[other].info
                raise ValueError(f"an actor named {name!r} already exists in namespace {namespace!r}; "
                                 "use get_if_exists=True to reuse it, or lumos.get_actor()")
        now = time.time()
        info = m.ActorInfo(
            spec.actor_id, spec.job_id, PENDING, opts.get("class_name", spec.function_name), name, namespace,
            bool(opts.get("detached")), None, None, 0, 0, int(opts.get("max_restarts", 0)), "", None, 1,
            now, 0.0, dict(spec.resources), opts.get("handle_meta", b""), spec.owner.worker_id)
        actor = _Actor(info, spec)
        self.actors[spec.actor_id] = actor
        if name:
            self.named[(namespace, name)] = spec.actor_id
        self._publish(actor)
        actor.schedule_task = self.gcs._spawn_task(self._create(actor), f"actor.create.{short(spec.actor_id)}")
        return info

    def _publish(self, actor: _Actor) -> None:
        actor.info.version += 1
        self._persist(actor)
        self.gcs.publish("actors", actor.info.actor_id, actor.info)

    def _persist(self, actor: _Actor) -> None:
        self.gcs.persist("actors", actor.info.actor_id,
                         [actor.info, actor.spec, actor.worker_id, actor.lease_id, actor.lease_node])

    def persist_all(self) -> None:
        """Write every actor row again (a storage that came back empty)."""
        for actor in self.actors.values():
            self._persist(actor)

    def restore(self, info: m.ActorInfo, spec: m.TaskSpec, worker_id: bytes | None, lease_id: int,
                lease_node: bytes | None) -> None:
        """Take back an actor row from storage (a restarted GCS); unfinished creations resume."""
        actor = _Actor(info, spec)
        actor.worker_id, actor.lease_id, actor.lease_node = worker_id, lease_id, lease_node
        self.actors[info.actor_id] = actor
        if info.state == DEAD:
            return
        if info.name:
            self.named[(info.namespace, info.name)] = info.actor_id
        if worker_id is not None:
            self._by_worker[worker_id] = info.actor_id
        if info.state in (PENDING, RESTARTING):
            actor.worker_id = None
            actor.schedule_task = self.gcs._spawn_task(self._create(actor), "actor.create.recovered")

    # ------------------------------------------------------------------ placement and creation

    def _pick_node(self, actor: _Actor) -> bytes | None:
        """The node for the actor's creation; None while nothing fits (or its bundle is unplaced).

        In a placement group: the node holding its bundle. Otherwise the global scheduler's
        choice, as for a spilled task (SPREAD, node affinity, load, infeasible-until-joined).

        Raises:
            Unschedulable: hard affinity to a node that is gone or too small; a placement
                group that was removed, or a bundle the actor does not fit in.
        """
        spec = actor.spec
        strategy = spec.strategy
        if isinstance(strategy, list) and strategy[:1] == ["PG"]:
            return self.gcs.placement_groups.node_for_bundle(bytes(strategy[1]), int(strategy[2]), spec.resources)
        gs = self.gcs.global_scheduler
        req = m.ScheduleLease(spec.job_id, spec.resources, strategy, actor.info.class_name, b"")
        node_id: bytes | None = gs.state.pick(gs.node_views(), req, time.monotonic())
        return node_id

    async def _raylet(self, node_id: bytes) -> Connection:
        async def open_conn() -> Connection:
            address = self.gcs.nodes[node_id].address
            return await connect(address, token=self.gcs.token, config=self.gcs.config,
                                 name=f"gcs->raylet-{short(node_id)}",
                                 use_unix=bool(address.unix_path) and os.path.exists(address.unix_path))

        return await self._raylets.get(node_id, open_conn)

    def _raylet_conn(self, node_id: bytes | None) -> Connection | None:
        conn = self._raylets.conns.get(node_id)
        return conn if conn is not None and not conn.is_closed else None

    def nodes_changed(self) -> None:
        self._nodes_changed.set()

    async def _create(self, actor: _Actor) -> None:
        """Place the actor and run its creation task; retried until it lives or dies."""
        info = actor.info
        while info.state in (PENDING, RESTARTING) and actor.intentional is None:
            try:
                node_id = self._pick_node(actor)
            except Unschedulable as e:
                self._mark_dead(actor, f"cannot be scheduled: {e}")
                return
            if node_id is None:
                self._nodes_changed.clear()
                try:
                    async with asyncio.timeout(1.0):
                        await self._nodes_changed.wait()
                except TimeoutError:
                    pass
                continue
            try:
                raylet = await self._raylet(node_id)
                grant: m.LeaseGrant = await raylet.call(m.RequestWorkerLease(
                    info.job_id, actor.spec.resources, b"gcs", actor.spec.strategy, info.class_name,
                    info.actor_id))
            except (OSError, ConnectionLost, TimeoutError, RemoteError) as e:
                logger.warning("could not lease a worker for actor %s on node %s: %s",
                               short(info.actor_id), short(node_id), e)
                await asyncio.sleep(0.2)
                continue
            if actor.intentional is not None or info.state == DEAD:
                raylet.notify(m.ReturnWorker(grant.lease_id, False))
                return
            actor.worker_id = grant.worker_id
            actor.lease_id = grant.lease_id
            actor.lease_node = node_id
            self._by_worker[grant.worker_id] = info.actor_id
            outcome = await self._run_creation(actor, grant)
            if outcome is None:
                return  # the worker died: on_worker_dead decides what happens next
            ok, error_blob = outcome
            if actor.intentional is not None or info.state == DEAD:
                return
            node = self.gcs.nodes.get(node_id)
            if actor.worker_id != grant.worker_id or node is None or node.state == "DEAD":
                return  # from before its node was declared dead: a restart took over (issue 12)
            if ok:
                winfo = self.gcs.workers.get(grant.worker_id)
                info.state = ALIVE
                info.address = grant.worker_address
                info.node_id = node_id
                info.pid = winfo.pid if winfo is not None else 0
                self._publish(actor)
                logger.info("actor %s (%s) alive on worker %s", short(info.actor_id), info.class_name,
                            short(grant.worker_id))
            else:
                self._mark_dead(actor, f"{info.class_name}.__init__ raised an exception", error_blob)
            return

    async def _run_creation(self, actor: _Actor, grant: m.LeaseGrant) -> tuple[bool, bytes | None] | None:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[m.TaskReply] = loop.create_future()

        def on_reply(conn: Connection, reply: m.TaskReply) -> None:
            if not done.done():
                done.set_result(reply)

        def on_close(conn: Connection) -> None:
            if not done.done():
                done.set_exception(ConnectionLost("the actor's worker went away during creation"))

        spec = actor.spec
        spec.attempt = actor.info.num_restarts
        actor.creating = True
        try:
            conn = await connect(grant.worker_address, token=self.gcs.token, config=self.gcs.config,
                                 handlers={m.TaskReply: on_reply}, on_close=on_close,
                                 name=f"gcs->actor-{short(actor.info.actor_id)}",
                                 use_unix=os.path.exists(grant.worker_address.unix_path or "/nonexistent"))
            try:
                conn.notify(m.PushTask(spec, grant.resource_ids))
                reply = await done
            finally:
                conn.close()
        except (OSError, ConnectionLost, TimeoutError) as e:
            logger.info("creation of actor %s interrupted: %s", short(actor.info.actor_id), e)
            return None
        finally:
            actor.creating = False
        now = time.time()
        if reply.system_error is not None:
            if spec.enable_task_events:
                self.gcs.task_events.add([m.TaskEvent(spec.task_id, spec.attempt, "FAILED", now, spec.job_id,
                                                      None, grant.node_id, grant.worker_id, reply.system_error)])
            return False, None
        blob = reply.returns[0].data if reply.returns else None
        if spec.enable_task_events:
            state = "FAILED" if reply.app_error else "FINISHED"
            self.gcs.task_events.add([m.TaskEvent(spec.task_id, spec.attempt, state, reply.end_time or now,
                                                  spec.job_id, None, grant.node_id, grant.worker_id,
                                                  "__init__ raised" if reply.app_error else None)])
        return (not reply.app_error), (blob if reply.app_error else None)

    # ------------------------------------------------------------------ death and restarts

    def _mark_dead(self, actor: _Actor, cause: str, error_blob: bytes | None = None) -> None:
        info = actor.info
        if info.state == DEAD:
            return
        info.state = DEAD
        info.death_cause = cause
        info.death_error = error_blob
        info.end_time = time.time()
        info.address = None
        if info.name and self.named.get((info.namespace, info.name)) == info.actor_id:
            del self.named[(info.namespace, info.name)]
        if self.gcs.kv.pop((CHECKPOINT_NS, info.actor_id), None) is not None:
            self.gcs.unpersist("kv", CHECKPOINT_NS.encode() + b"\0" + info.actor_id)
        self._release_worker(actor)
        logger.info("actor %s (%s) dead: %s", short(info.actor_id), info.class_name, cause)
        self._publish(actor)

    def _release_worker(self, actor: _Actor) -> None:
        """Give the actor's lease back: the raylet stops the worker (actors never pool)."""
        wid = actor.worker_id
        if wid is None:
            return
        self._by_worker.pop(wid, None)
        actor.worker_id = None
        raylet = self._raylet_conn(actor.lease_node)
        if raylet is not None:
            raylet.notify(m.KillWorker(wid, "its actor ended"))
            raylet.notify(m.ReturnWorker(actor.lease_id, False))

    def _failed(self, actor: _Actor, cause: str) -> None:
        """The actor's process (or node) is gone: restart it or declare it dead."""
        info = actor.info
        if info.state == DEAD:
            return
        self._by_worker.pop(actor.worker_id or b"", None)
        actor.worker_id = None
        if actor.intentional is not None:
            self._mark_dead(actor, actor.intentional)
            return
        owner_gone = self._owner_gone(actor)
        if owner_gone:
            self._mark_dead(actor, f"{cause}; its owner is gone, so it is not restarted")
            return
        if info.max_restarts == -1 or info.num_restarts < info.max_restarts:
            info.num_restarts += 1
            info.state = RESTARTING
            info.death_cause = cause
            info.address = None
            logger.info("restarting actor %s (%s), restart %d: %s", short(info.actor_id), info.class_name,
                        info.num_restarts, cause)
            self._publish(actor)
            actor.schedule_task = self.gcs._spawn_task(self._create(actor), "actor.restart")
        else:
            limit = info.max_restarts
            self._mark_dead(actor, f"{cause}; " + (f"it was restarted {limit} times (max_restarts={limit})"
                                                   if limit else "max_restarts=0, so it is not restarted"))

    def _owner_gone(self, actor: _Actor) -> bool:
        if actor.info.detached:
            return False
        job = self.gcs.jobs.get(actor.info.job_id)
        if job is not None and job.state != "RUNNING":
            return True
        owner = self.gcs.workers.get(actor.info.owner_worker_id)
        return owner is not None and owner.state == "DEAD"

    def on_worker_dead(self, worker_id: bytes, detail: str) -> None:
        actor_id = self._by_worker.get(worker_id)
        if actor_id is not None:
            actor = self.actors.get(actor_id)
            if actor is not None and actor.worker_id == worker_id:
                self._failed(actor, f"the actor's worker process died ({detail or 'cause unknown'})")
        # Actors owned by that worker (created from a task or another actor) share its fate.
        for actor in list(self.actors.values()):
            if (actor.info.owner_worker_id == worker_id and not actor.info.detached
                    and actor.info.state != DEAD):
                actor.intentional = "its owner (the worker that created it) died"
                if actor.worker_id is None:
                    self._mark_dead(actor, actor.intentional)
                else:
                    self._release_worker(actor)
                    self._mark_dead(actor, actor.intentional)

    def on_node_dead(self, node_id: bytes, reason: str) -> None:
        self._raylets.discard(node_id)
        for actor in list(self.actors.values()):
            if actor.lease_node == node_id and actor.info.state in (ALIVE, PENDING, RESTARTING) \
                    and actor.worker_id is not None:
                actor.lease_node = None
                self._failed(actor, f"its node {short(node_id)} died ({reason})")

    def on_job_finished(self, job_id: bytes) -> None:
        for actor in list(self.actors.values()):
            if actor.info.job_id == job_id and not actor.info.detached and actor.info.state != DEAD:
                actor.intentional = "its job finished (the driver exited)"
                self._mark_dead(actor, actor.intentional)

    # ------------------------------------------------------------------ requests

    def kill(self, conn: Connection, msg: m.KillActor) -> bool:
        actor = self.actors.get(msg.actor_id)
        if actor is None:
            raise ValueError(f"no actor {msg.actor_id.hex()}")
        info = actor.info
        if info.state == DEAD:
            return False
        reason = msg.reason or "killed by lumos.kill()"
        if msg.no_restart:
            actor.intentional = reason
            self._mark_dead(actor, reason)
            return True
        wid = actor.worker_id
        raylet = self._raylet_conn(actor.lease_node)
        if wid is not None and raylet is not None:
            raylet.notify(m.KillWorker(wid, reason))
        return True

    def exiting(self, conn: Connection, msg: m.ActorExiting) -> None:
        actor = self.actors.get(msg.actor_id)
        if actor is not None and actor.info.state != DEAD:
            actor.intentional = msg.reason
            self._by_worker.pop(actor.worker_id or b"", None)
            actor.worker_id = None
            self._mark_dead(actor, msg.reason)
            raylet = self._raylet_conn(actor.lease_node)
            if raylet is not None:
                raylet.notify(m.ReturnWorker(actor.lease_id, False))

    def close(self) -> None:
        self._raylets.close_all()
