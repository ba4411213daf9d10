"""Worker output reaches the driver; task state changes reach the GCS task-event log;
``lumos.state`` lists tasks, objects, workers and nodes.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import numpy as np
import pytest

import lumos
from lumos._private import worker_context
from lumos._private.protocol import messages as m
from lumos.exceptions import TaskError

from ..conftest import TEST_CONFIG, wait_for

# --------------------------------------------------------------------------- output to the driver

_DRIVER = textwrap.dedent("""
    import json, os, sys
    import lumos

    lumos.init(num_cpus=2, object_store_memory=128 * 1024 * 1024, _system_config=json.loads(sys.argv[1]),
               log_to_driver=sys.argv[2] == "on")

    @lumos.remote
    def chatty(tag):
        print(f"out-{tag} line one")
        print(f"out-{tag} line two", flush=True)
        sys.stderr.write(f"err-{tag} problem\\n")
        return os.getpid()

    pids = {
        "plain": lumos.get(chatty.remote("plain"), timeout=60),
        "named": lumos.get(chatty.options(name="custom_name").remote("named"), timeout=60),
    }
    print("DRIVER " + json.dumps(pids), flush=True)
    sys.stdin.read()   # the test closes stdin once it has seen what it waits for
    lumos.shutdown()
""")


class _Driver:
    def __init__(self, log_to_driver: bool) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _DRIVER, json.dumps(TEST_CONFIG), "on" if log_to_driver else "off"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            cwd=os.path.dirname(os.path.abspath(__file__)))
        self.out = b""
        self.err = b""

    def read_until(self, predicate, timeout_s: float) -> None:
        """Collect stdout/stderr until ``predicate(out, err)`` holds or the deadline passes."""
        deadline = time.monotonic() + timeout_s
        streams = {self.proc.stdout.fileno(): "out", self.proc.stderr.fileno(): "err"}
        while not predicate(self.out.decode(), self.err.decode()) and time.monotonic() < deadline:
            ready, _, _ = select.select(list(streams), [], [], 0.1)
            for fd in ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    streams.pop(fd)
                elif streams[fd] == "out":
                    self.out += chunk
                else:
                    self.err += chunk
            if not streams:
                break

    def finish(self) -> None:
        try:
            self.proc.stdin.close()
        except BrokenPipeError:
            pass
        self.proc.stdin = None  # communicate() must not touch the closed pipe
        try:
            out, err = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate(timeout=10)
        self.out += out
        self.err += err


def _pids(out: str) -> dict[str, int]:
    for line in out.splitlines():
        if line.startswith("DRIVER "):
            # print() writes the text and the newline separately: a worker line printed by the
            # driver's io thread may land between them, on the same line.
            value, _ = json.JSONDecoder().raw_decode(line[len("DRIVER "):])
            return value  # type: ignore[no-any-return]
    return {}


@pytest.mark.timeout(90)
def test_worker_print_and_stderr_reach_the_driver_prefixed_with_task_and_pid():
    d = _Driver(log_to_driver=True)
    try:
        def done(out: str, err: str) -> bool:
            return bool(_pids(out)) and "out-named line two" in out and "err-named problem" in err \
                and "out-plain line two" in out and "err-plain problem" in err
        d.read_until(done, 60)
    finally:
        d.finish()
    out, err = d.out.decode(), d.err.decode()
    pids = _pids(out)
    assert pids, f"driver failed:\n{out}\n{err}"
    plain, named = pids["plain"], pids["named"]
    seen = f"driver stdout:\n{out}\ndriver stderr:\n{err}"
    assert f"(chatty pid={plain}) out-plain line one\n" in out, seen
    assert f"(chatty pid={plain}) out-plain line two\n" in out, seen
    assert f"(custom_name pid={named}) out-named line one\n" in out, seen
    # stderr goes to the driver's stderr, as in Ray, with the same prefix.
    assert f"(chatty pid={plain}) err-plain problem\n" in err, seen
    assert f"(custom_name pid={named}) err-named problem\n" in err, seen
    assert "err-plain" not in out and "out-plain" not in err, seen
    assert d.proc.returncode == 0, seen


@pytest.mark.timeout(90)
def test_log_to_driver_false_keeps_worker_output_out_of_the_driver():
    d = _Driver(log_to_driver=False)
    try:
        d.read_until(lambda out, err: bool(_pids(out)), 60)
        time.sleep(1.0)  # give output that should not come a chance to arrive
        d.read_until(lambda out, err: False, 0.5)
    finally:
        d.finish()
    out, err = d.out.decode(), d.err.decode()
    assert _pids(out), f"driver failed:\n{out}\n{err}"
    assert "out-plain" not in out and "err-plain" not in err


# --------------------------------------------------------------------------- task-event log


@lumos.remote
def add(x, y=0):
    return x + y


def _task(task_id: str) -> dict:
    rows = [t for t in lumos.state.list_tasks() if t["task_id"] == task_id]
    return rows[0] if rows else {}


def _task_of(ref: lumos.ObjectRef, state: str = "FINISHED") -> dict:
    def find():
        for t in lumos.state.list_tasks():
            # RUNNING comes in the worker's batch, which may arrive after the owner's.
            if ref.hex() in t["return_object_ids"] and t["state"] == state and (
                    t["start_time"] or state not in ("FINISHED", "FAILED")):
                return t
        return None
    return wait_for(find, 10)


def _states(row: dict) -> list[str]:
    return [s for s, _, _ in row["events"]]


def test_task_events_record_states_times_ids_node_and_worker(fresh_cluster):
    ctx = fresh_cluster()

    @lumos.remote
    def where(x):
        c = lumos.get_runtime_context()
        return c.get_task_id(), c.get_worker_id()

    arg = lumos.put(np.ones(200_000))  # by reference
    ref = where.options(name="where_task").remote(arg)
    task_id, worker_id = lumos.get(ref, timeout=30)
    # FINISHED comes from the owner, RUNNING from the worker: wait for both batches.
    row = wait_for(lambda: {"RUNNING", "FINISHED"} <= set(_states(_task(task_id) or {"events": []}))
                   and _task(task_id), 10)
    assert row["name"] == "where_task"
    assert row["func_or_class_name"].endswith("where")
    assert row["state"] == "FINISHED"
    assert row["type"] == "NORMAL_TASK"
    assert row["job_id"] == ctx.address_info["job_id"]
    states = _states(row)
    for s in ("SUBMITTED", "SCHEDULED", "RUNNING", "FINISHED"):
        assert s in states, states
    times = {s: t for s, t, _ in row["events"]}
    assert times["SUBMITTED"] <= times["SCHEDULED"] <= times["RUNNING"] <= times["FINISHED"]
    assert row["submitted_time"] <= row["start_time"] <= row["end_time"] <= time.time()
    assert row["return_object_ids"] == [ref.hex()]
    assert row["arg_object_ids"] == [arg.hex()]
    assert row["node_id"] == ctx.address_info["node_id"]
    assert row["worker_id"] == worker_id
    assert row["attempt_number"] == 0 and row["retries"] == 0
    assert row["error_message"] is None and row["error_type"] is None
    assert row["required_resources"] == {"CPU": 1}


def test_failed_task_event_carries_the_error(fresh_cluster):
    fresh_cluster()

    @lumos.remote
    def boom():
        raise KeyError("the-missing-key")

    ref = boom.remote()
    with pytest.raises(TaskError):
        lumos.get(ref, timeout=30)
    row = _task_of(ref, "FAILED")
    assert "FAILED" in _states(row)
    assert "the-missing-key" in (row["error_message"] or "")
    assert row["end_time"] >= row["start_time"]
    # Ray's error_type says why: the task's own exception, a dead worker, a cancel.
    assert row["error_type"] == "TASK_EXECUTION_EXCEPTION"

    @lumos.remote(max_retries=0)
    def die():
        os._exit(1)

    @lumos.remote
    def hang():
        time.sleep(60)

    died, hung = die.remote(), hang.remote()
    with pytest.raises(lumos.exceptions.WorkerCrashedError):
        lumos.get(died, timeout=30)
    lumos.cancel(hung, force=True)
    with pytest.raises(lumos.exceptions.TaskCancelledError):
        lumos.get(hung, timeout=30)
    def row_of(ref: lumos.ObjectRef, state: str) -> dict | None:
        return next((t for t in lumos.state.list_tasks()
                     if ref.hex() in t["return_object_ids"] and t["state"] == state), None)

    assert wait_for(lambda: row_of(died, "FAILED"), 10)["error_type"] == "WORKER_DIED"
    assert wait_for(lambda: row_of(hung, "CANCELLED"), 10)["error_type"] == "TASK_CANCELLED"
    assert lumos.state.list_tasks(filters=[("error_type", "=", "WORKER_DIED")])


def test_retried_task_events_show_each_attempt(fresh_cluster, tmp_path):
    fresh_cluster()
    marker = str(tmp_path / "died")

    @lumos.remote(max_retries=2)
    def flaky(path):
        if not os.path.exists(path):
            open(path, "w").close()
            os._exit(1)
        return "ok"

    ref = flaky.remote(marker)
    assert lumos.get(ref, timeout=60) == "ok"
    _task_of(ref)
    # The second attempt's RUNNING comes from its worker's next batch. (The first attempt's
    # RUNNING was buffered in the worker that died, and is lost with it, as in Ray.)
    row = wait_for(lambda: [t for t in lumos.state.list_tasks() if ref.hex() in t["return_object_ids"]
                            and [1, "RUNNING"] in [[a, s] for s, _, a in t["events"]]], 10)[0]
    assert row["retries"] == 1
    assert row["attempt_number"] == 1
    assert row["state"] == "FINISHED"
    states = _states(row)
    assert "RETRIED" in states and states.count("SCHEDULED") == 2
    retried = [e for e in row["events"] if e[0] == "RETRIED"][0]
    finished = [e for e in row["events"] if e[0] == "FINISHED"][0]
    assert finished[2] == 1 and retried[1] <= finished[1]


def test_cancelled_task_event(fresh_cluster):
    fresh_cluster(num_cpus=1)

    @lumos.remote
    def block(t):
        time.sleep(t)

    first = block.remote(1.0)
    queued = block.remote(0)
    lumos.cancel(queued)
    with pytest.raises(lumos.exceptions.TaskCancelledError):
        lumos.get(queued, timeout=30)
    _task_of(queued, "CANCELLED")
    lumos.get(first, timeout=30)


def test_nested_tasks_record_their_parent(fresh_cluster):
    fresh_cluster()

    @lumos.remote
    def child(i):
        return lumos.get_runtime_context().get_task_id()

    @lumos.remote
    def parent():
        own = lumos.get_runtime_context().get_task_id()
        return own, lumos.get([child.remote(i) for i in range(3)], timeout=30)

    parent_ref = parent.remote()
    parent_id, child_ids = lumos.get(parent_ref, timeout=60)
    other = add.remote(1)
    lumos.get(other, timeout=30)

    def rows():
        got = {t["task_id"]: t for t in lumos.state.list_tasks()}
        return got if all(c in got for c in child_ids) and parent_id in got else None
    got = wait_for(rows, 10)
    for c in child_ids:
        assert got[c]["parent_task_id"] == parent_id
    # Tasks the driver submits share the driver's own task id as parent.
    driver_parent = got[parent_id]["parent_task_id"]
    assert driver_parent and driver_parent not in got
    assert _task_of(other)["parent_task_id"] == driver_parent


def test_task_events_are_buffered_and_sent_in_batches(fresh_cluster):
    """Nothing is sent per state change: with a long flush interval the GCS has no record of
    finished tasks until the process flushes, and then one flush carries all of them."""
    fresh_cluster(_system_config={"task_event_flush_interval_ms": 60_000})
    cw = worker_context.require()
    refs = [add.remote(i) for i in range(30)]
    assert lumos.get(refs, timeout=30) == list(range(30))
    raw = cw.call_gcs(m.GetTasks(cw.job_id, 1000))
    assert raw == [], "task events reached the GCS before a flush"
    rows = lumos.state.list_tasks()  # flushes this process's buffer first
    mine = {r for ref in refs for r in [ref.hex()]}
    finished = [t for t in rows if set(t["return_object_ids"]) & mine and t["state"] == "FINISHED"]
    assert len(finished) == 30


def test_a_task_that_ends_before_the_flush_leaves_one_packed_row_and_no_events(fresh_cluster, tmp_path):
    """A task's events ride on the task until it ends, and its end packs its whole attempt
    into one row: a finished burst leaves no buffered event of its tasks, one packed row
    each (a burst used to keep three event tuples and a dict per task until the flush). The
    GCS reads every row whole: each state with its time, the node, the worker, the actor
    calls' chain, a failure's type, and a retried task's two attempts."""
    fresh_cluster(_system_config={"task_event_flush_interval_ms": 60_000})
    cw = worker_context.require()
    flag = str(tmp_path / "ran-once")

    @lumos.remote
    def bad():
        raise ValueError("no")

    @lumos.remote(max_retries=1, retry_exceptions=True)
    def flaky(path):
        if not os.path.exists(path):
            open(path, "w").close()
            raise RuntimeError("first attempt")
        return "second"

    @lumos.remote
    class Counter:
        def __init__(self):
            self.n = 0

        def incr(self):
            self.n += 1
            return self.n

    counter = Counter.remote()
    adds = [add.remote(i) for i in range(20)]
    calls = [counter.incr.remote() for _ in range(10)]
    failing, retried = bad.remote(), flaky.remote(flag)
    assert lumos.get(adds + calls, timeout=30) == list(range(20)) + list(range(1, 11))
    assert lumos.get(retried, timeout=30) == "second"
    with pytest.raises(ValueError):
        lumos.get(failing, timeout=30)
    tids = {r._id[:16] for r in adds + calls + [failing]}
    wait_for(lambda: tids <= {p[0] for p in cw._packed_rows}, 10)
    assert len(cw._packed_rows) == len(tids)
    assert not tids & ({e[0] for e in cw._events} | set(cw._held_events) | set(cw._fresh))

    got = {t["task_id"]: t for t in lumos.state.list_tasks()}  # flushes this process's buffer first
    steps = [m.TaskState.SUBMITTED, m.TaskState.SCHEDULED, m.TaskState.RUNNING]
    for ref in adds + calls:
        row = got[ref.task_id().hex()]
        assert row["state"] == "FINISHED" and row["node_id"] and row["worker_id"]
        assert [e[0] for e in row["events"]] == [*steps, m.TaskState.FINISHED]
        assert row["submitted_time"] <= row["start_time"] <= row["end_time"]
    chain = [got[c.task_id().hex()] for c in calls]
    assert chain[0]["prev_call_task_id"] is None
    assert [c["prev_call_task_id"] for c in chain[1:]] == [c["task_id"] for c in chain[:-1]]
    assert {c["caller_id"] for c in chain} == {cw.worker_id.hex()}
    row = got[failing.task_id().hex()]
    assert (row["state"], row["error_type"]) == ("FAILED", "TASK_EXECUTION_EXCEPTION")
    assert "no" in row["error_message"] and [e[0] for e in row["events"]] == [*steps, m.TaskState.FAILED]
    row = got[retried.task_id().hex()]
    assert (row["state"], row["attempt_number"]) == ("FINISHED", 1)
    assert [(e[0], e[2]) for e in row["events"]] == [
        (m.TaskState.SUBMITTED, 0), (m.TaskState.SCHEDULED, 0), (m.TaskState.RETRIED, 0),
        (m.TaskState.SCHEDULED, 1), (m.TaskState.RUNNING, 1), (m.TaskState.FINISHED, 1)]


