"""PlacementGroupState fed events in the failure orders that matter, without sockets or a loop.

A placement is a two-phase commit: ``ReserveBundles`` to every node used (prepare), then
the bundles are recorded once all said yes (commit) or given back (rollback). Every state
here runs with ``validate=True``: its invariants are checked after each event.
"""

from __future__ import annotations

from typing import Any

import pytest

from lumos._private.gcs import placement_group_state as pgs
from lumos._private.gcs.global_scheduler import Unschedulable
from lumos._private.gcs.storage import pack_value, unpack_value
from lumos._private.protocol import messages as m
from lumos._private.raylet.resources import request_units

JOB, JOB2 = b"j" * 4, b"k" * 4
N1, N2, N3 = b"1" * 20, b"2" * 20, b"3" * 20
PG, PG2 = b"p" * 18, b"q" * 18


def of(actions: list[pgs.Action], kind: type) -> list[Any]:
    return [a for a in actions if isinstance(a, kind)]


def units(**res: float) -> dict[str, int]:
    return request_units(res)


class Groups:
    def __init__(self, warning_s: float = 10.0) -> None:
        self.s = pgs.PlacementGroupState(0.1, warning_s, validate=True)
        self.now = 0.0

    def __call__(self, event: pgs.Event) -> list[pgs.Action]:
        return self.s.handle(event, self.now)

    def info(self, pg_id: bytes = PG) -> m.PlacementGroupInfo:
        info = self.s.info_of(pg_id)
        assert info is not None
        return info

    def create(self, strategy: str = "SPREAD", n: int = 2, pg_id: bytes = PG, name: str = "",
               job: bytes = JOB, detached: bool = False) -> list[pgs.Action]:
        return self(pgs.GroupCreated(m.CreatePlacementGroup(pg_id, [{"CPU": 1}] * n, strategy, name, "", job,
                                                            detached), 1000.0))

    def tried(self, nodes: list[bytes], pg_id: bytes = PG, cpus: float = 4) -> list[pgs.Action]:
        views = [(nid, units(CPU=cpus)) for nid in nodes]
        return self(pgs.PlacementTried(pg_id, views, views))

    def answer(self, answers: dict[bytes, dict[int, list[int]] | None], pg_id: bytes = PG) -> list[pgs.Action]:
        return self(pgs.BundlesReserved(pg_id, answers))

    def place(self, nodes: list[bytes], pg_id: bytes = PG) -> None:
        """One placement round where every raylet says yes."""
        reserves = of(self.tried(nodes, pg_id), pgs.ReserveBundles)
        assert reserves
        self.answer({r.node_id: {} for r in reserves}, pg_id)


def test_spread_group_is_reserved_on_two_nodes_then_created() -> None:
    t = Groups()
    assert t.create() == [pgs.PublishGroup(PG), pgs.PlaceGroup(PG)]
    out = t.tried([N1, N2])
    assert of(out, pgs.ReserveBundles) == [pgs.ReserveBundles(PG, N1, [[0, {"CPU": 1}]]),
                                           pgs.ReserveBundles(PG, N2, [[1, {"CPU": 1}]])]
    assert t.info().state == pgs.PENDING and t.info().bundle_nodes == [None, None]  # nothing before commit
    out = t.answer({N1: {0: [3]}, N2: {}})
    info = t.info()
    assert info.state == pgs.CREATED and info.bundle_nodes == [N1, N2]
    assert info.bundle_gpu_ids == [[3], []]
    assert out == [pgs.PublishGroup(PG)]
    assert not t.s.wants_placement(PG)
    assert t.s.node_for_bundle(PG, 0, {"CPU": 1}) == info.bundle_nodes[0]


def test_a_reservation_refused_on_one_node_is_rolled_back_on_the_others_and_retried() -> None:
    t = Groups()
    t.create("STRICT_SPREAD", 2)
    t.tried([N1, N2])
    out = t.answer({N1: {}, N2: None})
    assert of(out, pgs.ReleaseBundles) == [pgs.ReleaseBundles(PG, N1, [0])]
    assert of(out, pgs.RetryPlacement) == [pgs.RetryPlacement(PG, 0.1, on_change=False)]
    assert t.info().state == pgs.PENDING and t.info().bundle_nodes == [None, None]
    assert t.s.wants_placement(PG)
    t.place([N1, N2])
    assert t.info().state == pgs.CREATED


