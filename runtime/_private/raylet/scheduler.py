"""The local scheduler of one node: worker leases and the worker pool (pure).

Owners ask their raylet for a *lease*: a worker plus the resources of one task shape.
This class decides which request gets which worker, when to start or stop worker
processes, and which requests can never run here. ``RayletServer`` feeds it events and
executes the actions it returns; it never touches processes or sockets.

```
LeaseRequested ─► fits and an idle worker of the job? ─► GrantLease
                  fits, no idle worker               ─► StartWorker (one per waiting request)
                  does not fit now                   ─► stays queued; later requests still run
                  exceeds the node's totals          ─► stays queued, ReportInfeasible once
LeaseReturned / WorkerExited ─► resources back ─► grant what now fits
WorkerBlocked (a task waits in get) ─► its CPUs are lent out until WorkerUnblocked
```
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from typing import Any, Union

from lumos._private.raylet.resources import NodeResources, from_units, request_units

# ----------------------------------------------------------------------------- events


@dataclasses.dataclass(slots=True)
class LeaseRequested:
    request_id: int
    job_id: bytes
    resources: dict[str, float]
    function_name: str = ""
    #: Actor creation: the worker becomes this actor's and is never pooled again.
    actor_id: bytes | None = None


@dataclasses.dataclass(slots=True)
class LeaseCancelled:
    request_id: int


@dataclasses.dataclass(slots=True)
class LeaseReturned:
    lease_id: int
    #: The worker failed or must not be reused.
    disconnect: bool


@dataclasses.dataclass(slots=True)
class WorkerRegistered:
    worker_id: bytes


@dataclasses.dataclass(slots=True)
class WorkerExited:
    worker_id: bytes


@dataclasses.dataclass(slots=True)
class WorkerBlocked:
    worker_id: bytes


@dataclasses.dataclass(slots=True)
class WorkerUnblocked:
    worker_id: bytes


@dataclasses.dataclass(slots=True)
class JobFinished:
    job_id: bytes


@dataclasses.dataclass(slots=True)
class Ticked:
    pass


Event = Union[LeaseRequested, LeaseCancelled, LeaseReturned, WorkerRegistered, WorkerExited,
              WorkerBlocked, WorkerUnblocked, JobFinished, Ticked]

# ----------------------------------------------------------------------------- actions


@dataclasses.dataclass(slots=True)
class GrantLease:
    request_id: int
    lease_id: int
    worker_id: bytes
    resource_ids: dict[str, list[Any]]


@dataclasses.dataclass(slots=True)
class StartWorker:
    pass


@dataclasses.dataclass(slots=True)
class StopWorker:
    worker_id: bytes
    reason: str
    #: The process may already be exiting on its own; do not blame the kill for it.
    quiet: bool = False


@dataclasses.dataclass(slots=True)
class ReportInfeasible:
    request_id: int
    resources: dict[str, float]
    function_name: str


@dataclasses.dataclass(slots=True)
class FailLease:
    request_id: int
    reason: str


Action = Union[GrantLease, StartWorker, StopWorker, ReportInfeasible, FailLease]

IDLE, LEASED, STARTING, DEAD = "IDLE", "LEASED", "STARTING", "DEAD"


@dataclasses.dataclass(slots=True)
class _Worker:
    worker_id: bytes
    state: str
    job_id: bytes | None = None
    lease_id: int = 0
    actor_id: bytes | None = None
    idle_since: float = 0.0
    blocked: bool = False


@dataclasses.dataclass(slots=True)
class _Lease:
    lease_id: int
    request_id: int
    worker_id: bytes
    units: dict[str, int]
    resource_ids: dict[str, list[Any]]
    job_id: bytes


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
        #: Lease id -> lease.
        self.leases: dict[int, _Lease] = {}
        #: Requests waiting for resources or a worker, in arrival order.
        self.queue: OrderedDict[int, _Request] = OrderedDict()
        self._next_lease = 1

    # ------------------------------------------------------------------ API

    def add_starting_worker(self, worker_id: bytes) -> None:
        """The server spawned a process for a StartWorker (or at boot)."""
        self.workers[worker_id] = _Worker(worker_id, STARTING)

    def handle(self, event: Event, now: float) -> list[Action]:
        actions: list[Action] = []
        if isinstance(event, LeaseRequested):
            units = request_units(event.resources)
            req = _Request(event, units, now)
            if not self.resources.feasible(units):
                req.infeasible = True
                actions.append(ReportInfeasible(event.request_id, dict(event.resources), event.function_name))
            self.queue[event.request_id] = req
        elif isinstance(event, LeaseCancelled):
            self.queue.pop(event.request_id, None)
        elif isinstance(event, LeaseReturned):
            self._return(event.lease_id, event.disconnect, now, actions)
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
                cpus = self.leases[w.lease_id].units.get("CPU", 0)
                self.resources.take("CPU", -cpus)
        elif isinstance(event, WorkerUnblocked):
            w = self.workers.get(event.worker_id)
            if w is not None and w.state == LEASED and w.blocked:
                w.blocked = False
                cpus = self.leases[w.lease_id].units.get("CPU", 0)
                self.resources.take("CPU", cpus)
        elif isinstance(event, JobFinished):
            for w in list(self.workers.values()):
                if w.job_id == event.job_id and w.state != DEAD:
                    actions.append(StopWorker(w.worker_id, "its job finished"))
            for rid, req in list(self.queue.items()):
                if req.event.job_id == event.job_id:
                    del self.queue[rid]
        elif isinstance(event, Ticked):
            self._reap_idle(now, actions)
        self._schedule(now, actions)
        if self.validate:
            self.check_invariants()
        return actions

    # ------------------------------------------------------------------ internals

    def _schedule(self, now: float, actions: list[Action]) -> None:
        starting = sum(1 for w in self.workers.values() if w.state == STARTING)
        waiting_for_worker = 0
        #: Resources of requests that fit but wait for a worker process: counted as taken,
        #: so one free CPU starts one worker, not one per queued request.
        reserved: dict[str, int] = {}
        for rid, req in list(self.queue.items()):
            if req.infeasible:
                if self.resources.feasible(req.units):
                    req.infeasible = False
                else:
                    continue
            if not self.resources.fits(_plus(req.units, reserved)):
                continue
            worker = self._idle_worker_for(req.event.job_id)
            if worker is None:
                waiting_for_worker += 1
                for k, v in req.units.items():
                    reserved[k] = reserved.get(k, 0) + v
                continue
            del self.queue[rid]
            ids = self.resources.allocate(req.units)
            lease_id = self._next_lease
            self._next_lease += 1
            worker.state = LEASED
            worker.lease_id = lease_id
            worker.job_id = req.event.job_id
            if req.event.actor_id is not None:
                worker.actor_id = req.event.actor_id
            self.leases[lease_id] = _Lease(lease_id, rid, worker.worker_id, req.units, ids, req.event.job_id)
            actions.append(GrantLease(rid, lease_id, worker.worker_id, ids))
        alive = sum(1 for w in self.workers.values() if w.state != DEAD)
        to_start = min(waiting_for_worker - starting, self.max_workers - alive)
        for _ in range(max(0, to_start)):
            actions.append(StartWorker())

    def _idle_worker_for(self, job_id: bytes) -> _Worker | None:
        fallback = None
        for w in self.workers.values():
            if w.state != IDLE:
                continue
            if w.job_id == job_id:
                return w
            if w.job_id is None and fallback is None:
                fallback = w
        return fallback

    def _return(self, lease_id: int, disconnect: bool, now: float, actions: list[Action]) -> None:
        lease = self.leases.pop(lease_id, None)
        if lease is None:
            return
        w = self.workers.get(lease.worker_id)
        self._release(lease, w)
        if w is None or w.state == DEAD:
            return
        if disconnect or w.actor_id is not None:
            actions.append(StopWorker(w.worker_id, "returned as failed" if disconnect else "its actor ended",
                                      quiet=disconnect))
            w.state = DEAD
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
        self.resources.release(units, lease.resource_ids)

    def _worker_exited(self, worker_id: bytes) -> None:
        w = self.workers.get(worker_id)
        if w is None:
            return
        if w.state == LEASED:
            lease = self.leases.pop(w.lease_id, None)
            if lease is not None:
                self._release(lease, w)
        w.state = DEAD
        del self.workers[worker_id]

    def _reap_idle(self, now: float, actions: list[Action]) -> None:
        idle = [w for w in self.workers.values() if w.state == IDLE]
        alive = sum(1 for w in self.workers.values() if w.state != DEAD)
        excess = alive - self.num_prestart
        for w in idle:
            if excess <= 0:
                break
            if now - w.idle_since > self.idle_timeout_s:
                actions.append(StopWorker(w.worker_id, "idle"))
                w.state = DEAD
                excess -= 1

    # ------------------------------------------------------------------ queries

    def lease_of_worker(self, worker_id: bytes) -> _Lease | None:
        w = self.workers.get(worker_id)
        if w is None or w.state != LEASED:
            return None
        return self.leases.get(w.lease_id)

    def infeasible_shapes(self) -> list[dict[str, float]]:
        return [dict(r.event.resources) for r in self.queue.values() if r.infeasible]

    def available_floats(self) -> dict[str, float]:
        return {k: from_units(max(v, 0)) for k, v in self.resources.available.items()}

    def check_invariants(self) -> None:
        res = self.resources
        for name, total in res.total.items():
            held = sum(l.units.get(name, 0) for l in self.leases.values()
                       if not (name == "CPU" and self.workers.get(l.worker_id, _Worker(b"", DEAD)).blocked))
            if res.available.get(name, 0) + held != total:
                raise AssertionError(f"{name}: available {res.available.get(name)} + leased {held} != total {total}")
        for lease in self.leases.values():
            w = self.workers.get(lease.worker_id)
            if w is None or w.state != LEASED or w.lease_id != lease.lease_id:
                raise AssertionError(f"lease {lease.lease_id} points at a worker that does not hold it")


def _plus(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    if not b:
        return a
    out = dict(a)
    for k, v in b.items():
        if k in out:
            out[k] += v
    return out
