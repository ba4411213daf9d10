"""LocalSchedulerState's spill-over decision (serve here or ask the GCS), without sockets."""

from __future__ import annotations

from typing import Any

from lumos._private.raylet import scheduler as sc

JOB = b"job1"
HERE, OTHER = b"n" * 20, b"o" * 20
W1, W2 = b"w1" * 8, b"w2" * 8
PG = b"p" * 18


def sched(cpus: float = 2, workers: tuple[bytes, ...] = (W1, W2)) -> sc.LocalSchedulerState:
    s = sc.LocalSchedulerState({"CPU": cpus, "GPU": 0}, 0, 8, 5.0, validate=True)
    for w in workers:
        s.add_starting_worker(w)
        s.handle(sc.WorkerRegistered(w), now=0)
    return s


def query(resources: dict[str, float] | None = None, strategy: Any = None, *,
          bundle: tuple[bytes, int] | None = None, arg_bytes_by_node: dict[bytes, int] | None = None,
          hops: int = 0, from_gcs: bool = False, gcs_connected: bool = True, alive_nodes: int = 2) -> sc.SpillQuery:
    return sc.SpillQuery(resources if resources is not None else {"CPU": 1.0}, strategy, bundle, arg_bytes_by_node,
                         hops, from_gcs, HERE, gcs_connected, alive_nodes, self_alive=True)


def test_a_request_that_fits_with_an_empty_queue_is_served_here() -> None:
    assert sched().should_spill(query()) is False


def test_a_request_that_does_not_fit_now_goes_to_the_gcs() -> None:
    s = sched(cpus=1)
    s.handle(sc.LeaseRequested(1, JOB, {"CPU": 1}), now=0)  # takes the only CPU
    assert s.should_spill(query()) is True


def test_a_queued_request_sends_later_ones_to_the_gcs() -> None:
    s = sched(cpus=1, workers=())
    s.handle(sc.LeaseRequested(1, JOB, {"CPU": 1}), now=0)  # fits, waits for a worker process
    assert s.queue
    assert s.should_spill(query({"CPU": 0.5})) is True


def test_a_request_larger_than_this_node_goes_to_the_gcs() -> None:
    assert sched().should_spill(query({"CPU": 16.0})) is True
    assert sched().should_spill(query({"GPU": 1.0})) is True


def test_the_only_node_serves_everything_even_what_does_not_fit() -> None:
    s = sched(cpus=1)
    assert s.should_spill(query({"CPU": 16.0}, alive_nodes=1)) is False
    assert s.should_spill(query(strategy=["SPREAD"], alive_nodes=1)) is False


def test_spilled_gcs_placed_and_disconnected_requests_are_never_sent_back() -> None:
    s = sched(cpus=1)
    big = {"CPU": 16.0}
    assert s.should_spill(query(big, hops=1)) is False
    assert s.should_spill(query(big, from_gcs=True)) is False
    assert s.should_spill(query(big, gcs_connected=False)) is False


def test_node_affinity_spills_for_another_node_or_for_this_one_that_can_never_fit() -> None:
    """Affinity to this node stays here, busy or not, while it fits the node at all; one
    it can never fit goes to the GCS (a soft one runs elsewhere, a hard one fails with
    TaskUnschedulable) rather than wait here for ever."""
    s = sched()
    assert s.should_spill(query(strategy=["NODE", OTHER, False])) is True
    assert s.should_spill(query({"CPU": 1.0}, strategy=["NODE", HERE, False])) is False
    assert s.should_spill(query({"CPU": 16.0}, strategy=["NODE", HERE, False])) is True
    assert s.should_spill(query({"CPU": 16.0}, strategy=["NODE", HERE, True])) is True


def test_spread_always_asks_the_gcs_when_there_are_other_nodes() -> None:
    assert sched().should_spill(query(strategy=["SPREAD"])) is True


def test_large_arguments_on_another_node_ask_the_gcs() -> None:
    s = sched()
    far = {OTHER: sc.LOCALITY_MIN_BYTES, HERE: 0}
    assert s.should_spill(query(arg_bytes_by_node=far)) is True
    near = {OTHER: sc.LOCALITY_MIN_BYTES, HERE: 1}
    assert s.should_spill(query(arg_bytes_by_node=near)) is False


def test_a_bundle_held_here_is_served_here_and_one_held_elsewhere_is_not() -> None:
    s = sched()
    (answer,) = s.handle(sc.BundlesRequested(1, PG, [(0, {"CPU": 1})]), now=0)
    assert answer.ok
    assert s.should_spill(query(bundle=(PG, 0))) is False
    assert s.should_spill(query(bundle=(PG, -1))) is False
    assert s.should_spill(query(bundle=(PG, 1))) is True
    s.handle(sc.BundlesRemoved(PG, None), now=1)
    assert s.should_spill(query(bundle=(PG, 0))) is True


def test_the_decision_changes_nothing() -> None:
    s = sched(cpus=1)
    s.handle(sc.LeaseRequested(1, JOB, {"CPU": 1}), now=0)
    before = (dict(s.resources.available), list(s.queue), dict(s.leases))
    for q in (query(), query({"CPU": 16.0}), query(strategy=["SPREAD"])):
        s.should_spill(q)
    assert (dict(s.resources.available), list(s.queue), dict(s.leases)) == before
    s.check_invariants()
