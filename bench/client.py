"""Client mode against Ray Client: a driver that reaches the cluster only through its client port.

    python bench/client.py --impl lumos          # lumos://, one run
    python bench/client.py --impl ray            # ray://, one run (ray[client] importable)
    python bench/client.py --compare [--ray-python PATH]   # both in one run, then the ratio table

Each implementation starts its own head in the foreground (``lumos start --head --block``
with its client server; ``ray start --head --block`` with its Ray Client server) as a
child process of this script, connects a driver through the client address only, and
stops the head by its pid (never ``ray stop``, which would end every Ray of this user).

Measured (best or median of several, after a warm-up):

- task round trip: ``get(f.remote())`` of a no-op task, one at a time (median, ms);
- actor call round trip (median, ms);
- 100 MiB ``put`` of a numpy array (best, ms) and 100 MiB ``get`` of it (best, ms).

``--ray-python`` runs the Ray side with another interpreter (a virtualenv with
``ray[client]``), so lumos and Ray need not share an environment.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from microbench import format_table  # noqa: E402  (the bench folder is not a package)

MIB = 1 << 20


def _start_head(cmd: list[str], env: dict[str, str], ready: str, timeout_s: float = 300.0
                ) -> tuple[subprocess.Popen[str], list[str]]:
    """Start a foreground head; return it and its output lines up to the one containing ``ready``."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    assert proc.stdout is not None
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()  # type: ignore[union-attr]
    seen: list[str] = []
    deadline = time.monotonic() + timeout_s
    while not any(ready in line for line in seen):
        try:
            seen.append(lines.get(timeout=1.0))
        except queue.Empty:
            if proc.poll() is None and time.monotonic() < deadline:
                continue
            _stop_head(proc)
            raise RuntimeError("the head did not start:\n" + "".join(seen)) from None
    return proc, seen


