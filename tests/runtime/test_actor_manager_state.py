"""ActorManagerState fed events in the failure orders that matter, without sockets or a loop.

Every state here runs with ``validate=True``: its invariants are checked after each event.
"""

from __future__ import annotations

from typing import Any

import pytest

from lumos._private.gcs import actor_state as ast
from lumos._private.gcs.storage import pack_value, unpack_value
from lumos._private.protocol import messages as m
from lumos._private.protocol.vocab import WorkerExitType

USER_ERROR = WorkerExitType.USER_ERROR
INTENDED_USER_EXIT = WorkerExitType.INTENDED_USER_EXIT
INTENDED_SYSTEM_EXIT = WorkerExitType.INTENDED_SYSTEM_EXIT

JOB, JOB2 = b"j" * 4, b"k" * 4
N1, N2 = b"1" * 20, b"2" * 20
DRIVER = b"d" * 20
A, B = b"a" * 16, b"b" * 16


def spec(actor_id: bytes = A, owner: bytes = DRIVER, job: bytes = JOB, args: bytes = b"", **opts: Any) -> m.TaskSpec:
    options = {"class_name": "Counter", **opts}
    return m.TaskSpec(b"t" + actor_id[1:], job, b"", 1, "Counter.__init__", b"f", "Counter.__init__", args, [], [],
                      1, {"CPU": 1}, 0, 0, None, m.Address(N1, owner, "", "127.0.0.1", 1), 0, None,
                      actor_id=actor_id, actor_options=options)


def addr(worker: bytes) -> m.Address:
    return m.Address(N1, worker, "", "127.0.0.1", 2)


def of(actions: list[ast.Action], kind: type) -> list[Any]:
    return [a for a in actions if isinstance(a, kind)]


class Actors:
    """A state plus the bookkeeping a test needs (clock, lease ids)."""

    def __init__(self, dead_kept: int = 10_000) -> None:
        self.s = ast.ActorManagerState(validate=True, dead_kept=dead_kept)
        self.now = 100.0
        self.next_lease = 1

    def __call__(self, event: ast.Event) -> list[ast.Action]:
        self.now += 1
        return self.s.handle(event, self.now)

    def info(self, actor_id: bytes = A) -> m.ActorInfo:
        info = self.s.info_of(actor_id)
        assert info is not None
        return info

    def lease(self, actor_id: bytes, node: bytes, worker: bytes) -> list[ast.Action]:
        self.next_lease += 1
        return self(ast.WorkerLeased(actor_id, node, self.next_lease, worker))

    def create(self, actor_id: bytes, node: bytes, worker: bytes) -> list[ast.Action]:
        """Lease and a successful ``__init__``: the actor is ALIVE on ``worker``."""
        (push,) = of(self.lease(actor_id, node, worker), ast.PushCreationTask)
        assert push.worker_id == worker
        out = self(ast.CreationFinished(actor_id, worker, True, None, addr(worker), 42))
        assert self.info(actor_id).state == ast.ALIVE
        return out


def registered(**opts: Any) -> Actors:
    t = Actors()
    out = t(ast.ActorRegistered(spec(**opts)))
    assert out == [ast.PublishActor(A), ast.PlaceActor(A)]
    return t


def test_registration_publishes_and_places_and_creation_makes_it_alive() -> None:
    t = registered(name="c")
    assert t.info().state == ast.PENDING and t.info().version == 2
    assert t.s.wants_placement(A)
    out = t.create(A, N1, b"w1")
    assert out == [ast.PublishActor(A)]
    info = t.info()
    assert (info.node_id, info.pid, info.address) == (N1, 42, addr(b"w1"))
    assert not t.s.wants_placement(A)
    assert t.s.named_info("", "c") is info


def test_a_retried_registration_changes_nothing_and_a_taken_name_is_refused() -> None:
    t = registered(name="c")
    assert t(ast.ActorRegistered(spec(name="c"))) == []
    with pytest.raises(ValueError, match="already exists in namespace ''"):
        t(ast.ActorRegistered(spec(B, name="c")))
    assert B not in t.s.actors
    assert t(ast.ActorRegistered(spec(B, name="c", get_if_exists=True))) == []
    assert t.s.registered_info(spec(B, name="c")).actor_id == A


