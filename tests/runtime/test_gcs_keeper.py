"""The GCS keeper (``lumos._private.gcs.keeper``): a head started with durable GCS storage
gets its GCS back after it dies, and ``lumos stop`` still ends everything.

The first tests run the keeper as a real process over a stand-in GCS
(``keeper_fake_gcs.py``) whose starts follow a plan; the last ones start real heads on a
real ``redis-server`` with the ``lumos`` command, kill their GCS and run drivers.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any, Iterator

import psutil
import pytest

from lumos._private.process import await_ready
from tests.conftest import RedisServer, process_gone, wait_for
from tests.runtime.test_cli import FAST, RUN_TASK, CliEnv, assert_all_gone, cli  # noqa: F401 (a fixture)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class KeeperRun:
    """A keeper process over the stand-in GCS, in a session directory of its own."""

    def __init__(self, tmp: str, plan: list[dict[str, Any]], give_up_s: float = 30.0) -> None:
        self.session = os.path.join(tmp, "session")
        os.makedirs(os.path.join(self.session, "logs"), mode=0o700)
        os.chmod(self.session, 0o700)
        self.plan = os.path.join(tmp, "plan.json")
        with open(self.plan, "w") as f:
            json.dump(plan, f)
        r, w = os.pipe()
        gcs_args = ["tests.runtime.keeper_fake_gcs", "--plan", self.plan, "--port", "0"]
        env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "lumos._private.gcs.keeper", "--session-dir", self.session,
             "--give-up-s", str(give_up_s), "--gcs-args", json.dumps(gcs_args), "--ready-fd", str(w)],
            pass_fds=(w,), env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(w)
        self.ready = await_ready(self.proc, r, 30)

    def starts(self) -> list[dict[str, Any]]:
        try:
            with open(self.plan + ".starts") as f:
                return [json.loads(line) for line in f]
        except FileNotFoundError:
            return []

    def log(self) -> str:
        try:
            with open(os.path.join(self.session, "logs", "keeper.log")) as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def pid_file(self) -> dict[str, Any] | None:
        try:
            with open(os.path.join(self.session, "gcs.pid")) as f:
                return json.load(f)  # type: ignore[no-any-return]
        except FileNotFoundError:
            return None

    def end(self) -> None:
        """Safety net: SIGKILL the keeper and every stand-in it started."""
        for start in self.starts():
            try:
                os.kill(start["pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


@pytest.fixture
def keeper_runs(tmp_path: Any) -> Iterator[list[KeeperRun]]:
    runs: list[KeeperRun] = []
    try:
        yield runs
    finally:
        for run in runs:
            run.end()


def start_keeper(runs: list[KeeperRun], tmp_path: Any, plan: list[dict[str, Any]], **kw: Any) -> KeeperRun:
    run = KeeperRun(str(tmp_path), plan, **kw)
    runs.append(run)
    return run



@pytest.mark.timeout(60)
def test_a_killed_gcs_is_started_again_on_the_port_it_had_and_sigterm_stops_both(
        keeper_runs: list[KeeperRun], tmp_path: Any) -> None:
    run = start_keeper(keeper_runs, tmp_path, [{"ready": True, "exit": "SIGKILL", "after": 0.3}])
    assert run.ready is not None and run.ready["port"] == 4321 and run.ready["keeper_pid"] == run.proc.pid
    wait_for(lambda: len(run.starts()) == 2, 15)
    first, second = run.starts()
    assert first["port"] == "0" and second["port"] == "4321"  # the restart listens where the GCS did
    wait_for(lambda: (run.pid_file() or {}).get("pid") == second["pid"], 10)
    assert "the GCS died (signal SIGKILL); restarting it on port 4321" in run.log()
    assert "the GCS is up again" in run.log()

    run.proc.send_signal(signal.SIGTERM)  # as `lumos stop` does: passed on, nothing restarted
    assert run.proc.wait(15) == 0
    assert process_gone(second["pid"])
    assert len(run.starts()) == 2 and run.pid_file() is None
    assert "the GCS stopped (exit code 0); the keeper exits" in run.log()


@pytest.mark.timeout(60)
def test_a_gcs_that_exits_cleanly_or_on_sigterm_is_not_started_again(
        keeper_runs: list[KeeperRun], tmp_path: Any) -> None:
    run = start_keeper(keeper_runs, tmp_path, [{"ready": True, "exit": 0, "after": 0.2}])
    assert run.proc.wait(15) == 0
    assert len(run.starts()) == 1 and run.pid_file() is None

    (tmp_path / "b").mkdir()
    run = start_keeper(keeper_runs, tmp_path / "b", [])  # runs until signalled
    pid = run.starts()[0]["pid"]
    os.kill(pid, signal.SIGTERM)  # the GCS alone stopped (its own stop path): not undone
    assert run.proc.wait(15) == 0
    assert len(run.starts()) == 1


@pytest.mark.timeout(60)
def test_a_gcs_dying_right_after_each_start_is_given_up_after_a_few(
        keeper_runs: list[KeeperRun], tmp_path: Any) -> None:
    from lumos._private.gcs.keeper import CRASH_LOOP
    run = start_keeper(keeper_runs, tmp_path, [{"ready": True, "exit": 3, "after": 0.05}] * (CRASH_LOOP + 3))
    assert run.proc.wait(45) == 1
    assert len(run.starts()) == CRASH_LOOP
    assert f"within 30s of each of its last {CRASH_LOOP} starts; not restarting it again" in run.log()
    assert "exit code 3" in run.log() and run.pid_file() is None


@pytest.mark.timeout(60)
def test_failed_starts_are_retried_with_backoff_until_the_cluster_stops_waiting(
        keeper_runs: list[KeeperRun], tmp_path: Any) -> None:
    plan = [{"ready": True, "exit": "SIGKILL", "after": 0.2}] + [{"ready": False, "exit": 1}] * 50
    run = start_keeper(keeper_runs, tmp_path, plan, give_up_s=2.5)
    t = time.monotonic()
    assert run.proc.wait(30) == 1
    starts = len(run.starts())
    # 0.2, 0.4, 0.8, 1.6 s apart: a few tries in 2.5 s, not one per loop turn
    assert 3 <= starts <= 6, starts
    assert time.monotonic() - t < 10
    assert "the GCS exited during start-up (exit code 1); trying again in" in run.log()
    assert "longer than the cluster waits for it" in run.log()


@pytest.mark.timeout(60)
def test_a_stop_signal_during_the_backoff_ends_the_keeper_without_another_start(
        keeper_runs: list[KeeperRun], tmp_path: Any) -> None:
    plan = [{"ready": True, "exit": "SIGKILL", "after": 0.2}] + [{"ready": False, "exit": 1}] * 50
    run = start_keeper(keeper_runs, tmp_path, plan, give_up_s=60)
    wait_for(lambda: len(run.starts()) >= 4, 20)  # in its longer waits now
    run.proc.send_signal(signal.SIGTERM)
    assert run.proc.wait(5) == 0
    n = len(run.starts())
    time.sleep(1.0)
    assert len(run.starts()) == n


@pytest.mark.timeout(60)
def test_a_first_start_that_fails_is_the_callers_to_report_not_retried(
        keeper_runs: list[KeeperRun], tmp_path: Any) -> None:
    run = start_keeper(keeper_runs, tmp_path, [{"ready": False, "exit": 2}] * 3)
    assert run.ready is None
    assert run.proc.wait(15) == 1
    assert len(run.starts()) == 1


# ----------------------------------------------------------------------------- real heads


def gcs_pid(session_dir: str) -> int | None:
    try:
        with open(os.path.join(session_dir, "gcs.pid")) as f:
            return int(json.load(f)["pid"])
    except (FileNotFoundError, ValueError):
        return None


def restarted_gcs_pid(session_dir: str, old: int) -> int | None:
    """The pid ``gcs.pid`` names once the keeper started a GCS other than ``old`` (running)."""
    pid = gcs_pid(session_dir)
    return pid if pid not in (None, old) and not process_gone(pid) else None


def start_head_on(cli: CliEnv, url: str, *extra: str) -> dict[str, Any]:
    cli.lumos("start", "--head", "--port", "0", "--num-cpus", "2", "--no-dashboard", "--no-client-server",
              "--gcs-storage", url, "--system-config", FAST, *extra)
    return cli.current()


LOOP = """
    import lumos, sys, time
    lumos.init(address="auto")
    @lumos.remote
    def f(x):
        return x + 1
    @lumos.remote
    class Counter:
        def __init__(self):
            self.n = 0
        def inc(self):
            self.n += 1
            return self.n
    c = Counter.remote()
    print("READY", flush=True)
    n = 0
    end = time.monotonic() + float(sys.argv[1])
    while time.monotonic() < end:
        assert lumos.get(f.remote(n), timeout=60) == n + 1
        assert lumos.get(c.inc.remote(), timeout=60) == n + 1
        n += 1
        time.sleep(0.02)
    print("DONE", n, flush=True)
