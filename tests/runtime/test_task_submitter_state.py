"""TaskSubmitterState (queues, leases, pipelining, retries) fed events without sockets.

Every step runs with ``validate=True``: the state checks its invariants after each pump.
"""

from __future__ import annotations

from typing import Any

from lumos import exceptions as exc
from lumos._private.core_worker import task_submitter as ts
from lumos._private.core_worker.tasks import DONE, PUSHED, QUEUED, LeasedWorker, PendingTask, TaskTemplate
from lumos._private.ids import new_task_id
from lumos._private.protocol import messages as m
from lumos._private.protocol.vocab import RetryPolicy, TaskKind
from lumos._private.raylet.memory_monitor import OOM_KILL_REASON

NODE = b"n" * 20
OWNER = m.Address(NODE, b"o" * 20, "", "127.0.0.1", 1)


class FakeConn:
    """Stands for a connection: the state only compares it and reads ``is_closed``."""

    def __init__(self) -> None:
        self.is_closed = False


def state(**kw: Any) -> ts.TaskSubmitterState:
    args = dict(max_tasks_in_flight_per_worker=4, pipeline_below_ms=2.0, max_pending_lease_requests=10,
                max_leases_per_scheduling_key=64, task_oom_retry_delay_base_ms=1000, validate=True)
    args.update(kw)
    s = ts.TaskSubmitterState(**args)  # type: ignore[arg-type]
    return s


def template(fn: bytes = b"f" * 16, max_retries: int = 3, cpus: float = 1.0) -> TaskTemplate:
    return TaskTemplate(fn, "f", "f", 1, {"CPU": cpus}, max_retries, RetryPolicy.NEVER, None, None)


def task(t: TaskTemplate) -> PendingTask:
    tid = new_task_id()
    spec = m.TaskSpec(tid, b"j" * 4, b"p" * 16, TaskKind.NORMAL_TASK, t.name, t.function_id, t.function_name, b"",
                      [], [], 1, t.resources, t.max_retries, RetryPolicy.NEVER, None, OWNER, 0, None)
    return PendingTask(spec, t, [], [], [], 0.0)


_lease_ids = iter(range(1, 1_000_000))


def grant(s: ts.TaskSubmitterState, q: Any) -> tuple[LeasedWorker, list[ts.Action]]:
    """A raylet grants a lease for ``q`` and its worker's connection opens."""
    lid = next(_lease_ids)
    wid = lid.to_bytes(20, "big")
    g = m.LeaseGrant(lid, wid, m.Address(NODE, wid, "", "127.0.0.1", 2), {}, NODE)
    lease = LeasedWorker(g, q, FakeConn())  # type: ignore[arg-type]
    s.lease_granted(q, lease)
    out = s.lease_connected(lease, FakeConn())
    s.validate()
    return lease, out


def of(actions: list[ts.Action], kind: type) -> list[Any]:
    return [a for a in actions if isinstance(a, kind)]


def reply(s: ts.TaskSubmitterState, t: PendingTask, took_s: float = 0.0001,
          exiting: str | None = None) -> list[ts.Action]:
    """The worker answers ``t`` and the owner settles it (records its values)."""
    lease = t.lease
    assert lease is not None
    s.reply_arrived(lease, t.spec.task_id, took_s, exiting)
    t.state = DONE
    out = s.after_reply(lease)
    s.validate()
    return out


def idle_worker(s: ts.TaskSubmitterState, fn: bytes = b"f" * 16) -> tuple[LeasedWorker, PendingTask]:
    """A worker leased for a task of ``fn``, which it ran: it idles now."""
    t = task(template(fn))
    s.enqueue(t)
    lease, _ = grant(s, t.queue)
    reply(s, t)
    assert lease in s.idle_leases
    return lease, t


def test_unknown_run_time_goes_one_per_worker_and_asks_a_lease_per_task() -> None:
    s = state()
    t = template()
    tasks = [task(t) for _ in range(3)]
    out: list[ts.Action] = []
    for x in tasks:
        out += s.enqueue(x)
    assert len(of(out, ts.RequestLease)) == 3
    q = tasks[0].queue
    assert q is not None and q.requesting == 3
    lease, out = grant(s, q)
    assert [a.task for a in of(out, ts.PushTask)] == [tasks[0]]  # depth 1 until the run time is known
    assert tasks[1].state == QUEUED


