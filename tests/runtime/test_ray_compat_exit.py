"""A script's last submissions run and their output is printed before it exits (as in Ray).

Each test runs a real script in its own process, which starts (and at exit stops) its own
private cluster.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from tests.conftest import TEST_CONFIG

pytestmark = pytest.mark.slow

_PRELUDE = """
import json, sys, time
import lumos
config = json.loads(sys.argv[1])
lumos.init(num_cpus=2, object_store_memory=256 * 1024 * 1024, _system_config=config)
"""


def _run(tmp_path: Any, body: str, **config: Any) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "script.py"
    script.write_text(_PRELUDE + textwrap.dedent(body))
    cfg = dict(TEST_CONFIG, **config)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return subprocess.run([sys.executable, str(script), json.dumps(cfg), str(tmp_path)], capture_output=True,
                          text=True, timeout=90, cwd=root)


def test_task_submitted_as_the_scripts_last_line_runs_and_prints(tmp_path: Any) -> None:
    proc = _run(tmp_path, """
        @lumos.remote
        def leave_a_mark(path):
            time.sleep(0.5)  # still running when the script ends
            open(path, "w").write("ran")
            print("last task says hello")

        leave_a_mark.remote(sys.argv[2] + "/mark")
    """)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "mark").read_text() == "ran"
    assert "last task says hello" in proc.stdout


def test_actor_call_submitted_last_runs(tmp_path: Any) -> None:
    proc = _run(tmp_path, """
        @lumos.remote
        class Writer:
            def write(self, path):
                open(path, "w").write("actor ran")

        w = Writer.remote()
        w.write.remote(sys.argv[2] + "/mark")
    """)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "mark").read_text() == "actor ran"


def test_worker_output_printed_just_before_exit_is_not_lost(tmp_path: Any) -> None:
    proc = _run(tmp_path, """
        @lumos.remote
        def say(i):
            for j in range(500):
                print(f"task {i} line {j}")
            return i

        assert lumos.get([say.remote(i) for i in range(2)], timeout=60) == [0, 1]
        [say.remote(i) for i in range(2, 4)]  # not waited for: they print while the script exits
    """)
    assert proc.returncode == 0, proc.stderr
    printed = [line for line in proc.stdout.splitlines() if " line " in line]
    assert len(printed) == 4 * 500, f"{len(printed)} of {4 * 500} lines printed"



def test_what_an_actor_prints_as_it_ends_itself_is_not_lost(tmp_path: Any) -> None:
    """An actor that ends itself (``exit_actor()``, ``sys.exit()``, sync or async): its last
    lines, and those of its ``__del__``, reach the driver. They were lost: the GCS, told of
    the exit, gave the lease back, and the raylet killed the worker before they left."""
    proc = _run(tmp_path, """
        class Leaving:
            def __init__(self, name):
                self.name = name
            def __del__(self):
                print(f"{self.name}: __del__ ran")
            def leave(self):
                print(f"{self.name}: goodbye")
                lumos.actor.exit_actor()
            def quit(self):
                print(f"{self.name}: goodbye")
                sys.exit()

        Leaver = lumos.remote(Leaving)

        @lumos.remote
        class AsyncLeaver(Leaving):
            async def leave_async(self):
                print(f"{self.name}: goodbye")
                lumos.actor.exit_actor()

        calls = [Leaver.remote(f"plain{i}").leave.remote() for i in range(3)]
        calls += [Leaver.remote("quit").quit.remote(), AsyncLeaver.remote("async").leave_async.remote()]
        for call in calls:
            try:
                lumos.get(call, timeout=60)
            except lumos.exceptions.ActorDiedError:
                pass
        time.sleep(1.0)  # (the output is forwarded by the raylet as it comes)
    """)
    assert proc.returncode == 0, proc.stderr
    for name in ("plain0", "plain1", "plain2", "quit", "async"):
        for line in (f"{name}: goodbye", f"{name}: __del__ ran"):
            assert line in proc.stdout, (line, proc.stdout, proc.stderr)

def test_exit_waits_for_unfinished_tasks_only_up_to_its_bound(tmp_path: Any) -> None:
    proc = _run(tmp_path, """
        @lumos.remote
        def forever():
            time.sleep(3600)

        forever.remote()
    """, exit_drain_timeout_s=0.5)
    assert proc.returncode == 0, proc.stderr
    assert "1 task(s) or actor call(s)" in proc.stderr and "exit_drain_timeout_s" in proc.stderr


def test_a_script_that_ends_with_an_uncaught_exception_does_not_wait(tmp_path: Any) -> None:
    # It waited exit_drain_timeout_s (10 s by default) for calls whose results nobody reads.
    proc = _run(tmp_path, """
        @lumos.remote
        def forever():
            time.sleep(3600)

        forever.remote()
        raise RuntimeError("the script's own bug")
    """, exit_drain_timeout_s=60)
    assert proc.returncode == 1
    assert "RuntimeError: the script's own bug" in proc.stderr
    assert "exit_drain_timeout_s" not in proc.stderr