def _stop_head(proc: subprocess.Popen[str]) -> None:
    """SIGTERM the head's process group (its children too, even when it died first), then SIGKILL."""
    for sig, wait_s in ((signal.SIGTERM, 60.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            continue
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:  # the group's other members
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)


def _measure(rt: Any, quick: bool) -> dict[str, float]:
    n = 50 if quick else 200
    repeat = 2 if quick else 4

    @rt.remote
    def noop() -> None:
        return None

    @rt.remote
    class Echo:
        def ping(self) -> None:
            return None

    def median_ms(call: Any) -> float:
        for _ in range(5):
            call()
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            call()
            times.append(time.perf_counter() - t0)
        times.sort()
        return times[len(times) // 2] * 1000

    results: dict[str, float] = {}
    results["task round trip (ms)"] = median_ms(lambda: rt.get(noop.remote()))
    actor = Echo.remote()
    results["actor call round trip (ms)"] = median_ms(lambda: rt.get(actor.ping.remote()))
    array = np.ones(100 * MIB // 8)
    puts, gets = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        ref = rt.put(array)
        puts.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        value = rt.get(ref)
        gets.append(time.perf_counter() - t0)
        assert value.nbytes == array.nbytes
        del value, ref
    results["put 100 MiB (ms)"] = min(puts) * 1000
    results["get 100 MiB (ms)"] = min(gets) * 1000
    return results


def run_lumos(num_cpus: int, quick: bool) -> dict[str, float]:
    root = tempfile.mkdtemp(prefix="lumos-bench-client-")
    os.chmod(root, 0o700)
    env = dict(os.environ, LUMOS_TMPDIR=root, PYTHONUNBUFFERED="1")
    env.pop("LUMOS_ADDRESS", None)
    lumos_bin = os.path.join(os.path.dirname(sys.executable), "lumos")
    head, lines = _start_head([lumos_bin, "start", "--head", "--port", "0", "--client-server-port", "0",
                               "--num-cpus", str(num_cpus), "--no-dashboard", "--object-store-memory",
                               str(1024 * MIB), "--block"], env, "The token is in")
    try:
        address = next(line.split("client address:", 1)[1].strip() for line in lines if "client address:" in line)
        token_path = next(line.split("The token is in", 1)[1].strip().rstrip(".") for line in lines
                          if "The token is in" in line)
        import lumos
        lumos.init(address, _token=token_path)
        try:
            return _measure(lumos, quick)
        finally:
            lumos.shutdown()
    finally:
        _stop_head(head)
        shutil.rmtree(root, ignore_errors=True)


def run_ray(num_cpus: int, quick: bool) -> dict[str, float]:
    import socket
    ports = []
    for _ in range(6):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
    temp = tempfile.mkdtemp(prefix="ray-bench-client-")
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1")
    env.setdefault("RAY_raylet_start_wait_time_s", "120")  # a loaded machine starts Ray's raylet slowly
    env.setdefault("RAY_agent_register_timeout_ms", "120000")  # ... and its agents
    # Both sides authenticate, as lumos's do: Ray's token mode (its token file, ~/.ray/auth_token).
    env.setdefault("RAY_AUTH_MODE", "token")
    os.environ.setdefault("RAY_AUTH_MODE", env["RAY_AUTH_MODE"])
    cmd = [ray_bin, "start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(ports[0]),
           "--ray-client-server-port", str(ports[1]), "--metrics-export-port", str(ports[2]),
           "--dashboard-agent-grpc-port", str(ports[3]), "--dashboard-agent-listen-port", str(ports[4]),
           "--runtime-env-agent-port", str(ports[5]), "--num-cpus", str(num_cpus), "--include-dashboard=false",
           "--object-store-memory", str(1024 * MIB), "--temp-dir", temp, "--block"]
    for attempt in range(5):  # Ray's head start times out now and then on a loaded machine
        try:
            head, _ = _start_head(cmd, env, "Ray runtime started")
            break
        except RuntimeError as e:
            if attempt == 4:
                raise
            print(f"ray start failed; trying again: {str(e)[-300:]}", file=sys.stderr)
    try:
        import ray
        # Ray binds its client server to the machine's address whatever --node-ip-address says.
        hosts = ["127.0.0.1", socket.gethostbyname(socket.gethostname())]
        for attempt in range(30):  # the client server starts a moment after the head reports
            try:
                ray.init(f"ray://{hosts[attempt % 2]}:{ports[1]}", log_to_driver=False)
                break
            except ConnectionError:
                if attempt == 29:
                    raise
                time.sleep(1)
        try:
            return _measure(ray, quick)
        finally:
            ray.shutdown()
    finally:
        _stop_head(head)
        shutil.rmtree(temp, ignore_errors=True)


def compare(args: argparse.Namespace) -> int:
    cols: dict[str, dict[str, float]] = {}
    for impl, python in (("ray", args.ray_python), ("lumos", sys.executable)):
        cmd = [python, os.path.abspath(__file__), "--impl", impl, "--json", "--num-cpus", str(args.num_cpus)]
        if args.quick:
            cmd.append("--quick")
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if out.returncode != 0:
            print(f"{impl} failed:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}", file=sys.stderr)
            return 1
        cols[impl] = json.loads(out.stdout.strip().splitlines()[-1])
    print(format_table(cols["ray"], cols["lumos"], "client mode (driver off the cluster)"))
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--impl", choices=["ray", "lumos"], default="lumos")
    p.add_argument("--compare", action="store_true", help="run both and print the ratio table")
    p.add_argument("--ray-python", default=os.environ.get("RAY_PYTHON", sys.executable),
                   help="interpreter with ray[client] for the Ray side of --compare (default: this one)")
    p.add_argument("--num-cpus", type=int, default=2)
    p.add_argument("--json", action="store_true", help="print results as one JSON line")
    p.add_argument("--quick", action="store_true", help="shorter runs (noisier)")
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the head we started on the way out
    if args.compare:
        return compare(args)
    results = run_ray(args.num_cpus, args.quick) if args.impl == "ray" else run_lumos(args.num_cpus, args.quick)
    if args.json:
        print(json.dumps(results))
    else:
        for k, v in results.items():
            print(f"{k:40s} {v:12.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