def test_short_tasks_are_pipelined_up_to_the_depth() -> None:
    s = state()
    t = template()
    first = task(t)
    s.enqueue(first)
    lease, _ = grant(s, first.queue)
    reply(s, first)  # now the queue's mean run time is short
    more = [task(t) for _ in range(6)]
    out: list[ts.Action] = []
    for x in more:
        out += s.enqueue(x)
    assert [a.task for a in of(out, ts.PushTask)] == more[:4]
    assert len(lease.tasks) == 4 and all(x.state == PUSHED for x in more[:4])
    assert lease not in s.idle_leases


def test_a_pipelined_worker_is_topped_up_in_halves_after_replies() -> None:
    """After a reply, a worker gets more only once half its depth came back, then to the
    full depth in one go (one write for several pushes, not one per reply)."""
    s = state(max_tasks_in_flight_per_worker=8)
    t = template()
    first = task(t)
    s.enqueue(first)
    lease, _ = grant(s, first.queue)
    reply(s, first)
    more = [task(t) for _ in range(20)]
    for x in more:
        s.enqueue(x)
    assert list(lease.tasks.values()) == more[:8]  # new work fills the depth at once
    for x in more[:3]:
        assert of(reply(s, x), ts.PushTask) == []  # 7, 6, 5 in flight: nothing yet
    pushed = of(reply(s, more[3]), ts.PushTask)  # 4 in flight: back to 8
    assert [p.task for p in pushed] == more[8:12] and len(lease.tasks) == 8
    s.validate()


def test_a_burst_over_two_workers_runs_every_task_once_and_both_idle_after() -> None:
    """Replies above the refill mark skip the pump: neither worker is starved, every task
    is pushed once, both end idle (``validate`` runs after each event)."""
    s = state(max_tasks_in_flight_per_worker=8)
    t = template()
    a, b = task(t), task(t)
    s.enqueue(a)
    s.enqueue(b)
    q = a.queue
    l1, _ = grant(s, q)
    l2, _ = grant(s, q)
    reply(s, a)
    reply(s, b)  # the run time is known and short: pipelined from now on
    burst = [task(t) for _ in range(100)]
    for x in burst:
        s.enqueue(x)
    assert len(l1.tasks) == 8 and len(l2.tasks) == 8
    done: list[PendingTask] = []
    while l1.tasks or l2.tasks:
        for lease in (l1, l2):
            if lease.tasks:
                x = next(iter(lease.tasks.values()))
                reply(s, x)
                done.append(x)
    assert sorted(map(id, done)) == sorted(map(id, burst)) and not q.tasks
    assert l1 in s.idle_leases and l2 in s.idle_leases


def test_lease_lost_mid_pipeline_retries_every_in_flight_task() -> None:
    s = state()
    t = template(max_retries=1)
    first = task(t)
    s.enqueue(first)
    lease, _ = grant(s, first.queue)
    reply(s, first)
    batch = [task(t) for _ in range(3)]
    for x in batch:
        s.enqueue(x)
    assert len(lease.tasks) == 3
    out = s.worker_failed(lease)
    s.validate()
    assert of(out, ts.ReturnLease) == [ts.ReturnLease(lease, True)]
    (death,) = of(out, ts.AwaitWorkerExit)
    assert death.tasks == batch and not lease.tasks and lease.dead
    out = s.worker_died(lease, death.tasks, "exit code 1")
    assert [(a.task, a.delay_s) for a in of(out, ts.RetryTask)] == [(x, 0.0) for x in batch]
    assert all(x.retries_left == 0 for x in batch)
    # The retry runs and the new worker dies too: no retries left, the error says so.
    for x in batch:
        s.enqueue(x, front=True)
    lease2, _ = grant(s, batch[0].queue)
    pushed = list(lease2.tasks.values())
    out = s.worker_died(lease2, pushed, None)
    errors = [a.error for a in of(out, ts.FailTask)]
    assert len(errors) == len(pushed) and all(isinstance(e, exc.WorkerCrashedError) for e in errors)
    assert "max_retries=1" in str(errors[0]) and "cause unknown" in str(errors[0])


