"""The GCS actor manager: runs ``ActorManagerState``'s decisions over the network.

The GCS owns every actor's lifecycle. A caller registers the actor's creation task;
the manager picks a node, leases a dedicated worker from that node's raylet, pushes
the creation task to it and publishes the actor's address once ``__init__`` returns.
Callers then talk to the actor's worker directly. What happens to an actor (restarts,
names, owners, stale replies) is decided by the pure ``ActorManagerState``
(actor_state.py); this module owns the I/O: RPC handlers, one placement loop per
creation, the creation connection to the worker, raylet notifications (through the
GCS's ``RayletPool``), storage writes and publishes.

```
RegisterActor ──► state ──PlaceActor──► _place loop: pick node ─► RequestWorkerLease (raylet)
                                              ▲  WorkerLeased ──► state ──PushCreationTask
                                              │                      │
                       no node yet: wait for a node change           ▼
                                               _push_creation: PushTask to the worker
                                               CreationFinished ──► state ──PublishActor
worker/node/job died, kill, exit ──► state ──► PublishActor, PlaceActor (restart),
                                               KillWorker/ReturnWorker (raylet), DeleteCheckpoint
```
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from typing import TYPE_CHECKING, Any

from lumos._private.gcs import actor_state as ast
from lumos._private.gcs.actor_state import ALIVE, DEAD, PENDING, RESTARTING  # noqa: F401  (re-exported)
from lumos._private.gcs.global_scheduler import Unschedulable, infeasible_text
from lumos._private.gcs.turns import Turns
from lumos._private.ids import ActorID, JobID, NodeID, WorkerID, short
from lumos._private.protocol import messages as m
from lumos._private.protocol.vocab import APP_ERROR_TYPE
from lumos._private.transport.connection import Connection, ConnectionLost, RemoteError, connect
from lumos._private.worker import CREATION_PRELOAD

if TYPE_CHECKING:
    from lumos._private.gcs.server import GcsServer

logger = logging.getLogger(__name__)

#: KV namespace of actor checkpoints (``__lumos_checkpoint__`` state).
CHECKPOINT_NS = "actor_ckpt"


def placement_resources(spec: m.TaskSpec) -> dict[str, float]:
    """What a node must have free to take the actor: its resources, plus the CPU an actor
    that asked for none needs to be placed (``actor_options["placement_cpus"]``; it holds
    none once created), as in Ray."""
    cpus = (spec.actor_options or {}).get("placement_cpus")
    if not isinstance(cpus, (int, float)) or cpus <= 0:
        return dict(spec.resources)
    return {**spec.resources, "CPU": float(spec.resources.get("CPU", 0.0)) + float(cpus)}


def _placement_hint(spec: m.TaskSpec) -> str:
    if (spec.actor_options or {}).get("placement_cpus"):
        return (" (an actor that asks for no resources needs 1 CPU on its node to be placed, as in Ray, "
                "and holds none; give it num_cpus=0 to place it on a node without CPUs)")
    return ""


class ActorManager:
    """Serves the actor table in the GCS process from an ``ActorManagerState``."""

    def __init__(self, gcs: "GcsServer") -> None:
        self.gcs = gcs
        self.state = ast.ActorManagerState(validate=gcs.config.validate,
                                           dead_kept=gcs.config.maximum_gcs_destroyed_actor_cached_count)
        #: Placement loops waiting for a node that fits, woken in registration order
        #: when a node joins and every second (what is free changes without one joining).
        self._turns = Turns(gcs._spawn_task, lambda: self.state.actors, 1.0, "actor.placement.turns")

    @property
    def actors(self) -> dict[bytes, Any]:
        return self.state.actors

    def handlers(self) -> dict[type, Any]:
        return {
            m.RegisterActor: self.register,
            m.GetActorInfo: lambda c, msg: self.state.info_of(msg.actor_id),
            m.GetNamedActor: lambda c, msg: self.state.named_info(msg.namespace, msg.name),
            m.KillActor: self.kill,
            m.ListActors: lambda c, msg: [a.info for a in self.state.actors.values()
                                          if msg.job_id is None or a.info.job_id == msg.job_id],
            m.ActorExiting: self.exiting,
        }

    # ------------------------------------------------------------------ events in, actions out

    def _dispatch(self, event: ast.Event) -> list[ast.Action]:
        actions = self.state.handle(event, time.time())
        for action in actions:
            self._execute(action)
        return actions

    def _execute(self, action: ast.Action) -> None:
        pool = self.gcs.raylets
        if isinstance(action, ast.PublishActor):
            self._persist(action.actor_id)
            info = self.state.info_of(action.actor_id)
            self.gcs.publish("actors", action.actor_id, info)
            if info is not None and info.detached and info.state == DEAD:
                self.gcs.drop_job_kv_if_unused(info.job_id)  # (it may have kept its finished job's)
        elif isinstance(action, ast.PlaceActor):
            self.gcs._spawn_task(self._place(action.actor_id), f"actor.create.{short(action.actor_id)}")
        elif isinstance(action, ast.ReturnWorker):
            pool.notify_nowait(action.node_id, m.ReturnWorker(action.lease_id, False, action.exit_type))
        elif isinstance(action, ast.KillWorker):
            pool.notify_nowait(action.node_id, m.KillWorker(action.worker_id, action.reason, action.graceful_s,
                                                            action.exit_type, action.clean_up))
        elif isinstance(action, ast.DeleteCheckpoint):
            if self.gcs.kv.pop((CHECKPOINT_NS, action.actor_id), None) is not None:
                self.gcs.unpersist("kv", CHECKPOINT_NS.encode() + b"\0" + action.actor_id)
        elif isinstance(action, ast.ForgetActor):
            self.gcs.unpersist("actors", action.actor_id)
        # PushCreationTask: run by the placement loop that asked for the lease.

    def _persist(self, actor_id: ActorID) -> None:
        self.gcs.persist("actors", actor_id, self.state.row(actor_id))

    def persist_all(self) -> None:
        """Write every actor row again (a storage that came back empty)."""
        for actor_id in self.state.actors:
            self._persist(actor_id)

    def restore(self, info: m.ActorInfo, spec: m.TaskSpec, worker_id: WorkerID | None, lease_id: int,
                lease_node: bytes | None) -> None:
        """Take back an actor row from storage (a restarted GCS); unfinished creations resume."""
        self._dispatch(ast.ActorRestored(info, spec, worker_id, lease_id, lease_node))

    # ------------------------------------------------------------------ requests

    def register(self, conn: Connection, msg: m.RegisterActor) -> m.ActorInfo:
        self._dispatch(ast.ActorRegistered(msg.spec))
        return self.state.registered_info(msg.spec)

    def kill(self, conn: Connection, msg: m.KillActor) -> bool:
        info = self.state.info_of(msg.actor_id)
        was_alive = info is not None and info.state != DEAD
        self._dispatch(ast.KillRequested(msg.actor_id, msg.reason or "killed by lumos.kill()", msg.no_restart,
                                         msg.graceful))
        return was_alive

    def exiting(self, conn: Connection, msg: m.ActorExiting) -> None:
        self._dispatch(ast.ActorExited(msg.actor_id, msg.reason))

    # ------------------------------------------------------------------ cluster events

    def nodes_changed(self) -> None:
        self._turns.wake()

    def on_worker_dead(self, worker_id: WorkerID, detail: str) -> None:
        self._dispatch(ast.WorkerDied(worker_id, detail))

    def on_node_dead(self, node_id: NodeID, reason: str, workers: list[bytes] | None = None) -> None:
        self._dispatch(ast.NodeDied(node_id, reason, list(workers or [])))

    def on_job_finished(self, job_id: JobID, recovered: bool = False) -> None:
        self._dispatch(ast.JobFinished(job_id, recovered))

    # ------------------------------------------------------------------ placement and creation

    def _pick_node(self, spec: m.TaskSpec, class_name: str) -> bytes | None:
        """The node for the actor's creation; None while nothing fits (or its bundle is unplaced).

        In a placement group: the node holding its bundle. Otherwise the global scheduler's
        choice, as for a spilled task (SPREAD, node affinity, load, infeasible-until-joined).

        Raises:
            Unschedulable: hard affinity to a node that is gone or too small; a placement
                group that was removed, or a bundle the actor does not fit in.
        """
        strategy = spec.strategy
        if isinstance(strategy, list) and strategy[:1] == ["PG"]:
            return self.gcs.placement_groups.node_for_bundle(bytes(strategy[1]), int(strategy[2]), spec.resources)
        gs = self.gcs.global_scheduler
        req = m.ScheduleLease(spec.job_id, placement_resources(spec), strategy, class_name, b"")
        try:
            node_id: NodeID | None = gs.state.pick(gs.node_views(), req, time.monotonic())
        except Unschedulable as e:
            raise Unschedulable(f"{e}{_placement_hint(spec)}") from None
        return node_id

    async def _place(self, actor_id: ActorID) -> None:
        """Place the actor and run its creation task; retried until it lives or dies."""
        state = self.state
        started = time.monotonic()
        warned = False
        #: The node a raylet named when the creation left it (``SpillbackReply``).
        named: NodeID | None = None
        while state.wants_placement(actor_id):
            actor = state.actors[actor_id]
            info, spec = actor.info, actor.spec
            try:
                node_id = named if named is not None else self._pick_node(spec, info.class_name)
                named = None
            except Unschedulable as e:
                self._dispatch(ast.ActorUnschedulable(actor_id, str(e)))
                return
            if node_id is None:
                in_group = isinstance(spec.strategy, list) and spec.strategy[:1] == ["PG"]
                if not warned and not in_group and time.monotonic() - started >= self.gcs.config.infeasible_warning_s:
                    # As for tasks: the job hears that its actor waits for a node that fits
                    # (its calls waited in silence).
                    warned = True
                    nodes = [(dict(n.resources_total), dict(n.labels)) for n in self.gcs.nodes.values()
                             if n.state == "ALIVE"]
                    text = infeasible_text(f"actor {info.class_name}", placement_resources(spec), spec.strategy,
                                           nodes) + _placement_hint(spec)
                    logger.warning("%s", text)
                    self.gcs.publish("errors", info.job_id, ["infeasible", text])
                await self._turns.wait(actor_id)
                continue
            try:
                raylet = await self.gcs.raylets.get(node_id)
                grant: m.LeaseGrant | m.SpillbackReply = await raylet.call(m.RequestWorkerLease(
                    info.job_id, spec.resources, m.GCS_OWNER, spec.strategy, info.class_name, actor_id,
                    retry_budget=info.max_restarts))
            except (OSError, ConnectionLost, TimeoutError, RemoteError, KeyError) as e:
                logger.warning("could not lease a worker for actor %s on node %s: %s",
                               short(actor_id), short(node_id), e)
                await asyncio.sleep(0.2)
                continue
            if isinstance(grant, m.SpillbackReply):
                # It waited on a busy node while another freed up (``may_move``): asked
                # there (the GCS's pick counted it there already).
                logger.info("actor %s leaves node %s, still busy, for node %s", short(actor_id), short(node_id),
                            short(grant.node_id))
                named = grant.node_id
                continue
            actions = self._dispatch(ast.WorkerLeased(actor_id, node_id, grant.lease_id, grant.worker_id))
            push = next((a for a in actions if isinstance(a, ast.PushCreationTask)), None)
            if push is None:
                continue  # dead meanwhile (the loop ends), or the node was: placed again
            outcome = await self._push_creation(actor_id, push.attempt, grant)
            if outcome is not None:  # None: the worker died, and WorkerDied decides what follows
                ok, error_blob = outcome
                winfo = self.gcs.workers.get(grant.worker_id)
                self._dispatch(ast.CreationFinished(actor_id, grant.worker_id, ok, error_blob,
                                                    grant.worker_address, winfo.pid if winfo is not None else 0))
            return

    def _with_preload(self, spec: m.TaskSpec) -> m.TaskSpec:
        """The creation spec to push: a copy that carries the job's config and the pickled
        class from the KV, which the new worker would otherwise ask the GCS for (two
        blocking round trips before ``__init__``, issue 19). What is not in the KV yet
        (a class still being exported) the worker fetches as before."""
        kv = self.gcs.kv
        preload = [kv.get(("job", spec.job_id)), kv.get(("fn", spec.job_id + spec.function_id))]
        if preload == [None, None]:
            return spec
        return dataclasses.replace(spec, actor_options={**(spec.actor_options or {}), CREATION_PRELOAD: preload})

    async def _push_creation(self, actor_id: ActorID, attempt: int,
                             grant: m.LeaseGrant) -> tuple[bool, bytes | None] | None:
        """Run the creation task on the leased worker: (ok, __init__'s error), or None if it went away."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[m.TaskReply] = loop.create_future()

        def on_reply(conn: Connection, reply: m.TaskReply) -> None:
            if not done.done():
                done.set_result(reply)

        def on_close(conn: Connection) -> None:
            if not done.done():
                done.set_exception(ConnectionLost("the actor's worker went away during creation"))

        spec = self.state.actors[actor_id].spec
        spec.attempt = attempt
        try:
            conn = await connect(grant.worker_address, token=self.gcs.token, config=self.gcs.config,
                                 handlers={m.TaskReply: on_reply}, on_close=on_close,
                                 name=f"gcs->actor-{short(actor_id)}",
                                 use_unix=os.path.exists(grant.worker_address.unix_path or "/nonexistent"))
            try:
                conn.notify(m.PushTask(self._with_preload(spec), grant.resource_ids))
                reply = await done
            finally:
                conn.close()
        except (OSError, ConnectionLost, TimeoutError) as e:
            logger.info("creation of actor %s interrupted: %s", short(actor_id), e)
            return None
        now = time.time()
        if reply.system_error is not None:
            if spec.enable_task_events:
                self.gcs.task_events.add([m.TaskEvent(spec.task_id, spec.attempt, m.TaskState.FAILED, now, spec.job_id,
                                                      {"error_type": "ACTOR_CREATION_FAILED"}, grant.node_id,
                                                      grant.worker_id, reply.system_error)])
            return False, None
        blob = reply.returns[0].data if reply.returns else None
        if spec.enable_task_events:
            state = m.TaskState.FAILED if reply.app_error else m.TaskState.FINISHED
            # The executor leaves RUNNING to whoever gets the reply (here): its start time.
            self.gcs.task_events.add([m.TaskEvent(
                spec.task_id, spec.attempt, m.TaskState.RUNNING if reply.start_time else state,
                reply.start_time or reply.end_time or now, spec.job_id,
                {"error_type": APP_ERROR_TYPE} if reply.app_error else None, grant.node_id,
                grant.worker_id, "__init__ raised" if reply.app_error else None,
                [[state, reply.end_time or now]] if reply.start_time else None)])
        return (not reply.app_error), (blob if reply.app_error else None)