# --------------------------------------------------------------------------- lumos.state


def test_list_tasks_filters_and_limit(fresh_cluster):
    fresh_cluster()

    @lumos.remote
    def bad():
        raise ValueError("no")

    failing = bad.remote()
    with pytest.raises(ValueError):
        lumos.get(failing, timeout=30)
    lumos.get([add.remote(i) for i in range(20)], timeout=30)
    wait_for(lambda: len(lumos.state.list_tasks(filters=[("state", "=", "FINISHED")])) == 20, 10)
    failed = lumos.state.list_tasks(filters=[("state", "=", "FAILED")])
    assert [t["return_object_ids"] for t in failed] == [[failing.hex()]]
    # An older match is found even when many newer tasks exist and the limit is small.
    assert [t["state"] for t in lumos.state.list_tasks(filters=[("state", "=", "FAILED")], limit=1)] == ["FAILED"]
    assert len(lumos.state.list_tasks(filters=[("name", "=", "add")])) == 20
    assert len(lumos.state.list_tasks(filters=[("state", "!=", "FINISHED")])) == 1
    assert len(lumos.state.list_tasks(limit=5)) == 5
    assert lumos.state.summarize_tasks() == {"add": {"FINISHED": 20}, "bad": {"FAILED": 1}}
    colours = {(e["cat"], e["name"], e["cname"], e["args"]["state"]) for e in lumos.timeline()}  # Chrome trace events
    assert colours == {("task::add", "add", "generic_work", "FINISHED"), ("task::bad", "bad", "terrible", "FAILED")}
    row = lumos.state.list_tasks(limit=1)[0]
    assert lumos.state.get_task(row["task_id"])["task_id"] == row["task_id"]
    assert lumos.state.get_task("0" * 32) is None
    with pytest.raises(ValueError, match="operator"):
        lumos.state.list_tasks(filters=[("state", ">", "x")])
    with pytest.raises(TypeError, match="filter"):
        lumos.state.list_tasks(filters=["state=FAILED"])


