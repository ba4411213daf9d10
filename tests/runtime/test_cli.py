"""The ``lumos`` command line, run as real subprocesses: demo, start, status, stop.

Every test points ``LUMOS_TMPDIR`` at its own short directory, so its
``current_cluster.json`` and ``lumos stop`` never touch another test's (or a user's)
cluster. Drivers run in subprocesses too: they read that variable at import.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from typing import Any, Iterator

import psutil
import pytest

from tests.conftest import wait_for

LUMOS = os.path.join(os.path.dirname(sys.executable), "lumos")
FAST = json.dumps({"heartbeat_interval_ms": 200, "node_death_timeout_ms": 3000, "validate": True})


class CliEnv:
    """One private ``LUMOS_TMPDIR`` and helpers to run the CLI and drivers in it."""

    def __init__(self) -> None:
        # Short: Unix socket paths (session dir + sockets/raylet-....sock) must stay < 108 bytes.
        self.root = tempfile.mkdtemp(prefix="lc", dir="/tmp")
        self.env = dict(os.environ, LUMOS_TMPDIR=self.root)
        self.env.pop("LUMOS_ADDRESS", None)
        self.env.pop("LUMOS_CLUSTER_TOKEN", None)

    def lumos(self, *args: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess[str]:
        out = subprocess.run([LUMOS, *args], env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and out.returncode != 0:
            raise AssertionError(f"lumos {' '.join(args)} exited {out.returncode}:\n{out.stdout}\n{out.stderr}")
        return out

    def driver(self, code: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=self.env, capture_output=True,
                              text=True, timeout=timeout)

    def current(self) -> dict[str, Any]:
        with open(os.path.join(self.root, "current_cluster.json")) as f:
            return json.load(f)  # type: ignore[no-any-return]

    def records(self) -> list[dict[str, Any]]:
        out = []
        for path in glob.glob(os.path.join(self.root, "started", "*.json")):
            with open(path) as f:
                out.append(json.load(f))
        return out

    def processes(self) -> list[psutil.Process]:
        """Every process of the recorded nodes, their workers included."""
        procs = []
        for rec in self.records():
            for ident in rec["processes"]:
                try:
                    p = psutil.Process(ident["pid"])
                    procs.append(p)
                    procs.extend(p.children(recursive=True))
                except psutil.NoSuchProcess:
                    pass
        return procs

    def cleanup(self) -> None:
        """Safety net after a failed test: stop, then SIGKILL whatever was recorded."""
        procs = self.processes()
        if self.records():
            subprocess.run([LUMOS, "stop", "--grace-period", "2"], env=self.env, capture_output=True, timeout=60)
        for p in procs:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        for rec in self.records():
            shutil.rmtree(rec.get("store_dir") or "/nonexistent", ignore_errors=True)
        # A GCS whose keeper was killed is in no record's process list: its pid file names it.
        for path in glob.glob(os.path.join(self.root, "session_*", "gcs.pid")):
            try:
                with open(path) as f:
                    psutil.Process(json.load(f)["pid"]).kill()
            except (OSError, ValueError, KeyError, psutil.Error):
                pass
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def cli() -> Iterator[CliEnv]:
    env = CliEnv()
    try:
        yield env
    finally:
        env.cleanup()


def assert_all_gone(procs: list[psutil.Process], records: list[dict[str, Any]]) -> None:
    wait_for(lambda: not [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE], 10)
    for rec in records:
        assert not os.path.exists(rec["store_dir"]), f"store directory left: {rec['store_dir']}"
        socks = glob.glob(os.path.join(rec["session_dir"], "sockets", "*"))
        assert not socks, f"socket files left: {socks}"


def start_head(cli: CliEnv, *extra: str) -> tuple[str, str]:
    if "--include-dashboard" not in extra:
        extra = ("--no-dashboard", *extra)
    out = cli.lumos("start", "--head", "--port", "0", "--num-cpus", "2", "--system-config", FAST, *extra)
    cur = cli.current()
    with open(cur["token_path"]) as f:
        token = f.read().strip()
    assert cur["gcs_address"] in out.stdout and token in out.stdout, out.stdout
    return cur["gcs_address"], token


RUN_TASK = """
    import lumos, os, sys
    ctx = lumos.init({init})
    @lumos.remote
    def where(x):
        return x * 2, lumos.get_runtime_context().get_node_id()
    value, node = lumos.get(where.remote(21), timeout=30)
    print("RESULT", value, node)
    lumos.shutdown()