def test_init_that_raised_kills_the_actor_with_its_error_and_frees_the_name() -> None:
    t = registered(name="c", max_restarts=5)
    t.lease(A, N1, b"w1")
    out = t(ast.CreationFinished(A, b"w1", False, b"err", None, 0))
    info = t.info()
    assert info.state == ast.DEAD and info.death_error == b"err" and "__init__ raised" in info.death_cause
    # (its worker's row: the user's code failed)
    assert of(out, ast.KillWorker) == [ast.KillWorker(N1, b"w1", "its actor ended", exit_type=USER_ERROR)]
    assert of(out, ast.DeleteCheckpoint) == [ast.DeleteCheckpoint(A)]
    assert t.s.named_info("", "c") is None
    # The name can be taken again by a new actor.
    assert of(t(ast.ActorRegistered(spec(B, name="c"))), ast.PlaceActor) == [ast.PlaceActor(B)]


def test_creation_reply_after_the_node_died_is_ignored_and_the_restart_goes_on() -> None:
    t = registered(max_restarts=1)
    t.lease(A, N1, b"w1")
    out = t(ast.NodeDied(N1, "no heartbeat"))
    assert t.info().state == ast.RESTARTING and t.info().num_restarts == 1
    assert of(out, ast.PlaceActor) == [ast.PlaceActor(A)]
    # The old worker's __init__ returns after its node was declared dead (issue 12): stale.
    assert t(ast.CreationFinished(A, b"w1", True, None, addr(b"w1"), 7)) == []
    assert t.info().state == ast.RESTARTING and t.info().address is None
    t.create(A, N2, b"w2")
    assert t.info().node_id == N2


def test_creation_on_a_node_that_died_without_restarts_left_kills_the_actor() -> None:
    t = registered()
    t.lease(A, N1, b"w1")
    t(ast.NodeDied(N1, "its raylet disconnected"))
    info = t.info()
    assert info.state == ast.DEAD and "max_restarts=0" in info.death_cause and N1.hex()[:8] in info.death_cause
    assert t(ast.CreationFinished(A, b"w1", True, None, addr(b"w1"), 7)) == []


def test_a_lease_from_a_node_declared_dead_meanwhile_is_returned_and_placement_goes_on() -> None:
    t = registered()
    t(ast.NodeDied(N1, "no heartbeat"))
    out = t.lease(A, N1, b"w1")
    assert of(out, ast.ReturnWorker) == [ast.ReturnWorker(N1, t.next_lease)] and not of(out, ast.PushCreationTask)
    assert t.s.wants_placement(A)
    t.create(A, N2, b"w2")


def test_a_lease_granted_after_the_actor_was_killed_is_returned() -> None:
    t = registered()
    t(ast.KillRequested(A, "killed by lumos.kill()", no_restart=True))
    assert not t.s.wants_placement(A)
    out = t.lease(A, N1, b"w1")
    assert out == [ast.ReturnWorker(N1, t.next_lease)]
    assert t.info().state == ast.DEAD


def test_restart_budget_is_spent_one_restart_per_failure_then_the_actor_dies() -> None:
    t = registered(max_restarts=2, name="c")
    t.create(A, N1, b"w1")
    for n, worker in enumerate([b"w2", b"w3"], start=1):
        out = t(ast.WorkerDied(t.s.actors[A].worker_id or b"", "SIGKILL"))
        assert t.info().state == ast.RESTARTING and t.info().num_restarts == n
        assert of(out, ast.PlaceActor) == [ast.PlaceActor(A)]
        (push,) = of(t.lease(A, N1, worker), ast.PushCreationTask)
        assert push.attempt == n  # the creation task's attempt counts restarts
        t(ast.CreationFinished(A, worker, True, None, addr(worker), 1))
    out = t(ast.WorkerDied(b"w3", "SIGKILL"))
    info = t.info()
    assert info.state == ast.DEAD and "restarted 2 times (max_restarts=2)" in info.death_cause
    assert not of(out, ast.PlaceActor) and not of(out, ast.KillWorker)  # the worker is gone already
    assert t.s.named_info("", "c") is None
    assert t(ast.WorkerDied(b"w3", "again")) == []


