"""Pure units, no processes: the local scheduler and object store state machines, resource
arithmetic, configuration, serialization and the public errors.

``…State`` classes are fed events and their actions compared; they run with
``validate=True`` so every event also checks their invariants.
"""

from __future__ import annotations

import dataclasses
import pickle
import sys
import threading

import numpy as np
import pyarrow as pa
import pytest

import lumos.exceptions as exc
from lumos._private import serialization as ser
from lumos._private.config import Config
from lumos._private.object_store import store_state as st
from lumos._private.protocol import messages as m
from lumos._private.raylet import resources as rs
from lumos._private.raylet import scheduler as sc
from lumos.object_ref import ObjectRef

JOB = b"job1"
OTHER_JOB = b"job2"
W1, W2, W3 = b"w1" * 8, b"w2" * 8, b"w3" * 8


# =========================================================================== LocalSchedulerState


def sched(resources=None, prestart=0, max_workers=8, idle_s=5.0, workers=()):
    s = sc.LocalSchedulerState(resources or {"CPU": 1}, prestart, max_workers, idle_s, validate=True)
    for w in workers:
        s.add_starting_worker(w)
        assert s.handle(sc.WorkerRegistered(w), now=0) == []
    return s


def req(rid, resources=None, job=JOB, actor=None):
    return sc.LeaseRequested(rid, job, resources if resources is not None else {"CPU": 1}, f"f{rid}", actor)


def grants(actions):
    return [a for a in actions if isinstance(a, sc.GrantLease)]


def test_second_lease_waits_for_cpu():
    s = sched({"CPU": 1}, workers=[W1, W2])
    (g,) = s.handle(req(1), now=0)
    assert g == sc.GrantLease(1, g.lease_id, W1, {})
    assert s.handle(req(2), now=0) == []
    (g2,) = s.handle(sc.LeaseReturned(g.lease_id, False), now=1)
    assert g2.request_id == 2 and g2.worker_id in (W1, W2)


def test_a_request_without_an_idle_worker_starts_one_worker():
    s = sched({"CPU": 4}, max_workers=8)
    assert s.handle(req(1), now=0) == [sc.StartWorker()]
    s.add_starting_worker(W1)  # the server spawns a process for each StartWorker at once
    # One worker is starting for request 1: request 2 asks for one more, not two.
    assert s.handle(req(2), now=0) == [sc.StartWorker()]
    s.add_starting_worker(W2)
    assert s.handle(sc.Ticked(), now=0) == []  # nothing more while they start
    acts = s.handle(sc.WorkerRegistered(W1), now=0)
    assert [g.request_id for g in grants(acts)] == [1]
    assert not [a for a in acts if isinstance(a, sc.StartWorker)]
    assert [g.request_id for g in grants(s.handle(sc.WorkerRegistered(W2), now=0))] == [2]


def test_worker_start_is_capped_by_max_workers():
    s = sched({"CPU": 8}, max_workers=2)
    started = 0
    for i in range(5):
        for action in s.handle(req(i), now=0):
            assert isinstance(action, sc.StartWorker)
            s.add_starting_worker(bytes([i]) * 16)
            started += 1
    assert started == 2


def test_workers_blocked_in_get_are_not_counted_against_the_worker_cap():
    # A chain of nested tasks: each waits in get() for the next, which needs a worker of
    # its own. With the cap counting blocked workers, the third task never got one.
    s = sched({"CPU": 1}, max_workers=2, workers=[W1, W2])
    (g1,) = s.handle(req(1), now=0)
    assert s.handle(req(2), now=0) == []  # its CPU is taken
    (g2,) = s.handle(sc.WorkerBlocked(g1.worker_id), now=0)  # the CPU is lent to request 2
    assert s.handle(sc.WorkerBlocked(g2.worker_id), now=1) == []
    assert s.handle(req(3), now=1) == [sc.StartWorker()]  # two alive, both blocked
    s.add_starting_worker(W3)
    (g3,) = grants(s.handle(sc.WorkerRegistered(W3), now=2))
    assert g3.request_id == 3 and g3.worker_id == W3
    # Unblocked again, they count: nothing more starts past the cap.
    s.handle(sc.WorkerUnblocked(g2.worker_id), now=3)
    assert s.handle(req(4, {"CPU": 0}), now=3) == []


def test_one_free_cpu_starts_one_worker_not_one_per_request():
    s = sched({"CPU": 1})
    assert s.handle(req(1), now=0) == [sc.StartWorker()]
    s.add_starting_worker(W1)
    assert s.handle(req(2), now=0) == []  # would not fit next to request 1 anyway


def test_infeasible_request_is_reported_once_and_does_not_block_others():
    s = sched({"CPU": 2}, workers=[W1])
    acts = s.handle(req(1, {"CPU": 8}), now=0)
    assert acts == [sc.ReportInfeasible(1, {"CPU": 8}, "f1")]
    assert s.infeasible_shapes() == [{"CPU": 8}]
    (g,) = s.handle(req(2), now=0)
    assert g.request_id == 2
    assert s.handle(sc.Ticked(), now=1) == []
    assert 1 in s.queue
    s.handle(sc.LeaseCancelled(1), now=2)
    assert s.infeasible_shapes() == [] and 1 not in s.queue


def test_unknown_custom_resource_is_infeasible():
    s = sched({"CPU": 2}, workers=[W1])
    assert s.handle(req(1, {"CPU": 1, "tpu": 1}), now=0) == [sc.ReportInfeasible(1, {"CPU": 1, "tpu": 1}, "f1")]


def test_blocked_worker_lends_its_cpu_until_unblocked():
    s = sched({"CPU": 1}, workers=[W1, W2])
    (g1,) = s.handle(req(1), now=0)
    assert s.handle(req(2), now=0) == []
    (g2,) = s.handle(sc.WorkerBlocked(g1.worker_id), now=1)  # e.g. waiting in get()
    assert g2.request_id == 2
    assert s.handle(sc.WorkerUnblocked(g1.worker_id), now=2) == []
    assert s.resources.available["CPU"] == -rs.UNIT  # over-committed until a lease returns
    assert s.handle(req(3), now=2) == []
    s.handle(sc.LeaseReturned(g2.lease_id, False), now=3)
    assert s.handle(sc.LeaseReturned(g1.lease_id, False), now=3)[0].request_id == 3


def test_returning_a_blocked_lease_does_not_give_the_cpu_back_twice():
    s = sched({"CPU": 1}, workers=[W1, W2])
    (g1,) = s.handle(req(1), now=0)
    s.handle(sc.WorkerBlocked(g1.worker_id), now=0)
    s.handle(sc.LeaseReturned(g1.lease_id, False), now=1)
    assert s.resources.available["CPU"] == rs.UNIT


def test_worker_exit_releases_its_lease():
    s = sched({"CPU": 1, "GPU": 1}, workers=[W1, W2])
    (g,) = s.handle(req(1, {"CPU": 1, "GPU": 1}), now=0)
    assert g.resource_ids == {"GPU": [[0, 1.0]]}
    (g2,) = s.handle(req(2, {"CPU": 1, "GPU": 1}), now=0) or [None]
    assert g2 is None
    (g2,) = s.handle(sc.WorkerExited(g.worker_id), now=1)
    assert g2.request_id == 2 and g2.resource_ids == {"GPU": [[0, 1.0]]}
    assert g.lease_id not in s.leases


def _remote(rid, resources=None, actor=None):
    """A request whose owner is on another node (it spilled here)."""
    r = req(rid, resources, actor=actor)
    r.remote_owner = True
    return r


def _local(rid, resources=None):
    """A request of an owner on this node."""
    r = req(rid, resources)
    r.local_owner = True
    return r


def spilled_in(s):
    """The scheduler's task leases of owners on other nodes (what a local owner recalls first)."""
    return [i for i, lease in s.task_leases.items() if lease.remote]


def recalls(actions):
    return [a.lease_id for a in actions if isinstance(a, sc.RecallLease)]