def test_list_objects_shows_owned_objects(fresh_cluster):
    ctx = fresh_cluster()
    small = lumos.put("tiny")
    big = lumos.put(np.zeros(2_000_000))
    rows = {r["object_id"]: r for r in lumos.state.list_objects()}
    assert rows[small.hex()]["owned"] and not rows[small.hex()]["in_store"]
    assert rows[big.hex()]["owned"] and rows[big.hex()]["in_store"]
    assert rows[big.hex()]["size_bytes"] >= 16_000_000
    assert rows[big.hex()]["node_id"] == ctx.address_info["node_id"]
    assert rows[big.hex()]["state"] == "READY"
    assert rows[big.hex()]["local_refs"] >= 1
    me = lumos.get_runtime_context().get_worker_id()
    assert rows[big.hex()]["owner_worker_id"] == me
    only = lumos.state.list_objects(filters=[("object_id", "=", big.hex())])
    assert [r["object_id"] for r in only] == [big.hex()]
    # A value held by a running task's worker is reported by that worker too.
    assert len(lumos.state.list_objects(limit=1)) == 1



@lumos.remote
def _wait_for_file(path: str) -> str:
    while not os.path.exists(path):
        time.sleep(0.02)
    return "done"


@lumos.remote
def _after(value: str) -> str:
    return value