def test_unlimited_restarts_never_run_out() -> None:
    t = registered(max_restarts=-1)
    worker = b"w0"
    t.create(A, N1, worker)
    for i in range(1, 6):
        t(ast.WorkerDied(worker, "crash"))
        worker = b"w%d" % i
        t.create(A, N1, worker)
    assert t.info().num_restarts == 5


def test_kill_with_restart_kills_the_worker_and_its_death_restarts_the_actor() -> None:
    t = registered(max_restarts=1)
    t.create(A, N1, b"w1")
    assert t(ast.KillRequested(A, "killed", no_restart=False)) == [
        ast.KillWorker(N1, b"w1", "killed", exit_type=INTENDED_USER_EXIT)]
    assert t.info().state == ast.ALIVE
    t(ast.WorkerDied(b"w1", "SIGKILL"))
    assert t.info().state == ast.RESTARTING
    with pytest.raises(ValueError, match="no actor"):
        t(ast.KillRequested(B, "killed", no_restart=True))


def test_an_actor_out_of_scope_ends_for_good_with_a_grace_for_its_clean_up() -> None:
    t = registered(max_restarts=3)
    t.create(A, N1, b"w1")
    out = t(ast.KillRequested(A, "every handle went out of scope", no_restart=True, graceful=True))
    assert t.info().state == ast.DEAD
    # (lumos's own stop: the default exit type)
    assert of(out, ast.KillWorker) == [ast.KillWorker(N1, b"w1", "its actor ended", ast.GRACEFUL_EXIT_S,
                                                      INTENDED_SYSTEM_EXIT)]


def test_kill_without_restart_and_exit_actor_end_it_for_good() -> None:
    t = registered(max_restarts=3)
    t.create(A, N1, b"w1")
    out = t(ast.KillRequested(A, "bye", no_restart=True))
    assert t.info().state == ast.DEAD and t.info().death_cause == "bye"
    assert of(out, ast.KillWorker) == [ast.KillWorker(N1, b"w1", "its actor ended", exit_type=INTENDED_USER_EXIT)]
    assert of(out, ast.ReturnWorker) == [ast.ReturnWorker(N1, t.next_lease)]
    assert t(ast.KillRequested(A, "again", no_restart=True)) == []

    t2 = registered(max_restarts=3)
    t2.create(A, N1, b"w1")
    out = t2(ast.ActorExited(A, "exit_actor() was called"))
    assert t2.info().state == ast.DEAD and not of(out, ast.KillWorker)
    # (the raylet stops the worker the lease comes back with: the user ended it)
    assert of(out, ast.ReturnWorker) == [ast.ReturnWorker(N1, t2.next_lease, INTENDED_USER_EXIT)]
    assert t2(ast.WorkerDied(b"w1", "exited")) == []  # no restart after an exit


def test_detached_actor_outlives_its_owner_and_job_and_still_restarts() -> None:
    t = Actors()
    owner = b"o" * 20
    t(ast.ActorRegistered(spec(A, owner=owner, max_restarts=1)))
    t(ast.ActorRegistered(spec(B, owner=owner, max_restarts=1, detached=True, name="svc")))
    t.create(A, N1, b"wa")
    t.create(B, N1, b"wb")
    out = t(ast.WorkerDied(owner, "the driver exited"))
    assert t.info(A).state == ast.DEAD and "its owner" in t.info(A).death_cause
    assert of(out, ast.KillWorker) == [ast.KillWorker(N1, b"wa", "its actor ended")]
    assert t.info(B).state == ast.ALIVE
    t(ast.JobFinished(JOB))
    assert t.info(B).state == ast.ALIVE
    t(ast.WorkerDied(b"wb", "SIGKILL"))
    assert t.info(B).state == ast.RESTARTING
    t.create(B, N2, b"wb2")
    assert t.s.named_info("", "svc") is t.info(B)


def test_job_finished_ends_its_actors_and_pending_creations() -> None:
    t = Actors()
    t(ast.ActorRegistered(spec(A, max_restarts=5)))
    t(ast.ActorRegistered(spec(B, job=JOB2)))
    t.lease(A, N1, b"wa")  # mid-creation
    out = t(ast.JobFinished(JOB))
    assert t.info(A).state == ast.DEAD and t.info(A).death_cause == "its job finished (the driver exited)"
    assert of(out, ast.ReturnWorker) == [ast.ReturnWorker(N1, t.next_lease)]
    assert t.info(B).state == ast.PENDING
    # The creation's late reply changes nothing.
    assert t(ast.CreationFinished(A, b"wa", True, None, addr(b"wa"), 1)) == []


