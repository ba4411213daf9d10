"""Client-visible cost of a GCS restart over Redis: a task probe while the GCS is down.

    python bench/gcs_failover.py [--period-ms 20] [--outage-s 2] [--before-s 3] [--after-s 3]

Starts a ``redis-server`` on a free loopback port (its data in a temporary directory), a
one-node cluster whose GCS keeps its tables there, and a driver thread that submits a
no-op task and ``get``s it every ``--period-ms``. After ``--before-s`` the GCS is
SIGKILLed; ``--outage-s`` later it is started again on its address
(``Cluster.restart_gcs()``), and the driver at once creates an actor and calls it.
Reports:

- probe latency p50 outside the outage, and max / p99 for probes started between the
  kill and the restarted GCS's readiness (the paper's Fig. 10a: < 30 ms client-visible
  for its chain-replicated GCS; the aim is tasks that never wait for the GCS);
- restart to first actor creation: from spawning the new GCS to the first actor's
  first method call returning (GCS start and recovery, the driver's reconnect, the
  actor's lease and worker start).

Prints a table and one JSON line (``RESULT {...}``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from typing import Any

import lumos
from lumos.testing import Cluster


@lumos.remote
def noop() -> None:
    return None


@lumos.remote(num_cpus=0)
class Pinger:
    def ping(self) -> int:
        return 1


def start_redis(data_dir: str) -> tuple[subprocess.Popen[bytes], int]:
    exe = shutil.which("redis-server")
    if exe is None:
        raise SystemExit("redis-server is not installed")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--dir", data_dir, "--save", "",
                             "--appendonly", "yes", "--appendfsync", "everysec",
                             "--logfile", os.path.join(data_dir, "redis.log")],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return proc, port
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"redis-server did not start; see {data_dir}/redis.log")


def stop_redis(proc: subprocess.Popen[bytes], data_dir: str) -> None:
    """Stop a server ``start_redis`` started and remove its data directory."""
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
    shutil.rmtree(data_dir, ignore_errors=True)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--period-ms", type=float, default=20.0)
    p.add_argument("--outage-s", type=float, default=2.0)
    p.add_argument("--before-s", type=float, default=3.0)
    p.add_argument("--after-s", type=float, default=3.0)
    args = p.parse_args()

    data_dir = tempfile.mkdtemp(prefix="lumos-bench-redis-")
    redis_proc, port = start_redis(data_dir)
    cluster = None
    try:
        cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 2, "_system_config": {"gcs_storage": f"redis://127.0.0.1:{port}"}})
        cluster.connect()
        lumos.get([noop.remote() for _ in range(10)], timeout=60)  # warm workers
        probes: list[tuple[float, float]] = []  # (start, latency), monotonic seconds
        errors: list[str] = []
        stop = threading.Event()

        def probe() -> None:
            period = args.period_ms / 1000
            while not stop.is_set():
                t0 = time.monotonic()
                try:
                    lumos.get(noop.remote(), timeout=60)
                except lumos.exceptions.LumosError as e:
                    errors.append(f"{type(e).__name__}: {e}")
                probes.append((t0, time.monotonic() - t0))
                time.sleep(max(0.0, period - (time.monotonic() - t0)))

        prober = threading.Thread(target=probe, name="bench.probe", daemon=True)
        prober.start()
        time.sleep(args.before_s)
        killed = time.monotonic()
        cluster.kill_gcs()
        time.sleep(args.outage_s)
        restart = time.monotonic()
        cluster.restart_gcs()  # from this thread: the GCS dies with the thread that started it
        ready = time.monotonic()
        actor = Pinger.remote()
        lumos.get(actor.ping.remote(), timeout=120)
        first_actor = time.monotonic()
        time.sleep(args.after_s)
        stop.set()
        prober.join(120)

        during = [lat for t0, lat in probes if killed <= t0 <= ready]
        outside = [lat for t0, lat in probes if not killed <= t0 <= ready]
        result: dict[str, Any] = {
            "probes": len(probes), "probes_during_outage": len(during), "probe_errors": len(errors),
            "outage_s": ready - killed,
            "p50_outside_ms": percentile(outside, 0.5) * 1000,
            "p99_during_ms": percentile(during, 0.99) * 1000,
            "max_during_ms": max(during, default=float("nan")) * 1000,
            "gcs_restart_to_ready_s": ready - restart,
            "restart_to_first_actor_s": first_actor - restart,
        }
        print(f"{'metric':<40} {'value':>10}")
        for label, key, unit in [("probes (all / during outage / errors)", None, ""),
                                 ("outage: kill to restarted GCS ready", "outage_s", "s"),
                                 ("probe latency p50 outside the outage", "p50_outside_ms", "ms"),
                                 ("probe latency p99 during the outage", "p99_during_ms", "ms"),
                                 ("probe latency max during the outage", "max_during_ms", "ms"),
                                 ("GCS restart to ready", "gcs_restart_to_ready_s", "s"),
                                 ("restart to first actor creation", "restart_to_first_actor_s", "s")]:
            if key is None:
                print(f"{label:<40} {len(probes):>4} / {len(during)} / {len(errors)}")
            else:
                print(f"{label:<40} {result[key]:>10.3f} {unit}")
        for e in errors[:3]:
            print("probe error:", e)
        print("RESULT", json.dumps(result))
    finally:
        if cluster is not None:
            cluster.shutdown()
        stop_redis(redis_proc, data_dir)


if __name__ == "__main__":
    main()
