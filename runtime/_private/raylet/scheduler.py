"""The local scheduler of one node: worker leases and the worker pool (pure).

Owners ask their raylet for a *lease*: a worker plus the resources of one task shape.
This class decides which request gets which worker, when to start or stop worker
processes, and which requests can never run here. ``RayletServer`` feeds it events and
executes the actions it returns; it never touches processes or sockets.

```
LeaseRequested ─► fits and an idle worker of the job? ─► GrantLease (owners on this node first)
                  fits, no idle worker               ─► StartWorker (one per waiting request)
                  does not fit now                   ─► stays queued; later requests still run
                  exceeds the node's totals          ─► stays queued, ReportInfeasible once
LeaseReturned / WorkerExited ─► resources back ─► grant what now fits
a local owner's request waits for resources that spilled-in task leases hold ─► RecallLease
WorkerBlocked (a task waits in get) ─► its CPUs are lent out until WorkerUnblocked
BundlesRequested (GCS, placement group) ─► all fit now? take them from the node ─► AnswerBundles
LeaseRequested in a bundle ─► granted from that bundle's own pool (its GPUs, its CPUs)
BundlesRemoved ─► workers in them stopped, queued requests failed, resources back to the node
```

Bottom-up scheduling starts here too: ``should_spill(SpillQuery)`` decides whether a lease
request is served on this node or forwarded to the GCS's global scheduler (``ScheduleLease``).
It is a pure query (no state changes); the server asks it when a request arrives and again
while the request still waits here.

Local owners come first. A task lease granted to an owner on another node (its request
spilled here) uses this node's spare capacity; when an owner on this node then asks and
its request waits for resources such leases hold, the scheduler recalls as many of them
as it needs (``RecallLease``): the owner pushes nothing more to the worker and returns
the lease once its tasks in flight are done. Without it, a busy driver whose requests
spilled took the only CPU of a node whose own driver came a moment later, and held it
for the rest of its backlog (8 one-CPU nodes with a driver each ran at 22-50% of linear on
a 16-core machine; docs/scaling.md). Actor and placement-group leases are never recalled.

No job starves. An owner keeps a lease while it has tasks for it, so the first driver with
a backlog, or with a loop of batches, held every CPU and a second driver's tasks, or an
actor the GCS placed here, waited for ever. A waiting request of a job that holds no task
lease here (an owner's on this node, or an actor's creation) recalls a task lease of a job
that holds more of the resource it is short of than the request's job would once granted
(``_recall_for``: at once when that job would still hold as much, after
``FAIR_SHARE_SLICE_S`` otherwise), and is served first when it is back: jobs with work take
turns rather than wait for each other's ends. Only a job holding nothing recalls: counted
per owner, one driver's nested tasks recalled each other's parents' leases (rounds of
2,000 nested tasks stalled for 0.3-1.4 s), and with more than a share per job, or served
fewest-held first, two drivers' nested tasks stalled 1-3 s a round (parents flapping in
and out of get() keep the CPUs oversubscribed while children wait). A recalled lease
whose owner is a stopped process is taken back by the server
(``RayletServer._take_back_from_frozen_owners``).
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from typing import Any, Iterator, Union

from lumos._private.ids import ActorID, JobID, NodeID, PlacementGroupID, WorkerID
from lumos._private.protocol.raylet_messages import GCS_OWNER, JOB_END_EXIT_S
from lumos._private.protocol.task_messages import label_spread_of
from lumos._private.protocol.vocab import PG_REMOVED_STOP_REASON
from lumos._private.raylet.resources import NodeResources, from_units, request_units, to_units

# ----------------------------------------------------------------------------- events


@dataclasses.dataclass(slots=True)
class LeaseRequested:
    request_id: int
    job_id: JobID
    resources: dict[str, float]
    function_name: str = ""
    #: Actor creation: the worker becomes this actor's and is never pooled again.
    actor_id: ActorID | None = None
    #: ``(placement group id, bundle index)`` to run in (index -1: any of its bundles here).
    bundle: tuple[bytes, int] | None = None
    #: The work's ``max_retries`` / ``max_restarts`` (None: not told), for the memory monitor.
    retry_budget: int | None = None
    #: The owner is a process on this node: its request may recall spilled-in leases.
    local_owner: bool = False
    #: The owner is on another node (the request spilled here): its task lease may be recalled.
    remote_owner: bool = False
    #: The owner's worker id (``GCS_OWNER``: an actor's creation the GCS asks for; b"": not
    #: told): a stopped owner's lease may be taken back (``RayletServer``).
    owner: bytes = b""
    #: The owner's node (b"": not told), asked whether it is stopped when it is another.
    owner_node: bytes = b""


@dataclasses.dataclass(slots=True)
class LeaseCancelled:
    request_id: int


@dataclasses.dataclass(slots=True)
class LeaseReturned:
    lease_id: int
    #: The worker failed or must not be reused.
    disconnect: bool
    #: What the row of a worker stopped for it says of its end (None: lumos's own stop).
    exit_type: str | None = None


@dataclasses.dataclass(slots=True)
class WorkerRegistered:
    worker_id: WorkerID


@dataclasses.dataclass(slots=True)
class WorkerExited:
    worker_id: WorkerID


@dataclasses.dataclass(slots=True)
class WorkerBlocked:
    worker_id: WorkerID


@dataclasses.dataclass(slots=True)
class WorkerUnblocked:
    worker_id: WorkerID


@dataclasses.dataclass(slots=True)
class JobFinished:
    job_id: JobID


@dataclasses.dataclass(slots=True)
class Ticked:
    pass


@dataclasses.dataclass(slots=True)
class BundlesRequested:
    """The GCS asks to reserve a placement group's bundles here: all or none."""

    request_id: int
    pg_id: PlacementGroupID
    #: ``[(bundle index, resources)]``.
    bundles: list[tuple[int, dict[str, float]]]


