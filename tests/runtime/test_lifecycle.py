"""Cluster lifecycle: init, shutdown, exit and crash of the driver leave nothing behind.

A private cluster is the driver's: ``shutdown()``, a normal interpreter exit without
``shutdown()`` and even a SIGKILL of the driver must end every process it started and
remove its sockets and its ``/dev/shm`` store. ``init`` after ``shutdown`` starts a new
cluster; ``init`` twice is a clear error unless ``ignore_reinit_error``.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import numpy as np
import psutil
import pytest

import lumos

from ..conftest import TEST_CONFIG, check_no_leaks, lumos_children, process_gone, start, wait_for


@lumos.remote
def pid_and_big(n):
    return os.getpid(), np.ones(n, dtype=np.uint8)


@lumos.remote
class Echo:
    def echo(self, x):
        return x



def _leftovers(session: str, pids: list[int]) -> dict[str, Any]:
    base = os.path.basename(session)
    return {
        "processes": [p for p in pids if not process_gone(p)],
        "sockets": glob.glob(os.path.join(session, "sockets", "*")),
        "stores": glob.glob(f"/dev/shm/lumos-{base}-*"),
    }


def _nothing_left(session: str, pids: list[int]) -> bool:
    return not any(_leftovers(session, pids).values())


def _use_cluster() -> list[int]:
    """Run tasks that create store files; return the pids of every lumos process."""
    refs = [pid_and_big.remote(2_000_000) for _ in range(4)]
    big = lumos.put(np.zeros(3_000_000))
    out = lumos.get(refs, timeout=60)
    assert all(a.nbytes == 2_000_000 for _, a in out)
    assert lumos.get(big, timeout=30).nbytes == 24_000_000
    return sorted({p.pid for p in lumos_children()})


def test_shutdown_leaves_no_process_socket_or_shm_file(fresh_cluster):
    ctx = fresh_cluster()
    session = ctx.address_info["session_dir"]
    pids = _use_cluster()
    assert len(pids) >= 4  # gcs, raylet, two workers
    base = os.path.basename(session)
    (store,) = glob.glob(f"/dev/shm/lumos-{base}-*")
    assert os.listdir(store), "the test should have put files into the store"
    assert glob.glob(os.path.join(session, "sockets", "*.sock"))
    lumos.shutdown()
    assert not lumos.is_initialized()
    assert _nothing_left(session, pids), _leftovers(session, pids)
    assert not [t for t in threading.enumerate() if t.name == "lumos-io"]
    lumos.shutdown()  # a second call is harmless
    check_no_leaks(session)


def test_init_shutdown_init_again_in_one_process(fresh_cluster):
    # Ray's arguments lumos has no counterpart for are accepted at Ray's defaults.
    first = fresh_cluster(labels=None, proxy_server_url=None, enable_resource_isolation=False)
    s1 = first.address_info["session_dir"]
    pids1 = _use_cluster()
    job1 = lumos.get_runtime_context().get_job_id()
    lumos.shutdown(wait_for_processes=False)
    assert _nothing_left(s1, pids1), _leftovers(s1, pids1)
    second = fresh_cluster()
    s2 = second.address_info["session_dir"]
    assert s2 != s1
    pids2 = _use_cluster()
    assert not set(pids1) & set(pids2)
    assert lumos.get_runtime_context().get_job_id() != job1 or s2 != s1
    lumos.shutdown()
    assert _nothing_left(s2, pids2), _leftovers(s2, pids2)


@lumos.remote
def _node_labels():
    return lumos.get_runtime_context().get_node_labels()


def test_init_labels_describe_the_node_to_tasks_and_state(fresh_cluster):
    ctx = fresh_cluster(num_cpus=1, labels={"zone": "us-east-1a", "owner": "rl-team"})
    # (with Ray's default label of every node)
    labels = {"zone": "us-east-1a", "owner": "rl-team", "ray.io/node-id": ctx.address_info["node_id"]}
    assert lumos.get_runtime_context().get_node_labels() == labels
    assert lumos.get(_node_labels.remote(), timeout=30) == labels
    assert lumos.nodes()[0]["Labels"] == labels and lumos.state.list_nodes()[0]["labels"] == labels
    address = lumos.get_runtime_context().gcs_address
    lumos.shutdown()
    with pytest.raises(TypeError, match="str -> str"):
        lumos.init(num_cpus=1, labels={"zone": 1})
    with pytest.raises(ValueError, match="ray.io/"):
        lumos.init(num_cpus=1, labels={"ray.io/node-id": "mine"})
    with pytest.raises(ValueError, match="labels"):
        lumos.init(address=address, labels={"zone": "b"})
    assert not lumos.is_initialized()


def test_ref_from_a_previous_cluster_fails_clearly(fresh_cluster):
    fresh_cluster()
    ref = lumos.put(np.ones(1_000_000))
    small = lumos.put(1)
    handle = Echo.remote()
    lumos.get(handle.echo.remote(1), timeout=30)
    lumos.shutdown()
    fresh_cluster()
    # The errors say where the ref came from (they asked "was the ObjectRef created by hand?").
    for r in (ref, small):
        t0 = time.monotonic()
        with pytest.raises(lumos.exceptions.ObjectLostError, match="earlier lumos session"):
            lumos.get(r, timeout=10)
        assert time.monotonic() - t0 < 5, "must fail at once, not wait for the timeout"
        with pytest.raises(lumos.exceptions.ObjectLostError, match="argument was freed: .*earlier lumos session"):
            lumos.get(pid_and_big.remote(r), timeout=10)
    with pytest.raises(lumos.exceptions.ActorDiedError, match="earlier lumos session"):
        lumos.get(handle.echo.remote(2), timeout=10)
    assert lumos.get(lumos.put(2), timeout=30) == 2


def test_a_process_that_dies_starting_up_is_named_with_its_reason(tmp_path):
    # It said "see .../logs/raylet.log", a file that does not exist, and not why.
    spill = tmp_path / "not-a-dir"
    spill.write_text("a file where the spill directory would be")
    try:
        with pytest.raises(RuntimeError, match=r"raylet exited during start-up \(exit code 1\): raylet could not "
                                               r"start: .*not-a-dir.*; see .*/logs/raylet-\w+\.log") as info:
            lumos.init(num_cpus=1, _system_config={**TEST_CONFIG,
                                                    "object_spilling_directory": str(spill / "spill")})
        assert os.path.isfile(str(info.value).rsplit("see ", 1)[1])
    finally:
        lumos.shutdown()
    wait_for(lambda: not lumos_children(), 10)


def test_init_twice_raises_clearly(fresh_cluster):
    ctx = fresh_cluster()
    with pytest.raises(RuntimeError, match=r"already.*shutdown\(\).*ignore_reinit_error"):
        lumos.init(num_cpus=1)
    # The failed call left the running cluster alone.
    assert lumos.is_initialized()
    assert lumos.get(pid_and_big.remote(10), timeout=30)[1].nbytes == 10
    assert lumos.get_runtime_context().get_job_id() == ctx.address_info["job_id"]


def test_ignore_reinit_error_returns_the_running_cluster(fresh_cluster):
    ctx = fresh_cluster()
    again = lumos.init(ignore_reinit_error=True, num_cpus=7)
    assert again.address_info["session_dir"] == ctx.address_info["session_dir"]
    assert lumos.cluster_resources()["CPU"] == 2  # the new arguments are ignored, as in Ray
    assert lumos.get(pid_and_big.remote(10), timeout=30)[1].nbytes == 10


def test_context_manager_shuts_down():
    with start() as ctx:
        session = ctx.address_info["session_dir"]
        pids = _use_cluster()
    assert not lumos.is_initialized()
    assert _nothing_left(session, pids), _leftovers(session, pids)
    check_no_leaks(session)


def test_api_calls_after_shutdown_fail_clearly_or_start_a_new_cluster(fresh_cluster):
    fresh_cluster()
    lumos.shutdown()
    with pytest.raises(RuntimeError, match="not initialized"):
        lumos.cluster_resources()
    with pytest.raises(RuntimeError, match="not initialized"):
        lumos.get_runtime_context()


# --------------------------------------------------------------------------- driver subprocesses

_DRIVER = textwrap.dedent("""
    import json, os, sys, time
    import numpy as np
    import lumos

    config = json.loads(sys.argv[1])
    mode = sys.argv[2]
    ctx = lumos.init(num_cpus=2, object_store_memory=256 * 1024 * 1024, _system_config=config)

    @lumos.remote
    def make(n):
        return os.getpid(), np.ones(n, dtype=np.uint8)

    out = lumos.get([make.remote(2_000_000) for _ in range(4)], timeout=60)
    keep = lumos.put(np.zeros(3_000_000))
    import psutil
    pids = [p.pid for p in psutil.Process().children(recursive=True)]
    print(json.dumps({"session": ctx.address_info["session_dir"], "pids": pids}), flush=True)
    if mode == "exit":
        sys.exit(0)          # no shutdown(): the atexit hook must clean up
    if mode == "exception":
        raise SystemExit("driver failed")
    time.sleep(120)          # wait to be killed