def test_node_removed_mid_two_phase_commit_keeps_the_others_and_places_its_bundle_again() -> None:
    t = Groups()
    t.create("STRICT_SPREAD", 2)
    t.tried([N1, N2])
    t(pgs.NodeDied(N2))  # between prepare and commit
    out = t.answer({N1: {}, N2: {}})  # N2 said yes before it died
    info = t.info()
    assert info.state == pgs.PENDING and info.bundle_nodes.count(N1) == 1 and N2 not in info.bundle_nodes
    assert not of(out, pgs.ReleaseBundles)
    # The next try places only the missing bundle, on a node other than N1 (STRICT_SPREAD).
    out = t.tried([N1, N2, N3])
    (reserve,) = of(out, pgs.ReserveBundles)
    assert reserve.node_id == N3 and len(reserve.bundles) == 1
    t.answer({N3: {}})
    assert t.info().state == pgs.CREATED and set(t.info().bundle_nodes) == {N1, N3}


def test_a_reservation_whose_answer_never_came_is_released_before_planning_again() -> None:
    t = Groups()
    t.create("STRICT_PACK", 2)
    t.tried([N1])  # the loop that asked was cancelled before the raylet answered
    out = t.tried([N2])
    assert out[0] == pgs.ReleaseBundles(PG, N1, [0, 1])
    assert of(out, pgs.ReserveBundles) == [pgs.ReserveBundles(PG, N2, [[0, {"CPU": 1}], [1, {"CPU": 1}]])]
    t.answer({N2: {}})
    assert t.info().bundle_nodes == [N2, N2]


def test_node_that_dies_while_its_reservation_fails_rolls_back_the_rest() -> None:
    t = Groups()
    t.create("SPREAD", 2)
    t.tried([N1, N2])
    t(pgs.NodeDied(N2))
    out = t.answer({N1: {}, N2: None})
    assert [r.node_id for r in of(out, pgs.ReleaseBundles)] == [N1]
    assert t.info().bundle_nodes == [None, None]


def test_removal_mid_two_phase_commit_releases_what_was_reserved_and_stops() -> None:
    t = Groups()
    t.create("SPREAD", 2, name="g")
    t.tried([N1, N2])
    out = t(pgs.GroupRemoved(PG, "removed by remove_placement_group()"))
    assert out == [pgs.PublishGroup(PG)] and t.info().state == pgs.REMOVED
    out = t.answer({N1: {}, N2: {}})
    assert sorted(r.node_id for r in of(out, pgs.ReleaseBundles)) == [N1, N2]
    assert not of(out, pgs.RetryPlacement) and not t.s.wants_placement(PG)
    assert t.s.named_info("", "g") is None
    with pytest.raises(Unschedulable, match="was removed"):
        t.s.node_for_bundle(PG, 0, {"CPU": 1})


def test_node_death_after_creation_reschedules_its_bundles_elsewhere() -> None:
    t = Groups()
    t.create("STRICT_SPREAD", 2)
    t.place([N1, N2])
    out = t(pgs.NodeDied(N1))
    info = t.info()
    assert info.state == pgs.RESCHEDULING and N1 not in info.bundle_nodes and N2 in info.bundle_nodes
    assert of(out, pgs.PlaceGroup) == [pgs.PlaceGroup(PG)] and "lost with node" in info.detail
    lost = info.bundle_nodes.index(None)
    assert t.s.node_for_bundle(PG, lost, {"CPU": 1}) is None  # not CREATED: callers wait
    t.place([N2, N3])
    assert t.info().state == pgs.CREATED and t.s.node_for_bundle(PG, lost, {"CPU": 1}) == N3
    assert t(pgs.NodeDied(N1)) == []  # a second report of the same death changes nothing


def test_infeasible_group_waits_for_nodes_and_warns_once_after_the_delay() -> None:
    t = Groups(warning_s=5.0)
    t.create("STRICT_PACK", 3)
    out = t.tried([N1, N2], cpus=2)
    assert "infeasible" in t.info().detail and of(out, pgs.PublishGroup)
    assert of(out, pgs.RetryPlacement) == [pgs.RetryPlacement(PG, 0.1, on_change=True)]
    assert not of(out, pgs.ReportInfeasible)
    t.now = 6.0
    (warn,) = of(t.tried([N1, N2], cpus=2), pgs.ReportInfeasible)
    assert warn.job_id == JOB and PG.hex() in warn.text
    t.now = 12.0
    out = t.tried([N1, N2], cpus=2)
    assert not of(out, pgs.ReportInfeasible) and not of(out, pgs.PublishGroup)  # same detail: no new row
    t.place([N1, N3])  # a node that fits joined
    assert t.info().state == pgs.CREATED and set(t.info().bundle_nodes) == {N1}


def test_busy_nodes_are_waiting_for_resources_not_infeasible() -> None:
    t = Groups()
    t.create("STRICT_PACK", 2)
    out = t(pgs.PlacementTried(PG, [(N1, units(CPU=1))], [(N1, units(CPU=4))]))
    assert t.info().detail == "waiting for resources held by other work" and not of(out, pgs.ReserveBundles)