@dataclasses.dataclass(slots=True)
class BundlesRemoved:
    pg_id: PlacementGroupID
    #: Bundle indices to free; None frees every bundle of the group here.
    indices: list[int] | None = None


@dataclasses.dataclass(slots=True)
class OwnershipChanged:
    """A worker started or stopped owning objects in this node's store: an idle worker
    that owns some is kept (ending it would free them: their owner is gone)."""

    worker_id: WorkerID
    owns: bool


Event = Union[LeaseRequested, LeaseCancelled, LeaseReturned, WorkerRegistered, WorkerExited,
              WorkerBlocked, WorkerUnblocked, JobFinished, Ticked, BundlesRequested, BundlesRemoved,
              OwnershipChanged]

# ----------------------------------------------------------------------------- actions


@dataclasses.dataclass(slots=True)
class GrantLease:
    request_id: int
    lease_id: int
    worker_id: WorkerID
    resource_ids: dict[str, list[Any]]


@dataclasses.dataclass(slots=True)
class StartWorker:
    pass


@dataclasses.dataclass(slots=True)
class RecallLease:
    """Ask the owner (on another node) of a spilled-in task lease to give it back once
    its tasks in flight are done: an owner on this node waits for what it holds."""

    lease_id: int


@dataclasses.dataclass(slots=True)
class StopWorker:
    worker_id: WorkerID
    reason: str
    #: The process may already be exiting on its own; do not blame the kill for it.
    quiet: bool = False
    #: What its row says of its end (None: lumos's own stop, INTENDED_SYSTEM_EXIT).
    exit_type: str | None = None
    #: Above 0: ask it to send what it holds and exit (``ExitWorker`` without clean-up),
    #: and kill it after this long.
    graceful_s: float = 0.0
    #: It exits on its own, perhaps after draining what it owns: note ``exit_type`` for
    #: its row and send it nothing.
    on_its_own: bool = False


@dataclasses.dataclass(slots=True)
class ReportInfeasible:
    request_id: int
    resources: dict[str, float]
    function_name: str


@dataclasses.dataclass(slots=True)
class FailLease:
    request_id: int
    reason: str
    #: The request's placement group was removed (``PlacementGroupRemoved`` at the owner).
    group_removed: bool = False


@dataclasses.dataclass(slots=True)
class AnswerBundles:
    request_id: int
    ok: bool
    reason: str = ""
    #: When ok: bundle index -> the node GPU indices it holds, for every requested bundle.
    gpu_ids: dict[int, list[int]] = dataclasses.field(default_factory=dict)


Action = Union[GrantLease, StartWorker, StopWorker, ReportInfeasible, FailLease, AnswerBundles, RecallLease]

# ----------------------------------------------------------------------------- spill-over decision

#: Waiting requests of local owners that each event considers for a recall (``RecallLease``).
RECALL_LOOKAHEAD = 8
#: A job holding more than another job whose request waits would once granted gives a
#: lease up (``RecallLease``) once it held it this long; at once when it would still hold
#: as much. Jobs on a node take turns, where the first with a backlog held every CPU to
#: its end (a driver looping over batches of tasks kept another driver's tasks, or an
#: actor's creation, from ever running; Ray's owners give a lease back after 500 ms in use).
FAIR_SHARE_SLICE_S = 0.5
#: A request that recalled leases keeps what it needs from later requests this long (a
#: recalled owner that is frozen, ``SIGSTOP``, never gives its lease back).
RECALL_HOLD_S = 5.0
#: A request that spilled here waits at most this long behind this node's own owners'
#: requests; then it is served in its arrival turn (it cannot go elsewhere: spilled requests
#: are served where they land).
SPILLED_IN_PATIENCE_S = 2.0

#: Arguments elsewhere worth at least this many more bytes send a request to the GCS.
LOCALITY_MIN_BYTES = 1024 * 1024


@dataclasses.dataclass(slots=True)
class SpillQuery:
    """A lease request as the spill-over decision sees it, with what the server knows of the cluster."""

    resources: dict[str, float]
    #: Scheduling strategy (``["NODE", id, soft]``, ``["SPREAD"]``, ``["PG", ...]``) or None.
    strategy: Any
    #: ``(placement group id, bundle index)`` for a request in a placement group.
    bundle: tuple[bytes, int] | None = None
    #: Bytes of the request's arguments on each node.
    arg_bytes_by_node: dict[bytes, int] | None = None
    #: Times the request was already forwarded (a spilled request is served where it lands).
    hops: int = 0
    #: The GCS placed the request here itself (actor creation): never sent back.
    from_gcs: bool = False
    #: This node's id.
    node_id: NodeID = NodeID(b"")
    #: The GCS connection is up (without it, everything is served here).
    gcs_connected: bool = True
    #: Alive nodes this raylet knows of, and whether it counts itself among them.
    alive_nodes: int = 1
    self_alive: bool = True
    #: This node's labels meet the request's hard and soft label conditions (True without any).
    labels_ok: bool = True

IDLE, LEASED, STARTING, DEAD = "IDLE", "LEASED", "STARTING", "DEAD"


