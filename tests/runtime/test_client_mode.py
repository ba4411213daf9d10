"""Client mode (``lumos://``) from another network namespace, with no lumos node there.

```
 namespace <n>h (10.200.0.1)                         namespace <n>w (10.200.0.2)
 lumos start --head --block                          client.py: lumos.init("lumos://10.200.0.1:P")
   GCS, raylet, client server :P ◄──── veth ────►     (no raylet, private /dev/shm and session root)
   └─ session (a driver for the client)               checker.py: a second client, after the first is gone
```
One head serves the whole story, driven step by step over the client's stdin/stdout:
tasks, actors, put/get/wait of a large array, errors; the link cut under a running
``get`` (``ConnectionError`` naming the head) and restored within the grace period
(the same session resumes: actor state and refs survive); then the client killed, and
a second client sees the first one's actor dead and its objects freed.
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
from tests.runtime.test_netns import HEAD_IP, _in_namespace, _lines, _ns_pids, veth_pair  # noqa: F401

CLIENT_PORT = 10071
GCS_PORT = 6391
CONFIG = {**TEST_CONFIG, "client_heartbeat_interval_s": 0.5, "client_heartbeat_timeout_s": 6.0,
          "client_reconnect_grace_s": 20.0}

CLIENT = r'''
import json, os, sys, time
import numpy as np
import lumos
address, token_file = sys.argv[1:3]

def step(name, **data):
    # One write: print() writes the line and its newline apart, and a worker's forwarded
    # output line can land between the two.
    sys.stdout.write(name + " " + json.dumps(data) + "\n")
    sys.stdout.flush()

def wait_for_line(word):
    line = sys.stdin.readline()
    assert line.strip() == word, line

ctx = lumos.init(address, _token=token_file)

@lumos.remote
def square(x):
    return x * x

@lumos.remote
def total(arr):
    return float(arr.sum()), lumos.get_runtime_context().get_node_id()

@lumos.remote
def fail():
    raise KeyError("no such key: 7")

@lumos.remote
def slow(s):
    time.sleep(s)
    return s

@lumos.remote
def nested():
    return [square.remote(3)]

@lumos.remote
class Counter:
    def __init__(self):
        self.n = 0
    def incr(self, by=1):
        self.n += by
        print("incremented to", self.n)
        return self.n

arr = np.arange(8 << 20, dtype=np.float64)          # 64 MiB
ref = lumos.put(arr)
back = lumos.get(ref, timeout=120)
counter = Counter.remote()
refs = [square.remote(i) for i in range(10)]
ready, not_ready = lumos.wait(refs, num_returns=10, timeout=60)
try:
    lumos.get(fail.remote(), timeout=60)
    error = None
except KeyError as e:
    error = [type(e).__name__, "no such key: 7" in str(e)]
inner = lumos.get(nested.remote(), timeout=60)[0]
step("BASIC",
     squares=lumos.get(refs, timeout=60), waited=[len(ready), len(not_ready)],
     roundtrip=bool(np.array_equal(back, arr)), readonly=not back.flags.writeable,
     remote_sum=lumos.get(total.remote(ref), timeout=120)[0] == float(arr.sum()),
     calls=lumos.get([counter.incr.remote() for _ in range(3)], timeout=60), error=error,
     nested=lumos.get(inner, timeout=60),
     node_ips=sorted({n["NodeManagerAddress"] for n in lumos.nodes()}), here=ctx.address_info["node_ip_address"],
     dashboard=ctx.dashboard_url)
del back

step("CUT_ME")
try:
    lumos.get(slow.remote(30), timeout=60)
    step("NOT_CUT")
except ConnectionError as e:
    step("CUT", message=str(e))
wait_for_line("restored")
step("RESUMED", calls=lumos.get(counter.incr.remote(10), timeout=60),
     same=bool(np.array_equal(lumos.get(ref, timeout=120)[:5], arr[:5])))

step("KILL_ME", actor=counter._actor_id.hex())
time.sleep(600)
'''

CHECKER = r'''
import json, sys, time
import lumos
address, token_file, actor = sys.argv[1:4]
lumos.init(address, _token=token_file)
deadline = time.monotonic() + 90
state, used = None, None
while time.monotonic() < deadline:
    state = next((a["state"] for a in lumos.state.list_actors(all_jobs=True) if a["actor_id"] == actor), None)
    used = lumos.cluster_resources()["object_store_memory"] - lumos.available_resources()["object_store_memory"]
    if state == "DEAD" and used < (32 << 20):
        break
    time.sleep(0.5)
print("CHECK " + json.dumps({"actor_state": state, "store_used": used}), flush=True)
lumos.shutdown()
'''


def _next(out: "queue.Queue[str]", seen: list[str], word: str, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            line = out.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"no {word} line within {timeout_s}s:\n{''.join(seen)}") from None
        seen.append(line)
        if line.startswith(word + " "):
            return json.loads(line[len(word) + 1:])  # type: ignore[no-any-return]


def _seen(out: "queue.Queue[str]", seen: list[str], text: str, timeout_s: float, why: str) -> None:
    """Wait until a line holding ``text`` has been read."""
    deadline = time.monotonic() + timeout_s
    while not any(text in line for line in seen):
        try:
            seen.append(out.get(timeout=max(0.1, deadline - time.monotonic())))
        except queue.Empty:
            raise AssertionError(f"{why}:\n{''.join(seen)}") from None


def _stop(proc: subprocess.Popen[str], readers: list[Any]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    for reader in readers:
        reader.join(10)
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None:
            try:
                pipe.close()
            except BrokenPipeError:
                pass


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_client_in_another_network_namespace_runs_work_survives_a_cut_and_is_cleaned_up_when_gone(
        veth_pair: tuple[str, str, str], tmp_path: Any) -> None:
    head_ns, client_ns, root = veth_pair
    lumos_bin = os.path.join(os.path.dirname(sys.executable), "lumos")
    head = _in_namespace(head_ns, root, [
        lumos_bin, "start", "--head", "--node-ip-address", HEAD_IP, "--port", str(GCS_PORT),
        "--client-server-port", str(CLIENT_PORT), "--num-cpus", "2", "--object-store-memory", str(512 << 20),
        "--no-dashboard", "--system-config", json.dumps(CONFIG), "--block"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    procs = [head]
    readers: dict[int, list[Any]] = {}
    try:
        assert head.stdout is not None
        head_out, reader = _lines(head.stdout)
        readers[head.pid] = [reader]
        seen: list[str] = []
        token, address = "", ""
        deadline = time.monotonic() + 60
        while not (token and address):
            try:
                line = head_out.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"the head did not start: {''.join(seen)}") from None
            seen.append(line)
            if "export LUMOS_CLUSTER_TOKEN=" in line:
                token = line.split("=", 1)[1].strip()
            if "client address:" in line:
                address = line.split("client address:", 1)[1].strip()
        assert address == f"lumos://{HEAD_IP}:{CLIENT_PORT}"
        token_file = tmp_path / "token"
        token_file.write_text(token)
        token_file.chmod(0o600)
        (tmp_path / "client.py").write_text(CLIENT)
        (tmp_path / "checker.py").write_text(CHECKER)

        client = _in_namespace(client_ns, root, [sys.executable, str(tmp_path / "client.py"), address,
                                                 str(token_file)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        procs.append(client)
        assert client.stdout is not None and client.stdin is not None
        out, reader = _lines(client.stdout)
        readers[client.pid] = [reader]
        lines: list[str] = []
        basic = _next(out, lines, "BASIC", 180)
        assert basic["squares"] == [i * i for i in range(10)] and basic["waited"] == [10, 0]
        assert basic["roundtrip"] and basic["readonly"] and basic["remote_sum"]
        assert basic["calls"] == [1, 2, 3]
        assert basic["error"] is not None and basic["error"][1], basic["error"]
        assert basic["nested"] == 9
        assert basic["node_ips"] == [HEAD_IP] and basic["here"] == HEAD_IP  # no node on the client's side
        _next(out, lines, "CUT_ME", 30)
        time.sleep(1.0)  # the slow task is submitted and its get is in flight
        dev = f"{head_ns[:-1]}b"
        subprocess.run(["ip", "-n", client_ns, "link", "set", dev, "down"], check=True, timeout=30)
        try:
            cut = _next(out, lines, "CUT", 60)
        finally:
            subprocess.run(["ip", "-n", client_ns, "link", "set", dev, "up"], check=True, timeout=30)
        assert f"{HEAD_IP}:{CLIENT_PORT}" in cut["message"], cut
        client.stdin.write("restored\n")
        client.stdin.flush()
        resumed = _next(out, lines, "RESUMED", 90)
        assert resumed == {"calls": 13, "same": True}, resumed
        actor = _next(out, lines, "KILL_ME", 30)["actor"]
        # The actor's print travels on its own (worker -> raylet -> GCS -> session), so it may
        # come after the lines the client printed once its get returned.
        _seen(out, lines, "incremented to 13", 30, "worker output did not reach the client")
        client.kill()  # gone for good: no goodbye, the session waits out its grace period
        client.wait(30)

        checker = _in_namespace(client_ns, root, [sys.executable, str(tmp_path / "checker.py"), address,
                                                  str(token_file), actor],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        procs.append(checker)
        text, _ = checker.communicate(timeout=150)
        checks = [line for line in text.splitlines() if line.startswith("CHECK ")]
        assert checker.returncode == 0 and checks, text
        check = json.loads(checks[0][len("CHECK "):])
        assert check["actor_state"] == "DEAD", check
        assert check["store_used"] < (32 << 20), check
    finally:
        for p in reversed(procs):
            _stop(p, readers.get(p.pid, []))
        deadline = time.monotonic() + 15
        while any(_ns_pids(ns) for ns in (head_ns, client_ns)) and time.monotonic() < deadline:
            time.sleep(0.2)