"""


def test_demo_runs_es_printing_reward_per_iteration_throughput_wall_time_and_workers(cli: CliEnv) -> None:
    out = cli.lumos("demo", "--workers", "2", "--iterations", "3", "--num-cpus", "2", timeout=120)
    assert "lumos demo es: evolution strategies" in out.stdout
    for it in (1, 2, 3):
        assert f"iteration {it}  reward " in out.stdout, out.stdout
    assert "timesteps/s" in out.stdout and "wall time:" in out.stdout and "with 2 workers" in out.stdout
    listing = cli.lumos("demo", "--list").stdout
    for name in ("es", "ppo", "allreduce", "serving", "hpo"):
        assert f"  {name} " in listing
    bad = cli.lumos("demo", "chess", check=False)
    assert bad.returncode == 1 and "unknown workload 'chess'" in bad.stderr and "ppo" in bad.stderr


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_start_head_status_drivers_second_node_and_stop(cli: CliEnv) -> None:
    address, token = start_head(cli, "--resources", '{"head_only": 1}', "--include-dashboard",
                                "--dashboard-port", "0")
    status = cli.lumos("status").stdout
    assert f"lumos cluster at {address}: 1 node(s) alive" in status
    assert "dashboard: http://127.0.0.1:" in status, status
    assert "CPU" in status and "2 / 2" in status and "head_only" in status

    out = cli.driver(RUN_TASK.format(init='address="auto"') + "    print('DASHBOARD', ctx.dashboard_url)\n")
    assert out.returncode == 0, out.stderr
    assert "RESULT 42" in out.stdout
    # A driver that connects learns the dashboard the head started.
    assert "DASHBOARD http://127.0.0.1:" in out.stdout, out.stdout

    # From a driver that knows only HOST:PORT and the token (no current_cluster.json to read).
    bare = dict(cli.env, LUMOS_TMPDIR=tempfile.mkdtemp(prefix="lx", dir="/tmp"))
    try:
        out = subprocess.run([sys.executable, "-c", textwrap.dedent(RUN_TASK.format(
            init=f'address="{address}", _token="{token}"'))], env=bare, capture_output=True, text=True, timeout=60)
    finally:
        shutil.rmtree(bare["LUMOS_TMPDIR"], ignore_errors=True)
    assert out.returncode == 0, out.stderr
    assert "RESULT 42" in out.stdout

    out = cli.lumos("start", "--address", address, "--token", token, "--num-cpus", "1",
                    "--resources", '{"second": 1}', "--labels", '{"rack": "r1", "zone": "b"}',
                    "--system-config", FAST)
    assert "joined the cluster" in out.stdout
    status = cli.lumos("status").stdout
    assert "2 node(s) alive" in status and "second" in status
    assert "labels               rack=r1, zone=b" in status, status  # (the head has none to show)
    assert status.count("labels ") == 1, status
    st = json.loads(cli.lumos("status", "--json").stdout)
    assert sorted(n["resources_total"].get("CPU") for n in st["nodes"]) == [1.0, 2.0]
    assert sorted(n["labels"].get("rack", "") for n in st["nodes"]) == ["", "r1"]
    assert sum(n["is_head"] for n in st["nodes"]) == 1

    procs = cli.processes()
    records = cli.records()
    assert len(records) == 2 and len(procs) >= 4  # GCS, dashboard, 2 raylets (and their workers)
    out = cli.lumos("stop")
    assert "stopped 2 node(s)" in out.stdout
    assert_all_gone(procs, records)
    assert not os.path.exists(os.path.join(cli.root, "current_cluster.json"))
    assert cli.records() == []
    assert "no lumos processes" in cli.lumos("stop").stdout


def test_wrong_token_is_refused_with_a_clear_error(cli: CliEnv) -> None:
    address, token = start_head(cli)
    out = cli.lumos("start", "--address", address, "--token", "0" * 64, "--num-cpus", "1", check=False)
    assert out.returncode == 1
    assert "token is wrong" in out.stderr, out.stderr
    assert len(cli.records()) == 1  # nothing started for the refused node

    out = cli.driver(f"""
        import lumos
        try:
            lumos.init(address="{address}", _token="{'1' * 64}")
        except ConnectionError as e:
            print("REFUSED", e)
    """)
    assert "REFUSED" in out.stdout and "token is probably wrong" in out.stdout, out.stdout + out.stderr

    out = cli.lumos("status", "--address", address, "--token", "bad" * 10, check=False)
    assert out.returncode == 1 and "token is wrong" in out.stderr
    # The head kept serving: the right token still works.
    out = cli.driver(RUN_TASK.format(init='address="auto"'))
    assert "RESULT 42" in out.stdout, out.stderr
    procs, records = cli.processes(), cli.records()
    cli.lumos("stop")
    assert_all_gone(procs, records)


def test_bad_arguments_get_clear_errors(cli: CliEnv) -> None:
    out = cli.lumos("start", "--head", "--resources", "{not json", check=False)
    assert out.returncode == 1 and "--resources is not valid JSON" in out.stderr
    out = cli.lumos("start", "--num-cpus", "1", check=False)
    assert out.returncode == 1 and "either --head" in out.stderr
    out = cli.lumos("start", "--head", "--labels", '{"ray.io/node-id": "mine"}', check=False)
    assert out.returncode == 1 and "--labels: node label 'ray.io/node-id'" in out.stderr
    assert "Traceback" not in out.stderr
    out = cli.lumos("start", "--head", "--gcs-storage", "etcd://127.0.0.1:2379", check=False)
    assert out.returncode == 1 and "--gcs-storage: unknown GCS storage" in out.stderr
    out = cli.lumos("start", "--address", "127.0.0.1:1", "--num-cpus", "1", check=False)
    assert out.returncode == 1 and "needs its token" in out.stderr
    out = cli.lumos("start", "--address", "127.0.0.1:1", "--token", "x" * 64, check=False)
    assert out.returncode == 1 and "cannot reach the lumos GCS at 127.0.0.1:1" in out.stderr
    out = cli.lumos("status", check=False)
    assert out.returncode == 1 and "no lumos cluster was started on this machine" in out.stderr
    out = cli.driver('import lumos\nlumos.init(address="auto")')
    assert out.returncode != 0 and "lumos start --head" in out.stderr
    assert cli.records() == []


def test_second_head_is_refused_while_one_runs(cli: CliEnv) -> None:
    address, _ = start_head(cli)
    out = cli.lumos("start", "--head", "--port", "0", check=False)
    assert out.returncode == 1 and f"already running at {address}" in out.stderr
    procs, records = cli.processes(), cli.records()
    cli.lumos("stop")
    assert_all_gone(procs, records)
