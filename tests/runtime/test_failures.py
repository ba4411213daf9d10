"""Errors and failures: user exceptions, worker crashes, retries, cancellation."""

from __future__ import annotations

import os
import sys
import time

import pytest

import lumos
from lumos.exceptions import TaskCancelledError, TaskError, WorkerCrashedError
from tests.conftest import wait_for


class MyError(Exception):
    pass


@lumos.remote
def raises(msg):
    raise MyError(msg)


def test_task_error_is_instance_of_user_class_with_remote_traceback(fresh_cluster):
    fresh_cluster()
    with pytest.raises(MyError) as info:
        lumos.get(raises.remote("boom"), timeout=30)
    err = info.value
    assert isinstance(err, TaskError)
    assert isinstance(err.cause, MyError)
    assert "boom" in str(err)
    assert "in raises" in err.traceback_str and "test_failures.py" in err.traceback_str
    assert "executor.py" not in err.traceback_str


def test_error_propagates_through_dependent_tasks(fresh_cluster):
    fresh_cluster()

    @lumos.remote
    def plus_one(x):
        return x + 1

    with pytest.raises(MyError):
        lumos.get(plus_one.remote(raises.remote("upstream")), timeout=30)

    @lumos.remote
    def reads_it():
        return lumos.get(raises.remote("below"))

    # Re-raised by a parent, the error's cause is still the user's exception, as in Ray
    # (it was the child's TaskError), and the text tells both tasks.
    with pytest.raises(MyError) as info:
        lumos.get(reads_it.remote(), timeout=30)
    assert type(info.value.cause) is MyError and str(info.value.cause) == "below"
    assert "reads_it" in str(info.value) and "in raises" in str(info.value)


def test_worker_death_is_retried_then_worker_crashed_error(fresh_cluster, tmp_path):
    fresh_cluster()
    counter = tmp_path / "attempts"

    @lumos.remote(max_retries=2)
    def die(path):
        with open(path, "a") as f:
            f.write("x")
        os._exit(1)

    with pytest.raises(WorkerCrashedError, match="max_retries=2") as info:
        lumos.get(die.remote(str(counter)), timeout=60)
    assert counter.read_text() == "xxx"
    assert "exit code 1" in str(info.value)
    # The cluster still works afterwards.
    with pytest.raises(MyError):
        lumos.get(raises.remote("still alive"), timeout=30)


def test_a_task_that_calls_sys_exit_fails_once_saying_so(fresh_cluster, tmp_path):
    # sys.exit() in a task ends its worker on purpose: the error says so (it read "died
    # (signal SIGKILL)", the raylet's kill after the worker's disconnect), the task is not
    # run again (each retry would end another worker), and what it printed is not lost.
    fresh_cluster()
    counter = tmp_path / "attempts"

    @lumos.remote(max_retries=3)
    def leave(path, code):
        with open(path, "a") as f:
            f.write("x")
        print("leaving now")
        sys.exit(code)

    @lumos.remote
    def short_task(i):
        return i

    for code in (2, 0):
        counter.unlink(missing_ok=True)
        with pytest.raises(WorkerCrashedError, match=rf"called sys.exit\({code}\)") as info:
            lumos.get(leave.remote(str(counter), code), timeout=60)
        assert "SIGKILL" not in str(info.value) and "leave()" in str(info.value)
        assert counter.read_text() == "x"
    # Tasks queued behind the exiting one run elsewhere.
    refs = [short_task.remote(i) for i in range(50)]
    exiting = leave.remote(str(counter), 3)
    refs += [short_task.remote(i) for i in range(50)]
    assert lumos.get(refs, timeout=60) == list(range(50)) * 2
    with pytest.raises(WorkerCrashedError, match=r"sys.exit\(3\)"):
        lumos.get(exiting, timeout=60)


def test_worker_death_then_success_on_retry(fresh_cluster, tmp_path):
    fresh_cluster()
    marker = tmp_path / "died-once"

    @lumos.remote(max_retries=1)
    def flaky(path):
        if not os.path.exists(path):
            open(path, "w").close()
            os._exit(1)
        return "ok"

    assert lumos.get(flaky.remote(str(marker)), timeout=60) == "ok"