"""


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_lumos_start_on_redis_brings_a_killed_gcs_back_and_drivers_go_on(
        cli: CliEnv, redis_server: RedisServer) -> None:
    rec = start_head_on(cli, redis_server.url)
    assert rec["gcs_keeper"] is True
    session = rec["session_dir"]
    first = gcs_pid(session)
    assert first is not None and not process_gone(first)
    keeper = psutil.Process(first).ppid()
    assert keeper in rec["pids"]  # the keeper is what the record lists; the GCS is its child

    import textwrap
    loop = subprocess.Popen([sys.executable, "-c", textwrap.dedent(LOOP), "12"], env=cli.env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert loop.stdout is not None and loop.stdout.readline().strip() == "READY"
        time.sleep(1.0)
        os.kill(first, signal.SIGKILL)
        second = wait_for(lambda: restarted_gcs_pid(session, first), 30)
        out, err = loop.communicate(timeout=120)
    finally:
        if loop.poll() is None:
            loop.kill()
            loop.wait()
    assert loop.returncode == 0, err
    done = [ln for ln in out.splitlines() if ln.startswith("DONE")]
    assert done and int(done[0].split()[1]) > 50, out  # the task and actor calls went on across the restart
    assert not process_gone(second) and psutil.Process(second).ppid() == keeper

    # A driver started after the restart works too.
    out2 = cli.driver(RUN_TASK.format(init='address="auto"'))
    assert out2.returncode == 0 and "RESULT 42" in out2.stdout, out2.stderr
    with open(os.path.join(session, "logs", "keeper.log")) as f:
        log = f.read()
    assert "the GCS died (signal SIGKILL); restarting it on port" in log
    assert "the GCS is up again" in log

    procs = cli.processes() + [psutil.Process(second)]
    records = cli.records()
    cli.lumos("stop")
    assert_all_gone(procs, records)
    assert gcs_pid(session) is None


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_stop_ends_the_gcs_of_a_killed_keeper_and_no_keeper_without_durable_storage(
        cli: CliEnv, redis_server: RedisServer) -> None:
    rec = start_head_on(cli, redis_server.url)
    gcs = gcs_pid(rec["session_dir"])
    assert gcs is not None
    keeper = psutil.Process(gcs).ppid()
    os.kill(keeper, signal.SIGKILL)  # the GCS goes on, unsupervised
    wait_for(lambda: process_gone(keeper), 10)
    assert not process_gone(gcs)
    out = cli.driver(RUN_TASK.format(init='address="auto"'))
    assert out.returncode == 0 and "RESULT 42" in out.stdout, out.stderr
    procs = cli.processes() + [psutil.Process(gcs)]
    records = cli.records()
    cli.lumos("stop")
    assert_all_gone(procs, records)

    # In memory, a restarted GCS would start empty: no keeper; nor when it is turned off.
    for args in ((), ("--gcs-storage", redis_server.url)):
        overrides = json.dumps({**json.loads(FAST), "gcs_restart_on_failure": False}) if args else FAST
        cli.lumos("start", "--head", "--port", "0", "--num-cpus", "1", "--no-dashboard", "--no-client-server",
                  "--system-config", overrides, *args)
        rec = cli.current()
        assert rec["gcs_keeper"] is False and gcs_pid(rec["session_dir"]) is None
        cmdlines = [" ".join(psutil.Process(p).cmdline()) for p in rec["pids"]]
        assert any("lumos._private.gcs.server" in c for c in cmdlines), cmdlines
        assert not any("keeper" in c for c in cmdlines), cmdlines
        cli.lumos("stop")


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_gcs_that_exited_for_lost_storage_comes_back_with_redis(
        cli: CliEnv, redis_server: RedisServer) -> None:
    fast = {**json.loads(FAST), "gcs_storage_unavailable_exit_s": 2.0, "gcs_storage_check_interval_ms": 200,
            "gcs_storage_timeout_s": 1.0, "gcs_reconnect_timeout_s": 60.0}
    cli.lumos("start", "--head", "--port", "0", "--num-cpus", "2", "--no-dashboard", "--no-client-server",
              "--gcs-storage", redis_server.url, "--system-config", json.dumps(fast))
    rec = cli.current()
    session = rec["session_dir"]
    first = gcs_pid(session)
    assert first is not None
    redis_server.stop()
    wait_for(lambda: process_gone(first), 30)  # it exits 1 once Redis has been gone 2 s
    time.sleep(2.0)  # the keeper's starts fail meanwhile (no storage) and are tried again
    redis_server.start()
    second = wait_for(lambda: restarted_gcs_pid(session, first), 40)
    out = cli.driver(RUN_TASK.format(init='address="auto"'), timeout=90)
    assert out.returncode == 0 and "RESULT 42" in out.stdout, out.stderr
    with open(os.path.join(session, "logs", "keeper.log")) as f:
        log = f.read()
    assert "the GCS died (exit code 1)" in log, log
    assert "the GCS exited during start-up (exit code 1); trying again in" in log, log
    procs = cli.processes() + [psutil.Process(second)]
    records = cli.records()
    cli.lumos("stop")
    assert_all_gone(procs, records)