def _one_task_on_a_worker() -> tuple[ts.TaskSubmitterState, PendingTask, Any]:
    """A state with one task (default template) pushed to a granted lease."""
    s = state()
    x = task(template())
    s.enqueue(x)
    lease, _ = grant(s, x.queue)
    return s, x, lease


def test_retry_after_oom_kill_waits_and_is_dropped_when_cancelled_meanwhile() -> None:
    s, x, lease = _one_task_on_a_worker()
    (death,) = of(s.worker_failed(lease), ts.AwaitWorkerExit)
    (retry,) = s.worker_died(lease, death.tasks, f"killed: {OOM_KILL_REASON}")
    assert isinstance(retry, ts.RetryTask) and retry.delay_s == 1.0 and x.retries_left == 2
    x.cancelled = True  # lumos.cancel() while it waits
    (fail,) = s.retry_due(x, retry.why)
    assert isinstance(fail, ts.FailTask) and isinstance(fail.error, exc.TaskCancelledError)
    x.state = DONE
    assert s.retry_due(x, retry.why) == []


def test_worker_death_of_a_force_cancelled_task_fails_it_as_cancelled() -> None:
    s, x, lease = _one_task_on_a_worker()
    x.cancelled = x.force_cancelled = True
    (death,) = of(s.worker_failed(lease), ts.AwaitWorkerExit)
    (fail,) = s.worker_died(lease, death.tasks, "SIGKILL")
    assert isinstance(fail.error, exc.TaskCancelledError) and x.retries_left == 3


def test_worker_death_of_a_task_whose_placement_group_was_removed_fails_it_without_retry() -> None:
    from lumos._private.protocol.vocab import PG_REMOVED_STOP_REASON
    s, x, lease = _one_task_on_a_worker()
    (death,) = of(s.worker_failed(lease), ts.AwaitWorkerExit)
    (fail,) = s.worker_died(lease, death.tasks, f"signal SIGKILL ({PG_REMOVED_STOP_REASON})")
    assert isinstance(fail, ts.FailTask) and isinstance(fail.error, exc.TaskPlacementGroupRemoved)
    assert "placement group was removed" in str(fail.error) and x.retries_left == 3


def test_reply_after_owner_side_cancel_is_not_retried_and_the_worker_idles() -> None:
    s, x, lease = _one_task_on_a_worker()
    x.cancelled = True  # cancel() of a pushed task only asks the worker
    s.reply_arrived(lease, x.spec.task_id, 0.01, False)
    assert not s.use_retry(x) and x.retries_left == 3
    x.state = DONE
    out = s.after_reply(lease)
    assert of(out, ts.StartIdleTimer) == [ts.StartIdleTimer(lease)] and lease in s.idle_leases
    s.validate()
    # A second reply (late duplicate) for the same lease starts no second timer.
    lease.idle_timer = object()
    assert of(s.after_reply(lease), ts.StartIdleTimer) == []


def test_retryable_error_uses_a_retry_until_none_is_left() -> None:
    s = state()
    x = task(template(max_retries=2))
    assert s.use_retry(x) and s.use_retry(x) and not s.use_retry(x)
    y = task(template(max_retries=-1))
    assert all(s.use_retry(y) for _ in range(5)) and y.retries_left == -1


def two_pushed(s: ts.TaskSubmitterState, t: TaskTemplate) -> tuple[LeasedWorker, PendingTask, PendingTask,
                                                                   PendingTask]:
    """A worker leased for a first task of ``t``, which it ran, then given two more at
    once: ``(lease, first, a, b)``."""
    first = task(t)
    s.enqueue(first)
    lease, _ = grant(s, first.queue)
    reply(s, first)
    a, b = task(t), task(t)
    s.enqueue(a)
    s.enqueue(b)
    assert a.lease is lease and b.lease is lease  # both pushed to it
    return lease, first, a, b


