"""The GCS actor table as a pure state machine: lifecycle, restarts, names, owners.

``ActorManagerState`` takes events (a registration, a worker leased for a creation, the
creation's reply, a worker, node or job that died, a kill) and returns actions
(publish a row, start placing an actor, push its creation task, give a lease back, kill
a worker, drop a checkpoint). It opens no sockets and awaits nothing; ``ActorManager``
(actor_manager.py) feeds it and runs the actions. Time is passed in (wall-clock seconds:
it only stamps rows).

```
PENDING_CREATION ──created──► ALIVE ──worker/node died, restarts left──► RESTARTING ──► ALIVE
        │                       │                                             │
        └──── __init__ raised, killed, out of restarts, owner gone ───────────┴──► DEAD
```

One creation, as the server drives it::

    ActorRegistered ─► PublishActor, PlaceActor
    (server picks a node, leases a worker there)
    WorkerLeased ─► PushCreationTask          (or ReturnWorker: the actor died meanwhile,
                                               or the node did; then it is placed again)
    (server pushes the creation task, awaits its reply)
    CreationFinished ─► PublishActor (ALIVE)  (or DEAD: __init__ raised; ignored when the
                                               worker is no longer the actor's: issue 12)

Every change bumps ``ActorInfo.version``; each ``PublishActor`` is one persisted and
published row (key: the actor id). A dead actor's row keeps its creation spec without the
constructor's arguments, and only the ``dead_kept`` most recently dead actors are kept at
all: the older ones are forgotten (``ForgetActor``, the row deleted from storage), so a
long-lived cluster's table does not grow with every actor it ever ran.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Union

from lumos._private.ids import ActorID, JobID, NodeID, WorkerID, short
from lumos._private.protocol import messages as m
from lumos._private.protocol.vocab import ACTOR_UNSCHEDULABLE_CAUSE, ActorNameTaken, WorkerExitType

logger = logging.getLogger(__name__)

PENDING, ALIVE, RESTARTING, DEAD = "PENDING_CREATION", "ALIVE", "RESTARTING", "DEAD"

# ----------------------------------------------------------------------------- events


@dataclasses.dataclass(slots=True)
class ActorRegistered:
    """A caller registered an actor's creation task (``RegisterActor``)."""

    spec: m.TaskSpec


@dataclasses.dataclass(slots=True)
class ActorRestored:
    """A row read back from storage by a restarted GCS."""

    info: m.ActorInfo
    spec: m.TaskSpec
    worker_id: WorkerID | None
    lease_id: int
    lease_node: bytes | None


@dataclasses.dataclass(slots=True)
class ActorUnschedulable:
    """No node can ever host the actor (hard affinity to a dead node, a removed group...)."""

    actor_id: ActorID
    reason: str


@dataclasses.dataclass(slots=True)
class WorkerLeased:
    """A raylet granted a dedicated worker for the actor's creation."""

    actor_id: ActorID
    node_id: NodeID
    lease_id: int
    worker_id: WorkerID


@dataclasses.dataclass(slots=True)
class CreationFinished:
    """The creation task on ``worker_id`` answered: ``__init__`` returned (ok) or raised."""

    actor_id: ActorID
    worker_id: WorkerID
    ok: bool
    #: The serialized exception ``__init__`` raised (None: a system error, or ok).
    error_blob: bytes | None
    address: m.Address | None
    pid: int


@dataclasses.dataclass(slots=True)
class WorkerDied:
    """A worker process ended (its raylet reported it dead)."""

    worker_id: WorkerID
    detail: str


@dataclasses.dataclass(slots=True)
class NodeDied:
    """A node was declared dead; ``workers`` were alive on it."""

    node_id: NodeID
    reason: str
    workers: list[bytes] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(slots=True)
class JobFinished:
    """A job ended. ``recovered``: read back as finished by a restarted GCS (recorded only)."""

    job_id: JobID
    recovered: bool = False


#: How long an actor whose handles all went out of scope gets for its clean-up
#: (``__ray_shutdown__``, ``__del__``, ``atexit``: the worker gives them 10 s) before its
#: worker is killed.
GRACEFUL_EXIT_S = 12.0


@dataclasses.dataclass(slots=True)
class KillRequested:
    """``lumos.kill(actor, no_restart=...)``, or every handle gone (``graceful``)."""

    actor_id: ActorID
    reason: str
    no_restart: bool
    #: The actor may run its clean-up before its worker is stopped.
    graceful: bool = False


