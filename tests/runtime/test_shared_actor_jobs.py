"""A detached actor that several drivers call runs as its creator's job, as in Ray: its
job id, the tasks and actors it starts (their environment and their lifetime) are its
creator's, whoever calls it and whenever that caller exits."""

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