def test_exiting_worker_gets_nothing_more_and_its_unrun_tasks_requeue_without_a_retry() -> None:
    s = state()
    t = template()
    lease, first, a, b = two_pushed(s, t)
    c = task(t)
    # max_calls reached: it exits after this reply
    out = reply(s, a, exiting=m.WorkerExitType.INTENDED_SYSTEM_EXIT)
    assert lease.exiting and of(out, ts.StartIdleTimer) == []
    out = s.enqueue(c)
    assert of(out, ts.PushTask) == [] and len(of(out, ts.RequestLease)) == 1
    out = s.worker_failed(lease)  # it closes with b unanswered
    s.validate()
    assert of(out, ts.AwaitWorkerExit) == []
    assert list(first.queue.tasks) == [b, c] and b.state == QUEUED and b.retries_left == 3


def test_an_exiting_workers_lease_goes_back_with_its_reply_or_its_last_handed_back_task() -> None:
    # It may outlive its last task while it drains what it owns: its resources must not.
    s = state()
    t = template()
    only = task(t)
    s.enqueue(only)
    lease, _ = grant(s, only.queue)
    out = reply(s, only, exiting=m.WorkerExitType.INTENDED_SYSTEM_EXIT)
    assert [(r.lease, r.disconnect) for r in of(out, ts.ReturnLease)] == [(lease, False)]

    s = state()
    lease, _, a, b = two_pushed(s, t)
    out = reply(s, a, exiting=m.WorkerExitType.INTENDED_SYSTEM_EXIT)
    assert of(out, ts.ReturnLease) == []  # b is still in flight there
    out = s.task_requeued(b)  # it hands b back unrun
    s.validate()
    assert [r.lease for r in of(out, ts.ReturnLease)] == [lease] and b.state == QUEUED
    assert len(of(out, ts.RequestLease)) == 1


def test_requeued_task_of_a_blocked_worker_runs_elsewhere() -> None:
    s = state()
    t = template()
    lease, first, a, b = two_pushed(s, t)
    out = s.task_requeued(b)  # a blocks in get() with b behind it
    assert lease.blocked and b.state == QUEUED and b.lease is None
    assert len(of(out, ts.RequestLease)) == 1
    other, out = grant(s, first.queue)
    assert [p.task for p in of(out, ts.PushTask)] == [b] and b.lease is other


def test_lease_granted_after_its_tasks_left_is_given_back() -> None:
    s = state()
    x = task(template())
    s.enqueue(x)
    s.enqueue(task(template()))
    q = x.queue
    lease, _ = grant(s, q)
    reply(s, x)
    y = q.leases[0].tasks
    for t2 in list(y.values()):
        reply(s, t2)
    late, out = grant(s, q)
    assert of(out, ts.ReturnLease) == [ts.ReturnLease(late, False)] and late not in q.leases


def test_idle_lease_of_another_shape_is_returned_when_a_new_key_needs_a_worker() -> None:
    s = state()
    lease_f, _ = idle_worker(s)
    out = s.enqueue(task(template(b"g" * 16, cpus=2.0)))
    assert of(out, ts.ReturnLease) == [ts.ReturnLease(lease_f, False)]
    assert len(of(out, ts.RequestLease)) == 1 and lease_f not in s.idle_leases
    assert s.return_lease(lease_f, disconnect=True) == []  # given back once only


def test_idle_lease_of_another_function_of_the_same_shape_runs_a_new_keys_task() -> None:
    # One shape (resources, strategy, retriable): the idle worker runs g's task as it is,
    # with no round trip to the raylet (calling several functions in turn asked and waited
    # for a worker at each switch).
    s = state()
    lease_f, f = idle_worker(s)
    g = task(template(b"g" * 16))
    out = s.enqueue(g)
    assert [p.task for p in of(out, ts.PushTask)] == [g] and g.lease is lease_f
    assert not of(out, ts.RequestLease) and not of(out, ts.ReturnLease)
    assert lease_f.queue is g.queue and lease_f not in f.queue.leases and lease_f not in s.idle_leases
    # Not retriable is another shape (the raylet's memory monitor is told which).
    reply(s, g)
    h = task(template(b"h" * 16, max_retries=0))
    out = s.enqueue(h)
    assert of(out, ts.ReturnLease) == [ts.ReturnLease(lease_f, False)] and len(of(out, ts.RequestLease)) == 1


