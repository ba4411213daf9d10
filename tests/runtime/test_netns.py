"""Two nodes on two network namespaces joined by a veth pair: no shared address at all.

The test creates two network namespaces and a veth pair between them (10.200.0.1/24 and
10.200.0.2/24); loopback stays down in both, so every byte between the nodes crosses the
veth. Each namespace also gets private tmpfs mounts over the session root and /dev/shm
(``ip netns exec`` runs in a new mount namespace), so the nodes cannot reach each
other's Unix sockets or object-store files either.

```
 namespace <n>h  (10.200.0.1)                namespace <n>w  (10.200.0.2)
 lumos start --head --block                  driver.py ── lumos start --address 10.200.0.1:P --block
   GCS + raylet {"head_only": 1} ◄── veth ──►   raylet {"worker_only": 1}, the driver's node
```
The driver runs tasks that need ``head_only`` (they land on the head) with an argument
in its own store (pulled by the head) and results in the head's store (pulled back).
Skipped only where creating a network namespace is not permitted (tried, not guessed).
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Iterator

import pytest

from tests.conftest import TEST_CONFIG

HEAD_IP, WORKER_IP = "10.200.0.1", "10.200.0.2"
GCS_PORT = 6390

DRIVER = r'''
import hashlib, json, os, queue, signal, subprocess, sys, threading, time
address, token, lumos_bin, config = sys.argv[1:5]
node = subprocess.Popen(
    [lumos_bin, "start", "--address", address, "--node-ip-address", "%(worker_ip)s",
     "--num-cpus", "1", "--resources", json.dumps({"worker_only": 1}), "--object-store-memory", str(256 << 20),
     "--system-config", config, "--block"],
    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    env=dict(os.environ, PYTHONUNBUFFERED="1", LUMOS_CLUSTER_TOKEN=token))
lines = queue.Queue()
threading.Thread(target=lambda: [lines.put(l) for l in node.stdout], daemon=True).start()
seen = []
deadline = time.monotonic() + 60
while not any("joined the cluster" in l for l in seen):
    try:
        seen.append(lines.get(timeout=max(0.1, deadline - time.monotonic())))
    except queue.Empty:
        print("worker node did not join:", "".join(seen), flush=True)
        node.kill()
        sys.exit(3)
try:
    import lumos
    ctx = lumos.init(address=address, _token=token, _system_config=json.loads(config))

    @lumos.remote(resources={"head_only": 1})
    def digest_on_head(blob):
        return lumos.get_runtime_context().get_node_id(), hashlib.sha256(blob).hexdigest(), len(blob)

    @lumos.remote(resources={"head_only": 1}, num_returns=2)
    def make_on_head(n):
        data = os.urandom(n)
        return data, hashlib.sha256(data).hexdigest()

    @lumos.remote(resources={"worker_only": 1})
    def local_node():
        return lumos.get_runtime_context().get_node_id()

    blob = os.urandom(8 << 20)
    ref = lumos.put(blob)
    head_node, head_digest, head_len = lumos.get(digest_on_head.remote(ref), timeout=120)
    data_ref, digest_ref = make_on_head.remote(6 << 20)
    data = lumos.get(data_ref, timeout=120)
    result = {
        "driver_node": ctx.address_info["node_id"],
        "nodes": {n["NodeID"]: n["NodeManagerAddress"] for n in lumos.nodes() if n["Alive"]},
        "head_task_node": head_node,
        "arg_digest_ok": head_digest == hashlib.sha256(blob).hexdigest() and head_len == len(blob),
        "result_digest_ok": hashlib.sha256(data).hexdigest() == lumos.get(digest_ref, timeout=60),
        "local_task_node": lumos.get(local_node.remote(), timeout=60),
    }
    print("RESULT " + json.dumps(result), flush=True)
    lumos.shutdown()
finally:
    node.send_signal(signal.SIGTERM)
    try:
        node.wait(30)
    except subprocess.TimeoutExpired:
        node.kill()
''' % {"worker_ip": WORKER_IP}


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=check)


def _ns_pids(ns: str) -> list[int]:
    out = _ip("netns", "pids", ns, check=False)
    return [int(p) for p in out.stdout.split()] if out.returncode == 0 else []


@pytest.fixture
def veth_pair() -> Iterator[tuple[str, str, str]]:
    """Two fresh network namespaces joined by a veth pair; yields (head ns, worker ns, session root)."""
    if shutil.which("ip") is None:
        pytest.skip("the `ip` command (iproute2) is not installed")
    tag = f"lm{os.getpid() % 100000}"
    head_ns, worker_ns = f"{tag}h", f"{tag}w"
    probe = _ip("netns", "add", head_ns, check=False)
    if probe.returncode != 0:
        pytest.skip(f"creating a network namespace is not permitted here: {probe.stderr.strip()}")
    root = f"/tmp/lumos_netns_{tag}"
    try:
        _ip("netns", "add", worker_ns)
        _ip("link", "add", f"{tag}a", "type", "veth", "peer", "name", f"{tag}b")
        _ip("link", "set", f"{tag}a", "netns", head_ns)
        _ip("link", "set", f"{tag}b", "netns", worker_ns)
        _ip("-n", head_ns, "addr", "add", f"{HEAD_IP}/24", "dev", f"{tag}a")
        _ip("-n", worker_ns, "addr", "add", f"{WORKER_IP}/24", "dev", f"{tag}b")
        _ip("-n", head_ns, "link", "set", f"{tag}a", "up")
        _ip("-n", worker_ns, "link", "set", f"{tag}b", "up")
        os.makedirs(root, exist_ok=True)
        yield head_ns, worker_ns, root
    finally:
        left = {}
        for ns in (head_ns, worker_ns):
            pids = _ns_pids(ns)
            if pids:
                left[ns] = pids
            for pid in pids:  # every process in a namespace this test created is this test's
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 10
        while any(_ns_pids(ns) for ns in (head_ns, worker_ns)) and time.monotonic() < deadline:
            time.sleep(0.1)
        for ns in (head_ns, worker_ns):
            _ip("netns", "del", ns, check=False)  # the veth pair goes with its namespaces
        try:
            os.rmdir(root)
        except OSError:
            pass
        assert not left, f"processes left in the test's namespaces after shutdown (killed): {left}"


def _in_namespace(ns: str, root: str, argv: list[str], **popen: Any) -> subprocess.Popen[str]:
    """Run ``argv`` in ``ns`` with private tmpfs mounts over ``root`` and /dev/shm."""
    script = 'mount -t tmpfs tmpfs /dev/shm && mount -t tmpfs -o mode=0700 tmpfs "$1" && shift && exec "$@"'
    env = dict(os.environ, LUMOS_TMPDIR=root, PYTHONUNBUFFERED="1")
    env.pop("LUMOS_CLUSTER_TOKEN", None)
    return subprocess.Popen(["ip", "netns", "exec", ns, "sh", "-c", script, "sh", root, *argv],
                            env=env, text=True, **popen)


def _lines(stream: Any) -> tuple["queue.Queue[str]", threading.Thread]:
    q: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [q.put(line) for line in stream], daemon=True,
                              name="test.netns.reader")
    reader.start()
    return q, reader


@pytest.mark.timeout(240)
@pytest.mark.slow
def test_head_and_node_in_two_network_namespaces_run_tasks_and_move_objects(
        veth_pair: tuple[str, str, str], tmp_path: Any) -> None:
    head_ns, worker_ns, root = veth_pair
    lumos_bin = os.path.join(os.path.dirname(sys.executable), "lumos")
    config = json.dumps(TEST_CONFIG)
    head = _in_namespace(head_ns, root, [
        lumos_bin, "start", "--head", "--node-ip-address", HEAD_IP, "--port", str(GCS_PORT), "--num-cpus", "1",
        "--resources", json.dumps({"head_only": 1}), "--object-store-memory", str(256 << 20), "--no-dashboard",
        "--system-config", config, "--block"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    reader: threading.Thread | None = None
    try:
        assert head.stdout is not None
        out, reader = _lines(head.stdout)
        seen: list[str] = []
        token = ""
        deadline = time.monotonic() + 60
        while not token:
            try:
                line = out.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"the head did not start: {''.join(seen)}") from None
            seen.append(line)
            if "export LUMOS_CLUSTER_TOKEN=" in line:
                token = line.split("=", 1)[1].strip()
        driver_file = tmp_path / "driver.py"
        driver_file.write_text(DRIVER)
        driver = _in_namespace(worker_ns, root, [sys.executable, str(driver_file), f"{HEAD_IP}:{GCS_PORT}",
                                                 token, lumos_bin, config],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            text, _ = driver.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            driver.kill()
            text, _ = driver.communicate()
            raise AssertionError(f"the driver did not finish:\n{text}") from None
        results = [line for line in text.splitlines() if line.startswith("RESULT ")]
        assert driver.returncode == 0 and results, f"driver failed (exit {driver.returncode}):\n{text}"
        r = json.loads(results[0][len("RESULT "):])
        nodes = r["nodes"]
        assert sorted(nodes.values()) == [HEAD_IP, WORKER_IP], nodes
        head_id = next(n for n, ip in nodes.items() if ip == HEAD_IP)
        assert nodes[r["driver_node"]] == WORKER_IP
        assert r["head_task_node"] == head_id
        assert r["local_task_node"] == r["driver_node"]
        assert r["arg_digest_ok"] and r["result_digest_ok"]
    finally:
        head.send_signal(signal.SIGTERM)
        try:
            head.wait(30)
        except subprocess.TimeoutExpired:
            head.kill()
            head.wait(10)
        if head.stdout is not None:
            if reader is not None:
                reader.join(10)
            head.stdout.close()
        # Every process of both nodes has left its namespace (the fixture checks and fails otherwise).
        deadline = time.monotonic() + 15
        while any(_ns_pids(ns) for ns in (head_ns, worker_ns)) and time.monotonic() < deadline:
            time.sleep(0.2)