@lumos.remote(max_retries=2)
def _crash_once(path: str) -> Any:
    if not os.path.exists(path):
        with open(path, "w") as f:
            f.write("crashed")
        os._exit(1)
    return np.ones(300_000)  # (in the store: its owner keeps the task, as lineage)


@lumos.remote(max_retries=0)
def _raise() -> None:
    raise ValueError("failed on purpose")


def test_object_rows_say_where_the_task_that_creates_them_stands(fresh_cluster, tmp_path):
    """Ray's task_status and attempt_number of an object, as its owner sees the task."""
    fresh_cluster(num_cpus=1)
    retried = _crash_once.remote(str(tmp_path / "crashed"))
    assert lumos.get(retried, timeout=60).sum() == 300_000
    failed = _raise.remote()
    with pytest.raises(ValueError):
        lumos.get(failed, timeout=60)
    put = lumos.put(np.zeros(1000))
    release = tmp_path / "release"
    running = _wait_for_file.remote(str(release))
    waiting = _after.remote(running)
    unplaced = _after.options(resources={"nowhere": 1}).remote("x")
    try:
        wait_for(lambda: any(t["state"] == "RUNNING" for t in lumos.state.list_tasks()
                             if t["name"].endswith("_wait_for_file")), 30, 0.05)
        rows = {r["object_id"]: r for r in lumos.state.list_objects() if r["owned"]}
        seen = {name: (rows[ref.hex()]["task_status"], rows[ref.hex()]["attempt_number"])
                for name, ref in [("retried", retried), ("failed", failed), ("put", put), ("running", running),
                                  ("waiting", waiting), ("unplaced", unplaced)]}
        assert seen == {"retried": ("FINISHED", 1), "failed": ("FAILED", 0), "put": ("NIL", 0),
                        "running": ("SUBMITTED_TO_WORKER", 0), "waiting": ("PENDING_ARGS_AVAIL", 0),
                        "unplaced": ("PENDING_NODE_ASSIGNMENT", 0)}, seen
        from lumos.util import state as ray_state
        assert [o.object_id for o in ray_state.list_objects(filters=[("task_status", "=", "FAILED")])] \
            == [failed.hex()]
    finally:
        release.write_text("go")
        lumos.cancel(unplaced)
    assert lumos.get(waiting, timeout=60) == "done"