def test_a_worker_that_goes_idle_moves_to_a_queue_of_its_shape_waiting_for_a_lease() -> None:
    # Many functions submitted at once: each asks the raylet for a worker, and the two
    # workers it has went idle in turn, waiting out the idle timeout (~100 ms a function).
    s = state()
    fs = [task(template(bytes([65 + i]) * 16)) for i in range(4)]
    for t in fs:
        s.enqueue(t)
    assert all(t.queue.requesting == 1 for t in fs)
    lease, out = grant(s, fs[0].queue)
    assert [p.task for p in of(out, ts.PushTask)] == [fs[0]]
    for i in range(1, 4):
        out = reply(s, fs[i - 1])
        assert [p.task for p in of(out, ts.PushTask)] == [fs[i]] and fs[i].lease is lease
        assert not of(out, ts.StartIdleTimer)
    out = reply(s, fs[3])
    assert of(out, ts.StartIdleTimer) == [ts.StartIdleTimer(lease)] and lease in s.idle_leases
    # The requests still in flight are granted later: those workers go straight back...
    late, out = grant(s, fs[1].queue)
    assert of(out, ts.ReturnLease) == [ts.ReturnLease(late, False)]
    # ...unless another function of the shape waits for one: it runs that one's task.
    busy = task(template(b"b" * 16))
    s.enqueue(busy)
    assert busy.lease is lease
    waiting = task(template(b"w" * 16))
    s.enqueue(waiting)
    assert waiting.queue.requesting == 1
    late, out = grant(s, fs[2].queue)
    assert [p.task for p in of(out, ts.PushTask)] == [waiting] and waiting.lease is late
    assert late.queue is waiting.queue and not of(out, ts.ReturnLease)


def test_a_user_thread_claims_an_idle_worker_of_another_function_of_its_shape() -> None:
    # Sync calls alternating between f and g: g's call is written straight to f's idle
    # worker by the user thread (it went through the io thread and a new lease).
    s = state()
    lease, f = idle_worker(s)
    g1 = task(template(b"g" * 16, cpus=2.0))
    s.enqueue(g1)  # (another shape: f's worker goes back, g's queue exists from now on)
    assert lease.dead
    f2 = task(template(b"f" * 16))
    s.enqueue(f2)
    lease2, _ = grant(s, f.queue)
    lease2.direct = True
    assert f2.lease is lease2
    reply(s, f2)
    h = task(template(b"h" * 16))
    s.enqueue(h)  # h's queue takes f's idle worker (``_adopt_idle``)
    assert h.lease is lease2
    reply(s, h)
    assert lease2 in s.idle_leases and lease2.queue is h.queue
    f3 = task(template(b"f" * 16))
    assert s.claim_idle(f.queue) is None  # (not told the task: only f's own workers)
    got = s.claim_idle(f.queue, f3)
    assert got is lease2 and got.claimed and got.queue is f.queue and lease2 in f.queue.leases
    out = s.direct_pushed(f3, got, True)
    assert of(out, ts.CancelIdleTimer) and f3.lease is lease2 and lease2 not in s.idle_leases
    s.validate()
    assert s.claim_idle(g1.queue, task(template(b"g" * 16, cpus=2.0))) is None  # (another shape)


def test_a_task_whose_argument_is_in_another_nodes_store_does_not_take_another_functions_worker() -> None:
    # Its lease request tells the raylet where the argument is (locality): an idle worker of
    # another function, elsewhere, would read 50 MB across the network.
    s = state()
    lease, _ = idle_worker(s)
    lease.direct = True
    # One whose argument is in the store of the idle worker's node takes it...
    near = task(template(b"h" * 16))
    near.spec.deps = [m.Dep(b"p" * 28, OWNER, None, NODE)]
    s.enqueue(near)
    assert near.lease is lease
    reply(s, near)
    # ... one whose argument is elsewhere does not.
    far = task(template(b"g" * 16))
    far.spec.deps = [m.Dep(b"o" * 28, OWNER, None, b"x" * 20)]
    assert s.claim_idle(ts.SchedulingQueue(far.template.key, far.template), far) is None
    out = s.enqueue(far)
    assert far.lease is None and len(of(out, ts.RequestLease)) == 1 and lease.queue is near.queue