@dataclasses.dataclass(slots=True)
class ActorExited:
    """The actor ended itself (``exit_actor()``): dead on purpose, never restarted."""

    actor_id: ActorID
    reason: str


Event = Union[ActorRegistered, ActorRestored, ActorUnschedulable, WorkerLeased, CreationFinished,
              WorkerDied, NodeDied, JobFinished, KillRequested, ActorExited]

# ----------------------------------------------------------------------------- actions


@dataclasses.dataclass(slots=True)
class PublishActor:
    """Persist the actor's row and publish it on the "actors" channel."""

    actor_id: ActorID


@dataclasses.dataclass(slots=True)
class PlaceActor:
    """Start placing the actor: pick a node, lease a worker there (then ``WorkerLeased``)."""

    actor_id: ActorID


@dataclasses.dataclass(slots=True)
class PushCreationTask:
    """Run the creation task on the leased worker (then ``CreationFinished``)."""

    actor_id: ActorID
    worker_id: WorkerID
    #: The spec's ``attempt``: the actor's restarts so far.
    attempt: int


@dataclasses.dataclass(slots=True)
class ReturnWorker:
    """Give an actor's lease back to its raylet (which stops the worker: actors never pool)."""

    node_id: NodeID | None
    lease_id: int
    #: What the stopped worker's row says of its end.
    exit_type: WorkerExitType = WorkerExitType.INTENDED_SYSTEM_EXIT


@dataclasses.dataclass(slots=True)
class KillWorker:
    node_id: NodeID | None
    worker_id: WorkerID
    reason: str
    #: Seconds the worker gets to exit on its own (an actor's clean-up) before the kill.
    graceful_s: float = 0.0
    #: What the worker's row says of its end.
    exit_type: WorkerExitType = WorkerExitType.INTENDED_SYSTEM_EXIT
    #: With ``graceful_s``: the actor runs its clean-up (False: its worker only sends what
    #: it holds, task events, output and metrics, and exits).
    clean_up: bool = True


@dataclasses.dataclass(slots=True)
class DeleteCheckpoint:
    """Drop the dead actor's ``__lumos_checkpoint__`` state from the KV table."""

    actor_id: ActorID


@dataclasses.dataclass(slots=True)
class ForgetActor:
    """Delete the row of a dead actor the table no longer keeps (``dead_kept``)."""

    actor_id: ActorID


Action = Union[PublishActor, PlaceActor, PushCreationTask, ReturnWorker, KillWorker, DeleteCheckpoint, ForgetActor]

# ----------------------------------------------------------------------------- state


class _Actor:
    __slots__ = ("info", "spec", "worker_id", "lease_id", "lease_node")

    def __init__(self, info: m.ActorInfo, spec: m.TaskSpec) -> None:
        self.info = info
        self.spec = spec
        #: The worker hosting (or being made to host) the actor.
        self.worker_id: WorkerID | None = None
        #: Its lease, and the node that granted it.
        self.lease_id = 0
        self.lease_node: bytes | None = None