def test_a_local_owner_recalls_the_spilled_in_lease_it_waits_for_once():
    s = sched({"CPU": 1}, workers=[W1, W2])
    (g,) = s.handle(_remote(1), now=0)
    assert s.handle(_local(2), now=1) == [sc.RecallLease(g.lease_id)]
    assert recalls(s.handle(sc.Ticked(), now=2)) == []  # asked once
    assert recalls(s.handle(_local(3), now=2)) == []  # what is being given back serves request 2 first
    (g2,) = s.handle(sc.LeaseReturned(g.lease_id, False), now=3)
    assert g2.request_id == 2 and not spilled_in(s)


def test_what_a_recall_frees_goes_to_the_local_owner_before_earlier_spilled_in_requests():
    s = sched({"CPU": 1}, workers=[W1, W2])
    (g,) = s.handle(_remote(1), now=0)
    assert s.handle(_remote(2), now=0) == []  # spilled here too, waits
    assert recalls(s.handle(_local(3), now=0.5)) == [g.lease_id]
    (g3,) = grants(s.handle(sc.LeaseReturned(g.lease_id, False), now=1))
    assert g3.request_id == 3
    (g2,) = grants(s.handle(sc.LeaseReturned(g3.lease_id, False), now=1.5))
    assert g2.request_id == 2


def test_a_spilled_in_request_that_waited_long_takes_its_turn_before_later_local_ones():
    s = sched({"CPU": 1}, workers=[W1, W2])
    (g,) = s.handle(req(1), now=0)
    assert s.handle(_remote(2), now=0) == []
    assert s.handle(_local(3), now=0.5) == []
    (g2,) = grants(s.handle(sc.LeaseReturned(g.lease_id, False), now=sc.SPILLED_IN_PATIENCE_S + 0.1))
    assert g2.request_id == 2  # waited its patience: served in arrival order


def test_only_task_leases_of_remote_owners_are_recalled_and_only_for_local_owners():
    s = sched({"CPU": 3}, workers=[W1, W2, W3, b"w4" * 8])
    s.handle(req(1), now=0)  # an owner on this node (or not told): never recalled
    s.handle(_remote(2, actor=b"actor"), now=0)  # an actor's lease: never recalled
    (g3,) = s.handle(_remote(3), now=0)
    assert recalls(s.handle(_remote(4), now=1)) == []  # a spilled-in request recalls nothing
    assert recalls(s.handle(req(5), now=1)) == []  # nor one whose owner is not known to be here
    assert recalls(s.handle(_local(6), now=1)) == [g3.lease_id]


def test_recalls_as_few_leases_as_the_request_needs_and_none_that_cannot_make_it_fit():
    s = sched({"CPU": 3}, workers=[W1, W2, W3, b"w4" * 8])
    leases = [g.lease_id for i in (1, 2) for g in s.handle(_remote(i), now=0)]
    s.handle(req(3), now=0)  # all three CPUs taken, one by a local owner
    assert recalls(s.handle(_local(4, {"CPU": 3}), now=1)) == []  # even both spilled-in ones would not do
    assert recalls(s.handle(_local(5, {"CPU": 1}), now=1)) == leases[:1]  # oldest first, one is enough
    assert recalls(s.handle(sc.LeaseCancelled(4), now=2)) == []
    s.handle(sc.LeaseReturned(leases[0], False), now=3)
    assert spilled_in(s) == leases[1:]
    s.handle(sc.WorkerExited(s.leases[leases[1]].worker_id), now=4)
    assert not spilled_in(s)


def _of(job, rid, resources=None):
    """A request of a driver of ``job`` (or one of its workers), a process on this node."""
    r = _local(rid, resources)
    r.job_id = job
    r.owner = b"owner-of-" + job
    return r


def test_a_job_holding_every_cpu_gives_one_to_another_job_at_once():
    s = sched({"CPU": 2}, workers=[W1, W2, W3])
    leases = [g.lease_id for i in (1, 2) for g in grants(s.handle(_of(b"jobA", i), now=0))]
    assert s.handle(_of(b"jobA", 3), now=0) == []  # A's backlog waits too, queued first
    assert recalls(s.handle(_of(b"jobB", 4), now=0.1)) == leases[:1]  # A holds 2, B none: at once
    assert recalls(s.handle(_of(b"jobB", 5), now=0.2)) == []  # one is on its way back
    (g,) = grants(s.handle(sc.LeaseReturned(leases[0], False), now=0.3))
    assert g.request_id == 4  # what A gave back goes to B, before A's earlier request
    # One each now: neither takes from the other, however long they wait.
    assert recalls(s.handle(sc.Ticked(), now=10)) == []


def test_a_job_holding_one_more_cpu_gives_it_up_after_a_time_slice():
    s = sched({"CPU": 1}, workers=[W1, W2])
    (a,) = grants(s.handle(_of(b"jobA", 1), now=0))
    s.handle(_of(b"jobA", 2), now=0)
    assert recalls(s.handle(_of(b"jobB", 3), now=0.1)) == []
    assert recalls(s.handle(sc.Ticked(), now=sc.FAIR_SHARE_SLICE_S - 0.01)) == []
    assert recalls(s.handle(sc.Ticked(), now=sc.FAIR_SHARE_SLICE_S + 0.01)) == [a.lease_id]
    (b,) = grants(s.handle(sc.LeaseReturned(a.lease_id, False), now=1))
    assert b.request_id == 3
    # Then A's waiting request takes its turn back a slice after B's grant.
    assert recalls(s.handle(sc.Ticked(), now=1 + sc.FAIR_SHARE_SLICE_S / 2)) == []
    assert recalls(s.handle(sc.Ticked(), now=1.01 + sc.FAIR_SHARE_SLICE_S)) == [b.lease_id]


def test_fair_share_serves_an_actors_creation_too_but_takes_no_blocked_lease_nor_from_the_same_job():
    s = sched({"CPU": 3}, workers=[W1, W2, W3, b"w4" * 8, b"w5" * 8])
    a1, a2 = [g for i in (1, 2) for g in grants(s.handle(_of(b"jobA", i), now=0))]
    s.handle(sc.WorkerBlocked(a1.worker_id), now=0)  # its CPU is lent out: not counted, not taken
    for i in (3, 4):
        assert grants(s.handle(_of(b"jobA", i), now=0))
    assert s.resources.available["CPU"] == 0
    # Nested work of one job (a task's subtasks) never recalls its own job's leases.
    assert recalls(s.handle(_of(b"jobA", 5), now=5)) == []
    creation = req(6, job=OTHER_JOB, actor=b"actor")
    creation.owner = sc.GCS_OWNER  # an actor's creation the GCS placed here
    assert recalls(s.handle(creation, now=5)) == [a2.lease_id]  # A holds 3 (a1 is blocked), its job none


def test_a_job_that_holds_a_lease_recalls_nothing_from_another_job():
    """Only a job holding nothing here recalls: two jobs running nested tasks, each holding
    leases, keep the arrival order (recalls up to equal shares stalled their rounds)."""
    s = sched({"CPU": 3}, workers=[W1, W2, W3, b"w4" * 8])
    for i in (1, 2):
        assert grants(s.handle(_of(b"jobA", i), now=0))
    assert grants(s.handle(_of(b"jobB", 3), now=0))
    assert recalls(s.handle(_of(b"jobB", 4), now=0.1)) == []
    assert recalls(s.handle(sc.Ticked(), now=10)) == []


def test_a_second_job_behind_the_firsts_ten_waiting_requests_still_recalls():
    s = sched({"CPU": 2}, workers=[W1, W2, W3])
    leases = [g.lease_id for i in (1, 2) for g in grants(s.handle(_of(b"jobA", i), now=0))]
    for i in range(3, 13):
        assert s.handle(_of(b"jobA", i), now=0) == []
    assert recalls(s.handle(_of(b"jobB", 20), now=0.1)) == leases[:1]