def test_a_queue_whose_request_waits_at_the_raylet_takes_an_idle_worker_of_its_shape() -> None:
    # f's earlier request is still in flight (the raylet has no CPU free: this process
    # holds it idle for g); f's new task takes g's idle worker instead of waiting.
    s = state()
    f1 = task(template(b"f" * 16))
    s.enqueue(f1)
    g = task(template(b"g" * 16))
    s.enqueue(g)
    lease, _ = grant(s, g.queue)
    f_queue = f1.queue
    s.task_gone(f1)  # (f1 ended meanwhile: cancelled)
    reply(s, g)
    assert lease in s.idle_leases and f_queue.requesting == 1
    f2 = task(template(b"f" * 16))
    out = s.enqueue(f2)
    assert [p.task for p in of(out, ts.PushTask)] == [f2] and f2.lease is lease


def test_idle_timer_expiry_returns_the_lease_unless_work_came() -> None:
    s, x, lease = _one_task_on_a_worker()
    reply(s, x)
    y = task(template())
    y.cancelled = True  # cancelled in the queue: a pump drops it
    x.queue.tasks.append(y)
    y.state, y.queue = QUEUED, x.queue
    assert s.idle_expired(lease) == []
    x.queue.tasks.clear()
    assert s.idle_expired(lease) == [ts.ReturnLease(lease, False)]
    s.validate()


def test_failed_lease_request_fails_the_queue_or_asks_again_from_here() -> None:
    s = state()
    tasks = [task(template()) for _ in range(2)]
    for x in tasks:
        s.enqueue(x)
    q = tasks[0].queue
    out = s.lease_request_failed(q, OSError("gone"), elsewhere=True)
    assert out == [ts.PumpLater(q, 0.1)] and q.requesting == 1 and len(q.tasks) == 2
    out = s.lease_request_failed(q, OSError("raylet gone"), elsewhere=False)
    assert [a.task for a in of(out, ts.FailTask)] == tasks and not q.tasks and q.requesting == 0
    assert "could not lease a worker" in str(out[0].error)
    s.validate()


def test_unreachable_worker_is_given_back_and_another_is_asked_for() -> None:
    s = state()
    x = task(template())
    s.enqueue(x)
    q = x.queue
    g = m.LeaseGrant(99, b"w" * 20, m.Address(NODE, b"w" * 20, "", "127.0.0.1", 3), {}, NODE)
    lease = LeasedWorker(g, q, FakeConn())  # type: ignore[arg-type]
    s.lease_granted(q, lease)
    out = s.lease_unreachable(lease)
    assert of(out, ts.ReturnLease) == [ts.ReturnLease(lease, True)]
    assert len(of(out, ts.RequestLease)) == 1 and x.state == QUEUED


def test_task_gone_forgets_a_queued_or_pushed_task() -> None:
    s = state()
    a, b = task(template()), task(template())
    s.enqueue(a)
    s.enqueue(b)
    lease, _ = grant(s, a.queue)
    s.task_gone(a)
    s.task_gone(b)
    a.state = b.state = DONE
    assert not lease.tasks and not a.queue.tasks
    s.validate()


def test_validate_names_a_task_in_two_places() -> None:
    s, x, lease = _one_task_on_a_worker()
    x.queue.tasks.append(x)
    try:
        s.validate()
    except AssertionError as e:
        assert "queued in state" in str(e) or "two places" in str(e)
    else:
        raise AssertionError("validate() missed a task both queued and pushed")


