"""Micro-benchmarks, run against Ray or lumos imported by name.

    python bench/microbench.py --impl lumos
    python bench/microbench.py --impl ray
    python bench/microbench.py --compare          # both, one after the other, and the ratio

Each implementation runs in its own subprocess on a fresh local cluster with the same
number of CPUs, so the two columns come from one run on one machine. ``ray`` is an
optional extra (``pip install -e ".[bench]"``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import time
from typing import Any, Callable

import numpy as np

MiB = 1024 * 1024


def _timeit(fn: Callable[[], Any], min_time_s: float = 1.0, max_iters: int = 1_000_000) -> float:
    """Seconds per call of fn, running for at least min_time_s after a warm-up."""
    fn()
    n = 0
    t0 = time.perf_counter()
    while True:
        fn()
        n += 1
        el = time.perf_counter() - t0
        if el >= min_time_s or n >= max_iters:
            return el / n


def _latencies(call: Callable[[], Any], n: int, warm_s: float = 0.5) -> list[float]:
    """Sorted seconds of ``n`` calls of ``call``, after ``warm_s`` seconds of untimed calls.

    The warm-up matters on virtual machines: after an idle spell it takes a few hundred
    milliseconds of back-to-back calls before cross-process wake-ups are fast again. On
    the 2-core VM of the README table, the first 1,000 lumos sync actor calls after 2 s
    idle ran 20-40% slower than the next ones; Ray's (four times slower) calls changed by
    about 5%. Both implementations get the same warm-up.
    """
    t_end = time.perf_counter() + warm_s
    while time.perf_counter() < t_end:
        call()
    lat = []
    for _ in range(n):
        t = time.perf_counter()
        call()
        lat.append(time.perf_counter() - t)
    lat.sort()
    return lat


def run(impl: str, num_cpus: int, quick: bool) -> dict[str, float]:
    ray = importlib.import_module(impl)
    results: dict[str, float] = {}
    scale = 0.3 if quick else 1.0

    t0 = time.perf_counter()
    ray.init(num_cpus=num_cpus, include_dashboard=False, **({"log_to_driver": False}))

    @ray.remote
    def noop(*args: Any) -> None:
        return None

    ray.get(noop.remote())
    results["init + first task (s)"] = time.perf_counter() - t0

    # Warm the worker pool: every CPU has a worker with the function loaded.
    ray.get([noop.remote() for _ in range(200)])

    lat = _latencies(lambda: ray.get(noop.remote()), int(2000 * scale))
    results["sync task round trip p50 (us)"] = lat[len(lat) // 2] * 1e6
    results["sync task round trip p99 (us)"] = lat[int(len(lat) * 0.99)] * 1e6

    n = int(10000 * scale)
    t = time.perf_counter()
    ray.get([noop.remote() for _ in range(n)])
    results["async tasks (/s)"] = n / (time.perf_counter() - t)

    @ray.remote
    def parent(k: int) -> None:
        ray.get([noop.remote() for _ in range(k)])

    per, parents = 100, max(2, num_cpus)
    ray.get([parent.remote(per) for _ in range(parents)])  # warm-up: workers for blocked parents
    t = time.perf_counter()
    ray.get([parent.remote(per) for _ in range(parents)])
    ray.get([parent.remote(per) for _ in range(parents)])
    results["nested subtasks (/s)"] = 2 * per * parents / (time.perf_counter() - t)

    results["put small (/s)"] = 1 / _timeit(lambda: ray.put(0), 1.0 * scale)
    small = ray.put(0)
    results["get small (/s)"] = 1 / _timeit(lambda: ray.get(small), 1.0 * scale)

    arr = np.random.randint(0, 255, size=100 * MiB, dtype=np.uint8)

    def put_big() -> None:
        ref = ray.put(arr)
        del ref

    results["put 100 MiB (GB/s)"] = 100 * MiB / _timeit(put_big, 2.0 * scale, 200) / 1e9
    big = ray.put(arr)
    results["zero-copy get 100 MiB (us)"] = _timeit(lambda: ray.get(big), 1.0 * scale) * 1e6
    del big

    one = ray.put(np.zeros(MiB, dtype=np.uint8))
    n = int(2000 * scale)
    t = time.perf_counter()
    ray.get([noop.remote(one) for _ in range(n)])
    results["1 MiB ref-arg tasks (/s)"] = n / (time.perf_counter() - t)

    value = np.ones(MiB, dtype=np.uint8)
    ray.get([noop.remote(value) for _ in range(20)])  # warm-up: store slots of this size
    t = time.perf_counter()
    ray.get([noop.remote(value) for _ in range(n)])
    results["1 MiB by-value arg tasks (/s)"] = n / (time.perf_counter() - t)
    lat = _latencies(lambda: ray.get(noop.remote(value)), int(1000 * scale))
    results["1 MiB by-value arg round trip p50 (us)"] = lat[len(lat) // 2] * 1e6

    @ray.remote
    def make_mib() -> np.ndarray:
        return np.ones(MiB, dtype=np.uint8)

    lat = _latencies(lambda: ray.get(make_mib.remote()), int(1000 * scale))
    results["1 MiB return round trip p50 (us)"] = lat[len(lat) // 2] * 1e6
    results["1 MiB return round trip p99 (us)"] = lat[int(len(lat) * 0.99)] * 1e6

    refs = [ray.put(i) for i in range(1000)]
    results["wait on 1000 refs (/s)"] = 1 / _timeit(
        lambda: ray.wait(refs, num_returns=len(refs)), 1.0 * scale, 20000)

    run_actors(ray, results, num_cpus, scale)
    ray.shutdown()
    return results


def run_actors(ray: Any, results: dict[str, float], num_cpus: int, scale: float) -> None:
    @ray.remote
    class Target:
        def ping(self, *args: Any) -> None:
            return None

    @ray.remote
    class AsyncTarget:
        async def ping(self, *args: Any) -> None:
            return None

    @ray.remote
    class Caller:
        def __init__(self, targets: list[Any]) -> None:
            self.targets = targets

        def run(self, n: int) -> int:
            refs = [self.targets[i % len(self.targets)].ping.remote() for i in range(n)]
            ray.get(refs)
            return n

    k = max(4, int(16 * scale))
    ray.get([Target.remote().ping.remote() for _ in range(2)])  # warm-up
    t = time.perf_counter()
    actors = [Target.remote() for _ in range(k)]
    ray.get([a.ping.remote() for a in actors])
    results["actor creation (/s)"] = k / (time.perf_counter() - t)
    for a in actors:
        ray.kill(a)
    del actors
    time.sleep(2.0)  # let the killed actors' processes go before timing latencies

    a = Target.remote()
    ray.get(a.ping.remote())
    lat = _latencies(lambda: ray.get(a.ping.remote()), int(2000 * scale))
    results["1:1 sync actor call p50 (us)"] = lat[len(lat) // 2] * 1e6

    n = int(10000 * scale)
    t = time.perf_counter()
    ray.get([a.ping.remote() for _ in range(n)])
    results["1:1 async actor calls (/s)"] = n / (time.perf_counter() - t)

    pairs = max(2, num_cpus)
    targets = [Target.remote() for _ in range(pairs)]
    callers = [Caller.remote(targets) for _ in range(pairs)]
    ray.get([c.run.remote(10) for c in callers])
    per = int(4000 * scale)
    t = time.perf_counter()
    ray.get([c.run.remote(per) for c in callers])
    results["n:n async actor calls (/s)"] = pairs * per / (time.perf_counter() - t)

    aa = AsyncTarget.remote()
    ray.get(aa.ping.remote())
    t = time.perf_counter()
    ray.get([aa.ping.remote() for _ in range(n)])
    results["async-actor calls (/s)"] = n / (time.perf_counter() - t)


HIGHER_IS_BETTER = {"(/s)": True, "(GB/s)": True, "(us)": False, "(ms)": False, "(s)": False}


def _better(key: str) -> bool:
    for suffix, higher in HIGHER_IS_BETTER.items():
        if key.endswith(suffix):
            return higher
    return True


def compare(script: str, num_cpus: int, quick: bool, timeout_s: float, first_col: str) -> int:
    """Run ``script --impl ray`` and ``--impl lumos`` one after the other; print the ratio table."""
    cols: dict[str, dict[str, float]] = {}
    for impl in ("ray", "lumos"):
        cmd = [sys.executable, script, "--impl", impl, "--json", "--num-cpus", str(num_cpus)]
        if quick:
            cmd.append("--quick")
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        if out.returncode != 0:
            print(f"{impl} failed:\n{out.stderr[-3000:]}", file=sys.stderr)
            return 1
        cols[impl] = json.loads(out.stdout.strip().splitlines()[-1])
    print(format_table(cols["ray"], cols["lumos"], first_col))
    return 0


def format_table(ray: dict[str, float], lumos: dict[str, float], first_col: str = "benchmark") -> str:
    lines = [f"| {first_col} | Ray | lumos | lumos vs Ray |", "|---|---:|---:|---:|"]
    for key in lumos:
        r, l = ray.get(key), lumos[key]
        if r is None:
            continue
        ratio = (l / r) if _better(key) else (r / l if l else float("inf"))
        lines.append(f"| {key} | {_fmt(r)} | {_fmt(l)} | {ratio:.2f}x |")
    return "\n".join(lines)


def _fmt(v: float) -> str:
    if v >= 100:
        return f"{v:,.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def bench_main(run_fn: Callable[[str, int, bool], dict[str, float]], doc: str | None, script: str,
               first_col: str, timeout_s: float) -> int:
    """The command line shared by the benchmarks that run on Ray and lumos alike."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--impl", choices=["ray", "lumos"], default="lumos")
    p.add_argument("--compare", action="store_true", help="run both and print the ratio")
    p.add_argument("--num-cpus", type=int, default=os.cpu_count() or 2)
    p.add_argument("--json", action="store_true", help="print results as one JSON line")
    p.add_argument("--quick", action="store_true", help="shorter runs (noisier)")
    args = p.parse_args()
    if args.compare:
        return compare(script, args.num_cpus, args.quick, timeout_s, first_col)
    results = run_fn(args.impl, args.num_cpus, args.quick)
    if args.json:
        print(json.dumps(results))
    else:
        for k, v in results.items():
            print(f"{k:40s} {_fmt(v):>12s}")
    return 0


def main() -> int:
    return bench_main(run, __doc__, __file__, "benchmark", timeout_s=900)


if __name__ == "__main__":
    sys.exit(main())