def test_retry_exceptions(fresh_cluster, tmp_path):
    fresh_cluster()
    attempts = tmp_path / "n"

    @lumos.remote(max_retries=3, retry_exceptions=[MyError])
    def sometimes(path):
        with open(path, "a") as f:
            f.write("x")
        if len(open(path).read()) < 3:
            raise MyError("not yet")
        return "done"

    assert lumos.get(sometimes.remote(str(attempts)), timeout=60) == "done"
    assert attempts.read_text() == "xxx"

    @lumos.remote(max_retries=3, retry_exceptions=[KeyError])
    def wrong_kind():
        raise MyError("not retried")

    with pytest.raises(MyError):
        lumos.get(wrong_kind.remote(), timeout=30)


def test_retry_exceptions_of_a_class_defined_in_the_script_and_of_actor_methods(fresh_cluster, tmp_path):
    # A class the worker cannot import (one of the driver's script, here a local one) went
    # by name and the task was never retried; actor methods ignored retry_exceptions.
    fresh_cluster()
    attempts = tmp_path / "n"

    class ScriptError(Exception):
        pass

    @lumos.remote(max_retries=3, retry_exceptions=[ScriptError])
    def sometimes(path):
        with open(path, "a") as f:
            f.write("x")
        if len(open(path).read()) < 3:
            raise ScriptError("not yet")
        return "done"

    assert lumos.get(sometimes.remote(str(attempts)), timeout=60) == "done"
    assert attempts.read_text() == "xxx"

    @lumos.remote(max_task_retries=2)
    class Flaky:
        def __init__(self):
            self.n = 0

        @lumos.method(retry_exceptions=True)
        def any_error(self):
            self.n += 1
            if self.n < 3:
                raise ValueError(self.n)
            return self.n

        def listed(self):
            self.n += 1
            if self.n < 3:
                raise ScriptError(self.n)
            return self.n

    assert lumos.get(Flaky.remote().any_error.remote(), timeout=60) == 3
    assert lumos.get(Flaky.remote().listed.options(retry_exceptions=[ScriptError]).remote(), timeout=60) == 3
    with pytest.raises(ScriptError):
        lumos.get(Flaky.remote().listed.remote(), timeout=60)  # no retry_exceptions: not retried
    with pytest.raises(ScriptError):
        lumos.get(Flaky.remote().listed.options(retry_exceptions=[KeyError]).remote(), timeout=60)


class _UnprintableError(Exception):
    def __str__(self):
        raise RuntimeError("no text")


def test_an_exception_whose_str_raises_is_the_tasks_error(fresh_cluster):
    # Formatting it in TaskError raised; the worker answered with an error kind the owner
    # did not know, which dropped the connection and killed the worker: four workers and
    # WorkerCrashedError for one user exception (an actor's connection was lost).
    fresh_cluster()

    @lumos.remote
    def raises():
        raise _UnprintableError()

    @lumos.remote
    class Raises:
        def boom(self):
            raise _UnprintableError()

        def ping(self):
            return "pong"

    start = time.monotonic()
    with pytest.raises(_UnprintableError) as info:
        lumos.get(raises.remote(), timeout=60)
    assert "_UnprintableError: <exception str() failed>" in str(info.value)
    a = Raises.remote()
    with pytest.raises(_UnprintableError):
        lumos.get(a.boom.remote(), timeout=60)
    assert lumos.get(a.ping.remote(), timeout=60) == "pong"
    assert time.monotonic() - start < 8


def test_calls_after_a_dropped_connection_to_a_live_actor_reach_it(fresh_cluster):
    # The connection to an actor dropped (a reply over the frame limit, a network fault)
    # while the actor lived on: the call in flight failed after the verdict's grace, and
    # every later call waited for ever (nothing connected again).
    from lumos._private import worker_context

    fresh_cluster(_system_config={"node_death_timeout_ms": 1000})

    @lumos.remote
    class Slow:
        def slow(self):
            time.sleep(1)
            return 1

        def pid(self):
            return os.getpid()

    a = Slow.remote()
    pid = lumos.get(a.pid.remote(), timeout=30)
    cw = worker_context.require()
    q = cw.actor_submitter.actors[a._actor_id]
    in_flight = a.slow.remote()
    time.sleep(0.3)
    cw._post(q.conn.close)
    with pytest.raises(lumos.exceptions.ActorDiedError, match="the connection to the actor dropped"):
        lumos.get(in_flight, timeout=60)
    assert lumos.get(a.pid.remote(), timeout=30) == pid
    assert lumos.get([a.pid.remote() for _ in range(5)], timeout=30) == [pid] * 5


