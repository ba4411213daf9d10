"""Several jobs on one long-lived cluster, as in Ray: a detached actor that several drivers
call runs as its creator's job (its job id, the tasks and actors it starts, their
environment and lifetime), whoever calls it and whenever that caller exits; the tasks a
driver leaves unfinished when it exits are shown FAILED, not RUNNING for ever."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Any

import pytest

import lumos
from lumos.testing import Cluster
from tests.conftest import TEST_CONFIG, check_no_leaks

_SVC = '''
import os, sys, time, lumos

@lumos.remote
def bg(seconds):
    time.sleep(seconds)
    return lumos.get_runtime_context().get_job_id(), os.environ.get("WHO")

@lumos.remote(num_cpus=0)
class Child:
    def job(self):
        return lumos.get_runtime_context().get_job_id()

@lumos.remote(num_cpus=0)
class Svc:
    def __init__(self):
        self.started = []

    def start(self):
        self.started.append((Child.remote(), bg.remote(3)))
        return lumos.get_runtime_context().get_job_id()

    def check(self):
        return lumos.get_runtime_context().get_job_id(), [
            (lumos.get(child.job.remote(), timeout=30), lumos.get(ref, timeout=60)) for child, ref in self.started]

lumos.init(address=sys.argv[1], _token=sys.argv[2], namespace="shared",
           runtime_env={"env_vars": {"WHO": sys.argv[3]}})
me = lumos.get_runtime_context().get_job_id()
if sys.argv[3] == "creator":
    svc = Svc.options(name="svc", lifetime="detached").remote()
else:
    svc = lumos.get_actor("svc")
print(me, lumos.get(svc.start.remote(), timeout=60), flush=True)
'''


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_detached_actor_runs_as_its_creators_job_for_every_caller(tmp_path: Any) -> None:
    script = tmp_path / "svc.py"
    script.write_text(textwrap.dedent(_SVC))
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "_system_config": dict(TEST_CONFIG)})
    try:
        def driver(who: str) -> list[str]:
            out = subprocess.run([sys.executable, str(script), cluster.address, cluster.token, who],
                                 capture_output=True, text=True, timeout=90)
            assert out.returncode == 0, out.stderr
            return out.stdout.split()

        creator_job, seen = driver("creator")
        assert seen == creator_job
        # Another job calls it and exits at once: what the actor started in that call is
        # its creator's job's (the caller's environment does not reach it), and lives on,
        # as what it started in its creator's call outlives its creator.
        other_job, seen = driver("other")
        assert other_job != creator_job and seen == creator_job
        cluster.connect(namespace="shared", runtime_env={"env_vars": {"WHO": "third"}})
        svc = lumos.get_actor("svc")
        started = (creator_job, (creator_job, "creator"))
        assert lumos.get(svc.check.remote(), timeout=90) == (creator_job, [started, started])
        lumos.kill(svc)
    finally:
        cluster.shutdown()
        check_no_leaks(cluster.session_dir)


_LEAVER = '''
import os, sys, time, lumos

@lumos.remote
def long_task():
    time.sleep(300)

@lumos.remote(num_cpus=0)
class Keeper:
    def start(self):
        self.ref = long_task.remote()  # the actor's, not the driver's: it lives on

lumos.init(address=sys.argv[1], _token=sys.argv[2], namespace="leave")
keeper = Keeper.options(name="keeper", lifetime="detached").remote()
lumos.get(keeper.start.remote(), timeout=60)
refs = [long_task.remote()]
task = refs[0].task_id().hex()
deadline = time.monotonic() + 60
while not [t for t in lumos.state.list_tasks() if t["task_id"] == task and t["state"] == "RUNNING"]:
    assert time.monotonic() < deadline, "the task did not start"
    time.sleep(0.05)
print(lumos.get_runtime_context().get_job_id(), task, flush=True)
os._exit(0) if sys.argv[3] == "exit" else time.sleep(300)
'''


@pytest.mark.slow
@pytest.mark.timeout(150)
@pytest.mark.parametrize("how", ["exit", "sigkill"])
def test_tasks_a_driver_left_unfinished_are_failed_when_its_job_ends(tmp_path: Any, how: str) -> None:
    import os
    import signal
    import time

    from tests.conftest import wait_for
    script = tmp_path / "leaver.py"
    script.write_text(textwrap.dedent(_LEAVER))
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "_system_config": dict(TEST_CONFIG)})
    try:
        proc = subprocess.Popen([sys.executable, str(script), cluster.address, cluster.token, how],
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        with proc, proc.stdout:
            line = proc.stdout.readline()  # (the driver's task runs)
            if how == "sigkill" or not line:
                os.kill(proc.pid, signal.SIGKILL)
            assert proc.wait(timeout=30) == (0 if how == "exit" else -signal.SIGKILL)
        job, task = line.split()
        cluster.connect(namespace="leave")

        def rows() -> dict[str, Any]:
            return {t["task_id"]: t for t in lumos.state.list_tasks(all_jobs=True) if t["job_id"] == job}

        wait_for(lambda: rows()[task]["state"] == "FAILED", 30, 0.1)
        row = rows()[task]
        assert row["error_type"] == "WORKER_DIED" and "its job finished" in row["error_message"], row
        # The detached actor's own task runs on: its owner lives.
        time.sleep(1)
        mine = [t for t in rows().values() if t["name"].endswith("long_task") and t["task_id"] != task]
        assert [t["state"] for t in mine] == ["RUNNING"], mine
        lumos.kill(lumos.get_actor("keeper"))
    finally:
        cluster.shutdown()
        check_no_leaks(cluster.session_dir)