def test_list_workers_nodes_and_jobs(fresh_cluster):
    ctx = fresh_cluster(num_cpus=2)
    pids = set(lumos.get([_pid.remote() for _ in range(4)], timeout=30))
    workers = lumos.state.list_workers()
    drivers = lumos.state.list_workers(filters=[("is_driver", "=", True)])
    assert [d["pid"] for d in drivers] == [os.getpid()]
    alive = {w["pid"] for w in lumos.state.list_workers(filters=[("state", "=", "ALIVE")])
             if not w["is_driver"]}
    assert pids <= alive
    for w in workers:
        assert w["node_id"] == ctx.address_info["node_id"]
    (node,) = lumos.state.list_nodes()
    assert node["state"] == "ALIVE" and node["is_head_node"]
    assert node["node_id"] == ctx.address_info["node_id"]
    assert node["resources_total"]["CPU"] == 2
    assert node["object_store_capacity_bytes"] > 0
    assert lumos.state.list_nodes(filters=[("state", "=", "DEAD")]) == []
    jobs = {j["job_id"]: j for j in lumos.state.list_jobs()}
    assert jobs[ctx.address_info["job_id"]]["state"] == "RUNNING"
    assert jobs[ctx.address_info["job_id"]]["driver_pid"] == os.getpid()