def test_an_oversized_exception_arrives_cut_with_its_class(fresh_cluster):
    # An error goes inline in the reply, once per return: one over the frame limit (256
    # MiB) dropped the connection and the worker was killed (WorkerCrashedError, retried).
    # Errors over MAX_ERROR_BYTES arrive cut, still of their class.
    from lumos._private.core_worker.executor import MAX_ERROR_BYTES

    fresh_cluster()

    @lumos.remote(num_returns=2)
    def raises(n):
        raise ValueError("x" * n)

    first, second = raises.remote(MAX_ERROR_BYTES + 1)
    for ref in (first, second):
        with pytest.raises(ValueError, match=r"MiB; cut to its first 65,536 characters") as info:
            lumos.get(ref, timeout=60)
        assert len(str(info.value)) < 200_000
    with pytest.raises(ValueError, match="x{1000}$"):  # (a smaller one stays whole)
        lumos.get(raises.remote(1000)[0], timeout=60)


def test_cancel_queued_task(fresh_cluster):
    fresh_cluster(num_cpus=1)

    @lumos.remote
    def block(t):
        time.sleep(t)
        return t

    first = block.remote(1.0)
    queued = block.remote(0)
    lumos.cancel(queued)
    with pytest.raises(TaskCancelledError):
        lumos.get(queued, timeout=30)
    assert lumos.get(first, timeout=30) == 1.0


def test_cancel_running_task_interrupts_it(fresh_cluster):
    fresh_cluster()

    @lumos.remote
    def spin():
        time.sleep(30)

    ref = spin.remote()
    time.sleep(0.5)
    t0 = time.monotonic()
    lumos.cancel(ref)
    with pytest.raises(TaskCancelledError) as info:
        lumos.get(ref, timeout=30)
    assert time.monotonic() - t0 < 5
    assert info.value.task_id == ref.task_id()  # (Ray's attribute)


def test_a_non_recursive_cancel_of_a_task_waiting_on_its_child_leaves_the_child_running(fresh_cluster,
                                                                                       tmp_path):
    fresh_cluster(num_cpus=2)

    @lumos.remote
    def child(marker):
        time.sleep(1.5)
        with open(marker, "w") as f:
            f.write("done")
        return 1

    @lumos.remote
    def parent(marker):
        pending = child.remote(marker)
        open(marker + ".parent", "w").close()
        return lumos.get(pending)

    for recursive, child_finishes in ((False, True), (True, False)):
        marker = tmp_path / f"recursive-{recursive}"
        ref = parent.remote(str(marker))
        wait_for(lambda: os.path.exists(f"{marker}.parent"), 30)
        time.sleep(0.3)  # the parent is blocked in get() of its child
        lumos.cancel(ref, recursive=recursive)
        with pytest.raises(TaskCancelledError):
            lumos.get(ref, timeout=30)
        time.sleep(2.5)
        assert marker.exists() == child_finishes, recursive


def test_force_cancel_kills_the_worker(fresh_cluster):
    fresh_cluster()

    @lumos.remote
    def stubborn():
        import signal
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        time.sleep(30)

    @lumos.remote
    def pid():
        return os.getpid()

    ref = stubborn.remote()
    time.sleep(0.5)
    lumos.cancel(ref, force=True)
    with pytest.raises(TaskCancelledError):
        lumos.get(ref, timeout=30)
    assert lumos.get(pid.remote(), timeout=30) > 0


def test_unpicklable_return_value_is_a_task_error(fresh_cluster):
    fresh_cluster()

    @lumos.remote
    def gives_lock():
        import threading
        return threading.Lock()

    with pytest.raises(TaskError, match="could not be serialized"):
        lumos.get(gives_lock.remote(), timeout=30)