def test_an_owner_that_died_with_its_node_stops_restarts_of_its_actors_elsewhere() -> None:
    t = Actors()
    owner = b"o" * 20
    t(ast.ActorRegistered(spec(A, owner=owner, max_restarts=3)))
    t.create(A, N2, b"wa")
    t(ast.NodeDied(N1, "no heartbeat", [owner, b"unrelated" * 2]))
    assert t.info().state == ast.ALIVE  # the owner's node died, not the actor's
    assert t.s.dead_owners == {owner}
    t(ast.WorkerDied(b"wa", "SIGKILL"))
    assert t.info().state == ast.DEAD and "its owner is gone" in t.info().death_cause


def _reload(t: Actors, finished_jobs: tuple[bytes, ...] = ()) -> tuple[Actors, list[ast.Action]]:
    """What a restarted GCS does: rows through the storage codec, oldest first, into a new state."""
    rows = [unpack_value(pack_value(t.s.row(a))) for a in t.s.actors]
    t2 = Actors()
    for job in finished_jobs:
        assert t2(ast.JobFinished(job, recovered=True)) == []
    out: list[ast.Action] = []
    for row in sorted(rows, key=lambda r: r[0].start_time):
        out += t2(ast.ActorRestored(*row))
    return t2, out


def test_gcs_restart_reloads_alive_pending_and_dead_actors() -> None:
    t = Actors()
    t(ast.ActorRegistered(spec(A, name="alive", max_restarts=1)))
    t(ast.ActorRegistered(spec(B, name="pending")))
    c = b"c" * 16
    t(ast.ActorRegistered(spec(c, name="dead")))
    t.create(A, N1, b"wa")
    t.lease(B, N2, b"wb")  # mid-creation when the GCS went down
    t(ast.KillRequested(c, "bye", no_restart=True))
    t2, out = _reload(t)
    assert out == [ast.PlaceActor(B)]  # an unfinished creation starts over
    assert t2.info(A).state == ast.ALIVE and t2.s.by_worker == {b"wa": A}
    assert t2.s.named_info("", "alive") is t2.info(A)
    assert t2.s.named_info("", "pending") is t2.info(B)
    assert t2.s.named_info("", "dead") is None and t2.info(c).state == ast.DEAD
    assert t2.s.wants_placement(B)
    # The alive actor's worker reports its death to the new GCS: it restarts as before.
    t2(ast.WorkerDied(b"wa", "SIGKILL"))
    assert t2.info(A).state == ast.RESTARTING and t2.info(A).num_restarts == 1
    # Versions keep increasing across the restart (subscribers drop older rows).
    assert t2.info(A).version > t.info(A).version


def test_gcs_restart_with_the_actors_node_dead_and_its_job_finished_does_not_restart_it() -> None:
    t = registered(max_restarts=2)
    t.create(A, N1, b"wa")
    t2, _ = _reload(t, finished_jobs=(JOB,))
    assert t2.info().state == ast.ALIVE  # finished jobs read back are recorded, nothing more
    t2(ast.NodeDied(N1, "it was dead when the GCS restarted"))
    assert t2.info().state == ast.DEAD and "its owner is gone" in t2.info().death_cause


def test_unschedulable_actor_dies_with_the_reason() -> None:
    t = registered(max_restarts=3)
    t(ast.ActorUnschedulable(A, "node 1234 named by NodeAffinitySchedulingStrategy(soft=False) is not alive"))
    assert t.info().state == ast.DEAD and t.info().death_cause.startswith("cannot be scheduled: node 1234")


def test_invariants_catch_drift() -> None:
    t = registered(name="c")
    t.create(A, N1, b"w1")
    t.s.by_worker[b"w9"] = A
    with pytest.raises(AssertionError, match="does not hold it"):
        t.s.check_invariants()
    del t.s.by_worker[b"w9"]
    t.s.named[("", "other")] = A
    with pytest.raises(AssertionError, match="name /other"):
        t.s.check_invariants()


