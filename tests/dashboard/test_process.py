"""The dashboard process: started by init(), off when asked, next free port, dies with
its driver, stopped by shutdown, and startable on its own (as ``lumos start --head`` does)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import urllib.request

import psutil
import pytest

import lumos
from lumos._private.dashboard_process import start_dashboard, stop_dashboard
from tests.conftest import wait_for
from tests.dashboard.conftest import dashboard_children

pytestmark = pytest.mark.timeout(120)


def _open(url: str) -> tuple[int, bytes]:
    """Follow the login link as a browser does (keeping its cookie)."""
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())
    with opener.open(url, timeout=20) as r:
        return r.status, r.read()


def _port(url: str) -> int:
    return int(url.split(":")[2].split("/")[0])


def test_include_dashboard_false_starts_nothing(fresh_cluster) -> None:
    ctx = fresh_cluster(include_dashboard=False)
    assert ctx.dashboard_url == ""
    assert not dashboard_children()


def test_busy_port_moves_to_the_next_free_one_and_shutdown_stops_it(fresh_cluster) -> None:
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen(1)
    busy = blocker.getsockname()[1]
    try:
        ctx = fresh_cluster(include_dashboard=True, dashboard_port=busy)
        port = _port(ctx.dashboard_url)
        assert port > busy
        assert _open(ctx.dashboard_url)[0] == 200
        with open(os.path.join(ctx.address_info["session_dir"], "dashboard.json")) as f:
            info = json.load(f)
        assert info["port"] == port and info["url"] == ctx.dashboard_url
        (proc,) = dashboard_children()
        lumos.shutdown()
        wait_for(lambda: not psutil.pid_exists(proc.pid) or proc.status() == psutil.STATUS_ZOMBIE, 10)
    finally:
        blocker.close()


def test_dashboard_dies_with_its_driver(tmp_path) -> None:
    script = textwrap.dedent("""
        import json, sys, time, lumos
        ctx = lumos.init(num_cpus=1, object_store_memory=64 * 1024 * 1024, include_dashboard=True)
        with open(ctx.address_info["session_dir"] + "/dashboard.json") as f:
            info = json.load(f)
        print(json.dumps(info), flush=True)
        time.sleep(120)
    """)
    driver = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              cwd=str(tmp_path))
    try:
        line = driver.stdout.readline()  # type: ignore[union-attr]
        info = json.loads(line)
        dash = psutil.Process(info["pid"])
        assert "lumos.dashboard" in " ".join(dash.cmdline())
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(10)

        def gone() -> bool:
            try:
                return dash.status() == psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                return True
        wait_for(gone, 10)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait(10)
        driver.stdout.close()  # type: ignore[union-attr]


def test_start_dashboard_on_its_own_for_a_running_cluster(fresh_cluster) -> None:
    ctx = fresh_cluster(include_dashboard=False)
    session = ctx.address_info["session_dir"]
    with pytest.raises(ValueError, match="dashboard_port"):
        start_dashboard(session, "unix:" + os.path.join(session, "sockets", "gcs.sock"),
                        os.path.join(session, "token"), port=70000)
    proc, url = start_dashboard(session, "unix:" + os.path.join(session, "sockets", "gcs.sock"),
                                os.path.join(session, "token"), port=0, private=False)
    try:
        assert url.startswith("http://127.0.0.1:") and "/login?token=" in url
        status, body = _open(url)
        assert status == 200 and b"bokeh" in body.lower()
    finally:
        stop_dashboard(proc)
    assert proc.poll() is not None