def test_gcs_death_gives_clear_errors_and_leaves_no_process(fresh_cluster):
    # Without Redis storage the GCS's tables die with it: the node's raylet exits, and the
    # driver's next calls fail at once with a clear error instead of hanging.
    import signal

    from tests.conftest import lumos_children, process_gone, wait_for
    fresh_cluster(num_cpus=1, include_dashboard=False)

    @lumos.remote
    def inc(x):
        return x + 1

    assert lumos.get(inc.remote(1), timeout=30) == 2
    (gcs,) = [p for p in lumos_children() if "lumos._private.gcs.server" in " ".join(p.cmdline())]
    raylets = [p.pid for p in lumos_children() if "lumos._private.raylet.server" in " ".join(p.cmdline())]
    assert raylets
    os.kill(gcs.pid, signal.SIGKILL)
    wait_for(lambda: all(process_gone(pid) for pid in raylets), 20)
    start = time.monotonic()
    with pytest.raises(lumos.exceptions.LumosSystemError, match="closed|lost|shut down"):
        lumos.get(inc.remote(2), timeout=30)
    with pytest.raises(lumos.exceptions.LumosSystemError, match="closed|lost|shut down"):
        lumos.remote(type("A", (), {"ping": lambda self: 1})).remote()
    assert time.monotonic() - start < 10


def _sleep_and_note_pid(path: str) -> None:
    import os
    import time
    with open(path, "w") as f:
        f.write(str(os.getpid()))
    time.sleep(120)


def test_a_worker_that_dies_leaving_a_forked_child_fails_its_task_at_once(fresh_cluster, tmp_path):
    # The child holds a copy of the worker's connections, so the owner saw none close: the
    # task waited as long as the child lived. The raylet now tells the lease's owner.
    import multiprocessing
    import os
    import signal

    fresh_cluster(num_cpus=1, include_dashboard=False)
    pid_file = str(tmp_path / "child.pid")

    @lumos.remote(max_retries=0)
    def dies_leaving_a_child(path: str) -> None:
        multiprocessing.Process(target=_sleep_and_note_pid, args=(path,)).start()
        wait_for(lambda: os.path.exists(path), 20)
        os._exit(3)

    try:
        with pytest.raises(lumos.exceptions.WorkerCrashedError, match="exit code 3"):
            lumos.get(dies_leaving_a_child.remote(pid_file), timeout=30)

        @lumos.remote(max_retries=2)
        def dies_once(path: str) -> str:
            if not os.path.exists(path + ".2"):
                multiprocessing.Process(target=_sleep_and_note_pid, args=(path + ".2",)).start()
                wait_for(lambda: os.path.exists(path + ".2"), 20)
                os._exit(3)
            return "second try"

        assert lumos.get(dies_once.remote(pid_file), timeout=30) == "second try"
    finally:
        for path in (pid_file, pid_file + ".2"):
            if os.path.exists(path):
                try:
                    with open(path) as f:
                        os.kill(int(f.read()), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass


def test_an_actors_worker_death_keeps_the_gcs_connection_to_its_raylet(fresh_cluster):
    # The raylet tells a task's owner when its leased worker exits; an actor's lease is the
    # GCS's, which hears of it otherwise: told too, it dropped its connection to the
    # raylet ("unexpected message LeasedWorkerExited"), failing what was in flight on it.
    import glob

    ctx = fresh_cluster(num_cpus=1, include_dashboard=False)

    @lumos.remote
    class Fragile:
        def die(self):
            os._exit(1)

        def ping(self):
            return 1

    for _ in range(2):
        a = Fragile.remote()
        assert lumos.get(a.ping.remote(), timeout=60) == 1
        with pytest.raises(lumos.exceptions.ActorDiedError):
            lumos.get(a.die.remote(), timeout=60)
    time.sleep(0.5)
    logs = ""
    for path in glob.glob(os.path.join(ctx.address_info["session_dir"], "logs", "*.log")):
        with open(path, errors="replace") as f:
            logs += f.read()
    assert "unexpected message" not in logs, logs[-3000:]