def test_a_request_of_two_cpus_gets_both_from_a_job_holding_them_in_turn():
    s = sched({"CPU": 2}, workers=[W1, W2, W3])
    a1, a2 = [g for i in (1, 2) for g in grants(s.handle(_of(b"jobA", i), now=0))]
    s.handle(_of(b"jobA", 3), now=0)
    # Counted in CPUs, not leases: B would hold two, A none, so B waits its turn.
    assert recalls(s.handle(_of(b"jobB", 4, {"CPU": 2}), now=0.1)) == []
    assert recalls(s.handle(sc.Ticked(), now=sc.FAIR_SHARE_SLICE_S + 0.01)) == [a1.lease_id, a2.lease_id]
    # The first CPU back is held for B, not granted to A's earlier request.
    assert grants(s.handle(sc.LeaseReturned(a1.lease_id, False), now=0.6)) == []
    (b,) = grants(s.handle(sc.LeaseReturned(a2.lease_id, False), now=0.7))
    assert b.request_id == 4


def test_what_a_recall_frees_is_held_for_its_request_only_for_a_while():
    s = sched({"CPU": 2}, workers=[W1, W2, W3])
    a1, a2 = [g for i in (1, 2) for g in grants(s.handle(_of(b"jobA", i), now=0))]
    s.handle(_of(b"jobA", 3), now=0)
    s.handle(_of(b"jobB", 4, {"CPU": 2}), now=0.1)
    s.handle(sc.Ticked(), now=1)  # both recalled; A's second worker is frozen and never answers
    assert grants(s.handle(sc.LeaseReturned(a1.lease_id, False), now=1.1)) == []
    (g,) = grants(s.handle(sc.Ticked(), now=1 + sc.RECALL_HOLD_S + 0.1))
    assert g.request_id == 3  # the hold ended: the free CPU serves who can use it


def test_disconnected_lease_stops_its_worker():
    s = sched({"CPU": 1}, workers=[W1])
    (g,) = s.handle(req(1), now=0)
    acts = s.handle(sc.LeaseReturned(g.lease_id, True), now=1)
    assert acts[0] == sc.StopWorker(W1, "returned as failed", quiet=True)
    assert s.handle(sc.LeaseReturned(g.lease_id, False), now=2) == []  # a second return is ignored


def test_actor_worker_is_never_pooled_again():
    s = sched({"CPU": 1}, workers=[W1, W2])
    (g,) = s.handle(req(1, actor=b"actor"), now=0)
    acts = s.handle(sc.LeaseReturned(g.lease_id, False), now=1)
    assert sc.StopWorker(g.worker_id, "its actor ended") in acts


def test_a_burst_of_queued_actors_costs_each_event_the_start_cap_not_the_queue():
    """1,000 queued num_cpus=0 actors: each worker registering looks at about
    ``max_workers`` queued requests (and none of the actor workers), and every actor
    gets a worker in the end, with never more than the cap starting at once."""
    s = sched({"CPU": 2}, max_workers=4)
    s.validate = False  # check_invariants scans every worker (quadratic by itself)
    looked = 0
    fits = s.resources.fits

    def counting_fits(units):
        nonlocal looked
        looked += 1
        return fits(units)

    s.resources.fits = counting_fits
    starting, granted = [], 0

    def run(actions):
        nonlocal granted
        for a in actions:
            if isinstance(a, sc.StartWorker):
                wid = b"w%07d" % len(s.workers) + b"." * 8
                s.add_starting_worker(wid)
                starting.append(wid)
            granted += isinstance(a, sc.GrantLease)

    for rid in range(1, 1001):
        run(s.handle(req(rid, {"CPU": 0}, actor=b"a%015d" % rid), now=0))
    most_looked = 0
    while starting:
        assert len(starting) <= 4
        looked = 0
        run(s.handle(sc.WorkerRegistered(starting.pop(0)), now=1))
        most_looked = max(most_looked, looked)
    assert granted == 1000 and not s.queue
    assert most_looked <= 4 + 1
    s.check_invariants()


def test_fractional_gpus_share_an_instance_and_whole_ones_do_not():
    s = sched({"CPU": 8, "GPU": 2}, workers=[W1, W2, W3, b"w4" * 8])
    (a,) = s.handle(req(1, {"GPU": 0.5}), now=0)
    (b,) = s.handle(req(2, {"GPU": 0.5}), now=0)
    assert a.resource_ids == b.resource_ids == {"GPU": [[0, 0.5]]}
    (c,) = s.handle(req(3, {"GPU": 1}), now=0)
    assert c.resource_ids == {"GPU": [[1, 1.0]]}
    assert s.handle(req(4, {"GPU": 0.5}), now=0) == []


def test_job_finished_stops_its_workers_and_drops_its_requests():
    s = sched({"CPU": 1}, workers=[W1, W2])
    (g,) = s.handle(req(1), now=0)
    s.handle(req(2, job=JOB), now=0)
    s.handle(req(3, job=OTHER_JOB), now=0)
    acts = s.handle(sc.JobFinished(JOB), now=1)
    assert sc.StopWorker(g.worker_id, "its job finished", graceful_s=m.JOB_END_EXIT_S) in acts  # sends what it holds first
    assert list(s.queue) == [3]


def test_idle_workers_above_the_prestart_count_are_reaped():
    s = sched({"CPU": 4}, prestart=1, idle_s=5.0, workers=[W1, W2, W3])
    assert s.handle(sc.Ticked(), now=4.0) == []
    acts = s.handle(sc.Ticked(), now=6.0)
    assert len(acts) == 2 and len({a.worker_id for a in acts}) == 2
    assert all(isinstance(a, sc.StopWorker) and a.reason == "idle" for a in acts)
    assert s.handle(sc.Ticked(), now=100.0) == []  # one stays: the prestart count


def test_idle_worker_of_the_same_job_is_preferred():
    s = sched({"CPU": 2}, workers=[W1, W2])
    (g,) = s.handle(req(1, job=OTHER_JOB), now=0)
    s.handle(sc.LeaseReturned(g.lease_id, False), now=1)
    (g2,) = s.handle(req(2, job=OTHER_JOB), now=2)
    assert g2.worker_id == g.worker_id


def test_invariants_catch_drift():
    s = sched({"CPU": 1}, workers=[W1])
    s.handle(req(1), now=0)
    s.resources.available["CPU"] += 1
    with pytest.raises(AssertionError, match="CPU"):
        s.check_invariants()


# =========================================================================== resources.py


