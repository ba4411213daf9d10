"""A scaling model from CPU cost per task in each process role, measured on one machine.

    python bench/scaling_model.py [--tasks 5000] [--nodes 1 2 4 8 16 32 64] [--cores 1 2 4 16]

No machine here has more than a few cores, so ``bench/scaling.py``'s measured table
shows the cores, not lumos, as the ceiling. This script measures what each task costs
each process role instead, and projects throughput from it:

1. CPU microseconds per task of the driver, the raylet(s), the workers and the GCS:
   ``utime + stime`` from ``/proc/<pid>/stat`` before and after a run of N empty tasks
   (submitted in batches, as ``scaling.py`` does), divided by N. The pids come from the
   cluster (``lumos.testing.Cluster``); a worker started during the run counts from 0.
2. Two paths, each with tasks pipelined on leased workers (what a batch of submits
   does) and with a new lease per task (tasks one at a time, leases returned at once).
   **local**: a one-node cluster, every task runs where it was submitted
   (the local scheduler grants the leases; the GCS is not asked). **spilled**: a
   two-node cluster whose tasks need a resource only the second node has, so the
   driver's raylet cannot run them and forwards every lease request to the global
   scheduler in the GCS, and the tasks run on the other node.
3. Projection (paper setup: drivers on every node, each node with ``C`` cores):
   a node runs at most ``C / (driver + raylet + worker)`` tasks per CPU-second, and no
   faster than its single-threaded raylet (``1 / raylet``) allows; ``N`` nodes run ``N``
   times that, up to what one GCS process can serve (``1 / gcs``, per task that
   involves it). The local path's GCS cost is its task-event log only, so the ceiling is
   far off; the spilled path's GCS cost bounds a cluster where every task spills.

``--measured`` adds ``scaling.py``'s measured table from the same machine (slow).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

ROLES = ("driver", "raylet", "worker", "gcs")
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """``utime + stime`` of a process, in seconds (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) * TICK_S


def _children(pid: int) -> list[int]:
    import psutil
    try:
        return [c.pid for c in psutil.Process(pid).children()]
    except psutil.Error:
        return []


def cluster_pids(cluster: Any) -> dict[int, str]:
    """pid -> role for every process of ``cluster`` and this driver."""
    pids = {os.getpid(): "driver"}
    head = cluster.head_node._processes
    if head.gcs_proc is not None:
        pids[head.gcs_proc.pid] = "gcs"
    for node in cluster.list_all_nodes():
        pids[node.raylet_pid] = "raylet"
        for child in _children(node.raylet_pid):
            pids[child] = "worker"
    return pids


def _cpu_by_role(pids: dict[int, str], before: dict[int, float]) -> dict[str, float]:
    out = {role: 0.0 for role in ROLES}
    for pid, role in pids.items():
        out[role] += cpu_seconds(pid) - before.get(pid, 0.0)
    return out


def measure(cluster: Any, run: Any, n: int) -> dict[str, float]:
    """CPU microseconds per task of each role over ``run()`` (``n`` tasks), less what each
    role burns idle over as long (heartbeats, resource reports), measured right after."""
    pids = cluster_pids(cluster)
    before = {pid: cpu_seconds(pid) for pid in pids}
    t = time.perf_counter()
    run()
    wall = time.perf_counter() - t
    pids = {**pids, **cluster_pids(cluster)}  # workers started meanwhile count from 0
    busy = _cpu_by_role(pids, before)
    before = {pid: cpu_seconds(pid) for pid in pids}
    time.sleep(wall)
    idle = _cpu_by_role(pids, before)
    out = {role: max(0.0, busy[role] - idle[role]) / n * 1e6 for role in ROLES}
    out["tasks_per_s"] = n / wall
    return out