""")


def _run_driver(mode: str) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    proc = subprocess.Popen([sys.executable, "-c", _DRIVER, json.dumps(TEST_CONFIG), mode],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=os.path.dirname(os.path.abspath(__file__)))
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            proc.wait(30)
            raise AssertionError(f"driver failed: {proc.stderr.read() if proc.stderr else ''}")
        info = json.loads(line)
    except BaseException:
        proc.kill()
        proc.wait(10)
        raise
    assert len(info["pids"]) >= 4, info
    return proc, info


def _reap(proc: subprocess.Popen[str], info: dict[str, Any]) -> None:
    """Last resort for a failed test: kill what the driver left running."""
    if proc.poll() is None:
        proc.kill()
    proc.communicate(timeout=30)
    for pid in info["pids"]:
        if not process_gone(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("mode", ["exit", "exception"])
def test_driver_exit_without_shutdown_leaves_nothing_behind(mode):
    proc, info = _run_driver(mode)
    try:
        assert proc.wait(30) == (0 if mode == "exit" else 1)
        wait_for(lambda: _nothing_left(info["session"], info["pids"]), 10)
    finally:
        _reap(proc, info)


@pytest.mark.timeout(90)
def test_sigkilled_driver_leaves_nothing_behind():
    proc, info = _run_driver("sleep")
    try:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        try:
            wait_for(lambda: _nothing_left(info["session"], info["pids"]), 15)
        except AssertionError:
            raise AssertionError(f"left behind: {_leftovers(info['session'], info['pids'])}") from None
    finally:
        _reap(proc, info)


def test_killed_worker_leaves_no_socket_file(fresh_cluster):
    ctx = fresh_cluster()
    sockets = os.path.join(ctx.address_info["session_dir"], "sockets")

    @lumos.remote
    def die():
        os._exit(1)

    with pytest.raises(lumos.exceptions.WorkerCrashedError):
        lumos.get(die.options(max_retries=0).remote(), timeout=30)
    # Let the pool refill, then compare the socket files with the live workers.
    def workers_match_sockets() -> bool:
        alive = {w["worker_id"][:12] for w in lumos.state.list_workers()
                 if w["state"] == "ALIVE" and not w["is_driver"]}
        files = {f[len("worker-"):-len(".sock")] for f in os.listdir(sockets) if f.startswith("worker-")}
        return bool(alive) and files == alive
    wait_for(workers_match_sockets, 30)



@pytest.mark.parametrize("worker_start", ["fork", "spawn"])
def test_a_tasks_subprocesses_end_with_the_cluster(fresh_cluster, worker_start):
    """A process a task started and left running (a direct child, and one a shell put in
    the background) ends at shutdown(); both outlived the cluster."""
    fresh_cluster(num_cpus=1, _system_config={"worker_start": worker_start})

    @lumos.remote
    def spawn():
        direct = subprocess.Popen(["sleep", "300"])
        shell = subprocess.Popen("sleep 300 >/dev/null 2>&1 & echo $!", shell=True, stdout=subprocess.PIPE, text=True)
        background = int(shell.communicate()[0])
        return direct.pid, background

    pids = lumos.get(spawn.remote(), timeout=30)
    assert all(psutil.pid_exists(p) for p in pids)
    lumos.shutdown()
    try:
        wait_for(lambda: all(process_gone(p) for p in pids), 10)
    finally:
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass

@lumos.remote
def _square(x: int) -> int:
    return x * x


def test_a_forked_child_gets_a_clear_error_and_the_parent_keeps_its_cluster(fresh_cluster):
    """``multiprocessing``'s default start method on Linux forks: the child inherits the
    driver's core worker without its io thread, and a call there waited for ever. Now it
    raises at once, the child's exit leaves the parent's cluster alone, and the parent
    goes on."""
    import multiprocessing

    fresh_cluster(num_cpus=1, include_dashboard=False)
    pending = _square.remote(3)
    ctx = multiprocessing.get_context("fork")
    answers = ctx.Queue()

    def child() -> None:
        for call in (lambda: lumos.get(_square.remote(2), timeout=10), lambda: lumos.put(1)):
            try:
                call()
                answers.put("no error")
            except RuntimeError as e:
                answers.put(str(e))
            except Exception as e:  # noqa: BLE001 (the test reports what it was)
                answers.put(f"{type(e).__name__}: {e}")
        assert not lumos.is_initialized()

    p = ctx.Process(target=child)
    p.start()
    got = [answers.get(timeout=30) for _ in range(2)]
    p.join(30)
    answers.close()
    answers.join_thread()
    for text in got:
        assert f"forked from process {os.getpid()}" in text, text
        assert "spawn" in text
    assert p.exitcode == 0
    assert lumos.get(pending, timeout=30) == 9
    assert lumos.get(_square.remote(4), timeout=30) == 16


@pytest.mark.timeout(90)
def test_placement_groups_and_timeline_start_a_cluster_as_put_does(fresh_cluster, tmp_path):
    """As in Ray: placement_group(), placement_group_table(), get_current_placement_group(),
    list_named_actors() and timeline() start a local cluster when none is connected (they
    raised 'not initialized'); timeline(filename) writes the file and returns None."""
    from lumos.util.placement_group import get_current_placement_group, placement_group, placement_group_table
    assert not lumos.is_initialized()
    pg = placement_group([{"CPU": 1}])
    assert lumos.is_initialized() and lumos.get(pg.ready(), timeout=30)
    lumos.shutdown()
    assert placement_group_table() == {} and get_current_placement_group() is None
    assert lumos.util.list_named_actors() == []
    lumos.shutdown()
    assert lumos.timeline(str(tmp_path / "trace.json")) is None
    assert json.loads((tmp_path / "trace.json").read_text()) == []
    lumos.shutdown()
