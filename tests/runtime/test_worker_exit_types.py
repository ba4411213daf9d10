"""A dead worker's row says why it ended (``exit_type``, as Ray's rows do), for each way a
worker or driver ends: the user's kill, ``exit_actor``, ``sys.exit()`` in a task and a
forced cancel; lumos's own stops (every handle gone, ``max_calls``, idle workers); an
actor whose ``__init__`` raised; a kill from outside; a driver that shut down and one
that was killed. Read through ``lumos.state`` and Ray's ``util.state``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from typing import Any

import pytest

import lumos
from lumos.util import state as ray_state
from tests.conftest import TEST_CONFIG, check_no_leaks, wait_for

pytestmark = pytest.mark.timeout(120)


@lumos.remote
class Plain:
    def pid(self) -> int:
        return os.getpid()

    def leave(self) -> None:
        lumos.actor.exit_actor()


@lumos.remote
class BrokenInit:
    def __init__(self) -> None:
        raise ValueError("no")

    def pid(self) -> int:
        return os.getpid()


@lumos.remote(max_retries=0)
def sleep_then_pid(s: float) -> int:
    time.sleep(s)
    return os.getpid()


@lumos.remote(max_retries=0)
def write_pid_and_sleep(path: str) -> None:
    with open(path, "w") as f:
        f.write(str(os.getpid()))
    time.sleep(100)


@lumos.remote(max_retries=0)
def write_pid_and_exit(path: str) -> None:
    with open(path, "w") as f:
        f.write(str(os.getpid()))
    sys.exit(0)


@lumos.remote(max_calls=1)
def once() -> int:
    return os.getpid()


def _dead_rows() -> dict[int, dict[str, Any]]:
    return {w["pid"]: w for w in lumos.state.list_workers(filters=[("state", "=", "DEAD")])}


def _exit_types(pids: dict[str, int]) -> dict[str, str | None]:
    rows = _dead_rows()
    return {what: rows[pid]["exit_type"] if pid in rows else None for what, pid in pids.items()}


def test_each_way_a_worker_ends_is_named_in_its_row(fresh_cluster: Any, tmp_path: Any) -> None:
    fresh_cluster(num_cpus=2)
    pids: dict[str, int] = {}
    killed = Plain.remote()
    pids["lumos.kill"] = lumos.get(killed.pid.remote(), timeout=60)
    lumos.kill(killed)
    dropped = Plain.remote()
    pids["out of scope"] = lumos.get(dropped.pid.remote(), timeout=60)
    del dropped
    shot = Plain.remote()
    pids["SIGKILL"] = lumos.get(shot.pid.remote(), timeout=60)
    os.kill(pids["SIGKILL"], signal.SIGKILL)
    leaving = Plain.remote()
    pids["exit_actor"] = lumos.get(leaving.pid.remote(), timeout=60)
    with pytest.raises(lumos.exceptions.ActorDiedError):
        lumos.get(leaving.leave.remote(), timeout=60)
    broken = BrokenInit.remote()
    with pytest.raises(lumos.exceptions.ActorDiedError):
        lumos.get(broken.pid.remote(), timeout=60)
    marker = tmp_path / "cancelled.pid"
    ref = write_pid_and_sleep.remote(str(marker))
    wait_for(lambda: marker.exists() and marker.read_text(), 30, 0.05)
    pids["cancel(force=True)"] = int(marker.read_text())
    lumos.cancel(ref, force=True)
    with pytest.raises(lumos.exceptions.TaskCancelledError):
        lumos.get(ref, timeout=60)
    marker = tmp_path / "exited.pid"
    with pytest.raises(lumos.exceptions.WorkerCrashedError, match="sys.exit"):
        lumos.get(write_pid_and_exit.remote(str(marker)), timeout=60)
    pids["sys.exit(0) in a task"] = int(marker.read_text())
    pids["max_calls"] = lumos.get(once.remote(), timeout=60)

    expected = {
        "lumos.kill": "INTENDED_USER_EXIT",
        "out of scope": "INTENDED_SYSTEM_EXIT",
        "SIGKILL": "SYSTEM_ERROR",
        "exit_actor": "INTENDED_USER_EXIT",
        "cancel(force=True)": "INTENDED_USER_EXIT",
        "sys.exit(0) in a task": "INTENDED_USER_EXIT",
        "max_calls": "INTENDED_SYSTEM_EXIT",
    }
    wait_for(lambda: _exit_types(pids) == expected, 30, 0.1)
    # The actor whose __init__ raised: its worker's pid never reached the caller.
    rows = _dead_rows()
    assert [w["exit_type"] for w in rows.values() if w["pid"] not in pids.values()] == ["USER_ERROR"], rows
    # Ray's rows say the same, and filter on it.
    user_exits = ray_state.list_workers(filters=[("exit_type", "=", "INTENDED_USER_EXIT")], limit=1000)
    assert {w.pid for w in user_exits} == {pid for what, pid in pids.items()
                                           if expected[what] == "INTENDED_USER_EXIT"}
    # A live worker's row has none.
    assert {w["exit_type"] for w in lumos.state.list_workers(filters=[("state", "=", "ALIVE")])} == {None}


def test_idle_workers_stopped_by_lumos_keep_their_start_time(fresh_cluster: Any) -> None:
    fresh_cluster(num_cpus=2, _system_config={"num_prestart_workers": 0, "worker_idle_timeout_s": 0.5})
    pids = set(lumos.get([sleep_then_pid.remote(1.0) for _ in range(2)], timeout=60))
    assert len(pids) == 2

    def both_dead() -> list[dict[str, Any]]:
        rows = [w for w in lumos.state.list_workers(filters=[("state", "=", "DEAD")]) if w["pid"] in pids]
        return rows if len(rows) == 2 else []
    for row in wait_for(both_dead, 30, 0.1):
        assert row["exit_type"] == "INTENDED_SYSTEM_EXIT" and "idle" in row["exit_detail"], row
        # The row of a dead worker kept when it started (each report is stamped anew).
        assert row["end_time"] - row["start_time"] >= 1.0, row


def test_a_driver_that_shut_down_and_one_that_was_killed() -> None:
    from lumos.testing import Cluster
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "_system_config": dict(TEST_CONFIG)})
    try:
        connect = f"import os, sys, lumos\nlumos.init(address={cluster.address!r}, _token={cluster.token!r})\n"
        clean = subprocess.run([sys.executable, "-c", connect + "print(os.getpid())\nlumos.shutdown()\n"],
                               capture_output=True, text=True, timeout=60)
        assert clean.returncode == 0, clean.stderr
        clean_pid = int(clean.stdout.split()[-1])
        with subprocess.Popen([sys.executable, "-c", connect + textwrap.dedent("""
                print(os.getpid(), flush=True)
                sys.stdin.read()
            """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as doomed:
            try:
                doomed_pid = int(doomed.stdout.readline())  # type: ignore[union-attr]
            finally:
                doomed.kill()  # (SIGKILL: no shutdown, no atexit)
                doomed.wait(30)
        cluster.connect()

        def drivers() -> dict[int, str | None]:
            rows = lumos.state.list_workers(filters=[("is_driver", "=", True), ("state", "=", "DEAD")])
            return {w["pid"]: w["exit_type"] for w in rows}
        wait_for(lambda: drivers() == {clean_pid: "INTENDED_USER_EXIT", doomed_pid: "SYSTEM_ERROR"}, 30, 0.1)
    finally:
        cluster.shutdown()
        check_no_leaks(cluster.session_dir)