def _batched(ray: Any, fn: Any, n: int, batch: int = 500) -> None:
    for _ in range(n // batch):
        ray.get([fn.remote() for _ in range(batch)], timeout=600)


def _one_by_one(ray: Any, fn: Any, n: int) -> None:
    for _ in range(n):
        ray.get(fn.remote(), timeout=600)


def measure_path(spill: bool, lease_per_task: bool, n: int, repeats: int,
                 defer_events: bool = False) -> dict[str, float]:
    """Median per-task costs over ``repeats`` runs of ``n`` tasks on the local or spilled
    path. ``lease_per_task``: tasks one at a time, each on a new lease (the owner returns
    an idle lease at once), so every task is scheduled; else batches pipelined on leases.
    ``defer_events``: task events stay buffered in their processes during the run, which
    leaves the GCS only what scheduling asks of it."""
    import lumos
    from lumos.testing import Cluster
    config: dict[str, Any] = {"lease_idle_timeout_ms": 0} if lease_per_task else {}
    if defer_events:
        config["task_event_flush_interval_ms"] = 3_600_000
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "_system_config": config})
    try:
        if spill:
            cluster.add_node(num_cpus=1, resources={"far": 1})
        cluster.connect()
        opts = {"resources": {"far": 0.001}} if spill else {}

        @lumos.remote(**opts)
        def noop() -> None:
            return None

        submit = _one_by_one if lease_per_task else _batched
        submit(lumos, noop, 500)  # warm-up: workers started, function exported
        runs = [measure(cluster, lambda: submit(lumos, noop, n), n) for _ in range(repeats)]
    finally:
        cluster.shutdown()
    return {k: sorted(r[k] for r in runs)[len(runs) // 2] for k in runs[0]}


def project(cost: dict[str, float], nodes: int, cores: int, gcs_share: float = 1.0) -> float:
    """Tasks/s of ``nodes`` nodes of ``cores`` cores, from per-task CPU microseconds.

    ``gcs_share``: the fraction of tasks whose cost includes ``cost["gcs"]``."""
    node_cpu = cost["driver"] + cost["raylet"] + cost["worker"]
    per_node = min(cores * 1e6 / node_cpu, 1e6 / max(cost["raylet"], 1e-9))
    gcs = cost["gcs"] * gcs_share
    ceiling = 1e6 / gcs if gcs > 0 else float("inf")
    return min(nodes * per_node, ceiling)


def _fmt(v: float) -> str:
    return "∞" if v == float("inf") else f"{v:,.0f}"


def report(costs: dict[str, dict[str, float]], nodes: list[int], cores: list[int]) -> str:
    lines = ["CPU microseconds per empty task, by process role (median of runs):", "",
             "| path | driver | raylet | worker | GCS | total | GCS share | measured tasks/s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for path, c in costs.items():
        total = sum(c[r] for r in ROLES)
        lines.append(f"| {path} | {c['driver']:.0f} | {c['raylet']:.0f} | {c['worker']:.0f} | {c['gcs']:.1f} | "
                     f"{total:.0f} | {c['gcs'] / total:.1%} | {c['tasks_per_s']:,.0f} |")
    for path, c in costs.items():
        lines += ["", f"Projected tasks/s, {path} path (nodes x cores per node; drivers on every node):", "",
                  "| nodes | " + " | ".join(f"{k} cores" for k in cores) + " |",
                  "|---:|" + "---:|" * len(cores)]
        for n in nodes:
            lines.append(f"| {n} | " + " | ".join(_fmt(project(c, n, k)) for k in cores) + " |")
        if c["gcs"] > 0:
            lines.append(f"\nGCS ceiling on this path: {_fmt(1e6 / c['gcs'])} tasks/s (one GCS process, one core)")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", type=int, default=5000, help="empty tasks per measured run")
    p.add_argument("--repeats", type=int, default=3, help="runs per path (the median is used)")
    p.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    p.add_argument("--cores", type=int, nargs="+", default=[1, 2, 4, 16])
    p.add_argument("--measured", action="store_true", help="also run bench/scaling.py here")
    p.add_argument("--json", action="store_true", help="also print the per-task costs as one JSON line")
    args = p.parse_args()
    if args.tasks < 500 or args.repeats < 1:
        p.error("--tasks must be >= 500 and --repeats >= 1")
    load = os.getloadavg()
    print(f"machine: {os.cpu_count()} cores, load average {load[0]:.2f} before the run", flush=True)
    one = max(500, args.tasks // 5)  # a lease per task is slower: fewer tasks
    costs = {"local, pipelined": measure_path(False, False, args.tasks, args.repeats),
             "local, pipelined, event log deferred": measure_path(False, False, args.tasks, args.repeats, True),
             "spilled, pipelined": measure_path(True, False, args.tasks, args.repeats),
             "local, a lease per task": measure_path(False, True, one, args.repeats),
             "spilled, a lease per task": measure_path(True, True, one, args.repeats)}
    print(report(costs, args.nodes, args.cores))
    if args.json:
        print(json.dumps(costs))
    if args.measured:
        here = os.path.dirname(os.path.abspath(__file__))
        print("\nbench/scaling.py on this machine:", flush=True)
        subprocess.run([sys.executable, os.path.join(here, "scaling.py"), "--nodes", "1", "2", "4",
                        "--tasks", "3000"], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
