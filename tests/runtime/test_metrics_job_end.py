"""A driver that exits right after its actors and tasks recorded metrics loses none of
them: its job's workers are asked to send what they hold and exit (``ExitWorker``
without clean-up, killed after ``JOB_END_EXIT_S``), where they were killed at once and the
records since their last report (up to a second's) were lost."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Any, Iterator

import pytest

import lumos
from tests.conftest import running_head, wait_for

pytestmark = pytest.mark.timeout(120)

_DRIVER = textwrap.dedent("""
    import sys
    import lumos
    from lumos.util.metrics import Counter

    lumos.init(address=sys.argv[1])

    @lumos.remote
    class Server:
        def __init__(self):
            self.served = Counter("job_end_served")

        def handle(self, x):
            self.served.inc()
            return x

    @lumos.remote
    def work(i):
        Counter("job_end_tasks").inc()
        return i

    server = Server.remote()
    assert lumos.get([server.handle.remote(i) for i in range(300)], timeout=60) == list(range(300))
    assert lumos.get([work.remote(i) for i in range(50)], timeout=60) == list(range(50))
    # exits now: the actor's and the workers' last records are not reported yet
""")


@pytest.fixture(scope="module")
def head() -> Iterator[Any]:
    yield from running_head(num_cpus=2)


def total(name: str) -> float:
    return sum(s["value"] for row in lumos.state.metrics() if row["name"] == name for s in row["series"])


def test_a_finished_jobs_workers_report_before_they_go(head: Any) -> None:
    proc = subprocess.run([sys.executable, "-c", _DRIVER, head.address], capture_output=True, text=True,
                          timeout=100, cwd=os.path.dirname(os.path.abspath(__file__)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    wait_for(lambda: total("job_end_served") == 300 and total("job_end_tasks") == 50, 15)
    # The actor's worker ended as lumos's own stop, on its own (not killed).
    def actor_worker_rows() -> list[dict[str, Any]]:
        return [w for w in lumos.state.list_workers() if not w["is_driver"] and w["state"] == "DEAD"
                and "its actor ended" in (w["exit_detail"] or "")]
    rows = wait_for(actor_worker_rows, 15)
    assert rows[0]["exit_type"] == "INTENDED_SYSTEM_EXIT" and "exit code 0" in rows[0]["exit_detail"], rows