@dataclasses.dataclass(slots=True)
class _Worker:
    worker_id: WorkerID
    state: str
    job_id: JobID | None = None
    lease_id: int = 0
    actor_id: ActorID | None = None
    idle_since: float = 0.0
    blocked: bool = False
    #: Owns objects in this node's store (not reaped when idle).
    owns_objects: bool = False
    #: Returned by its owner as exiting, and still running (``_return``).
    draining: bool = False
    #: The current lease's ``LeaseRequested.retry_budget``.
    retry_budget: int | None = None


@dataclasses.dataclass(slots=True)
class _Lease:
    lease_id: int
    request_id: int
    worker_id: WorkerID
    units: dict[str, int]
    resource_ids: dict[str, list[Any]]
    job_id: JobID
    #: The bundle whose pool the units came from (None: the node's own pool).
    bundle: tuple[bytes, int] | None = None
    #: Asked back (``RecallLease``) and not returned yet.
    recalled: bool = False
    #: The request it was recalled for: served first once it is back (else the owner's
    #: own waiting requests, queued earlier, took what it gave back).
    recalled_for: int = 0
    #: When it was recalled (after ``RECALL_HOLD_S`` it is no longer counted on).
    recalled_at: float = 0.0
    #: When the last ``RecallLease`` for it went (``_resend_recalls``).
    recall_sent_at: float = 0.0
    #: ``LeaseRequested.owner``, ``remote_owner`` and ``owner_node`` of its request.
    owner: bytes = b""
    remote: bool = False
    owner_node: bytes = b""
    #: When it was granted (the scheduler's clock).
    granted_at: float = 0.0


class _Bundle:
    """One reserved placement-group bundle: taken from the node, lent out to its leases.

    Its pool is a ``NodeResources`` of its own; pool instance ``i`` of a GPU is node GPU
    ``index_map["GPU"][i]``, so tasks in the bundle see exactly the bundle's GPUs.
    """

    __slots__ = ("key", "units", "node_ids", "pool", "index_map")

    def __init__(self, key: tuple[bytes, int], units: dict[str, int], node_ids: dict[str, list[Any]]) -> None:
        self.key = key
        #: Units taken from the node's pool (given back on removal).
        self.units = units
        #: The node instances it holds (``{"GPU": [[node index, fraction], ...]}``).
        self.node_ids = node_ids
        self.pool = NodeResources({k: from_units(v) for k, v in units.items()})
        #: Resource -> node instance index of each pool instance.
        self.index_map: dict[str, list[int]] = {}
        for name, picks in node_ids.items():
            self.pool.instances[name] = [to_units(frac) for _, frac in picks]
            self.index_map[name] = [int(idx) for idx, _ in picks]

    def to_node_ids(self, ids: dict[str, list[Any]]) -> dict[str, list[Any]]:
        return {name: [[self.index_map[name][int(i)], f] for i, f in picks] if name in self.index_map else picks
                for name, picks in ids.items()}

    def to_pool_ids(self, ids: dict[str, list[Any]]) -> dict[str, list[Any]]:
        out: dict[str, list[Any]] = {}
        for name, picks in ids.items():
            m = self.index_map.get(name)
            out[name] = [[m.index(int(i)), f] for i, f in picks] if m is not None else picks
        return out


@dataclasses.dataclass(slots=True)
class _Request:
    event: LeaseRequested
    units: dict[str, int]
    since: float
    infeasible: bool = False


