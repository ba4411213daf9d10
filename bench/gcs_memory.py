"""GCS memory per task over a long run with its tables in Redis.

    python bench/gcs_memory.py [--tasks 200000] [--warmup 20000] [--batch 1000]

Starts a ``redis-server`` on a free loopback port, a one-node cluster whose GCS keeps
its tables there, and runs no-op tasks in batches of ``--batch`` (submit, then ``get``
the batch). The GCS's resident memory (RSS) is read after ``--warmup`` tasks and at
the end; the difference divided by the tasks in between is its growth per task. The
task-event log is bounded (``task_event_max_records`` and ``task_event_max_bytes`` in
the GCS; its Redis stream keeps the batches of the records the GCS holds), so the aim
is a flat line: under 1 KB per task after warm-up.

Prints the RSS samples, a summary and one JSON line (``RESULT {...}``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any

import psutil

import lumos
from lumos.testing import Cluster

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gcs_failover import start_redis, stop_redis  # noqa: E402  (the bench folder is not a package)


@lumos.remote
def noop() -> None:
    return None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=int, default=200_000)
    p.add_argument("--warmup", type=int, default=20_000)
    p.add_argument("--batch", type=int, default=1_000)
    args = p.parse_args()
    if not 0 < args.warmup < args.tasks or args.batch <= 0:
        raise SystemExit("need 0 < --warmup < --tasks and --batch > 0")

    data_dir = tempfile.mkdtemp(prefix="lumos-bench-redis-")
    redis_proc, port = start_redis(data_dir)
    cluster = None
    try:
        cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 2, "_system_config": {
                "gcs_storage": f"redis://127.0.0.1:{port}",
                # On a loaded machine a starved raylet can miss 5 s of heartbeats and be
                # declared dead, which ends the run; liveness is not what this measures.
                "node_death_timeout_ms": 60_000}})
        cluster.connect()
        gcs_proc = cluster._head_processes().gcs_proc
        assert gcs_proc is not None
        gcs = psutil.Process(gcs_proc.pid)
        redis = psutil.Process(redis_proc.pid)
        samples: list[tuple[int, int, int]] = []  # (tasks done, GCS RSS, Redis RSS)
        done = 0
        warm_rss = 0
        start = time.monotonic()
        while done < args.tasks:
            n = min(args.batch, args.tasks - done)
            lumos.get([noop.remote() for _ in range(n)], timeout=300)
            done += n
            if done == args.warmup or done % (args.tasks // 10) == 0 or done == args.tasks:
                time.sleep(0.3)  # the task-event flush of the last batch reaches the GCS
                rss = gcs.memory_info().rss
                samples.append((done, rss, redis.memory_info().rss))
                print(f"{done:>8} tasks  GCS RSS {rss / 2**20:8.1f} MiB  "
                      f"Redis RSS {samples[-1][2] / 2**20:8.1f} MiB", flush=True)
                if done == args.warmup:
                    warm_rss = rss
        wall = time.monotonic() - start
        end_rss = samples[-1][1]
        per_task = (end_rss - warm_rss) / (args.tasks - args.warmup)
        # The second half alone: past the task log's bound the line should be flat.
        mid = min((smp for smp in samples if smp[0] >= args.tasks // 2), key=lambda smp: smp[0])
        per_task_late = (end_rss - mid[1]) / (args.tasks - mid[0]) if mid[0] < args.tasks else 0.0
        result: dict[str, Any] = {
            "tasks": args.tasks, "warmup": args.warmup, "wall_s": wall, "tasks_per_s": args.tasks / wall,
            "gcs_rss_after_warmup_mib": warm_rss / 2**20, "gcs_rss_end_mib": end_rss / 2**20,
            "gcs_bytes_per_task_after_warmup": per_task,
            "gcs_bytes_per_task_second_half": per_task_late,
            "redis_rss_end_mib": samples[-1][2] / 2**20,
        }
        print(f"GCS growth after warm-up: {per_task:.1f} bytes per task "
              f"({warm_rss / 2**20:.1f} -> {end_rss / 2**20:.1f} MiB over {args.tasks - args.warmup} tasks), "
              f"{per_task_late:.1f} bytes per task over the second half; "
              f"{args.tasks / wall:,.0f} tasks/s")
        print("RESULT", json.dumps(result))
    finally:
        if cluster is not None:
            cluster.shutdown()
        stop_redis(redis_proc, data_dir)


if __name__ == "__main__":
    main()