def test_job_finished_removes_its_groups_but_not_detached_ones() -> None:
    t = Groups()
    t.create("PACK", 2)
    t.create("PACK", 1, pg_id=PG2, detached=True)
    t.place([N1])
    t.place([N1], pg_id=PG2)
    out = t(pgs.JobFinished(JOB))
    assert of(out, pgs.ReleaseBundles) == [pgs.ReleaseBundles(PG, N1, None)]
    assert t.info().state == pgs.REMOVED and t.info().detail == "its job finished"
    assert t.info(PG2).state == pgs.CREATED


def test_gcs_restart_reloads_created_pending_and_removed_groups() -> None:
    t = Groups()
    t.create("SPREAD", 2, name="created")
    t.place([N1, N2])
    t.create("SPREAD", 1, pg_id=PG2, name="pending")
    t.tried([N1], pg_id=PG2)  # its reservation was in flight when the GCS went down
    gone = b"r" * 18
    t.create("PACK", 1, pg_id=gone, name="removed")
    t(pgs.GroupRemoved(gone, "removed"))
    rows = [unpack_value(pack_value(g.info)) for g in t.s.groups.values()]
    t2 = Groups()
    out: list[pgs.Action] = []
    for row in rows:
        out += t2(pgs.GroupRestored(row))
    assert out == [pgs.PlaceGroup(PG2)]
    assert t2.info().state == pgs.CREATED and t2.s.named_info("", "created") is t2.info()
    assert t2.s.named_info("", "removed") is None and t2.s.named_info("", "pending") is t2.info(PG2)
    # A node that was dead when the GCS came back: its bundles are placed again.
    out = t2(pgs.NodeDied(N2))
    assert t2.info().state == pgs.RESCHEDULING and of(out, pgs.PlaceGroup) == [pgs.PlaceGroup(PG)]
    t2.place([N1, N3])
    t2.place([N1], pg_id=PG2)
    assert t2.info().state == t2.info(PG2).state == pgs.CREATED
    assert t2.info().version > t.info().version


def test_a_row_from_an_older_gcs_without_gpu_ids_is_restored() -> None:
    t = Groups()
    info = m.PlacementGroupInfo(PG, "", "", "PACK", [{"CPU": 1}], pgs.CREATED, [N1], JOB, False, 1.0)
    assert info.bundle_gpu_ids == []
    assert t(pgs.GroupRestored(info)) == []
    assert t.info().bundle_gpu_ids == [[]]


def test_bad_requests_are_refused_naming_the_problem() -> None:
    t = Groups()
    with pytest.raises(ValueError, match="valid: PACK, SPREAD"):
        t.create("SQUEEZE")
    t.create(name="g")
    with pytest.raises(ValueError, match="already exists"):
        t.create(pg_id=PG2, name="g")
    assert t.create(name="g") == []  # a retried request
    with pytest.raises(ValueError, match="no placement group"):
        t(pgs.GroupRemoved(PG2, "x"))
    with pytest.raises(Unschedulable, match="out of range"):
        t.s.node_for_bundle(PG, 2, {"CPU": 1})
    with pytest.raises(Unschedulable, match="does not fit"):
        t.s.node_for_bundle(PG, 0, {"CPU": 2})
    with pytest.raises(Unschedulable, match="does not exist"):
        t.s.node_for_bundle(PG2, 0, {"CPU": 1})


def test_removed_groups_beyond_the_bound_are_dropped_with_their_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pgs, "KEEP_REMOVED", 1)
    t = Groups()
    ids = [bytes([i]) * 18 for i in range(1, 4)]
    out: list[pgs.Action] = []
    for pg_id in ids:
        out += t.create(pg_id=pg_id)
        t(pgs.GroupRemoved(pg_id, "removed"))
    out += t.create(pg_id=PG)
    assert of(out, pgs.DeleteGroupRow) == [pgs.DeleteGroupRow(ids[0]), pgs.DeleteGroupRow(ids[1])]
    assert list(t.s.groups) == [ids[2], PG]


def test_invariants_catch_drift() -> None:
    t = Groups()
    t.create("STRICT_SPREAD", 2)
    t.place([N1, N2])
    t.s.groups[PG].info.bundle_nodes[1] = N1
    with pytest.raises(AssertionError, match="STRICT_SPREAD with two bundles on one node"):
        t.s.check_invariants()
    t.s.groups[PG].info.bundle_nodes[1] = N2
    t.s.dead_nodes.add(N2)
    with pytest.raises(AssertionError, match="dead node"):
        t.s.check_invariants()
