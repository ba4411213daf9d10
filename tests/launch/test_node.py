"""``python -m lumos.launch.node``: the foreground node that Slurm steps and containers run.

Its normal life (start, join, SIGTERM) is exercised by test_slurm.py and test_kubernetes.py;
here, how it refuses to start.
"""

from __future__ import annotations

import os
import subprocess
import sys

import psutil
import pytest

from lumos.launch.kubernetes import new_token
from tests.conftest import check_no_leaks, wait_for


def test_node_refuses_a_session_root_others_can_write_and_says_why(short_root: str) -> None:
    token = os.path.join(short_root, "token")
    with open(token, "w") as f:
        f.write(new_token())
    os.chmod(token, 0o600)
    shared = os.path.join(short_root, "shared")
    os.mkdir(shared)
    os.chmod(shared, 0o777)
    out = subprocess.run([sys.executable, "-m", "lumos.launch.node", "--head", "--port", "0", "--token-file", token,
                          "--node-ip-address", "127.0.0.1", "--no-dashboard"],
                         env={**os.environ, "LUMOS_TMPDIR": shared}, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "has mode 777, not 700" in out.stderr, out.stderr
    assert not os.listdir(shared)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_node_stops_the_rest_and_exits_1_when_its_raylet_dies(short_root: str) -> None:
    token = os.path.join(short_root, "token")
    with open(token, "w") as f:
        f.write(new_token())
    os.chmod(token, 0o600)
    address_file = os.path.join(short_root, "address")
    proc = subprocess.Popen([sys.executable, "-m", "lumos.launch.node", "--head", "--port", "0",
                             "--token-file", token, "--node-ip-address", "127.0.0.1", "--no-dashboard",
                             "--num-cpus", "1", "--address-file", address_file],
                            env={**os.environ, "LUMOS_TMPDIR": os.path.join(short_root, "root")},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: os.path.exists(address_file) or proc.poll() is not None, 60, 0.1)
        children = psutil.Process(proc.pid).children()
        raylet = next(c for c in children if "raylet" in " ".join(c.cmdline()))
        raylet.kill()
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 1, out
    assert "exited; stopping the node" in out
    assert all(not c.is_running() or c.status() == psutil.STATUS_ZOMBIE for c in children)
    check_no_leaks(None)


@pytest.mark.timeout(180)
def test_head_starts_a_client_server_that_a_lumos_client_runs_tasks_through(short_root: str) -> None:
    token = os.path.join(short_root, "token")
    with open(token, "w") as f:
        f.write(new_token())
    os.chmod(token, 0o600)
    address_file = os.path.join(short_root, "address")
    client_file = os.path.join(short_root, "client")
    env = {**os.environ, "LUMOS_TMPDIR": os.path.join(short_root, "root")}
    proc = subprocess.Popen([sys.executable, "-m", "lumos.launch.node", "--head", "--port", "0",
                             "--token-file", token, "--node-ip-address", "127.0.0.1", "--no-dashboard",
                             "--num-cpus", "1", "--client-server-port", "0", "--client-file", client_file,
                             "--address-file", address_file],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: os.path.exists(address_file) or proc.poll() is not None, 60, 0.1)
        assert proc.poll() is None
        with open(client_file) as f:
            client = f.read().strip()
        assert client.startswith("lumos://127.0.0.1:")
        # A driver with no node of its own, in another process: it has the address and the token file only.
        driver = ("import lumos, sys\n"
                  "lumos.init(sys.argv[1], _token=sys.argv[2])\n"
                  "f = lumos.remote(lambda x: x * 2)\n"
                  "print('result', lumos.get(f.remote(21), timeout=60))\n"
                  "lumos.shutdown()\n")
        out = subprocess.run([sys.executable, "-c", driver, client, token], capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0 and "result 42" in out.stdout, out.stdout + out.stderr
    finally:
        proc.terminate()
        try:
            printed, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            printed, _ = proc.communicate(timeout=10)
    assert f"lumos client address: {client}" in printed, printed
    assert proc.returncode == 0, printed
    check_no_leaks(None)