def test_reply_done_settles_the_lease_then_tops_it_up_or_idles_it() -> None:
    s = state()
    t = template()
    xs = [task(t) for _ in range(3)]
    for x in xs:
        s.enqueue(x)
    lease, _ = grant(s, xs[0].queue)  # unknown run time: one task in flight per worker
    first = next(iter(lease.tasks.values()))
    out = s.reply_done(lease, first.spec.task_id, 0.5, False)  # slow: still one in flight
    first.state = DONE
    assert first.spec.task_id not in lease.tasks and [a.task for a in of(out, ts.PushTask)] == xs[1:2]
    s.validate()
    for x in xs[1:]:
        out = s.reply_done(lease, x.spec.task_id, 0.5, False)
        x.state = DONE
    assert of(out, ts.StartIdleTimer) == [ts.StartIdleTimer(lease)] and lease in s.idle_leases
    s.validate()


def test_a_claim_and_the_io_threads_events_never_interleave() -> None:
    """A user thread claims an idle lease (``push_direct``) while the io thread settles
    replies on it and expires its idle timer, both through ``Serialized``: a claimed lease is
    never returned, and a returned one is never claimed. The state lets the other thread run
    in the middle of returning a lease (and of a claim), where an unlocked proxy breaks."""
    import sys
    import threading
    import time

    class Yielding(ts.TaskSubmitterState):
        def return_lease(self, lease: LeasedWorker, disconnect: bool) -> list[ts.Action]:
            time.sleep(0)
            return super().return_lease(lease, disconnect)

    s = Yielding(max_tasks_in_flight_per_worker=4, pipeline_below_ms=2.0, max_pending_lease_requests=10,
                 max_leases_per_scheduling_key=64)
    x = task(template())
    s.enqueue(x)
    lease, _ = grant(s, x.queue)
    lease.direct = True
    q = lease.queue
    s.reply_done(lease, x.spec.task_id, 0.0001, False)
    x.state = DONE
    p = ts.Serialized(s, threading.Lock())
    broken: list[str] = []
    stop = time.monotonic() + 0.3
    claims = returns = 0

    def io_thread() -> None:
        nonlocal returns
        while time.monotonic() < stop and not broken:
            p.reply_done(lease, x.spec.task_id, 0.0001, False)
            if of(p.idle_expired(lease), ts.ReturnLease):
                returns += 1
                if lease.claimed:
                    broken.append("the io thread returned a lease a user thread had claimed")
                with p.lock:  # the raylet grants the same worker again
                    lease.dead = False
                    q.leases.append(lease)

    def user_thread() -> None:
        nonlocal claims
        while time.monotonic() < stop and not broken:
            got = p.claim_idle(q)
            if got is not None:
                claims += 1
                time.sleep(0)
                if got.dead:
                    broken.append("a user thread claimed a returned lease")
                with p.lock:  # the io thread books the task (``direct_pushed``), here unclaimed
                    got.claimed = False

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=io_thread), threading.Thread(target=user_thread)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=10)
    finally:
        sys.setswitchinterval(old)
    assert not any(th.is_alive() for th in threads)
    assert not broken, broken[0]
    assert claims and returns  # both sides ran, the race was exercised


def test_leases_whose_workers_wait_in_get_do_not_count_against_the_lease_cap() -> None:
    """Tasks that each wait in get() for one another (a barrier): with every lease's
    worker blocked, the queued ones still get leases past ``max_leases_per_scheduling_key``
    (counted, they waited for ever); a blocked lease takes no task meanwhile."""
    s = state(max_leases_per_scheduling_key=2)
    t = template()
    tasks = [task(t) for _ in range(4)]
    out: list[ts.Action] = []
    for x in tasks:
        out += s.enqueue(x)
    assert len(of(out, ts.RequestLease)) == 2  # the cap
    q = tasks[0].queue
    assert q is not None
    a, _ = grant(s, q)
    b, _ = grant(s, q)
    assert tasks[0].lease is a and tasks[1].lease is b and q.requesting == 0
    assert of(s.pump(q), ts.RequestLease) == []
    assert len(of(s.worker_blocked(a, True), ts.RequestLease)) == 1  # a's task waits in get()
    assert len(of(s.worker_blocked(b, True), ts.RequestLease)) == 1
    s.validate()
    assert q.requesting == 2
    c, out = grant(s, q)
    assert [p.task for p in of(out, ts.PushTask)] == [tasks[2]]  # not to a or b
    assert s.worker_blocked(b, True) == []  # no change
    # Unblocked, a lease counts again: with a and c counted, no more requests.
    out = s.worker_blocked(a, False)
    assert not a.blocked and of(out, ts.RequestLease) == []
    s.validate()