def test_state_api_needs_init():
    assert not lumos.is_initialized()
    with pytest.raises(RuntimeError, match="init"):
        lumos.state.list_tasks()


@lumos.remote
def _pid():
    time.sleep(0.2)
    return os.getpid()


# --------------------------------------------------------------------------- idle workers


def test_an_idle_actor_runs_no_flushes_until_something_is_buffered(fresh_cluster):
    fresh_cluster()

    @lumos.remote
    class Idle:
        def wakeups(self):
            return worker_context.require().flush_wakeups

    a = Idle.remote()
    first = lumos.get(a.wakeups.remote(), timeout=30)
    time.sleep(1.0)  # idleness is what is measured: ten flushes at the 100 ms interval before
    second = lumos.get(a.wakeups.remote(), timeout=30)
    assert second - first <= 2  # the first call's own events (and its reply's dead refs)


def test_output_and_dead_refs_of_idle_actors_threads_still_reach_the_driver(fresh_cluster):
    fresh_cluster()
    lines: list[str] = []
    worker_context.require().log_handler = lambda batch: lines.extend(str(rec[5]) for rec in batch)

    @lumos.remote
    class Late:
        def print_later(self):
            threading.Timer(0.5, lambda: print("late-line", flush=True)).start()

        def drop_later(self, box):
            self.box = box  # a borrowed ref, dropped by a thread once this actor is idle

            def drop() -> None:
                self.box = None

            threading.Timer(0.5, drop).start()

    printer, dropper = Late.remote(), Late.remote()  # each wake-up on its own
    ref = lumos.put(np.ones(1_000_000))
    oid = ref.hex()
    lumos.get([printer.print_later.remote(), dropper.drop_later.remote([ref])], timeout=30)
    del ref
    wait_for(lambda: any("late-line" in line for line in lines), 10)
    wait_for(lambda: oid not in {o["object_id"] for o in lumos.state.list_objects()}, 10)


def _child_prints(i: int) -> None:
    print(f"child-line {i}")
    print(f"child-err {i}", file=sys.stderr)
    print("x" + "é" * 2500)  # longer than a record (5,001 bytes): sent in pieces
    print(f"child-partial {i}", end="")  # flushed at the child's exit