class LocalSchedulerState:
    """Leases, resources and the worker pool of one node."""

    def __init__(self, resources: dict[str, float], num_prestart: int, max_workers: int,
                 idle_timeout_s: float, validate: bool = False) -> None:
        self.resources = NodeResources(resources)
        self.num_prestart = num_prestart
        self.max_workers = max_workers
        self.idle_timeout_s = idle_timeout_s
        self.validate = validate
        #: Worker id -> worker, in start order.
        self.workers: OrderedDict[bytes, _Worker] = OrderedDict()
        #: The workers of ``workers`` that host no actor (starting, idle, running tasks):
        #: what each event's scans look at. A worker leaves it when it is leased to an
        #: actor (and never comes back: an actor's worker is stopped when its lease ends),
        #: so a burst of a thousand actors does not make every event scan a thousand
        #: workers (issue 19).
        self._task_workers: OrderedDict[bytes, _Worker] = OrderedDict()
        #: Lease id -> lease.
        self.leases: dict[int, _Lease] = {}
        #: Requests waiting for resources or a worker, in arrival order.
        self.queue: OrderedDict[int, _Request] = OrderedDict()
        #: (placement group id, bundle index) -> bundle reserved on this node.
        self.bundles: dict[tuple[bytes, int], _Bundle] = {}
        #: Lease id -> task lease from the node's own pool (no actor's, no bundle's), in
        #: grant order: what a waiting request may recall (``_recall_for``).
        self.task_leases: dict[int, _Lease] = {}
        #: Job -> its leases in ``task_leases``; how many of those are remote owners'.
        self._job_leases: dict[bytes, int] = {}
        self._remote_leases = 0
        #: Waiting request -> when several leases were recalled for it. For
        #: ``RECALL_HOLD_S`` the resources it needs are held for it: what the first
        #: recalled lease gave back went to the holder's own earlier requests while a
        #: request of two CPUs waited for the second. (Not for a request that recalled
        #: one lease, which goes to it first when it is back: held for every request, a
        #: job's nested tasks waited behind another job's request for their parents'
        #: CPUs, rounds of 2,000 nested tasks beside a second such driver stalling 1-3 s.)
        self._recalling: dict[int, float] = {}
        self._next_lease = 1

    # ------------------------------------------------------------------ API

    def add_starting_worker(self, worker_id: WorkerID) -> None:
        """The server spawned a process for a StartWorker (or at boot)."""
        self.workers[worker_id] = self._task_workers[worker_id] = _Worker(worker_id, STARTING)

    def handle(self, event: Event, now: float) -> list[Action]:
        actions: list[Action] = []
        if isinstance(event, LeaseRequested):
            units = request_units(event.resources)
            req = _Request(event, units, now)
            if event.bundle is not None:
                reason = self._bundle_problem(event.bundle, units, event.resources)
                if reason:
                    actions.append(FailLease(event.request_id, reason))
                    self._schedule(now, actions)
                    return actions
            elif not self.resources.feasible(units):
                req.infeasible = True
                actions.append(ReportInfeasible(event.request_id, dict(event.resources), event.function_name))
            self.queue[event.request_id] = req
        elif isinstance(event, LeaseCancelled):
            self.queue.pop(event.request_id, None)
        elif isinstance(event, LeaseReturned):
            self._return(event.lease_id, event.disconnect, now, actions, event.exit_type)
        elif isinstance(event, WorkerRegistered):
            w = self.workers.get(event.worker_id)
            if w is not None and w.state == STARTING:
                w.state = IDLE
                w.idle_since = now
        elif isinstance(event, WorkerExited):
            self._worker_exited(event.worker_id)
        elif isinstance(event, WorkerBlocked):
            w = self.workers.get(event.worker_id)
            if w is not None and w.state == LEASED and not w.blocked:
                w.blocked = True
                lease = self.leases[w.lease_id]
                self._pool_of(lease).take("CPU", -lease.units.get("CPU", 0))
        elif isinstance(event, WorkerUnblocked):
            w = self.workers.get(event.worker_id)
            if w is not None and w.state == LEASED and w.blocked:
                w.blocked = False
                lease = self.leases[w.lease_id]
                self._pool_of(lease).take("CPU", lease.units.get("CPU", 0))
        elif isinstance(event, JobFinished):
            # Actor workers are the GCS's to end: detached actors outlive their job.
            for w in list(self.workers.values()):
                if w.job_id == event.job_id and (w.state != DEAD or w.draining) and w.actor_id is None:
                    actions.append(StopWorker(w.worker_id, "its job finished", graceful_s=JOB_END_EXIT_S))
            for rid, req in list(self.queue.items()):
                if req.event.job_id == event.job_id and req.event.actor_id is None:
                    del self.queue[rid]
        elif isinstance(event, Ticked):
            self._reap_idle(now, actions)
            self._resend_recalls(now, actions)
        elif isinstance(event, BundlesRequested):
            self._reserve_bundles(event, actions)
        elif isinstance(event, BundlesRemoved):
            self._remove_bundles(event.pg_id, event.indices, actions)
        elif isinstance(event, OwnershipChanged):
            w = self.workers.get(event.worker_id)
            if w is not None:
                w.owns_objects = event.owns
        self._schedule(now, actions)
        if self.validate:
            self.check_invariants()
        return actions

    # ------------------------------------------------------------------ internals

    def _schedule(self, now: float, actions: list[Action]) -> None:
        if self._recalling:
            for rid in [r for r in self._recalling if r not in self.queue]:
                del self._recalling[rid]
        if not self.queue:
            # Nothing to grant and no worker to start (a start needs a waiting request):
            # skip the scans over every worker, which each event paid (a worker
            # registering among a thousand actors, issue 19).
            return
        # Listed once per event, over the workers that host no actor: with hundreds of
        # actors starting, scanning every worker for each queued request, or for each
        # event, made a burst quadratic (issue 19).
        starting = alive = 0
        idle = []
        for w in self._task_workers.values():
            if w.state != DEAD:
                # A worker blocked in get() or wait() is not counted against the cap: the
                # work it waits for may need one more worker (a chain of nested tasks
                # deeper than the cap waited for ever).
                if not w.blocked:
                    alive += 1
                if w.state == STARTING:
                    starting += 1
                elif w.state == IDLE:
                    idle.append(w)
        waiting_for_worker = 0
        #: Resources of requests that fit but wait for a worker process: counted as taken,
        #: so one free CPU starts one worker, not one per queued request.
        reserved: dict[str, int] = {}
        #: The same, per bundle.
        bundle_reserved: dict[tuple[bytes, int], dict[str, int]] = {}
        granted: list[int] = []
        #: The first few requests of owners on this node that wait for resources.
        short: list[_Request] = []
        for rid, req in self._grant_order(now):
            if not idle and waiting_for_worker - starting >= self.max_workers - alive:
                # Nothing later in the queue can be granted (no idle worker) or start one
                # more (the cap is reached): a burst of queued actors costs each event a
                # look at the cap's worth of requests, not at all of them (issue 19).
                if self.task_leases:
                    self._waiting_local(reserved, short)
                break
            bundle: _Bundle | None = None
            if req.event.bundle is not None:
                bundle = self._bundle_that_fits(req.event.bundle, req.units, bundle_reserved)
                if bundle is None:
                    continue
                held = bundle_reserved.setdefault(bundle.key, {})
            else:
                if req.infeasible:
                    if self.resources.feasible(req.units):
                        req.infeasible = False
                    else:
                        continue
                if not self.resources.fits(_plus(req.units, reserved)):
                    _add_short(short, req)
                    if self._recalling and now - self._recalling.get(rid, -RECALL_HOLD_S) < RECALL_HOLD_S:
                        for k, v in req.units.items():
                            reserved[k] = reserved.get(k, 0) + v
                    continue
                held = reserved
            worker = _idle_worker_for(req.event.job_id, idle)
            if worker is None:
                waiting_for_worker += 1
                for k, v in req.units.items():
                    held[k] = held.get(k, 0) + v
                continue
            granted.append(rid)
            idle.remove(worker)
            if bundle is None:
                ids = self.resources.allocate(req.units)
            else:
                ids = bundle.to_node_ids(bundle.pool.allocate(req.units))
            lease_id = self._next_lease
            self._next_lease += 1
            worker.state = LEASED
            worker.lease_id = lease_id
            worker.job_id = req.event.job_id
            worker.retry_budget = req.event.retry_budget
            if req.event.actor_id is not None:
                worker.actor_id = req.event.actor_id
                del self._task_workers[worker.worker_id]
                alive -= 1
            lease = self.leases[lease_id] = _Lease(lease_id, rid, worker.worker_id, req.units, ids,
                                                   req.event.job_id, bundle.key if bundle is not None else None,
                                                   owner=req.event.owner, remote=req.event.remote_owner,
                                                   owner_node=req.event.owner_node, granted_at=now)
            if bundle is None and req.event.actor_id is None:
                self._add_task_lease(lease)
            actions.append(GrantLease(rid, lease_id, worker.worker_id, ids))
        for rid in granted:
            del self.queue[rid]
        if short and self.task_leases:
            for req in short:
                if self._others_hold(req.event) and self._recall_for(req, reserved, actions, now):
                    break
        # The cap is on workers that run tasks and are not blocked: each actor has a process
        # of its own, and actors beyond the cap must not wait for ever (as in Ray).
        to_start = min(waiting_for_worker - starting, self.max_workers - alive)
        for _ in range(max(0, to_start)):
            actions.append(StartWorker())

    def _grant_order(self, now: float) -> Iterator[tuple[int, _Request]]:
        """The queue in the order requests are served: owners on this node first, then
        requests that spilled here from other nodes (each group in arrival order). One
        that spilled here and waited ``SPILLED_IN_PATIENCE_S`` takes its arrival turn among
        the first, so a node kept busy by its own owners still serves it. The queue is not
        copied (a copy per event was quadratic); the second pass runs only when the first
        met a spilled-in request it left for later."""
        later = False
        for rid, req in self.queue.items():
            if req.event.remote_owner and now - req.since < SPILLED_IN_PATIENCE_S:
                later = True
            else:
                yield rid, req
        if later:
            for rid, req in self.queue.items():
                if req.event.remote_owner and now - req.since < SPILLED_IN_PATIENCE_S:
                    yield rid, req

    def _waiting_local(self, reserved: dict[str, int], short: list[_Request]) -> None:
        """Add to ``short`` the requests that may recall (``_may_recall``, among the first
        few dozen queued) and wait for resources: the grant loop stopped early, as no
        worker is idle, but a recall can still help them."""
        for seen, req in enumerate(self.queue.values()):
            if seen >= 8 * RECALL_LOOKAHEAD or len(short) >= RECALL_LOOKAHEAD:
                return
            if req.event.bundle is None and not req.infeasible \
                    and not self.resources.fits(_plus(req.units, reserved)):
                _add_short(short, req)

    def _recall_for(self, req: _Request, reserved: dict[str, int], actions: list[Action], now: float) -> bool:
        """Recall the task leases ``req`` needs, oldest first: none if even all those it
        may take would not make it fit, none more while those already recalled will do.
        True when ``req`` will fit once the recalled leases are back.

        It may take a lease that spilled in from an owner on another node if its own
        owner is on this node (local owners first), and, when ``req``'s job holds no task
        lease here (so never its own), another job's lease when, in the resource ``req``
        is short of (CPU, most often), that job holds more than ``req`` would once granted
        (counting leases that hold their resources: not recalled, no task blocked in get):
        at once when it would still hold as much after giving the lease back, else once
        the lease was held ``FAIR_SHARE_SLICE_S`` (so jobs with work take turns on an odd
        CPU, and a request of two CPUs gets them from a job holding two)."""
        if now - self._recalling.get(req.event.request_id, -RECALL_HOLD_S) < RECALL_HOLD_S:
            return True  # its recalls are on their way back
        need = _plus(req.units, reserved)
        for lease in self.task_leases.values():
            if lease.recalled and now - lease.recalled_at < RECALL_HOLD_S:  # (else its owner may be frozen)
                need = _minus(need, lease.units)
        available = self.resources.available
        if self.resources.fits(need):
            return True
        fair = not self._job_leases.get(req.event.job_id, 0)
        short = [k for k, v in need.items() if v > available.get(k, 0)]
        key = "CPU" if "CPU" in short else short[0] if short else "CPU"
        mine = req.units.get(key, 0)  # what its job holds once granted (nothing before)
        held: dict[bytes, int] | None = None
        before: dict[bytes, int] = {}
        picked = []
        for lease in self.task_leases.values():
            if lease.recalled or not _helps(lease.units, need, available):
                continue
            w = self.workers.get(lease.worker_id)
            if w is not None and w.blocked:
                continue  # its CPU is lent out already, and its task is half done
            if not (lease.remote and req.event.local_owner):
                if not fair:
                    continue
                if held is None:
                    held = self._held_by_job(key)
                    before = dict(held)
                theirs = held.get(lease.job_id, 0) - lease.units.get(key, 0)
                if not (mine <= theirs or (mine <= before.get(lease.job_id, 0)
                                           and now - lease.granted_at >= FAIR_SHARE_SLICE_S)):
                    continue
                held[lease.job_id] = theirs
            picked.append(lease)
            need = _minus(need, lease.units)
            if self.resources.fits(need):
                for chosen in picked:
                    chosen.recalled = True
                    chosen.recalled_for = req.event.request_id
                    chosen.recalled_at = chosen.recall_sent_at = now
                    actions.append(RecallLease(chosen.lease_id))
                if len(picked) > 1:
                    self._recalling[req.event.request_id] = now
                return True
        return False

    def _resend_recalls(self, now: float, actions: list[Action]) -> None:
        """A lease recalled ``RECALL_HOLD_S`` ago and still held while the request it was
        recalled for waits is asked back again, every ``RECALL_HOLD_S``: a recall its owner
        missed (a race in the owner, or a peer that lost the message) would otherwise keep
        the lease from being recalled ever again (a recalled lease is never picked twice),
        and the request waited as long as the owner had tasks. An owner that already gives
        it back ignores the repeat. ``recalled_at`` stays the first recall's time (what a
        frozen owner's take-back goes by)."""
        if not self.queue:
            return
        for lease in self.task_leases.values():
            if lease.recalled and now - lease.recall_sent_at >= RECALL_HOLD_S and lease.recalled_for in self.queue:
                lease.recall_sent_at = now
                actions.append(RecallLease(lease.lease_id))

    def _add_task_lease(self, lease: _Lease) -> None:
        self.task_leases[lease.lease_id] = lease
        self._job_leases[lease.job_id] = self._job_leases.get(lease.job_id, 0) + 1
        self._remote_leases += lease.remote

    def _drop_task_lease(self, lease: _Lease) -> None:
        """A lease ended (returned, or its worker gone): the request it was recalled for,
        if still waiting, is served first."""
        if self.task_leases.pop(lease.lease_id, None) is None:
            return
        if lease.recalled_for in self.queue:
            self.queue.move_to_end(lease.recalled_for, last=False)
        n = self._job_leases[lease.job_id] - 1
        if n:
            self._job_leases[lease.job_id] = n
        else:
            del self._job_leases[lease.job_id]
        self._remote_leases -= lease.remote

    def _others_hold(self, event: LeaseRequested) -> bool:
        """Leases ``_recall_for`` might take for this request exist: remote owners' for a
        local owner, else another job's when the request's holds none (a lone job's
        waiting requests skip it)."""
        if event.local_owner and self._remote_leases:
            return True
        return bool(self.task_leases) and not self._job_leases.get(event.job_id, 0)

    def _held_by_job(self, key: str) -> dict[bytes, int]:
        """Job -> units of ``key`` its task leases hold (not recalled, not blocked)."""
        held: dict[bytes, int] = {}
        for lease in self.task_leases.values():
            if not lease.recalled:
                w = self.workers.get(lease.worker_id)
                if w is None or not w.blocked:
                    held[lease.job_id] = held.get(lease.job_id, 0) + lease.units.get(key, 0)
        return held

    def _return(self, lease_id: int, disconnect: bool, now: float, actions: list[Action],
                exit_type: str | None = None) -> None:
        lease = self.leases.pop(lease_id, None)
        if lease is None:
            return
        self._drop_task_lease(lease)
        w = self.workers.get(lease.worker_id)
        self._release(lease, w)
        if w is None or w.state == DEAD:
            return
        if disconnect or w.actor_id is not None:
            actions.append(StopWorker(w.worker_id, "returned as failed" if disconnect else "its actor ended",
                                      quiet=disconnect, exit_type=exit_type))
            w.state = DEAD
            return
        if exit_type is not None:
            # The worker said it exits (max_calls, sys.exit()); it may first wait for the
            # objects it owns to go out of scope (``Executor.drain_owned``): never leased
            # again, its resources free now, and it goes on its own (or with its job).
            actions.append(StopWorker(w.worker_id, "it exits", exit_type=exit_type, on_its_own=True))
            w.state = DEAD
            w.draining = True
            return
        w.state = IDLE
        w.lease_id = 0
        w.idle_since = now

    def _release(self, lease: _Lease, w: _Worker | None) -> None:
        units = lease.units
        if w is not None and w.blocked:
            units = dict(units)
            units["CPU"] = 0  # already lent out while blocked
            w.blocked = False
        if lease.bundle is None:
            self.resources.release(units, lease.resource_ids)
            return
        bundle = self.bundles.get(lease.bundle)
        if bundle is not None:  # else removed, and its whole reservation went back already
            bundle.pool.release(units, bundle.to_pool_ids(lease.resource_ids))

    def _pool_of(self, lease: _Lease) -> NodeResources:
        if lease.bundle is not None:
            bundle = self.bundles.get(lease.bundle)
            if bundle is not None:
                return bundle.pool
            return NodeResources({})  # removed: nothing to lend or take back
        return self.resources

    # ------------------------------------------------------------------ placement-group bundles

    def _bundles_of(self, ref: tuple[bytes, int]) -> list[_Bundle]:
        pg_id, index = ref
        if index >= 0:
            b = self.bundles.get((pg_id, index))
            return [b] if b is not None else []
        return [b for key, b in self.bundles.items() if key[0] == pg_id]

    def has_bundle(self, ref: tuple[bytes, int]) -> bool:
        return bool(self._bundles_of(ref))

    def _bundle_problem(self, ref: tuple[bytes, int], units: dict[str, int], resources: dict[str, float]) -> str:
        bundles = self._bundles_of(ref)
        which = "any bundle" if ref[1] < 0 else f"bundle {ref[1]}"
        if not bundles:
            return (f"placement group {ref[0].hex()}: {which} is not reserved on this node "
                    "(the group was removed, or the bundle moved after a node failure)")
        if not any(b.pool.feasible(units) for b in bundles):
            sizes = [b.pool.as_floats(b.pool.total) for b in bundles]
            return (f"the request {resources} does not fit in {which} of placement group {ref[0].hex()} "
                    f"(bundle resources: {sizes[0] if len(sizes) == 1 else sizes}); ask for at most what "
                    "the bundle holds")
        return ""

    def _bundle_that_fits(self, ref: tuple[bytes, int], units: dict[str, int],
                          reserved: dict[tuple[bytes, int], dict[str, int]]) -> _Bundle | None:
        for b in self._bundles_of(ref):
            if b.pool.fits(_plus(units, reserved.get(b.key, {}))):
                return b
        return None

    def _reserve_bundles(self, event: BundlesRequested, actions: list[Action]) -> None:
        new = [(i, request_units(res)) for i, res in event.bundles if (event.pg_id, i) not in self.bundles]
        want: dict[str, int] = {}
        for _, units in new:
            for k, v in units.items():
                want[k] = want.get(k, 0) + v
        # GPUs: each bundle needs its own whole instances, so check them one by one on a scratch copy.
        scratch = NodeResources({})
        scratch.total, scratch.available = self.resources.total, dict(self.resources.available)
        scratch.instances = {k: list(v) for k, v in self.resources.instances.items()}
        for _, units in new:
            if not scratch.fits(units):
                free = self.resources.as_floats({k: max(v, 0) for k, v in self.resources.available.items()})
                actions.append(AnswerBundles(event.request_id, False,
                                             f"bundles need {self.resources.as_floats(want)}, free here: {free}"))
                return
            scratch.allocate(units)
        for index, units in new:
            ids = self.resources.allocate(units)
            self.bundles[(event.pg_id, index)] = _Bundle((event.pg_id, index), units, ids)
        # Every requested bundle, also those held already (a retried request gets the same answer).
        gpus = {i: list(self.bundles[(event.pg_id, i)].index_map.get("GPU", [])) for i, _ in event.bundles}
        actions.append(AnswerBundles(event.request_id, True, gpu_ids=gpus))

    def _remove_bundles(self, pg_id: PlacementGroupID, indices: list[int] | None, actions: list[Action]) -> None:
        keys = [k for k in self.bundles if k[0] == pg_id and (indices is None or k[1] in indices)]
        if not keys:
            return
        gone = set(keys)
        for lease_id, lease in list(self.leases.items()):
            if lease.bundle in gone:
                del self.leases[lease_id]
                w = self.workers.get(lease.worker_id)
                if w is not None and w.state != DEAD:
                    actions.append(StopWorker(w.worker_id, PG_REMOVED_STOP_REASON))
                    w.state = DEAD
        for rid, req in list(self.queue.items()):
            ref = req.event.bundle
            if ref is not None and ref[0] == pg_id and not any(
                    k not in gone for k in self.bundles if k[0] == pg_id and (ref[1] < 0 or k[1] == ref[1])):
                del self.queue[rid]
                actions.append(FailLease(rid, f"placement group {pg_id.hex()} was removed", True))
        for key in keys:
            b = self.bundles.pop(key)
            self.resources.release(b.units, b.node_ids)

    def _worker_exited(self, worker_id: WorkerID) -> None:
        w = self.workers.get(worker_id)
        if w is None:
            return
        if w.state == LEASED:
            lease = self.leases.pop(w.lease_id, None)
            if lease is not None:
                self._drop_task_lease(lease)
                self._release(lease, w)
        w.state = DEAD
        del self.workers[worker_id]
        self._task_workers.pop(worker_id, None)

    def _reap_idle(self, now: float, actions: list[Action]) -> None:
        idle = [w for w in self.workers.values() if w.state == IDLE]
        alive = sum(1 for w in self.workers.values() if w.state != DEAD)
        excess = alive - self.num_prestart
        for w in idle:
            if excess <= 0:
                break
            if now - w.idle_since > self.idle_timeout_s and not w.owns_objects:
                actions.append(StopWorker(w.worker_id, "idle"))
                w.state = DEAD
                excess -= 1

    # ------------------------------------------------------------------ queries

    def should_spill(self, q: SpillQuery) -> bool:
        """Bottom-up: serve here while the request fits and nothing waits; else ask the GCS.

        Never for requests the GCS itself placed here (actor creation), nor for ones already
        spilled here (``hops``), nor when this is the only node. Node affinity to another
        node, a bundle held elsewhere, SPREAD and arguments that mostly live elsewhere go to
        the GCS, which sees every node.
        """
        if q.hops > 0 or q.from_gcs or not q.gcs_connected:
            return False
        if not q.labels_ok:  # the GCS knows which nodes' labels meet the request's selector
            return True
        strategy = q.strategy
        if strategy and strategy[0] == "NODE":
            # Affinity to this node that it can never fit goes to the GCS too: a soft one
            # runs elsewhere, a hard one fails (TaskUnschedulable) rather than wait for ever.
            return bytes(strategy[1]) != q.node_id or not self.resources.feasible(request_units(q.resources))
        if q.bundle is not None:  # the GCS knows where the group's bundles are
            return not self.has_bundle(q.bundle)
        if q.alive_nodes <= 1 and q.self_alive:
            return False
        if strategy and (strategy[0] == "SPREAD" or label_spread_of(strategy)):
            return True
        args = q.arg_bytes_by_node
        if args:
            here = args.get(q.node_id, 0)
            if max(args.values()) - here >= LOCALITY_MIN_BYTES:
                return True  # most of the arguments live on another node: let the GCS weigh it
        units = request_units(q.resources)
        if not self.resources.feasible(units):
            return True
        return bool(self.queue) or not self.resources.fits(units)

    def may_move(self, q: SpillQuery) -> bool:
        """A request placed here by another's choice (a spillback, ``hops``; the GCS's, for
        an actor's creation) that still waits for resources may move to another node that
        has room for it now (the GCS names one, or none; Ray's raylet spills its waiting
        tasks alike). Not requests pinned here: node affinity or a bundle; and not while
        this raylet sees no other node or no GCS."""
        if (q.hops == 0 and not q.from_gcs) or not q.gcs_connected or q.bundle is not None:
            return False
        if q.alive_nodes <= 1 and q.self_alive:
            return False
        if q.strategy and q.strategy[0] in ("NODE", "PG"):
            return False
        return not self.resources.fits(request_units(q.resources))  # (else it waits for a worker only)

    def lease_of_worker(self, worker_id: WorkerID) -> _Lease | None:
        w = self.workers.get(worker_id)
        if w is None or w.state != LEASED:
            return None
        return self.leases.get(w.lease_id)

    def blocked_jobs(self) -> list[JobID]:
        """The job of each task worker whose task waits in get() or wait() (such workers
        are not counted against ``max_workers``)."""
        return [w.job_id for w in self._task_workers.values() if w.blocked and w.state == LEASED]

    def infeasible_shapes(self) -> list[dict[str, float]]:
        return [dict(r.event.resources) for r in self.queue.values() if r.infeasible]

    def available_floats(self) -> dict[str, float]:
        return {k: from_units(max(v, 0)) for k, v in self.resources.available.items()}

    def check_invariants(self) -> None:
        res = self.resources

        def held_by(leases: list[_Lease], name: str) -> int:
            return sum(l.units.get(name, 0) for l in leases
                       if not (name == "CPU" and self.workers.get(l.worker_id, _Worker(b"", DEAD)).blocked))

        node_leases = [l for l in self.leases.values() if l.bundle is None]
        for name, total in res.total.items():
            held = held_by(node_leases, name) + sum(b.units.get(name, 0) for b in self.bundles.values())
            if res.available.get(name, 0) + held != total:
                raise AssertionError(f"{name}: available {res.available.get(name)} + leased {held} != total {total}")
        for key, b in self.bundles.items():
            in_bundle = [l for l in self.leases.values() if l.bundle == key]
            for name, total in b.pool.total.items():
                held = held_by(in_bundle, name)
                if b.pool.available.get(name, 0) + held != total:
                    raise AssertionError(f"bundle {key[1]} of {key[0].hex()[:8]} {name}: available "
                                         f"{b.pool.available.get(name)} + leased {held} != total {total}")
        for lease in self.leases.values():
            w = self.workers.get(lease.worker_id)
            if w is None or w.state != LEASED or w.lease_id != lease.lease_id:
                raise AssertionError(f"lease {lease.lease_id} points at a worker that does not hold it")
        for lease_id, lease in self.task_leases.items():
            if self.leases.get(lease_id) is not lease or lease.bundle is not None:
                raise AssertionError(f"task lease {lease_id} is not a lease of the node's pool held here")
        jobs: dict[bytes, int] = {}
        for lease in self.task_leases.values():
            jobs[lease.job_id] = jobs.get(lease.job_id, 0) + 1
        if jobs != self._job_leases or self._remote_leases != sum(l.remote for l in self.task_leases.values()):
            raise AssertionError(f"task leases by job {self._job_leases} (remote {self._remote_leases}), "
                                 f"counted {jobs}")
        task_workers = [k for k, w in self.workers.items() if w.actor_id is None]
        if task_workers != list(self._task_workers):
            raise AssertionError(f"{len(self._task_workers)} workers indexed as hosting no actor, "
                                 f"{len(task_workers)} are")