def test_a_recalled_lease_takes_nothing_more_and_goes_after_its_last_reply() -> None:
    s = state()
    t = template()
    first = task(t)
    s.enqueue(first)
    q = first.queue
    lease, _ = grant(s, q)
    reply(s, first)  # short tasks: pipelined from now on
    burst = [task(t) for _ in range(6)]
    for x in burst:
        s.enqueue(x)
    assert list(lease.tasks.values()) == burst[:4]
    assert s.recalled(FakeConn(), lease.lease_id) == []  # another raylet's lease of that id: not this one
    out = s.recalled(lease.raylet, lease.lease_id)
    s.validate()
    assert lease.recalled and not lease.dead and of(out, ts.PushTask) == []
    assert len(q.tasks) == 2 and q.requesting > 0  # the queued two wait for another worker
    for x in burst[:3]:
        assert of(reply(s, x), ts.PushTask) == [] and not lease.dead
    out = reply(s, burst[3])
    assert of(out, ts.ReturnLease) == [ts.ReturnLease(lease, False)] and lease.dead
    assert of(out, ts.PushTask) == []
    other, out = grant(s, q)
    assert [p.task for p in of(out, ts.PushTask)] == burst[4:]


def test_a_recall_read_before_its_grant_returns_the_lease_once_granted() -> None:
    # The raylet grants a lease and recalls it in the same turn (another job's request
    # waits); the owner reads the recall first (the grant's reply resumes the request's
    # coroutine a turn later). Ignored, the lease stayed with the owner for good.
    s = state()
    t = template()
    first = task(t)
    out = s.enqueue(first)
    q = first.queue
    raylet = FakeConn()
    g = m.LeaseGrant(7, b"w" * 20, m.Address(NODE, b"w" * 20, "", "127.0.0.1", 2), {}, NODE)
    assert s.recalled(raylet, 7) == []
    assert s.recalled(FakeConn(), 8) == []  # another raylet's, or one given back already
    lease = LeasedWorker(g, q, raylet)  # type: ignore[arg-type]
    s.lease_granted(q, lease)
    assert lease.recalled
    out = s.lease_connected(lease, FakeConn())
    s.validate()
    assert of(out, ts.ReturnLease) == [ts.ReturnLease(lease, False)] and of(out, ts.PushTask) == []
    assert list(q.tasks) == [first] and q.requesting == 1  # it asks again
    assert (raylet, 7) not in s.early_recalls
    # A later grant of another lease is not taken for it.
    other, out = grant(s, q)
    assert not other.recalled and [p.task for p in of(out, ts.PushTask)] == [first]
    for i in range(ts.EARLY_RECALLS + 10):  # bounded
        s.recalled(raylet, 1000 + i)
    assert len(s.early_recalls) == ts.EARLY_RECALLS


def test_a_lease_recalled_while_a_user_thread_claimed_it_goes_back_if_the_write_failed() -> None:
    s = state()
    lease, _ = idle_worker(s)
    lease.direct = True
    f = task(template())
    got = s.claim_idle(lease.queue, f)
    assert got is lease
    assert of(s.recalled(lease.raylet, lease.lease_id), ts.ReturnLease) == []  # claimed: kept for now
    out = s.direct_pushed(f, lease, False)  # the write could not go
    s.validate()
    assert of(out, ts.ReturnLease) == [ts.ReturnLease(lease, False)] and lease.dead
    assert of(out, ts.PushTask) == [] and list(f.queue.tasks) == [f] and f.queue.requesting == 1


def test_a_recalled_idle_lease_is_returned_at_once() -> None:
    s = state()
    lease, _ = idle_worker(s)
    out = s.recalled(lease.raylet, lease.lease_id)
    s.validate()
    assert out == [ts.ReturnLease(lease, False)] and lease not in s.idle_leases
    assert s.recalled(lease.raylet, lease.lease_id) == []  # once