def test_output_of_processes_a_task_forks_reaches_the_driver(fresh_cluster):
    # multiprocessing's default start method on Linux forks: the children inherited the
    # worker's capture without the io thread that sends it, and what they printed was lost.
    import multiprocessing

    fresh_cluster()
    records: list[list[Any]] = []
    worker_context.require().log_handler = records.extend

    @lumos.remote
    def forks() -> tuple[int, list[int]]:
        procs = [multiprocessing.Process(target=_child_prints, args=(i,)) for i in range(3)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        print("parent-line")
        return os.getpid(), [p.pid for p in procs]

    parent, children = lumos.get(forks.remote(), timeout=60)

    def seen(text: str) -> list[list[Any]]:
        return [rec for rec in records if rec[5] == text]

    wait_for(lambda: all(seen(f"child-partial {i}") for i in range(3)) and seen("parent-line"), 20)
    for i, pid in enumerate(children):
        (line,) = seen(f"child-line {i}")
        (err,) = seen(f"child-err {i}")
        assert line[3] == pid and err[3] == pid and not line[4] and err[4]  # the child's pid; stderr
        assert line[2] == "forks"  # the task that forked it
    assert seen("parent-line")[0][3] == parent
    # A line longer than a pipe record comes back whole.
    assert [rec[5] for rec in records if "x" in rec[5]] == ["x" + "é" * 2500] * 3


def _chatter(marker: str) -> None:
    os.setsid()  # (a daemon: what stays in its worker's process group ends with the worker)
    with open(marker + ".pid", "w") as f:
        f.write(str(os.getpid()))
    for _ in range(20_000):
        print("y" * 100)
    sys.stdout.flush()
    with open(marker, "w") as f:
        f.write("done")


def test_a_forked_child_outlives_its_worker_without_blocking_on_its_output(fresh_cluster, tmp_path):
    # The child held the output pipe's read end too, so when its worker died it got no
    # EPIPE: it blocked for ever once the pipe was full.
    import multiprocessing
    import signal

    fresh_cluster(num_cpus=1)
    marker = str(tmp_path / "chatter-done")

    @lumos.remote(max_retries=0)
    def dies_with_a_chatty_child(m: str) -> None:
        multiprocessing.Process(target=_chatter, args=(m,)).start()
        wait_for(lambda: os.path.exists(m + ".pid"), 20)
        os._exit(1)

    with pytest.raises(lumos.exceptions.WorkerCrashedError):
        lumos.get(dies_with_a_chatty_child.remote(marker), timeout=60)
    try:
        wait_for(lambda: os.path.exists(marker), 30)
    finally:
        if not os.path.exists(marker):
            with open(marker + ".pid") as f:
                os.kill(int(f.read()), signal.SIGKILL)


def test_a_direct_write_that_did_not_go_shows_one_scheduled(fresh_cluster, monkeypatch):
    """A call a user thread writes itself records SCHEDULED before its write; when the write
    does not go (the socket full, the connection closing), the io thread sends it the usual
    way, which records SCHEDULED again: one of them, not two, is the task's."""
    fresh_cluster(num_cpus=1)
    from lumos._private.transport.connection import Connection

    @lumos.remote
    class Echo:
        def ping(self, x):
            return x

    actor = Echo.remote()
    assert lumos.get(add.remote(1), timeout=30) == 1  # a lease held idle: the next is written directly
    assert lumos.get(actor.ping.remote(1), timeout=30) == 1
    cw = worker_context.require()
    sent_before = cw.direct_tasks, cw.actor_submitter.direct_sent
    write_now = Connection.write_now
    refused = []

    def refuse_pushes(self, body, went=None):
        if type(body) is m.PushTask:
            refused.append(body.spec.task_id)
            return False
        return write_now(self, body, went)

    monkeypatch.setattr(Connection, "write_now", refuse_pushes)
    task_ref = add.remote(2)
    assert lumos.get(task_ref, timeout=30) == 2
    call_ref = actor.ping.remote(3)
    assert lumos.get(call_ref, timeout=30) == 3
    monkeypatch.undo()
    assert len(refused) == 2 and (cw.direct_tasks, cw.actor_submitter.direct_sent) == sent_before
    for ref in (task_ref, call_ref):
        states = _states(_task_of(ref))
        assert states.count("SCHEDULED") == 1, states


def _driver_stderr(code: str, done: Any) -> str:
    """Run a driver script (``TEST_CONFIG`` as its argument) until ``done(out, err)``, then
    end it (closing its stdin); its whole stderr."""
    proc = subprocess.Popen([sys.executable, "-c", code, json.dumps(TEST_CONFIG)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    d = _Driver.__new__(_Driver)
    d.proc, d.out, d.err = proc, b"", b""
    try:
        d.read_until(done, 60)
    finally:
        d.finish()
    return d.err.decode()


_LOGGING_DRIVER = textwrap.dedent("""
    import json, logging, sys
    import lumos
    lumos.init(num_cpus=1, include_dashboard=False, _system_config=json.loads(sys.argv[1]))

    @lumos.remote
    def logs() -> None:
        logging.getLogger("mylib").warning("task-warning from a library logger")
        logging.getLogger("mylib").info("task-info not shown at Python's default level")

    @lumos.remote
    class Configured:
        def __init__(self) -> None:
            logging.basicConfig(level=logging.INFO, format="custom %(levelname)s %(name)s %(message)s")

        def talk(self) -> None:
            logging.getLogger("mine").info("actor-info after basicConfig")

    lumos.get(logs.remote(), timeout=60)
    a = Configured.remote()
    lumos.get(a.talk.remote(), timeout=60)
    print("DRIVER {}", flush=True)
    sys.stdin.read()
    lumos.shutdown()
""")


@pytest.mark.timeout(90)
def test_a_tasks_logging_reaches_the_driver_as_from_a_plain_process():
    # The worker's root logger wrote to its log file only (lumos's handler), and made a
    # task's own basicConfig a no-op: nothing of a task's logging reached the driver.
    err = _driver_stderr(_LOGGING_DRIVER, lambda out, err: "actor-info after basicConfig" in err and "DRIVER" in out)
    assert "task-warning from a library logger" in err, err
    assert "custom INFO mine actor-info after basicConfig" in err, err
    assert "task-info not shown" not in err, err
    assert "lumos._private" not in err, err  # lumos's own records stay in the worker's log file


_UNHANDLED_DRIVER = textwrap.dedent("""
    import json, sys, time
    import lumos
    lumos.init(num_cpus=1, include_dashboard=False, _system_config=json.loads(sys.argv[1]))

    @lumos.remote(max_retries=0)
    def boom(x):
        raise ValueError(f"boom-{x}")

    @lumos.remote
    def use(v):
        return v

    @lumos.remote
    def handle(refs):
        try:
            lumos.get(refs[0])
        except ValueError:
            return "handled"

    boom.remote("dropped-at-once")
    r = boom.remote("dropped-later")
    time.sleep(1.0)
    del r
    seen = boom.remote("got")
    try:
        lumos.get(seen, timeout=60)
    except ValueError:
        pass
    del seen
    dep = boom.remote("as-an-argument")
    out = use.remote(dep)
    del dep
    lumos.wait([out], timeout=60)
    del out
    lent = boom.remote("handled-by-a-borrower")
    assert lumos.get(handle.remote([lent]), timeout=60) == "handled"
    del lent
    slow = lumos.remote(lambda: time.sleep(30)).remote()
    time.sleep(0.5)
    lumos.cancel(slow)
    del slow
    time.sleep(1.0)
    print("DRIVER {}", flush=True)
    sys.stdin.read()
    lumos.shutdown()
""")


@pytest.mark.timeout(90)
def test_an_error_nobody_got_is_printed_once_when_its_refs_go():
    # A fire-and-forget call that failed was silent: Ray prints it as an unhandled error.
    err = _driver_stderr(_UNHANDLED_DRIVER, lambda out, err: "DRIVER" in out)
    assert err.count("Unhandled error (suppress with 'LUMOS_IGNORE_UNHANDLED_ERRORS=1')") == 3, err
    for what in ("dropped-at-once", "dropped-later", "as-an-argument"):
        assert err.count(f"ValueError: boom-{what}") == 1, err
    assert "boom-got" not in err and "Cancel" not in err, err
    assert "boom-handled-by-a-borrower" not in err, err  # the borrower that read it handled it


_LAST_WORDS_DRIVER = textwrap.dedent("""
    import json, os, signal, sys, threading
    import lumos
    from lumos._private import worker_context
    from lumos._private.protocol import messages as m
    lumos.init(num_cpus=2, include_dashboard=False, _system_config=json.loads(sys.argv[1]))

    @lumos.remote
    class Speaker:
        def __init__(self, i):
            self.i = i

        def __repr__(self):  # names the actor in its output's prefix, as in Ray
            return f"Speaker(#{self.i})"

        def last_words(self, i):
            print(f"last-words-of-actor-{i}", flush=True)

    @lumos.remote
    class AsyncSpeaker:
        async def say(self):
            print("said-by-an-async-actor", flush=True)

    lumos.get(AsyncSpeaker.options(num_cpus=0).remote().say.remote())
    speakers = [Speaker.options(num_cpus=0).remote(i) for i in range(2)]
    lumos.get([s.last_words.remote(-1) for s in speakers])
    # The raylet, which forwards the workers' output, is slow (frozen) while the actors
    # print their last lines and the driver leaves: it must wait for their forwarding.
    (raylet_pid,) = [n.pid for n in worker_context.core_worker.call_gcs(m.GetAllNodes())]
    os.kill(raylet_pid, signal.SIGSTOP)
    threading.Timer(0.5, os.kill, (raylet_pid, signal.SIGCONT)).start()
    lumos.get([s.last_words.remote(i) for i, s in enumerate(speakers)])
    lumos.shutdown()
""")


@pytest.mark.timeout(120)
def test_what_tasks_printed_before_their_replies_reaches_a_driver_that_shuts_down_at_once():
    # The output travels worker -> raylet -> GCS -> driver, the reply straight to the
    # driver: a script that shut down right after its last get lost the last lines when
    # the raylet had not forwarded them yet (one run in three here). The driver's
    # shutdown now waits for each raylet's forwarding (FlushLogs).
    out = subprocess.run([sys.executable, "-c", _LAST_WORDS_DRIVER, json.dumps(TEST_CONFIG)],
                         capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stderr
    text = out.stdout + out.stderr
    assert "last-words-of-actor-0" in text and "last-words-of-actor-1" in text, text
    assert "(Speaker(#0) pid=" in text and "(Speaker(#1) pid=" in text, text
    assert "(AsyncSpeaker.say pid=" in text, text  # (an async actor's call is named too: it was "(pid=N)")
    assert "declared dead" not in text and "ERROR" not in text, text  # (the raylets answer the GCS's ask)