def test_an_actor_row_written_before_placement_group_id_gets_it_from_its_spec() -> None:
    import dataclasses
    from lumos._private.protocol import codec
    group = b"g" * 18
    t = Actors()
    t(ast.ActorRegistered(dataclasses.replace(spec(A), strategy=["PG", group, -1, True])))
    t(ast.ActorRegistered(spec(B)))
    assert t.info(A).placement_group_id == group and t.info(B).placement_group_id is None
    # A stored row from before the field: its ActorInfo one field short.
    (info, row_spec, *rest) = t.s.row(A)
    old_fields = codec._ENCODERS[m.ActorInfo](info)[:-1]
    old = codec._DECODERS[m.ActorInfo._code](old_fields)
    assert old.placement_group_id is None
    t2 = Actors()
    t2(ast.ActorRestored(old, row_spec, *rest))
    assert t2.info(A).placement_group_id == group


def _aid(i: int) -> bytes:
    return i.to_bytes(4, "big") * 4


def test_a_dead_actor_keeps_no_constructor_arguments() -> None:
    t = Actors()
    t(ast.ActorRegistered(spec(A, args=b"x" * 50_000, max_restarts=1)))
    t.create(A, N1, b"wa")
    t(ast.WorkerDied(b"wa", "SIGKILL"))
    assert t.s.actors[A].spec.args == b"x" * 50_000  # a restart needs them
    t(ast.KillRequested(A, "bye", no_restart=True))
    assert t.info().state == ast.DEAD and t.s.actors[A].spec.args == b""
    assert t.s.actors[A].spec.function_name == "Counter.__init__"
    row = unpack_value(pack_value(t.s.row(A)))
    assert row[1].args == b"" and row[0].state == ast.DEAD


def test_only_the_most_recently_dead_actors_are_kept() -> None:
    t = Actors(dead_kept=3)
    ids = [_aid(i) for i in range(6)]
    for aid in ids:
        t(ast.ActorRegistered(spec(aid)))
        t.create(aid, N1, b"w" + aid)
    forgotten: list[bytes] = []
    for aid in ids[:5]:
        forgotten += [f.actor_id for f in of(t(ast.KillRequested(aid, "bye", no_restart=True)), ast.ForgetActor)]
    assert forgotten == ids[:2]  # the longest dead first, each once the table holds more than 3
    assert [a for a in ids if a in t.s.actors] == ids[2:]
    assert t.s.info_of(ids[0]) is None and t.info(ids[5]).state == ast.ALIVE


def test_actors_that_die_together_are_published_before_they_are_forgotten() -> None:
    """A job's end kills its actors in one event: each is published (its row written, its
    callers told) before it can be forgotten, at a later event."""
    t = Actors(dead_kept=2)
    ids = [_aid(i) for i in range(5)]
    for aid in ids:
        t(ast.ActorRegistered(spec(aid)))
    out = t(ast.JobFinished(JOB))
    assert of(out, ast.PublishActor) == [ast.PublishActor(a) for a in ids] and not of(out, ast.ForgetActor)
    out = t(ast.ActorRegistered(spec(A, job=JOB2)))
    assert of(out, ast.ForgetActor) == [ast.ForgetActor(a) for a in ids[:3]]
    assert [a for a in ids if a in t.s.actors] == ids[3:]


def test_a_restarted_gcs_keeps_the_most_recently_dead_of_the_rows_it_reads() -> None:
    t = Actors(dead_kept=10)
    ids = [_aid(i) for i in range(4)]
    for aid in ids:
        t(ast.ActorRegistered(spec(aid)))
    for aid in reversed(ids):  # die in the reverse order of their registration
        t(ast.KillRequested(aid, "bye", no_restart=True))
    rows = [unpack_value(pack_value(t.s.row(a))) for a in ids]
    t2 = Actors(dead_kept=2)
    for row in rows:
        assert not of(t2(ast.ActorRestored(*row)), ast.ForgetActor)  # (not while rows come in)
    out = t2(ast.ActorRegistered(spec(B)))
    assert of(out, ast.ForgetActor) == [ast.ForgetActor(ids[3]), ast.ForgetActor(ids[2])]
    assert set(t2.s.actors) == {ids[0], ids[1], B}


def test_dead_kept_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        ast.ActorManagerState(dead_kept=0)