def test_units_are_exact_for_fractions():
    assert rs.to_units(0.1) + rs.to_units(0.2) == rs.to_units(0.3)
    assert rs.from_units(rs.to_units(2)) == 2 and isinstance(rs.from_units(rs.to_units(2)), int)
    assert rs.from_units(rs.to_units(0.25)) == 0.25
    assert rs.request_units({"CPU": 1, "GPU": 0, "x": 0.5}) == {"CPU": rs.UNIT, "x": rs.UNIT // 2}


def test_node_resources_fit_allocate_release():
    r = rs.NodeResources({"CPU": 2, "GPU": 2, "memory": 0})
    assert "memory" not in r.total
    assert r.feasible({"CPU": 2 * rs.UNIT}) and not r.feasible({"CPU": 3 * rs.UNIT})
    assert not r.feasible({"accel": 1})
    ids = r.allocate({"CPU": rs.UNIT, "GPU": 2 * rs.UNIT})
    assert ids == {"GPU": [[0, 1.0], [1, 1.0]]}
    assert not r.fits({"GPU": rs.UNIT // 10})
    r.release({"CPU": rs.UNIT, "GPU": 2 * rs.UNIT}, ids)
    assert r.available == r.total and r.instances["GPU"] == [rs.UNIT, rs.UNIT]


def test_gpu_instances_best_fit_fractions_and_whole_numbers():
    r = rs.NodeResources({"GPU": 2})
    a = r.allocate({"GPU": rs.to_units(0.7)})
    b = r.allocate({"GPU": rs.to_units(0.3)})
    assert a == {"GPU": [[0, 0.7]]} and b == {"GPU": [[0, 0.3]]}  # fills GPU 0 first
    assert not r.fits({"GPU": rs.to_units(1.5)})  # above one must be whole
    c = r.allocate({"GPU": rs.to_units(1)})
    assert c == {"GPU": [[1, 1.0]]}
    assert not r.fits({"GPU": rs.to_units(0.1)})
    r.release({"GPU": rs.to_units(0.7)}, a)
    assert r.fits({"GPU": rs.to_units(0.7)}) and not r.fits({"GPU": rs.to_units(1)})


def test_whole_gpu_needs_an_untouched_instance():
    r = rs.NodeResources({"GPU": 2})
    r.allocate({"GPU": rs.to_units(0.5)})
    r.allocate({"GPU": rs.to_units(0.5)})  # same instance (best fit)
    assert r.fits({"GPU": rs.UNIT}) and not r.fits({"GPU": 2 * rs.UNIT})


# =========================================================================== ObjectStoreState

MiB = 1024 * 1024
A, B, C, D = (bytes([i]) * 20 for i in range(1, 5))


def store(capacity=100 * MiB, recycle=50 * MiB, timeout_s=2.0):
    return st.ObjectStoreState("/dev/shm/lumos-test", capacity, recycle, timeout_s, validate=True)


def create(s, rid, oid, size, client=W1, now=0.0):
    return s.handle(st.CreateRequested(rid, oid, size, client), now)


def test_create_grants_a_new_file_and_seal_counts_it():
    s = store()
    (g,) = create(s, 1, A, 10 * MiB)
    assert isinstance(g, st.GrantCreate) and not g.reused
    assert g.path.endswith(A.hex() + ".w") and g.final_path.endswith(A.hex())
    assert g.file_size == 10 * MiB and s.used_bytes == 10 * MiB
    assert s.handle(st.ObjectSealed(A, 10 * MiB), 0) == []
    assert s.objects[A].sealed
    assert s.stats()["num_objects"] == 1


def test_duplicate_and_oversized_creates_are_rejected():
    s = store()
    create(s, 1, A, MiB)
    (r,) = create(s, 2, A, MiB)
    assert isinstance(r, st.RejectCreate) and "already exists" in r.reason
    assert not r.exists  # still being written: not usable as a result
    s.handle(st.ObjectSealed(A, MiB), 0)
    (r,) = create(s, 4, A, MiB)
    assert isinstance(r, st.RejectCreate) and r.exists  # sealed, same size: a re-run may use it
    (r,) = create(s, 5, A, 2 * MiB)
    assert isinstance(r, st.RejectCreate) and not r.exists
    (r,) = create(s, 3, B, 200 * MiB)
    assert isinstance(r, st.RejectCreate) and "larger than the object store" in r.reason
    assert s.used_bytes == MiB


def test_create_waits_for_frees_then_is_granted():
    s = store(capacity=30 * MiB, recycle=0)
    create(s, 1, A, 20 * MiB)
    s.handle(st.ObjectSealed(A, 20 * MiB), 0)
    assert create(s, 2, B, 20 * MiB) == []
    assert s.stats()["pending_creates"] == 1
    acts = s.handle(st.ObjectsFreed([A], [False]), 1)
    assert st.UnlinkFile(s.final_path(A)) in acts
    (g,) = [a for a in acts if isinstance(a, st.GrantCreate)]
    assert g.request == 2 and g.object_id == B


def test_pulled_copies_are_evicted_oldest_first_to_make_room():
    s = store(capacity=40 * MiB, recycle=0)
    for rid, oid in ((1, A), (2, B)):  # two copies pulled from other nodes
        create(s, rid, oid, 15 * MiB, client=st.PULLED)
        s.handle(st.ObjectSealed(oid, 15 * MiB), 0)
    create(s, 3, C, 5 * MiB)  # made here: a primary
    s.handle(st.ObjectSealed(C, 5 * MiB), 0)
    acts = create(s, 4, D, 10 * MiB)  # 45 MiB would not fit: the oldest copy goes
    assert st.UnlinkFile(s.final_path(A)) in acts
    assert any(isinstance(a, st.GrantCreate) and a.object_id == D for a in acts)
    assert A not in s.objects and B in s.objects and C in s.objects
    assert s.stats()["evicted_copies"] == 1
    # Evicting every copy would still not make room: nothing is evicted, the create waits.
    assert create(s, 5, bytes([9]) * 20, 30 * MiB) == []
    assert B in s.objects and s.stats()["pending_creates"] == 1


def test_a_pulled_copy_used_as_a_rerun_result_is_never_evicted():
    s = store(capacity=20 * MiB, recycle=0)
    create(s, 1, A, 15 * MiB, client=st.PULLED)
    s.handle(st.ObjectSealed(A, 15 * MiB), 0)
    (r,) = create(s, 2, A, 15 * MiB)  # the task that made A ran again here
    assert r.exists and s.objects[A].creator == W1
    assert create(s, 3, B, 10 * MiB) == []  # waits: A is a primary now
    assert A in s.objects


def test_pending_create_is_rejected_after_its_deadline():
    s = store(capacity=30 * MiB, timeout_s=2.0)
    create(s, 1, A, 20 * MiB)
    create(s, 2, B, 20 * MiB, now=10.0)
    assert s.handle(st.Ticked(), 11.0) == []
    (r,) = s.handle(st.Ticked(), 12.5)
    assert isinstance(r, st.RejectCreate) and r.request == 2 and "full" in r.reason and "waited" in r.reason


def test_creates_are_first_come_first_served():
    s = store(capacity=30 * MiB, recycle=0)
    create(s, 1, A, 20 * MiB)
    assert create(s, 2, B, 20 * MiB) == []
    assert create(s, 3, C, 5 * MiB) == []  # would fit, but waits behind request 2
    acts = s.handle(st.ObjectsFreed([A], [False]), 1)
    assert [a.request for a in acts if isinstance(a, st.GrantCreate)] == [2, 3]


def test_recyclable_free_pools_the_slot_and_the_next_create_reuses_it():
    s = store()
    (g,) = create(s, 1, A, 10 * MiB)
    s.handle(st.ObjectSealed(A, 10 * MiB), 0)
    acts = s.handle(st.ObjectsFreed([A], [True]), 1)
    assert acts == [st.RenameFile(s.final_path(A), f"/dev/shm/lumos-test/pool-{g.slot}")]
    assert s.pool_bytes == 10 * MiB and s.used_bytes == 10 * MiB
    acts = create(s, 2, B, 9 * MiB)
    assert acts[0] == st.RenameFile(f"/dev/shm/lumos-test/pool-{g.slot}", s._tmp_path(B))
    assert acts[1].reused and acts[1].slot == g.slot and acts[1].file_size == 10 * MiB
    assert s.pool_bytes == 0


def test_slot_much_larger_than_the_request_is_not_reused():
    s = store()
    create(s, 1, A, 40 * MiB)
    s.handle(st.ObjectSealed(A, 40 * MiB), 0)
    s.handle(st.ObjectsFreed([A], [True]), 0)
    (g,) = create(s, 2, B, MiB)
    assert not g.reused


def test_shared_objects_are_unlinked_not_pooled():
    s = store()
    (g,) = create(s, 1, A, MiB)
    s.handle(st.ObjectSealed(A, MiB), 0)
    s.handle(st.MarkedShared([A]), 0)
    acts = s.handle(st.ObjectsFreed([A], [True]), 1)
    assert acts == [st.UnlinkFile(s.final_path(A)), st.DropSlot(W1, g.slot)]
    assert s.used_bytes == 0


def test_free_of_an_object_another_process_views_unlinks_it():
    s = store()
    (g,) = create(s, 1, A, MiB)
    s.handle(st.ObjectSealed(A, MiB), 0)
    s.handle(st.ObjectsPinned(W2, [A]), 0)  # a task still holds its argument
    acts = s.handle(st.ObjectsFreed([A], [True]), 1)
    assert acts == [st.UnlinkFile(s.final_path(A)), st.DropSlot(W1, g.slot)]
    assert s.pool_bytes == 0


def test_pooled_slot_granted_to_another_process_drops_the_old_mapping():
    s = store()
    (g,) = create(s, 1, A, MiB, client=W1)
    s.handle(st.ObjectSealed(A, MiB), 0)
    s.handle(st.ObjectsFreed([A], [True]), 1)
    acts = create(s, 2, B, MiB, client=W2)
    assert st.DropSlot(W1, g.slot) in acts
    assert any(isinstance(a, st.GrantCreate) and a.reused and a.slot == g.slot for a in acts)


def test_pool_is_evicted_to_make_room():
    s = store(capacity=30 * MiB, recycle=30 * MiB)
    (g,) = create(s, 1, A, 20 * MiB)
    s.handle(st.ObjectSealed(A, 20 * MiB), 0)
    s.handle(st.ObjectsFreed([A], [True]), 0)
    acts = create(s, 2, B, 25 * MiB, client=W2)  # does not fit the pooled slot's size window
    assert st.UnlinkFile(f"/dev/shm/lumos-test/pool-{g.slot}") in acts
    assert st.DropSlot(W1, g.slot) in acts
    assert any(isinstance(a, st.GrantCreate) and not a.reused for a in acts)
    assert s.pool_bytes == 0 and s.used_bytes == 25 * MiB


def test_pool_is_bounded_by_recycle_bytes():
    s = store(recycle=15 * MiB)
    for i, oid in enumerate((A, B)):
        create(s, i, oid, 10 * MiB)
        s.handle(st.ObjectSealed(oid, 10 * MiB), 0)
    s.handle(st.ObjectsFreed([A], [True]), 0)
    acts = s.handle(st.ObjectsFreed([B], [True]), 0)
    assert any(isinstance(a, st.UnlinkFile) for a in acts)  # A's slot made way
    assert s.pool_bytes == 10 * MiB


def test_client_gone_frees_its_unsealed_objects_and_pending_creates():
    s = store(capacity=30 * MiB)
    create(s, 1, A, 20 * MiB, client=W1)        # never sealed
    create(s, 2, B, 5 * MiB, client=W2)
    s.handle(st.ObjectSealed(B, 5 * MiB), 0)
    assert create(s, 3, C, 20 * MiB, client=W1) == []  # pending
    acts = s.handle(st.ClientGone(W1), 1)
    assert st.UnlinkFile(s._tmp_path(A)) in acts
    assert A not in s.objects and B in s.objects
    assert s.stats()["pending_creates"] == 0
    assert s.used_bytes == 5 * MiB


def test_a_create_of_an_id_another_process_writes_waits_for_its_seal_or_its_end():
    """A task's retry creates the ids its dead attempt was writing, maybe before the dead
    worker is reaped: the create waits for the other writer instead of being refused
    ("object already exists in the store", an ObjectStoreFullError to the user)."""
    s = store(capacity=30 * MiB)
    create(s, 1, A, 5 * MiB, client=W1)  # a dead attempt's, not reaped yet
    assert create(s, 2, A, 5 * MiB, client=W2) == []  # waits
    acts = s.handle(st.ClientGone(W1), 1)
    assert [a.request for a in acts if isinstance(a, st.GrantCreate)] == [2]
    assert s.objects[A].creator == W2 and not s.objects[A].sealed
    # Sealed by the other writer (alive after all, slow or frozen): the retry's value
    # replaces that one, as it replaces one a dead attempt sealed.
    create(s, 3, B, 5 * MiB, client=W3)
    assert create(s, 4, B, 5 * MiB, client=W2) == []
    acts = s.handle(st.ObjectSealed(B, 5 * MiB), 2)
    assert st.UnlinkFile(s.final_path(B)) in acts
    assert [a.request for a in acts if isinstance(a, st.GrantCreate)] == [4] and s.objects[B].creator == W2
    # Neither before the deadline: refused, saying why; a waiter that goes is forgotten.
    create(s, 5, C, MiB, client=W3)
    assert create(s, 6, C, MiB, client=W2) == [] and create(s, 7, C, MiB, client=W1) == []
    s.handle(st.ClientGone(W1), 3)
    acts = s.handle(st.Ticked(), 3 + 2.0)
    (reject,) = [a for a in acts if isinstance(a, st.RejectCreate)]
    assert reject.request == 6 and "still being written by another process" in reject.reason
    assert s.handle(st.ObjectSealed(C, MiB), 6) == []


def test_freeing_unknown_objects_is_harmless():
    s = store()
    assert s.handle(st.ObjectsFreed([D], [True]), 0) == []
    assert s.used_bytes == 0


# =========================================================================== config.py


def test_config_defaults_env_and_overrides_precedence():
    default = Config.resolve({}, environ={})
    assert default == Config()
    env = {"LUMOS_HEARTBEAT_INTERVAL_MS": "250", "LUMOS_VALIDATE": "yes", "LUMOS_WAIT_SLICE_S": "0.5"}
    c = Config.resolve({}, environ=env)
    assert c.heartbeat_interval_ms == 250 and c.validate is True and c.wait_slice_s == 0.5
    c = Config.resolve({"heartbeat_interval_ms": 100}, environ=env)
    assert c.heartbeat_interval_ms == 100 and c.validate is True
    assert Config.from_json(c.to_json()) == c
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.validate = False  # type: ignore[misc]


@pytest.mark.parametrize("raw,value", [("1", True), ("true", True), ("ON", True), ("0", False), ("off", False)])
def test_config_bool_env_values(raw, value):
    assert Config.resolve({}, environ={"LUMOS_LOG_TO_DRIVER": raw}).log_to_driver is value


@pytest.mark.parametrize("name,raw", [("LUMOS_HEARTBEAT_INTERVAL_MS", "fast"), ("LUMOS_VALIDATE", "maybe"),
                                      ("LUMOS_WAIT_SLICE_S", "1,5")])
def test_config_bad_env_values_are_rejected_naming_the_variable(name, raw):
    with pytest.raises(ValueError, match=name):
        Config.resolve({}, environ={name: raw})


def test_config_unknown_override_lists_valid_keys():
    with pytest.raises(ValueError, match="heartbeat_interval_ms"):
        Config.resolve({"heartbeat_interval": 5}, environ={})


def test_config_ignores_unrelated_env():
    assert Config.resolve({}, environ={"LUMOS_NOT_A_FIELD": "x", "HEARTBEAT_INTERVAL_MS": "1"}) == Config()


@pytest.mark.parametrize("override", [
    {"heartbeat_interval_ms": "fast"}, {"validate": "yes"}, {"validate": 1},
    {"max_frame_bytes": -1}, {"max_frame_bytes": 0}, {"heartbeat_interval_ms": 0}, {"wait_slice_s": 0.0},
    {"handshake_timeout_s": None}, {"heartbeat_interval_ms": True}, {"object_store_memory": 1.5},
    {"rpc_timeout_s": float("inf")}, {"rpc_timeout_s": float("nan")}, {"rpc_timeout_s": 10 ** 400},
    {"rpc_timeout_s": False}, {"max_workers_per_node": 0}, {"num_prestart_workers": -2},
])
def test_config_bad_override_values_are_rejected(override):
    with pytest.raises((TypeError, ValueError), match=next(iter(override))):
        Config.resolve(override, environ={})


@pytest.mark.parametrize("name,raw", [("LUMOS_HEARTBEAT_INTERVAL_MS", "0"), ("LUMOS_RPC_TIMEOUT_S", "nan"),
                                      ("LUMOS_MAX_FRAME_BYTES", "-1")])
def test_config_out_of_range_env_values_are_rejected_naming_the_variable(name, raw):
    with pytest.raises(ValueError, match=name):
        Config.resolve({}, environ={name: raw})


def test_config_valid_overrides_of_each_type_are_accepted_unchanged():
    assert Config.resolve(dataclasses.asdict(Config()), environ={}) == Config()
    overrides = {"heartbeat_interval_ms": 1, "object_store_memory": 0, "num_prestart_workers": 0,
                 "max_workers_per_node": -1, "handshake_timeout_s": 0.25, "pipeline_below_ms": 0.0,
                 "validate": True, "log_to_driver": False}
    c = Config.resolve(overrides, environ={})
    for name, value in overrides.items():
        assert getattr(c, name) == value and type(getattr(c, name)) is type(value), name
    # An int is a fine number of seconds; the Config holds it as the float its field declares.
    c = Config.resolve({"rpc_timeout_s": 2}, environ={})
    assert c.rpc_timeout_s == 2.0 and type(c.rpc_timeout_s) is float


# =========================================================================== serialization.py


def roundtrip(value):
    blob = ser.serialize(value).to_bytes()
    kind, out = ser.deserialize(blob)
    assert kind == ser.KIND_VALUE
    return out


@pytest.mark.parametrize("value", [
    0, -1, 2 ** 100, 1.5, float("inf"), "text ü", b"\x00bytes", None, True, 3 + 4j,
    [1, [2, [3, [4]]]], (1, "a"), {"k": {"nested": [1, 2]}}, set([1, 2]), frozenset(["a"]),
    {i: str(i) for i in range(100)}, list(range(1000)),
])
def test_plain_values_round_trip(value):
    assert roundtrip(value) == value


def _nested(depth, leaf=None):
    value = {"leaf": leaf}
    for _ in range(depth):
        value = {"n": value}
    return value


def _depth(value):
    depth = 0
    while "n" in value:
        value, depth = value["n"], depth + 1
    return depth, value["leaf"]


def test_values_nested_past_the_recursion_limit_round_trip_and_deeper_ones_fail_clearly():
    # A dict nested 500 deep ran out of the interpreter's recursion (two levels per dict)
    # where Ray's serializer goes to ~2,000: pickled again under a raised limit, then
    # the limit is put back.
    limit = sys.getrecursionlimit()
    for leaf in (None, lambda: 1):  # the C pickler's path, and cloudpickle's
        depth, back = _depth(roundtrip(_nested(2500, leaf)))
        assert depth == 2500 and (back is None if leaf is None else back() == 1)
        assert sys.getrecursionlimit() == limit
    with pytest.raises(ser.SerializationError, match=r"nested more deeply than pickling can follow \(6000 levels"):
        ser.serialize(_nested(5000))
    assert sys.getrecursionlimit() == limit


def test_closures_and_lambdas_round_trip_by_value():
    k = 7
    f = lambda x: x + k  # noqa: E731
    assert roundtrip(f)(1) == 8

    class Local:
        def __init__(self):
            self.v = 3

    assert roundtrip(Local()).v == 3


def test_numpy_buffers_go_out_of_band_aligned_and_come_back_zero_copy():
    arr = np.arange(100_000, dtype=np.float64)
    sv = ser.serialize({"a": arr, "b": arr[::2].copy()})
    assert len(sv.buffers) == 2
    blob = bytearray(sv.total_size)
    sv.write_into(memoryview(blob))
    assert bytes(blob) == sv.to_bytes()
    kind, stream, buffers = ser.parse(memoryview(blob))
    base = np.frombuffer(blob, dtype=np.uint8).ctypes.data
    for b in buffers:
        assert (np.frombuffer(b, dtype=np.uint8).ctypes.data - base) % ser.ALIGN == 0
    _, out = ser.deserialize(memoryview(blob))
    assert np.array_equal(out["a"], arr)
    assert np.shares_memory(out["a"], np.frombuffer(blob, dtype=np.uint8))  # a view, not a copy
    _, ro = ser.deserialize(bytes(blob))
    assert not ro["a"].flags.writeable  # from immutable bytes: read-only, like Ray


@pytest.mark.parametrize("arr", [
    np.zeros((3, 4), dtype=np.int32), np.arange(10)[::3], np.array(["a", "bc"]),
    np.array([{"x": 1}, None], dtype=object), np.zeros(0), np.asfortranarray(np.ones((5, 6))),
    np.array([(1, 2.0)], dtype=[("a", "i4"), ("b", "f8")]),
])
def test_numpy_arrays_of_all_kinds_round_trip(arr):
    out = roundtrip(arr)
    assert out.dtype == arr.dtype and out.shape == arr.shape
    assert out.tolist() == arr.tolist()


def test_arrow_table_round_trips_with_out_of_band_buffers():
    table = pa.table({"x": pa.array(np.arange(50_000)), "s": pa.array([str(i) for i in range(50_000)])})
    sv = ser.serialize(table)
    assert sv.buffers, "arrow buffers should travel out of band"
    assert len(sv.pickled) < 10_000
    out = roundtrip(table)
    assert out.equals(table)


def test_nested_object_refs_are_recorded():
    owner = m.Address(b"n" * 16, b"w" * 16, "/tmp/x.sock", "127.0.0.1", 1)
    r1, r2 = ObjectRef(b"\x01" * 20, owner), ObjectRef(b"\x02" * 20, None)
    sv = ser.serialize({"refs": [r1, (r2,)], "n": 1})
    assert sv.nested_refs == [r1, r2]
    _, out = ser.deserialize(sv.to_bytes())
    assert out["refs"][0] == r1 and out["refs"][0].owner_address() == owner
    assert ser.serialize([1, 2]).nested_refs == []


def test_nested_serialize_keeps_ref_recording_separate():
    r = ObjectRef(b"\x03" * 20)

    class Inner:
        def __reduce__(self):
            assert ser.serialize("other").nested_refs == []
            return (str, ("inner",))

    sv = ser.serialize([Inner(), r])
    assert sv.nested_refs == [r]


@pytest.mark.parametrize("make,name", [
    (threading.Lock, "lock"), (lambda: (x for x in range(3)), "generator"),
    (lambda: {"deep": [threading.Lock()]}, "dict"),
])
def test_unpicklable_values_raise_a_clear_serialization_error(make, name):
    with pytest.raises(ser.SerializationError, match="could not serialize a value of type") as info:
        ser.serialize(make())
    assert isinstance(info.value, TypeError)
    assert "picklable" in str(info.value)


def test_a_value_whose_reduce_raises_is_reported_with_the_cause():
    class Bad:
        def __reduce__(self):
            raise RuntimeError("refuses to pickle")

    with pytest.raises(ser.SerializationError, match="refuses to pickle"):
        ser.serialize([Bad()])


def test_code_pickled_by_value_keeps_its_file_name():
    # cloudpickle 3.1.3 writes "<dynamic-code>" for every file name; a remote traceback
    # must still name the user's file (and a notebook's cell file).
    def nested():
        return lambda: 1 / 0

    exported = ser.deserialize_code(ser.dumps_code(nested))
    sent = ser.deserialize(ser.serialize(nested).to_bytes())[1]
    for loaded in (exported, sent):
        assert loaded.__code__.co_filename == __file__
        assert loaded().__code__.co_filename == __file__
        with pytest.raises(ZeroDivisionError) as info:
            loaded()()
        assert info.traceback[-1].path.name == "test_units.py"


def test_corrupt_blobs_raise_deserialization_error():
    good = ser.serialize(np.arange(1000)).to_bytes()
    with pytest.raises(ser.DeserializationError, match="truncated"):
        ser.deserialize(good[:8])
    with pytest.raises(ser.DeserializationError, match="truncated"):
        ser.deserialize(good[: len(good) // 2])
    with pytest.raises(ser.DeserializationError, match="version"):
        ser.deserialize(bytes([99]) + good[1:])
    head_len = 16 + 16  # header + one buffer entry
    broken = bytearray(good)
    broken[head_len:head_len + 4] = b"\x00\x00\x00\x00"
    with pytest.raises(ser.DeserializationError):
        ser.deserialize(bytes(broken))


def test_a_truncated_inline_blob_without_buffers_says_it_is_truncated():
    good = ser.serialize(list(range(100))).to_bytes()
    with pytest.raises(ser.DeserializationError, match="^serialized value is truncated$"):
        ser.deserialize(good[:-20])
    # a short header, and a memoryview (a store file's form), say the same
    with pytest.raises(ser.DeserializationError, match="truncated"):
        ser.deserialize(good[:10])
    with pytest.raises(ser.DeserializationError, match="could not deserialize"):
        ser.deserialize(memoryview(good[:-20]))


def test_none_and_empty_tuple_serialize_to_one_shared_blob():
    assert ser.serialize(None) is ser.serialize(None)
    assert ser.serialize(()).to_bytes() is ser.serialize(()).to_bytes()
    assert ser.serialize(None).nested_refs == [] and ser.serialize(()).nested_refs == []
    assert ser.deserialize(ser.serialize(()).to_bytes()) == (ser.KIND_VALUE, ())
    # another kind is not the shared value
    blob = ser.serialize(None, ser.KIND_ERROR).to_bytes()
    assert ser.deserialize(blob) == (ser.KIND_ERROR, None)
    assert ser.deserialize(ser.serialize(None).to_bytes()) == (ser.KIND_VALUE, None)


def test_plain_values_skip_the_ref_recording_context():
    seen = []

    def run():
        ser.serialize((1, 2.0, "x", {"k": b"y"}))
        ser.serialize(np.arange(4))
        seen.append(hasattr(ser._local, "refs"))

    t = threading.Thread(target=run)
    t.start()
    t.join(10)
    assert seen == [False]


def test_inline_blobs_without_buffers_are_read_without_parsing_a_buffer_table(monkeypatch):
    blobs = [ser.serialize(v).to_bytes() for v in ((1,), {"a": 1}, "s")]
    arr = ser.serialize(np.arange(8)).to_bytes()

    def no_parse(blob):
        raise AssertionError("parse called for a blob without buffers")

    monkeypatch.setattr(ser, "parse", no_parse)
    assert [ser.deserialize(b)[1] for b in blobs] == [(1,), {"a": 1}, "s"]
    with pytest.raises(AssertionError):
        ser.deserialize(arr)   # out-of-band buffers still go through the table


@pytest.mark.parametrize("arr", [
    np.array([True, False]), np.arange(5, dtype=np.int8), np.arange(3, dtype=np.uint64),
    np.array([1 + 2j]), np.arange(4, dtype=">i4"), np.array(3.5), np.zeros((0, 3)),
    np.array([b"ab", b"c"]), np.array(["xyz", "é"]), np.float16([1, 2]),
    np.arange(12.0).reshape(3, 4),
])
def test_plain_arrays_pickle_as_buffer_dtype_string_and_shape(arr):
    for value in (arr, (arr, 1), {"k": [arr]}):
        sv = ser.serialize(value)
        # numpy's own reduction pickles a dtype object by reference to numpy's modules
        assert b"_rebuild_ndarray" in sv.pickled and b"numpy" not in sv.pickled
        assert len(sv.buffers) == 1
    for blob in (sv.to_bytes(), memoryview(sv.to_bytes())):
        out = ser.deserialize(blob)[1]["k"][0]
        assert out.dtype == arr.dtype and out.shape == arr.shape and np.array_equal(out, arr)
        assert not out.flags.writeable


@pytest.mark.parametrize("arr", [
    np.asfortranarray(np.arange(6.0).reshape(2, 3)), np.arange(10)[::2],
    np.zeros(2, dtype=[("a", "<i4"), ("b", "<f8")]),
    np.array(["2020-01-01"], dtype="datetime64[ns]"), np.array([5], dtype="timedelta64[s]"),
])
def test_other_arrays_keep_numpys_own_reduction(arr):
    sv = ser.serialize((arr,))
    assert b"_rebuild_ndarray" not in sv.pickled
    out = ser.deserialize(sv.to_bytes())[1][0]
    assert out.dtype == arr.dtype and out.shape == arr.shape and np.array_equal(out, arr)


def test_value_that_fails_to_unpickle_raises_deserialization_error():
    class Boom:
        def __reduce__(self):
            return (_raise_on_load, ())

    blob = ser.serialize(Boom()).to_bytes()
    with pytest.raises(ser.DeserializationError, match="loading failed"):
        ser.deserialize(blob)


def _raise_on_load():
    raise ValueError("loading failed")


def test_error_kind_is_kept():
    blob = ser.serialize(ValueError("x"), ser.KIND_ERROR).to_bytes()
    assert ser.kind_of(blob) == ser.KIND_ERROR
    kind, err = ser.deserialize(blob)
    assert kind == ser.KIND_ERROR and isinstance(err, ValueError)


# =========================================================================== exceptions.py


class UserError(Exception):
    pass


class OutOfDeviceMemory(MemoryError):
    pass


class UserErrorWithArgs(Exception):
    def __init__(self, code, detail):
        super().__init__(code, detail)
        self.code = code


def _task_error(cause):
    return exc.TaskError("train_step", "Traceback (most recent call last):\n  File \"x.py\", line 3\n"
                         f"{type(cause).__name__}: {cause}\n", cause, pid=4411, node_ip="127.0.0.1",
                         task_id_hex="ab" * 16)


def test_task_error_is_an_instance_of_the_user_class_and_carries_the_traceback():
    err = _task_error(UserError("bad input")).as_instanceof_cause()
    assert isinstance(err, exc.TaskError) and isinstance(err, UserError)
    assert isinstance(err, exc.RayTaskError)
    assert "x.py" in err.traceback_str and "bad input" in str(err)
    assert "train_step" in str(err) and "pid=4411" in str(err)
    assert err.cause.args == ("bad input",)
    # As Ray's: args hold the original exception, repr names both classes.
    assert err.args == (err.cause,)
    assert repr(err) == "TaskError(UserError)(UserError('bad input'))"
    with pytest.raises(UserError):
        raise err


def test_task_error_pickles_and_stays_an_instance_of_the_user_class():
    err = _task_error(UserErrorWithArgs(7, "detail")).as_instanceof_cause()
    back = pickle.loads(pickle.dumps(err))
    assert isinstance(back, UserErrorWithArgs) and isinstance(back, exc.TaskError)
    assert str(back) == str(err)
    assert back.traceback_str == err.traceback_str
    assert back.code == 7  # attributes of the cause are reachable
    plain = pickle.loads(pickle.dumps(_task_error(UserError("p"))))
    assert isinstance(plain, exc.TaskError) and str(plain) == str(_task_error(UserError("p")))


def test_nested_task_error_uses_the_innermost_user_class():
    inner = _task_error(UserError("deep")).as_instanceof_cause()
    outer = exc.TaskError("outer", "tb", inner).as_instanceof_cause()
    assert isinstance(outer, UserError)
    assert outer.args == (inner.cause,)


def test_task_error_of_builtin_exceptions_is_catchable_as_them():
    for cause in (ValueError("v"), KeyError("k"), ZeroDivisionError("z"), OSError(2, "no file"),
                  MemoryError("oom"), OutOfDeviceMemory("cuda"), exc.ObjectStoreFullError("full")):
        err = _task_error(cause).as_instanceof_cause()
        assert isinstance(err, type(cause))
        assert isinstance(pickle.loads(pickle.dumps(err)), type(cause))


def test_task_error_without_a_cause_is_plain():
    err = exc.TaskError("f", "tb only")
    assert err.as_instanceof_cause() is err
    assert pickle.loads(pickle.dumps(err)).traceback_str == "tb only"


def test_task_error_renders_remote_traceback_for_ipython():
    lines = _task_error(UserError("shown")).as_instanceof_cause()._render_traceback_()
    assert "train_step" in lines[0] and "x.py" in "\n".join(lines)


_SIMPLE = [getattr(exc, name) for name in exc.__all__
           if name not in ("TaskError", "RayTaskError") and isinstance(getattr(exc, name), type)]


@pytest.mark.parametrize("cls", _SIMPLE, ids=[c.__name__ for c in _SIMPLE])
def test_every_error_pickles_to_an_equal_message(cls):
    if cls in (exc.TaskCancelledError,):
        err = cls("ab" * 16, "by the user")
    elif issubclass(cls, exc.ObjectLostError):
        err = cls("cd" * 16, "its node died")
    elif cls is exc.ActorDiedError:
        err = cls("ef" * 16, "killed", UserError("x"))
    else:
        err = cls("something happened to task f: do this next")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err)
    assert str(back) == str(err)
    assert isinstance(back, exc.LumosError)


def test_builtin_bases_and_ray_names():
    assert issubclass(exc.GetTimeoutError, TimeoutError)
    assert issubclass(exc.ObjectStoreFullError, MemoryError)
    assert issubclass(exc.OwnerDiedError, exc.ObjectLostError)
    assert exc.RayError is exc.LumosError
    # As in Ray: a restart in progress is not a death, and an unschedulable actor is neither.
    assert issubclass(exc.ActorDiedError, exc.RayActorError) and issubclass(exc.ActorUnavailableError, exc.RayActorError)
    assert not issubclass(exc.ActorUnavailableError, exc.ActorDiedError)
    assert not issubclass(exc.ActorUnschedulableError, exc.RayActorError)
    err = exc.ActorDiedError("ab" * 8, "its __init__ raised", ValueError("no"))
    assert (err.actor_id, err.actor_init_failed, err.preempted) == ("ab" * 8, True, False)
    assert err.error_msg == str(err) and not exc.ActorUnavailableError("ab" * 8, "restarting").actor_init_failed
    back = pickle.loads(pickle.dumps(exc.ActorUnschedulableError("cd" * 8, "no node")))
    assert type(back) is exc.ActorUnschedulableError and back.actor_id == "cd" * 8 and "no node" in str(back)
    assert exc.RaySystemError is exc.LumosSystemError
    for name in exc.__all__:
        assert hasattr(exc, name), name


# =========================================================================== gcs/task_log.py


def test_task_log_stays_bounded_archives_the_oldest_and_keeps_live_tasks(tmp_path):
    from lumos._private.gcs.task_log import TaskEventTable, read_archive
    from lumos._private.protocol import messages as msgs
    archive = tmp_path / "task_events.msgpack"
    table = TaskEventTable(100, str(archive))
    job = b"\x01" * 4

    def tid(i: int) -> bytes:
        return i.to_bytes(16, "big")

    # An old task that is still running, then many finished ones.
    table.add([msgs.TaskEvent(tid(0), 0, "SUBMITTED", 1.0, job, {"name": "long"}),
               msgs.TaskEvent(tid(0), 0, "RUNNING", 1.1, job)])
    for i in range(1, 251):
        table.add([msgs.TaskEvent(tid(i), 0, "SUBMITTED", 2.0, job, {"name": f"t{i}"}),
                   msgs.TaskEvent(tid(i), 0, "FINISHED", 2.1, job)])
    assert len(table.records) <= 100
    assert tid(0) in table.records  # live: kept
    assert tid(250) in table.records and tid(1) not in table.records  # newest kept, oldest archived
    lines = list(read_archive(str(archive)))
    assert len(lines) == table.num_archived == 251 - len(table.records)
    assert lines[0]["task_id"] == tid(1).hex() and lines[0]["job_id"] == job.hex()
    assert {r["name"] for r in lines} == {f"t{i}" for i in range(1, 252 - len(table.records))}
    assert all(r["state"] == "FINISHED" for r in lines)
    # Changes the dashboard polls for do not mention archived tasks.
    last, rows, more = table.updates(0, 10_000)
    assert not more and {bytes(r[0]) for r in rows} == set(table.records)
    table.close()


def test_task_events_are_kept_in_time_order_whatever_order_they_arrive_in(tmp_path):
    """The executor's RUNNING can reach the GCS before its owner's SUBMITTED..FINISHED
    (their flushes are independent): a record's events stay in time order."""
    from lumos._private.gcs.task_log import TaskEventTable
    from lumos._private.protocol import messages as msgs
    table = TaskEventTable(100, str(tmp_path / "archive"))
    tid, job = b"\x07" * 16, b"\x01" * 4
    table.add([msgs.TaskEvent(tid, 0, "RUNNING", 2.0, job)])
    table.add([msgs.TaskEvent(tid, 0, "SUBMITTED", 1.0, job, {"name": "t"}, None, None, None,
                              [["RUNNING", 2.0], ["FINISHED", 3.0]])])
    rec = table.records[tid]
    assert [(e[0], e[1]) for e in rec.events] == [("SUBMITTED", 1.0), ("RUNNING", 2.0), ("FINISHED", 3.0)]
    assert rec.state == "FINISHED"
    table.close()


def test_task_archive_rotates_and_stays_under_its_bound_keeping_the_newest(tmp_path):
    """A long-lived cluster: the archive on disk stays under ``max_archive_bytes`` (the
    current file and one rotated ``.1``); what is read back is the newest history, in order."""
    import os

    from lumos._private.gcs.task_log import TaskEventTable, read_archive
    from lumos._private.protocol import messages as msgs
    archive = tmp_path / "task_events.msgpack"
    bound = 16 * 1024
    table = TaskEventTable(50, str(archive), max_archive_bytes=bound)
    job = b"\x01" * 4
    for i in range(3000):
        tid = i.to_bytes(16, "big")
        table.add([msgs.TaskEvent(tid, 0, "SUBMITTED", 2.0, job, {"name": f"t{i}"}),
                   msgs.TaskEvent(tid, 0, "FINISHED", 2.1, job)])
        sizes = [os.path.getsize(p) for p in (archive, str(archive) + ".1") if os.path.exists(p)]
        assert sum(sizes) <= bound + 4096, (i, sizes)  # (plus at most one chunk past half)
    assert os.path.exists(str(archive) + ".1")
    names = [int(r["name"][1:]) for r in read_archive(str(archive))]
    assert names == sorted(names) and names == list(range(names[0], names[-1] + 1))  # no gap, in order
    assert names[-1] == 3000 - len(table.records) - 1  # the newest archived is there
    assert 0 < len(names) < table.num_archived  # the oldest were dropped
    table.close()


# =========================================================================== process.py


def test_the_gcs_and_raylet_collect_garbage_less_often_than_python_s_default(cluster):
    """Their state is many small containers without cycles: at Python's default (700)
    the GCS spent up to two thirds of its time in collections that freed nothing."""
    import glob
    import os

    from lumos._private.process import SERVICE_GC_THRESHOLDS
    logs = os.path.join(cluster.address_info["session_dir"], "logs")
    want = f"collector thresholds {SERVICE_GC_THRESHOLDS}"
    for pattern in ("gcs*.log", "raylet*.log"):
        texts = []
        for path in glob.glob(os.path.join(logs, pattern)):
            with open(path) as f:
                texts.append(f.read())
        assert any(want in t for t in texts), (pattern, want)


def test_process_stopped_tells_a_stopped_process_from_a_running_or_gone_one():
    import os
    import signal
    import subprocess
    from lumos._private.process import process_stopped
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert not process_stopped(child.pid)
        os.kill(child.pid, signal.SIGSTOP)
        deadline = 50
        while not process_stopped(child.pid) and deadline:
            threading.Event().wait(0.05)
            deadline -= 1
        assert process_stopped(child.pid)
        os.kill(child.pid, signal.SIGCONT)
        while process_stopped(child.pid) and deadline:
            threading.Event().wait(0.05)
            deadline -= 1
        assert not process_stopped(child.pid)
    finally:
        child.kill()
        child.wait(10)
    assert not process_stopped(child.pid)  # gone


def test_a_recall_its_owner_missed_is_sent_again_while_its_request_waits():
    """A recalled lease is never picked for a recall twice; if its owner missed the
    ``RecallLease`` (a race, a lost message) the request it was recalled for waited as long
    as the owner had tasks. It is asked again every ``RECALL_HOLD_S`` while that request
    waits, and no more once it is served."""
    s = sched({"CPU": 1}, workers=[W1])  # (a second idle one would be reaped meanwhile)
    (a,) = grants(s.handle(_of(b"jobA", 1), now=0))
    s.handle(_of(b"jobA", 2), now=0)
    assert recalls(s.handle(_of(b"jobB", 3), now=0.1)) == []  # B would hold as much as A: A's slice first
    t = sc.FAIR_SHARE_SLICE_S + 0.01
    assert recalls(s.handle(sc.Ticked(), now=t)) == [a.lease_id]
    assert recalls(s.handle(sc.Ticked(), now=t + 1)) == []  # the owner is giving it back
    t2 = t + sc.RECALL_HOLD_S + 0.01
    assert recalls(s.handle(sc.Ticked(), now=t2)) == [a.lease_id]  # it was missed: asked again
    assert recalls(s.handle(sc.Ticked(), now=t2 + 1)) == []
    acts = s.handle(sc.LeaseReturned(a.lease_id, False), now=t2 + 1.5)
    assert sc.StartWorker() in acts and not grants(acts)  # the CPU is B's (a worker of its job starts)
    assert recalls(s.handle(sc.Ticked(), now=t2 + sc.RECALL_HOLD_S + 1)) == []  # back: nothing to ask