def _add_short(short: list[_Request], req: _Request) -> None:
    """Add a request that waits for resources to those a recall may serve: up to
    ``RECALL_LOOKAHEAD``, one per job, shape and kind of owner (the later ones would recall
    nothing the first could not, and they hid a second driver's request from the look when
    the first driver kept ten requests waiting)."""
    if len(short) >= RECALL_LOOKAHEAD or not _may_recall(req.event):
        return
    e = req.event
    for r in short:
        if r is req or (r.event.job_id == e.job_id and r.units == req.units and r.event.local_owner == e.local_owner):
            return
    short.append(req)


def _may_recall(event: LeaseRequested) -> bool:
    """A waiting request that may recall leases (``_recall_for``): an owner's on this node,
    or an actor's creation the GCS placed here. One that spilled here from another node's
    owner recalls nothing (it waits its ``SPILLED_IN_PATIENCE_S``, or moves)."""
    return event.local_owner or event.owner == GCS_OWNER


def _helps(units: dict[str, int], need: dict[str, int], available: dict[str, int]) -> bool:
    """Giving back ``units`` brings ``need`` closer to fitting: it holds some of a resource
    that ``available`` is short of."""
    return any(units.get(k, 0) > 0 for k, v in need.items() if v > available.get(k, 0))


def _minus(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    """``a`` less ``b``, per resource, not below zero (resources ``a`` does not name stay out)."""
    return {k: max(0, v - b.get(k, 0)) for k, v in a.items()}


def _plus(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    if not b:
        return a
    out = dict(a)
    for k, v in b.items():
        if k in out:
            out[k] += v
    return out


def _idle_worker_for(job_id: JobID, idle: list[_Worker]) -> _Worker | None:
    """An idle worker that last ran this job's tasks, else one that never ran any."""
    fallback = None
    for w in idle:
        if w.job_id == job_id:
            return w
        if w.job_id is None and fallback is None:
            fallback = w
    return fallback
