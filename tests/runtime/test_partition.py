"""A partition, not a crash: the link to a node goes down (its processes run on), the GCS
declares it dead, the driver's work there is failed over, and when the link comes back the
node is fenced: it exits with its workers instead of running on beside the restarted actor.

```
 namespace <n>h  (10.200.0.1)                    namespace <n>w  (10.200.0.2)
 driver.py ── lumos start --head --block          lumos start --address 10.200.0.1:P --block
   GCS + raylet {"w": 2} ◄────── veth (taken down, then up) ──────► raylet {"w": 2}
```
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import time
from typing import Any

import pytest

from tests.conftest import TEST_CONFIG
from tests.runtime.test_netns import (GCS_PORT, HEAD_IP, WORKER_IP, _in_namespace, _ip, _lines, _ns_pids,
                                      veth_pair)

__all__ = ["veth_pair"]  # the fixture, used here

DRIVER = r'''
import json, os, queue, subprocess, sys, threading, time
lumos_bin, config, marker_dir = sys.argv[1:4]
head = subprocess.Popen(
    [lumos_bin, "start", "--head", "--node-ip-address", "%(head_ip)s", "--port", "%(port)s", "--num-cpus", "2",
     "--resources", json.dumps({"w": 2}), "--object-store-memory", str(128 << 20), "--no-dashboard",
     "--system-config", config, "--block"],
    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
lines = queue.Queue()
threading.Thread(target=lambda: [lines.put(l) for l in head.stdout], daemon=True).start()
token = ""
seen = []
deadline = time.monotonic() + 50
while not token and time.monotonic() < deadline:
    try:
        line = lines.get(timeout=1)
    except queue.Empty:
        continue
    seen.append(line)
    if "export LUMOS_CLUSTER_TOKEN=" in line:
        token = line.split("=", 1)[1].strip()
if not token:
    print("the head did not start:", "".join(seen), flush=True)
    head.kill()
    sys.exit(3)
print("TOKEN " + token, flush=True)
try:
    import lumos
    from lumos.util.scheduling_strategies import NodeAffinitySchedulingStrategy as Affinity
    lumos.init(address="%(head_ip)s:%(port)s", _token=token, _system_config=json.loads(config))
    def far_node():
        return [n["NodeID"] for n in lumos.nodes() if n["Alive"] and n["NodeManagerAddress"] == "%(worker_ip)s"]
    while not far_node():
        time.sleep(0.1)
    far = far_node()[0]

    @lumos.remote(resources={"w": 1}, max_retries=2)
    def stuck_once(marker):
        if not os.path.exists(marker):
            open(marker, "w").close()
            time.sleep(120)
        return lumos.get_runtime_context().get_node_id()

    @lumos.remote(resources={"w": 1}, max_restarts=1, max_task_retries=-1)
    class Counter:
        def __init__(self):
            self.n = 0
        def slow_add(self, marker):
            if not os.path.exists(marker):
                open(marker, "w").close()
                time.sleep(120)
            self.n += 1
            return self.n, os.getpid()
        def add(self):
            self.n += 1
            return self.n, os.getpid()
        def pid(self):
            return os.getpid()

    there = Affinity(far, soft=True)
    counter = Counter.options(scheduling_strategy=there).remote()
    old_pid = lumos.get(counter.pid.remote(), timeout=60)
    task = stuck_once.options(scheduling_strategy=there).remote(os.path.join(marker_dir, "task"))
    call = counter.slow_add.remote(os.path.join(marker_dir, "call"))
    later = counter.add.remote()
    while not all(os.path.exists(os.path.join(marker_dir, m)) for m in ("task", "call")):
        time.sleep(0.05)
    print("RUNNING", flush=True)
    while far_node():
        time.sleep(0.1)
    task_node = lumos.get(task, timeout=60)
    (n1, pid1), (n2, pid2) = lumos.get([call, later], timeout=60)
    print("RESULT " + json.dumps({"far": far, "task_node": task_node, "counts": [n1, n2],
                                  "pids": [pid1, pid2], "old_pid": old_pid}), flush=True)
    sys.stdin.readline()  # the test brings the link back and sees the node exit
    print("AFTER " + json.dumps({"far_alive": bool(far_node()), "next": lumos.get(counter.add.remote(), timeout=30)}),
          flush=True)
    lumos.shutdown()
finally:
    head.terminate()
    try:
        head.wait(30)
    except subprocess.TimeoutExpired:
        head.kill()
''' % {"head_ip": HEAD_IP, "worker_ip": WORKER_IP, "port": GCS_PORT}


def _expect(out: "queue.Queue[str]", prefix: str, seen: list[str], timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            line = out.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"no {prefix!r} line within {timeout_s}s:\n{''.join(seen)}") from None
        seen.append(line)
        if line.startswith(prefix):
            return line[len(prefix):].strip()


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_a_partitioned_node_is_failed_over_and_fenced_when_the_link_returns(
        veth_pair: tuple[str, str, str], tmp_path: Any) -> None:
    head_ns, worker_ns, root = veth_pair
    tag = head_ns[:-1]
    lumos_bin = os.path.join(os.path.dirname(sys.executable), "lumos")
    config = json.dumps(TEST_CONFIG)
    driver_file = tmp_path / "driver.py"
    driver_file.write_text(DRIVER)
    markers = tmp_path / "markers"
    markers.mkdir()
    # The driver and the head share the head's namespace: they talk over its own address.
    _ip("-n", head_ns, "link", "set", "lo", "up")
    driver = _in_namespace(head_ns, root, [sys.executable, str(driver_file), lumos_bin, config, str(markers)],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    node: subprocess.Popen[str] | None = None
    seen: list[str] = []
    try:
        assert driver.stdout is not None and driver.stdin is not None
        out, _reader = _lines(driver.stdout)
        token_file = tmp_path / "token"
        token_file.write_text(_expect(out, "TOKEN ", seen, 60))
        token_file.chmod(0o600)
        node = _in_namespace(worker_ns, root, [
            lumos_bin, "start", "--address", f"{HEAD_IP}:{GCS_PORT}", "--token-file", str(token_file),
            "--node-ip-address",
            WORKER_IP, "--num-cpus", "2", "--resources", json.dumps({"w": 2}), "--object-store-memory",
            str(128 << 20), "--system-config", config, "--block"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _expect(out, "RUNNING", seen, 120)
        _ip("-n", worker_ns, "link", "set", f"{tag}b", "down")  # the node runs on, cut off
        r = json.loads(_expect(out, "RESULT ", seen, 120))
        assert r["task_node"] != r["far"]  # the task ran again on the head
        assert r["counts"] == [1, 2] and r["pids"][0] == r["pids"][1] != r["old_pid"]
        assert _ns_pids(worker_ns)  # cut off, not dead: its processes still run
        _ip("-n", worker_ns, "link", "set", f"{tag}b", "up")
        deadline = time.monotonic() + 90
        while _ns_pids(worker_ns) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _ns_pids(worker_ns), "the fenced node kept running after the link came back"
        driver.stdin.write("\n")
        driver.stdin.flush()
        after = json.loads(_expect(out, "AFTER ", seen, 60))
        assert after == {"far_alive": False, "next": [3, r["pids"][0]]}, after
        assert driver.wait(60) == 0, "".join(seen)
    finally:
        for p in (driver, node):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(10)
        if driver.stdout is not None:
            driver.stdout.close()
        if driver.stdin is not None:
            driver.stdin.close()