class ActorManagerState:
    """Every actor of the cluster (dead ones too), its names and its workers."""

    def __init__(self, validate: bool = False, dead_kept: int = 10_000) -> None:
        if dead_kept < 1:
            raise ValueError(f"dead_kept must be at least 1, not {dead_kept}")
        self.validate = validate
        #: Actor id -> actor.
        self.actors: dict[bytes, _Actor] = {}
        #: How many dead actors the table keeps (for ``list_actors``, a handle's late
        #: call, a restarted GCS); ``_dead``: their ids, the longest dead first.
        self.dead_kept = dead_kept
        self._dead: dict[bytes, None] = {}
        self._dead_sorted = True
        #: (namespace, name) -> actor id, for actors that are not dead.
        self.named: dict[tuple[str, str], bytes] = {}
        #: Worker id -> actor id, for workers hosting (or being made to host) an actor.
        self.by_worker: dict[bytes, bytes] = {}
        #: Nodes declared dead: a lease or reply from one of them is stale.
        self.dead_nodes: set[bytes] = set()
        #: Jobs that finished: their non-detached actors are not restarted.
        self.finished_jobs: set[bytes] = set()
        #: Owners that died with their node while owning live actors: those are not restarted.
        self.dead_owners: set[bytes] = set()

    # ------------------------------------------------------------------ queries

    def info_of(self, actor_id: ActorID) -> m.ActorInfo | None:
        a = self.actors.get(actor_id)
        return a.info if a is not None else None

    def named_info(self, namespace: str, name: str) -> m.ActorInfo | None:
        actor_id = self.named.get((namespace, name))
        return self.info_of(actor_id) if actor_id is not None else None

    def registered_info(self, spec: m.TaskSpec) -> m.ActorInfo:
        """What ``RegisterActor`` answers once ``ActorRegistered(spec)`` was handled: the actor,
        or the live one of that name (``get_if_exists``)."""
        info = self.info_of(spec.actor_id or b"")
        if info is None:
            opts: dict[str, Any] = spec.actor_options or {}
            info = self.named_info(opts.get("namespace") or "", opts.get("name") or "")
        if info is None:
            raise LookupError(f"actor {short(spec.actor_id or b'')} is not registered")
        return info

    def wants_placement(self, actor_id: ActorID) -> bool:
        """The actor waits for a node and worker (its placement loop keeps going)."""
        a = self.actors.get(actor_id)
        return a is not None and a.info.state in (PENDING, RESTARTING) and a.worker_id is None

    def row(self, actor_id: ActorID) -> list[Any]:
        """The actor's persisted row: ``[info, spec, worker_id, lease_id, lease_node]``."""
        a = self.actors[actor_id]
        return [a.info, a.spec, a.worker_id, a.lease_id, a.lease_node]

    # ------------------------------------------------------------------ events

    def handle(self, event: Event, now: float) -> list[Action]:
        """Apply ``event`` at wall-clock ``now``; the actions to run, in order.

        Raises:
            ValueError: a malformed registration, a name taken in its namespace, or a kill
                of an unknown actor (the state is unchanged).
        """
        actions: list[Action] = []
        if isinstance(event, ActorRegistered):
            self._register(event.spec, now, actions)
        elif isinstance(event, ActorRestored):
            self._restore(event, actions)
        elif isinstance(event, ActorUnschedulable):
            a = self.actors.get(event.actor_id)
            if a is not None:
                self._mark_dead(a, ACTOR_UNSCHEDULABLE_CAUSE + event.reason, None, now, actions)
        elif isinstance(event, WorkerLeased):
            self._leased(event, actions)
        elif isinstance(event, CreationFinished):
            self._creation_finished(event, now, actions)
        elif isinstance(event, WorkerDied):
            self._worker_died(event.worker_id, event.detail, now, actions)
        elif isinstance(event, NodeDied):
            self._node_died(event, now, actions)
        elif isinstance(event, JobFinished):
            self.finished_jobs.add(event.job_id)
            if not event.recovered:
                for a in list(self.actors.values()):
                    if a.info.job_id == event.job_id and not a.info.detached and a.info.state != DEAD \
                            and not self._owned_by_live_actor(a):
                        self._mark_dead(a, "its job finished (the driver exited)", None, now, actions,
                                        job_ended=True)
        elif isinstance(event, KillRequested):
            self._kill(event, now, actions)
        elif isinstance(event, ActorExited):
            a = self.actors.get(event.actor_id)
            if a is not None and a.info.state != DEAD:
                node, lease = a.lease_node, a.lease_id
                self._drop_worker(a)
                self._mark_dead(a, event.reason, None, now, actions)
                actions.append(ReturnWorker(node, lease, WorkerExitType.INTENDED_USER_EXIT))
        if len(self._dead) > self.dead_kept and not isinstance(event, ActorRestored):
            self._forget_oldest_dead(actions)  # (a restarted GCS's rows: at once after them)
        if self.validate:
            self.check_invariants()
        return actions

    # ------------------------------------------------------------------ registration and recovery

    def _register(self, spec: m.TaskSpec, now: float, actions: list[Action]) -> None:
        if spec.kind != m.TaskKind.ACTOR_CREATION_TASK or not spec.actor_id:
            raise ValueError("RegisterActor needs an actor creation task")
        if type(spec.enable_task_events) is not bool:
            raise ValueError("RegisterActor's enable_task_events must be a bool")
        opts: dict[str, Any] = spec.actor_options or {}
        name = opts.get("name") or ""
        namespace = opts.get("namespace") or ""
        if spec.actor_id in self.actors:
            return  # a retried registration
        if name:
            other = self.named.get((namespace, name))
            if other is not None:
                if opts.get("get_if_exists"):
                    return
                raise ActorNameTaken(f"an actor named {name!r} already exists in namespace {namespace!r}; "
                                 "use get_if_exists=True to reuse it, or lumos.get_actor()")
        info = m.ActorInfo(
            spec.actor_id, spec.job_id, PENDING, opts.get("class_name", spec.function_name), name, namespace,
            bool(opts.get("detached")), None, None, 0, 0, int(opts.get("max_restarts", 0)), "", None, 1,
            now, 0.0, dict(spec.resources), opts.get("handle_meta", b""), spec.owner.worker_id,
            placement_group_id=m.placement_group_of(spec.strategy))
        self.actors[spec.actor_id] = _Actor(info, spec)
        if name:
            self.named[(namespace, name)] = spec.actor_id
        self._publish(spec.actor_id, actions)
        actions.append(PlaceActor(spec.actor_id))

    def _restore(self, e: ActorRestored, actions: list[Action]) -> None:
        info = e.info
        if info.placement_group_id is None:  # (a record from before the field)
            info.placement_group_id = m.placement_group_of(e.spec.strategy)
        a = _Actor(info, e.spec)
        self.actors[info.actor_id] = a
        if info.state == DEAD:
            a.spec = _without_args(a.spec)  # (a row from before dead rows lost them)
            self._dead[info.actor_id] = None
            self._dead_sorted = False  # (rows come back in storage order)
            return
        if info.name:
            self.named[(info.namespace, info.name)] = info.actor_id
        if info.state in (PENDING, RESTARTING):
            actions.append(PlaceActor(info.actor_id))  # an unfinished creation starts over
            return
        a.worker_id, a.lease_id, a.lease_node = e.worker_id, e.lease_id, e.lease_node
        if e.worker_id is not None:
            self.by_worker[e.worker_id] = info.actor_id

    # ------------------------------------------------------------------ creation

    def _leased(self, e: WorkerLeased, actions: list[Action]) -> None:
        a = self.actors.get(e.actor_id)
        if a is None or a.info.state == DEAD or a.worker_id is not None or e.node_id in self.dead_nodes:
            # Dead meanwhile, leased twice, or from a node declared dead since: give it back
            # (the placement loop goes on while the actor still wants a node).
            actions.append(ReturnWorker(e.node_id, e.lease_id))
            return
        a.worker_id, a.lease_id, a.lease_node = e.worker_id, e.lease_id, e.node_id
        self.by_worker[e.worker_id] = e.actor_id
        actions.append(PushCreationTask(e.actor_id, e.worker_id, a.info.num_restarts))

    def _creation_finished(self, e: CreationFinished, now: float, actions: list[Action]) -> None:
        a = self.actors.get(e.actor_id)
        if a is None or a.info.state == DEAD:
            return
        if a.worker_id != e.worker_id or a.lease_node in self.dead_nodes:
            return  # from before its node was declared dead: a restart took over (issue 12)
        info = a.info
        if not e.ok:
            self._mark_dead(a, f"{info.class_name}.__init__ raised an exception", e.error_blob, now, actions,
                            exit_type=WorkerExitType.USER_ERROR)
            return
        info.state = ALIVE
        info.address = e.address
        info.node_id = a.lease_node
        info.pid = e.pid
        self._publish(info.actor_id, actions)
        logger.info("actor %s (%s) alive on worker %s", short(info.actor_id), info.class_name, short(e.worker_id))

    # ------------------------------------------------------------------ death and restarts

    def _mark_dead(self, a: _Actor, cause: str, error_blob: bytes | None, now: float,
                   actions: list[Action], graceful: bool = False,
                   exit_type: WorkerExitType = WorkerExitType.INTENDED_SYSTEM_EXIT, job_ended: bool = False) -> None:
        """``exit_type``: what its worker's row says, when that worker is stopped here.
        ``job_ended``: its worker sends what it holds and exits (``m.JOB_END_EXIT_S``), no
        clean-up run (as Ray's force-kill of a finished job's actors)."""
        info = a.info
        if info.state == DEAD:
            return
        info.state = DEAD
        info.death_cause = cause
        info.death_error = error_blob
        info.end_time = now
        info.address = None
        if info.name and self.named.get((info.namespace, info.name)) == info.actor_id:
            del self.named[(info.namespace, info.name)]
        actions.append(DeleteCheckpoint(info.actor_id))
        if a.worker_id is not None:
            # Give the lease back: the raylet stops the worker (actors never pool).
            actions.append(KillWorker(a.lease_node, a.worker_id, "its actor ended",
                                      GRACEFUL_EXIT_S if graceful else m.JOB_END_EXIT_S if job_ended else 0.0,
                                      exit_type, clean_up=not job_ended))
            actions.append(ReturnWorker(a.lease_node, a.lease_id))
            self._drop_worker(a)
        # No restart can come: the constructor's arguments (inline values, refs to pinned
        # ones) are of no more use, and the row is kept, in memory and storage, for long.
        a.spec = _without_args(a.spec)
        logger.info("actor %s (%s) dead: %s", short(info.actor_id), info.class_name, cause)
        self._publish(info.actor_id, actions)
        self._dead[info.actor_id] = None

    def _forget_oldest_dead(self, actions: list[Action]) -> None:
        """Drop the dead actors beyond ``dead_kept``, the longest dead first; not those
        this event published (their row is written and sent once ``actions`` run, and
        their callers learn of the death from it: they wait for the next event)."""
        if not self._dead_sorted:
            self._dead = dict.fromkeys(sorted(self._dead, key=lambda i: self.actors[i].info.end_time))
            self._dead_sorted = True
        fresh = {a.actor_id for a in actions if isinstance(a, PublishActor)}
        for actor_id in list(self._dead):
            if len(self._dead) <= self.dead_kept:
                break
            if actor_id in fresh:
                continue
            del self._dead[actor_id]
            del self.actors[actor_id]
            actions.append(ForgetActor(actor_id))

    def _drop_worker(self, a: _Actor) -> None:
        if a.worker_id is not None:
            self.by_worker.pop(a.worker_id, None)
            a.worker_id = None

    def _failed(self, a: _Actor, cause: str, now: float, actions: list[Action]) -> None:
        """The actor's process (or node) is gone: restart it or declare it dead."""
        info = a.info
        if info.state == DEAD:
            return
        self._drop_worker(a)
        if self._owner_gone(a):
            self._mark_dead(a, f"{cause}; its owner is gone, so it is not restarted", None, now, actions)
            return
        if info.max_restarts == -1 or info.num_restarts < info.max_restarts:
            info.num_restarts += 1
            info.state = RESTARTING
            info.death_cause = cause
            info.address = None
            logger.info("restarting actor %s (%s), restart %d: %s", short(info.actor_id), info.class_name,
                        info.num_restarts, cause)
            self._publish(info.actor_id, actions)
            actions.append(PlaceActor(info.actor_id))
        else:
            limit = info.max_restarts
            self._mark_dead(a, f"{cause}; " + (f"it was restarted {limit} times (max_restarts={limit})"
                                               if limit else "max_restarts=0, so it is not restarted"),
                            None, now, actions)

    def _owned_by_live_actor(self, a: _Actor) -> bool:
        """``a`` was made by an actor that still lives (its worker's): a detached actor's
        children, say, which outlive the job they belong to, as in Ray (they end with their
        owner: ``_worker_died``)."""
        owner = self.by_worker.get(a.info.owner_worker_id)
        live = self.actors.get(owner) if owner is not None and owner != a.info.actor_id else None
        return live is not None and live.info.state != DEAD

    def _owner_gone(self, a: _Actor) -> bool:
        if a.info.detached:
            return False
        if a.info.owner_worker_id in self.dead_owners:
            return True
        return a.info.job_id in self.finished_jobs and not self._owned_by_live_actor(a)

    def _worker_died(self, worker_id: WorkerID, detail: str, now: float, actions: list[Action]) -> None:
        actor_id = self.by_worker.get(worker_id)
        if actor_id is not None:
            a = self.actors[actor_id]
            if a.worker_id == worker_id:
                self._failed(a, f"the actor's worker process died ({detail or 'cause unknown'})", now, actions)
        # Actors owned by that worker (created from a task or another actor) share its fate.
        for a in list(self.actors.values()):
            if a.info.owner_worker_id == worker_id and not a.info.detached and a.info.state != DEAD:
                self._mark_dead(a, "its owner (the worker that created it) died", None, now, actions)

    def _node_died(self, e: NodeDied, now: float, actions: list[Action]) -> None:
        self.dead_nodes.add(e.node_id)
        gone = set(e.workers)
        if gone:
            self.dead_owners.update(a.info.owner_worker_id for a in self.actors.values()
                                    if a.info.owner_worker_id in gone and a.info.state != DEAD)
        for a in list(self.actors.values()):
            if a.lease_node == e.node_id and a.info.state != DEAD and a.worker_id is not None:
                self._failed(a, f"its node {short(e.node_id)} died ({e.reason})", now, actions)
                a.lease_node = None

    def _kill(self, e: KillRequested, now: float, actions: list[Action]) -> None:
        a = self.actors.get(e.actor_id)
        if a is None:
            raise ValueError(f"no actor {e.actor_id.hex()}")
        if a.info.state == DEAD:
            return
        # (graceful: every handle went out of scope, lumos's stop; else the user's kill)
        exit_type = WorkerExitType.INTENDED_SYSTEM_EXIT if e.graceful else WorkerExitType.INTENDED_USER_EXIT
        if e.no_restart:
            self._mark_dead(a, e.reason, None, now, actions, graceful=e.graceful, exit_type=exit_type)
        elif a.worker_id is not None:
            # Its worker dies; WorkerDied then restarts the actor as its max_restarts allows.
            actions.append(KillWorker(a.lease_node, a.worker_id, e.reason, exit_type=exit_type))

    def _publish(self, actor_id: ActorID, actions: list[Action]) -> None:
        self.actors[actor_id].info.version += 1
        actions.append(PublishActor(actor_id))

    # ------------------------------------------------------------------ invariants

    def check_invariants(self) -> None:
        """Raise AssertionError naming the first actor whose bookkeeping disagrees."""
        for (ns, name), actor_id in self.named.items():
            a = self.actors.get(actor_id)
            if a is None or a.info.state == DEAD or (a.info.namespace, a.info.name) != (ns, name):
                raise AssertionError(f"name {ns}/{name} points at actor {short(actor_id)}, which is "
                                     f"{'unknown' if a is None else a.info.state + ' ' + a.info.name}")
        for worker_id, actor_id in self.by_worker.items():
            a = self.actors.get(actor_id)
            if a is None or a.worker_id != worker_id:
                raise AssertionError(f"worker {short(worker_id)} is listed for actor {short(actor_id)}, "
                                     "which does not hold it")
        for actor_id in self._dead:
            if actor_id not in self.actors:
                raise AssertionError(f"actor {short(actor_id)} is in the dead actors' order but not in the table")
        for actor_id, a in self.actors.items():
            info = a.info
            what = f"actor {short(actor_id)} ({info.state})"
            if info.state != DEAD and info.name and self.named.get((info.namespace, info.name)) != actor_id:
                raise AssertionError(f"{what} is named {info.name!r} but the name points elsewhere")
            if info.state == DEAD and (a.worker_id is not None or info.address is not None):
                raise AssertionError(f"{what} still has a worker or an address")
            if info.state == ALIVE and (a.worker_id is None or info.address is None):
                raise AssertionError(f"{what} has no worker or no address")
            if a.worker_id is not None:
                if self.by_worker.get(a.worker_id) != actor_id:
                    raise AssertionError(f"{what}: its worker {short(a.worker_id)} is not indexed")
                if a.lease_node is None or a.lease_node in self.dead_nodes:
                    raise AssertionError(f"{what}: its worker's node {short(a.lease_node or b'')} is "
                                         "unknown or dead")
            if info.state == RESTARTING and info.num_restarts < 1:
                raise AssertionError(f"{what} restarts without a restart counted")
            if (info.state == DEAD) != (actor_id in self._dead):
                raise AssertionError(f"{what} is {'not ' if info.state == DEAD else ''}in the dead actors' order")
            if info.state == DEAD and (a.spec.args or a.spec.deps or a.spec.nested_refs):
                raise AssertionError(f"{what} still holds its constructor's arguments")
            if info.max_restarts != -1 and info.num_restarts > info.max_restarts:
                raise AssertionError(f"{what}: {info.num_restarts} restarts > max_restarts={info.max_restarts}")


def _without_args(spec: m.TaskSpec) -> m.TaskSpec:
    """A dead actor's creation spec: what it was, without what it was given."""
    if not (spec.args or spec.deps or spec.nested_refs):
        return spec
    return dataclasses.replace(spec, args=b"", deps=[], nested_refs=[])
