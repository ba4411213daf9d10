"""The paper's workloads (``lumos.examples``) on Ray and on lumos, with identical code.

    python bench/workloads.py --impl lumos
    python bench/workloads.py --impl ray
    python bench/workloads.py --compare          # both, one after the other, and the ratio

Every workload module takes the Ray-like module as its first argument, so the same
functions run on ``import ray`` and ``import lumos``. Each implementation runs in its own
subprocess on a fresh local cluster with the same number of CPUs. ``ray`` is an optional
extra (``pip install -e ".[bench]"``); lumos must be importable by Ray's workers too
(an editable install in the same environment does it).

Workloads and what is measured:

- ES: CartPole timesteps per second over the iterations (workers already started), and
  the system's overhead per iteration: its wall time less the slowest worker's own
  rollout time (the rest is the same numpy and CartPole work on either system);
- PPO-style: timesteps per second of asynchronous rollouts + parameter-server updates;
- allreduce: median milliseconds of a ring allreduce (and of gather/broadcast);
- serving: p50/p99 latency of one request at a time, and requests per second with
  requests in flight, for a small and a larger input.
"""

from __future__ import annotations

import importlib
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from microbench import bench_main, init_with_retries  # noqa: E402  (the bench folder is not a package)


def run(impl: str, num_cpus: int, quick: bool) -> dict[str, float]:
    if impl == "ray":
        os.environ.setdefault("RAY_raylet_start_wait_time_s", "120")
    ray = importlib.import_module(impl)
    from lumos.examples import allreduce, es, ppo, serving

    scale = 0.3 if quick else 1.0
    init_with_retries(ray, impl, num_cpus)
    results: dict[str, float] = {}
    try:
        workers = max(2, num_cpus)
        es.run(ray, workers=workers, iterations=2)  # warm-up: worker processes, imports
        r = es.run(ray, workers=workers, iterations=max(3, int(15 * scale)))
        results["ES timesteps (/s)"] = r.timesteps_per_s
        results["ES iteration (ms)"] = r.wall_s / len(r.rewards) * 1e3
        results["ES system overhead per iteration (ms)"] = r.overhead_ms

        p = ppo.run(ray, workers=workers, iterations=max(10, int(60 * scale)))
        results["PPO-style timesteps (/s)"] = p.timesteps_per_s
        results["PPO-style updates (/s)"] = p.updates / p.wall_s

        for n, mb in ((4, 1.0), (4, 16.0)):
            a = allreduce.run(ray, workers=n, size_mb=mb, iterations=max(2, int(5 * scale)))
            if not a.correct:
                raise RuntimeError(f"{impl}: allreduce gave a wrong sum")
            results[f"ring allreduce {n}x{mb:g} MiB (ms)"] = float(np.median(a.ring_s)) * 1e3
            results[f"gather/broadcast {n}x{mb:g} MiB (ms)"] = float(np.median(a.naive_s)) * 1e3

        s = serving.run(ray, workers=2, requests=max(300, int(2000 * scale)), warmup_s=0.5)
        for name, stats in s.stats.items():
            results[f"serving {name} p50 (ms)"] = stats["p50_ms"]
            results[f"serving {name} p99 (ms)"] = stats["p99_ms"]
            results[f"serving {name} (requests/s)"] = stats["requests_per_s"]
    finally:
        ray.shutdown()
    return results


def main() -> int:
    return bench_main(run, __doc__, __file__, "workload", timeout_s=1200)


if __name__ == "__main__":
    sys.exit(main())
