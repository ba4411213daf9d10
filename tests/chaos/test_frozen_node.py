"""Chaos: a node frozen mid-workload (SIGSTOP of its raylet and workers, later SIGCONT).

Every task and actor call must end with its own result; each attempt runs at most once
(the task-event log's attempt numbers bound the runs recorded by the functions
themselves); the actor's calls run in order on each copy; and after the node runs again
exactly one copy of the actor is alive: the frozen one is fenced and exits.
"""

from __future__ import annotations

import os
import time
from collections import Counter as Tally
from typing import Any

import psutil
import pytest

import lumos
from lumos.testing import Cluster
from lumos.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from tests.conftest import TEST_CONFIG, check_no_leaks, process_gone, wait_for
from tests.runtime.test_gray_failure import alive, freeze, node_processes, thaw

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

NUM_TASKS = 24
NUM_CALLS = 40


def _record(path: str, line: str) -> None:
    """Append one line in one write (O_APPEND: lines of concurrent runs never mix)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


@lumos.remote(resources={"w": 0.5}, max_retries=3)
def work(i: int, log_dir: str) -> tuple[int, int]:
    time.sleep(0.3)
    _record(os.path.join(log_dir, "tasks"), f"{i} {os.getpid()}")
    return i, os.getpid()


@lumos.remote(resources={"w": 0.5}, max_restarts=2, max_task_retries=-1)
class Ledger:
    def __init__(self, log_dir: str) -> None:
        self.path = os.path.join(log_dir, f"ledger-{os.getpid()}")
        self.seen: list[int] = []

    def record(self, k: int) -> tuple[int, int, int]:
        time.sleep(0.05)
        self.seen.append(k)
        _record(self.path, str(k))
        return k, os.getpid(), len(self.seen)

    def pid(self) -> int:
        return os.getpid()


def _lines(path: str) -> list[str]:
    try:
        with open(path) as f:
            return f.read().split()
    except FileNotFoundError:
        return []


def test_a_node_frozen_mid_workload_runs_each_attempt_once_and_keeps_one_actor(tmp_path: Any) -> None:
    log_dir = str(tmp_path)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "_system_config": dict(TEST_CONFIG)})
    procs: list[psutil.Process] = []
    try:
        frozen = cluster.add_node(num_cpus=2, resources={"w": 2})
        spare = cluster.add_node(num_cpus=2, resources={"w": 2})
        cluster.connect()
        ledger = Ledger.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
            frozen.node_id, soft=True)).remote(log_dir)
        first_pid = lumos.get(ledger.pid.remote(), timeout=60)
        tasks = [work.remote(i, log_dir) for i in range(NUM_TASKS)]
        calls = [ledger.record.remote(k) for k in range(NUM_CALLS)]
        # Mid-workload: some tasks and calls are done, most are not.
        wait_for(lambda: len(_lines(os.path.join(log_dir, "tasks"))) >= 3
                 and len(_lines(os.path.join(log_dir, f"ledger-{first_pid}"))) >= 5, 60, 0.01)
        procs = node_processes(frozen.raylet_pid)
        freeze(procs)
        wait_for(lambda: not alive(frozen.node_id), 30, 0.1)

        results = lumos.get(tasks, timeout=120)
        replies = lumos.get(calls, timeout=120)
        thaw(procs)
        wait_for(lambda: all(process_gone(p.pid) for p in procs), 30, 0.1)

        # Every task and call ends with its own result.
        assert [i for i, _pid in results] == list(range(NUM_TASKS))
        assert [k for k, _pid, _n in replies] == list(range(NUM_CALLS))

        # Each attempt ran at most once: the runs each function recorded never exceed the
        # attempts the task-event log counts, and the run that answered is among them.
        rows = {r["task_id"]: r for r in lumos.state.list_tasks(limit=100_000)}
        runs = Tally(int(line) for line in _lines(os.path.join(log_dir, "tasks"))[::2])
        for ref, (i, pid) in zip(tasks, results):
            row = rows[ref.task_id().hex()]
            assert row["state"] == "FINISHED"
            assert 1 <= runs[i] <= row["attempt_number"] + 1, (i, runs[i], row)
        ledger_files = [f for f in os.listdir(log_dir) if f.startswith("ledger-")]
        call_runs: Tally[int] = Tally()
        for name in ledger_files:
            ks = [int(k) for k in _lines(os.path.join(log_dir, name))]
            assert ks == sorted(ks), f"calls ran out of order on {name}: {ks}"
            assert len(ks) == len(set(ks)), f"a call ran twice on one copy ({name})"
            call_runs.update(ks)
        for ref, (k, pid, n) in zip(calls, replies):
            row = rows[ref.task_id().hex()]
            assert 1 <= call_runs[k] <= row["attempt_number"] + 1, (k, call_runs[k], row)
        # Each copy answered with consecutive counts: no call was answered twice by one copy.
        by_copy: dict[int, list[int]] = {}
        for _k, pid, n in replies:
            by_copy.setdefault(pid, []).append(n)
        for counts in by_copy.values():
            assert counts == sorted(counts) and len(counts) == len(set(counts))

        # One live copy of the actor: the restarted one; the frozen copy is gone.
        live = [a for a in lumos.state.list_actors() if a["class_name"] == "Ledger" and a["state"] == "ALIVE"]
        assert len(live) == 1 and live[0]["node_id"] == spare.node_id, live
        copies = [int(f.split("-")[1]) for f in ledger_files] + [first_pid]
        assert [pid for pid in set(copies) if not process_gone(pid)] == [live[0]["pid"]]
        assert lumos.get(ledger.record.remote(NUM_CALLS), timeout=30)[1] == live[0]["pid"]
    finally:
        thaw(procs)
        cluster.shutdown()
        check_no_leaks(cluster.session_dir)
