"""Empty-task throughput as the cluster grows (the paper's Figure 8), on one machine.

    python bench/scaling.py [--nodes 1 2 4 8] [--drivers-per-node 1] [--tasks 5000] [--baseline]
                             [--local-only] [--defer-events] [--lease-idle-ms MS]

For each cluster size N: a head plus N-1 nodes of one CPU each (``lumos.testing.Cluster``,
real raylet processes), and N x ``--drivers-per-node`` driver *processes*, driver i
attached to node i mod N (as in the paper, every node has drivers submitting). Each
driver warms up, waits for the common start signal, submits ``--tasks`` empty tasks
(at most ``--window`` in flight) and reports its start and end. Throughput is all tasks
over the span from the first start to the last end. Prints a table.

Issue 4 target: on a machine with more cores than nodes (16 on the GPU machine),
throughput grows near-linearly with nodes. On a small machine the cores, not lumos,
are the ceiling: every node's raylet, worker and driver share them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any


def _driver(args: argparse.Namespace) -> int:
    """One driver process: attach to node ``--node-id``, warm up, wait for GO, submit."""
    import lumos
    from lumos._private import worker_context
    _attach(args.address, args.token, args.node_id, args.system_config)

    @lumos.remote
    def noop() -> None:
        return None

    if args.local_only:
        from lumos.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        noop = noop.options(scheduling_strategy=NodeAffinitySchedulingStrategy(args.node_id, soft=False))
    lumos.get([noop.remote() for _ in range(args.warmup)], timeout=300)
    # Where this driver's leases are granted during the run: on its own node (the local
    # scheduler) or spilled to another one (private API: a benchmark's diagnostic).
    leases: list[str] = []
    submitter = worker_context.require().submitter
    granted = submitter.lease_granted

    def counting(q: Any, lease: Any) -> None:
        leases.append(lease.node_id.hex())
        granted(q, lease)
    submitter.lease_granted = counting
    print("READY", flush=True)
    if sys.stdin.readline().strip() != "GO":
        return 1
    t0 = time.time()
    pending: list[Any] = []
    for _ in range(args.tasks // args.batch):
        pending.append([noop.remote() for _ in range(args.batch)])
        if len(pending) * args.batch >= args.window:
            lumos.get(pending.pop(0), timeout=600)
    for refs in pending:
        lumos.get(refs, timeout=600)
    t1 = time.time()
    print("RESULT " + json.dumps({"tasks": args.tasks // args.batch * args.batch, "t0": t0, "t1": t1,
                                  "leases": len(leases),
                                  "leases_elsewhere": sum(1 for n in leases if n != args.node_id)}), flush=True)
    lumos.shutdown()
    return 0


def _attach(address: str, token: str, node_id_hex: str, system_config: str) -> None:
    """``lumos.init(address=...)``, but with the driver's core worker on the given node.

    ``init`` attaches to the head's raylet when several nodes share a machine; the paper's
    setup has drivers on every node, so this picks the node (private API: a benchmark).
    """
    from lumos import api
    from lumos._private import worker_context
    from lumos._private.config import Config
    from lumos._private.transport.connection import parse_address
    config = Config.resolve(json.loads(system_config))
    gcs = parse_address(address)
    nodes = [n for n in api._fetch_nodes(config, token.encode(), gcs) if n.state == "ALIVE"]
    node = next(n for n in nodes if n.node_id.hex() == node_id_hex)
    cw = api._start_core_worker(config, token.encode(), gcs, node.address.unix_path, node.session_dir,
                                node.node_id, node.object_store_dir, node.address.host, "")
    worker_context.core_worker = cw
    api._register_exit_handler()


def _spin(seconds: float, q: Any) -> None:
    """Pure-Python work for ``seconds``: loop iterations done (one process of the baseline)."""
    n = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(1000):
            n += 1
    q.put(n)


def machine_work(procs: int, seconds: float = 1.0) -> int:
    """The machine's own parallel capacity: loop iterations that ``procs`` processes of
    pure-Python work do together in ``seconds``. Against the first cluster size's figure
    it shows how the machine itself scales (hyperthreads, shared caches, clock limits),
    with no lumos in the way."""
    import multiprocessing as mp
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    ps = [ctx.Process(target=_spin, args=(seconds, q)) for _ in range(procs)]
    for p in ps:
        p.start()
    done = sum(q.get() for _ in ps)
    for p in ps:
        p.join()
    return done


def _run_size(n_nodes: int, args: argparse.Namespace) -> dict[str, Any]:
    from lumos.testing import Cluster
    system_config: dict[str, Any] = {}
    if args.defer_events:
        system_config["task_event_flush_interval_ms"] = 3_600_000
    if args.lease_idle_ms is not None:
        system_config["lease_idle_timeout_ms"] = args.lease_idle_ms
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "_system_config": system_config})
    drivers: list[subprocess.Popen[str]] = []
    try:
        nodes = [cluster.head_node] + [cluster.add_node(num_cpus=1) for _ in range(n_nodes - 1)]
        n_drivers = n_nodes * args.drivers_per_node
        for i in range(n_drivers):
            node = nodes[i % n_nodes]
            assert node is not None
            drivers.append(subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--_driver", "--address", cluster.address,
                 "--token", cluster.token, "--node-id", node.node_id, "--tasks", str(args.tasks),
                 "--warmup", str(args.warmup), "--batch", str(args.batch), "--window", str(args.window),
                 "--system-config", json.dumps(system_config)] + (["--local-only"] if args.local_only else []),
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
        for d in drivers:
            assert d.stdout is not None
            line = d.stdout.readline()
            if line.strip() != "READY":
                raise RuntimeError(f"a driver failed to start (exit {d.poll()}): {line!r}")
        for d in drivers:
            assert d.stdin is not None
            d.stdin.write("GO\n")
            d.stdin.flush()
        results = []
        for d in drivers:
            out, _ = d.communicate(timeout=900)
            rows = [line for line in out.splitlines() if line.startswith("RESULT ")]
            if d.returncode != 0 or not rows:
                raise RuntimeError(f"a driver failed (exit {d.returncode}): {out[-2000:]}")
            results.append(json.loads(rows[0][len("RESULT "):]))
        total = sum(r["tasks"] for r in results)
        span = max(r["t1"] for r in results) - min(r["t0"] for r in results)
        spans = [r["t1"] - r["t0"] for r in results]
        return {"nodes": n_nodes, "drivers": n_drivers, "tasks": total, "seconds": span,
                "tasks_per_s": total / span, "driver_seconds": [round(x, 3) for x in spans],
                "leases": sum(r["leases"] for r in results),
                "leases_elsewhere": sum(r["leases_elsewhere"] for r in results)}
    finally:
        for d in drivers:
            if d.poll() is None:
                d.kill()
                d.communicate()
        cluster.shutdown()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 4, 8], help="cluster sizes to measure")
    p.add_argument("--drivers-per-node", type=int, default=1)
    p.add_argument("--tasks", type=int, default=5000, help="empty tasks per driver")
    p.add_argument("--warmup", type=int, default=200, help="tasks per driver before the clock starts")
    p.add_argument("--batch", type=int, default=500, help="tasks submitted between gets")
    p.add_argument("--window", type=int, default=2000, help="most tasks in flight per driver")
    p.add_argument("--json", action="store_true", help="also print the rows as one JSON line")
    p.add_argument("--baseline", action="store_true",
                   help="also measure the machine's own scaling with as many busy processes (driver and "
                        "worker per node) running plain Python")
    p.add_argument("--local-only", action="store_true",
                   help="pin each driver's tasks to its own node (NodeAffinity, soft=False): the local "
                        "scheduler's path alone, with no leases spilled to other drivers' nodes")
    p.add_argument("--lease-idle-ms", type=int, default=None,
                   help="lease_idle_timeout_ms (default 200): how long an owner keeps an idle worker; a long "
                        "one keeps each driver's warm-up lease on its own node until the start")
    p.add_argument("--defer-events", action="store_true",
                   help="hold the task-event log past the run (the GCS's only per-task work)")
    # Internal: run as one driver process.
    p.add_argument("--_driver", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--address", help=argparse.SUPPRESS)
    p.add_argument("--token", help=argparse.SUPPRESS)
    p.add_argument("--node-id", help=argparse.SUPPRESS)
    p.add_argument("--system-config", default="{}", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args._driver:
        return _driver(args)
    if min(args.nodes) < 1 or args.drivers_per_node < 1 or args.tasks < args.batch or args.batch < 1:
        p.error("--nodes and --drivers-per-node must be >= 1, and --tasks >= --batch >= 1")
    print(f"empty tasks, {args.tasks} per driver, {args.drivers_per_node} driver(s) per node, "
          f"one CPU per node; machine: {os.cpu_count()} cores"
          + ("; each driver's tasks pinned to its node" if args.local_only else ""), flush=True)
    rows = []
    for n in args.nodes:
        row = _run_size(n, args)
        if args.baseline:
            row["machine_work"] = machine_work(2 * row["drivers"])
        rows.append(row)
        print(f"  measured {n} node(s): {row['tasks_per_s']:,.0f} tasks/s", flush=True)
    base = rows[0]["tasks_per_s"] / rows[0]["nodes"]
    extra = f" {'machine':>8}" if args.baseline else ""
    print(f"\n{'nodes':>5} {'drivers':>7} {'tasks':>8} {'seconds':>8} {'tasks/s':>10} {'vs linear':>9} "
          f"{'drivers s':>11} {'leases':>9}{extra}")
    for r in rows:
        ds = r["driver_seconds"]
        spread = f"{min(ds):.2f}-{max(ds):.2f}"
        leases = f"{r['leases']}/{r['leases_elsewhere']}"
        extra = (f" {r['machine_work'] / (rows[0]['machine_work'] * r['nodes'] / rows[0]['nodes']):>8.0%}"
                 if args.baseline else "")
        print(f"{r['nodes']:>5} {r['drivers']:>7} {r['tasks']:>8} {r['seconds']:>8.2f} "
              f"{r['tasks_per_s']:>10,.0f} {r['tasks_per_s'] / (base * r['nodes']):>8.0%} {spread:>11} "
              f"{leases:>9}{extra}")
    print("\ndrivers s: the fastest and slowest driver's own time; leases: granted during the run / of "
          "them on another node than the driver's")
    if args.baseline:
        print("\nmachine: plain Python in 2 processes per node (the busy driver and worker) at once, "
              "against linear from the first size; the ceiling of any scaling on this machine")
    if args.json:
        print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
