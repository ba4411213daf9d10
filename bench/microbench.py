"""Micro-benchmarks, run against Ray or lumos imported by name.

    python bench/microbench.py --impl lumos
    python bench/microbench.py --impl ray
    python bench/microbench.py --compare          # both, one after the other, and the ratio

Each implementation runs in its own subprocess on a fresh local cluster with the same
number of CPUs, so the two columns come from one run on one machine. ``ray`` is an
optional extra (``pip install -e ".[bench]"``).

``--compare`` adds a third column, the no-distribution floor: Python's own
``concurrent.futures.ProcessPoolExecutor`` with as many processes, on the rows it can
run (a sync round trip, async calls, a 1 MiB argument by value). Latency rows print
their p50 and p99; the machine's load average is printed under the table, since other
work on the machine moves every figure.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
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


def _percentiles(results: dict[str, float], name: str, lat: list[float]) -> None:
    """``name p50 (us)`` and ``name p99 (us)`` from sorted seconds."""
    results[f"{name} p50 (us)"] = lat[len(lat) // 2] * 1e6
    results[f"{name} p99 (us)"] = lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e6


def _ppe_noop(*args: Any) -> None:
    return None


def run_ppe(num_cpus: int, quick: bool) -> dict[str, float]:
    """The rows a ``ProcessPoolExecutor`` can run: the floor without distribution."""
    results: dict[str, float] = {}
    scale = 0.3 if quick else 1.0
    with ProcessPoolExecutor(num_cpus) as ex:
        for f in [ex.submit(_ppe_noop) for _ in range(200)]:
            f.result()
        _percentiles(results, "sync task round trip",
                     _latencies(lambda: ex.submit(_ppe_noop).result(), int(2000 * scale)))
        n = int(10000 * scale)
        t = time.perf_counter()
        for f in [ex.submit(_ppe_noop) for _ in range(n)]:
            f.result()
        results["async tasks (/s)"] = n / (time.perf_counter() - t)
        value = np.ones(MiB, dtype=np.uint8)
        n = int(2000 * scale)
        t = time.perf_counter()
        for f in [ex.submit(_ppe_noop, value) for _ in range(n)]:
            f.result()
        results["1 MiB by-value arg tasks (/s)"] = n / (time.perf_counter() - t)
        _percentiles(results, "1 MiB by-value arg round trip",
                     _latencies(lambda: ex.submit(_ppe_noop, value).result(), int(1000 * scale)))
    return results


def run(impl: str, num_cpus: int, quick: bool) -> dict[str, float]:
    if impl == "ppe":
        return run_ppe(num_cpus, quick)
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

    _percentiles(results, "sync task round trip", _latencies(lambda: ray.get(noop.remote()), int(2000 * scale)))

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
    _percentiles(results, "zero-copy get 100 MiB", _latencies(lambda: ray.get(big), int(2000 * scale), 0.2))
    del big

    one = ray.put(np.zeros(MiB, dtype=np.uint8))
    # Warm-up: the first numpy argument a worker meets makes it import numpy (~80 ms of
    # CPU each, in Ray and lumos alike), which is not what this row measures.
    ray.get([noop.remote(one) for _ in range(20)])
    n = int(2000 * scale)
    t = time.perf_counter()
    ray.get([noop.remote(one) for _ in range(n)])
    results["1 MiB ref-arg tasks (/s)"] = n / (time.perf_counter() - t)

    value = np.ones(MiB, dtype=np.uint8)
    ray.get([noop.remote(value) for _ in range(20)])  # warm-up: store slots of this size
    t = time.perf_counter()
    ray.get([noop.remote(value) for _ in range(n)])
    results["1 MiB by-value arg tasks (/s)"] = n / (time.perf_counter() - t)
    _percentiles(results, "1 MiB by-value arg round trip",
                 _latencies(lambda: ray.get(noop.remote(value)), int(1000 * scale)))

    @ray.remote
    def make_mib() -> np.ndarray:
        return np.ones(MiB, dtype=np.uint8)

    # The first burst of n live 1 MiB values faults in n MiB of fresh store memory, in
    # Ray's plasma as in lumos's files (~4.5 us a page on this kind of VM): it is timed
    # alone (the "first round" row), then the steady state, a round later, is the row.
    ray.get([make_mib.remote() for _ in range(20)])  # (workers import numpy)
    t = time.perf_counter()
    ray.get([make_mib.remote() for _ in range(n)])
    results["1 MiB return tasks, first round (/s)"] = n / (time.perf_counter() - t)
    t = time.perf_counter()
    ray.get([make_mib.remote() for _ in range(n)])
    results["1 MiB return tasks (/s)"] = n / (time.perf_counter() - t)
    _percentiles(results, "1 MiB return round trip",
                 _latencies(lambda: ray.get(make_mib.remote()), int(1000 * scale)))

    refs = [ray.put(i) for i in range(1000)]
    results["wait on 1000 refs (/s)"] = 1 / _timeit(
        lambda: ray.wait(refs, num_returns=len(refs)), 1.0 * scale, 20000)
    _percentiles(results, "wait on 1000 ready refs",
                 _latencies(lambda: ray.wait(refs, num_returns=len(refs)), int(1000 * scale), 0.2))

    run_actors(ray, results, num_cpus, scale)
    run_actor_footprint(ray, results, num_cpus, scale)
    ray.shutdown()
    return results


def run_actor_footprint(ray: Any, results: dict[str, float], num_cpus: int, scale: float) -> None:
    """Rows of ``bench/actors.py`` (actor creation at scale, memory per actor) when it
    defines ``microbench_rows(ray, results, num_cpus, scale)``; nothing otherwise."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    try:
        actors = importlib.import_module("actors")
    except ImportError:
        return
    finally:
        sys.path.pop(0)
    rows = getattr(actors, "microbench_rows", None)
    if rows is not None:
        rows(ray, results, num_cpus, scale)


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
    # Warm-up: kept alive through the burst (a dropped handle's actor exits meanwhile,
    # and its exit would be timed with the burst).
    warm = [Target.remote() for _ in range(2)]
    ray.get([w.ping.remote() for w in warm])
    t = time.perf_counter()
    actors = [Target.remote() for _ in range(k)]
    ray.get([a.ping.remote() for a in actors])
    results["actor creation (/s)"] = k / (time.perf_counter() - t)
    for a in actors + warm:
        ray.kill(a)
    del actors
    time.sleep(2.0)  # let the killed actors' processes go before timing latencies

    a = Target.remote()
    ray.get(a.ping.remote())
    _percentiles(results, "1:1 sync actor call", _latencies(lambda: ray.get(a.ping.remote()), int(2000 * scale)))

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
    for actor in [a, aa, *targets, *callers]:
        ray.kill(actor)
    time.sleep(2.0)  # the next rows create actors: these processes' exits are not theirs to pay


HIGHER_IS_BETTER = {"(/s)": True, "(GB/s)": True, "(us)": False, "(ms)": False, "(s)": False, "(MiB)": False}


def _better(key: str) -> bool:
    for suffix, higher in HIGHER_IS_BETTER.items():
        if key.endswith(suffix):
            return higher
    return True


def _busy_fraction_since(prev: tuple[int, int] | None) -> tuple[float | None, tuple[int, int] | None]:
    """The machine's busy share of CPU time since ``prev`` (``/proc/stat``'s first line:
    (busy, total) jiffies), and the new reading; (None, None) where there is no /proc."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None, None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    now = (sum(fields) - idle, sum(fields))
    if prev is None or now[1] == prev[1]:
        return None, now
    return (now[0] - prev[0]) / (now[1] - prev[1]), now


def settle(max_s: float = 60.0, busy_below: float = 0.15, window_s: float = 0.5,
           read: Callable[[tuple[int, int] | None], tuple[float | None, tuple[int, int] | None]]
           = _busy_fraction_since, sleep: Callable[[float], None] = time.sleep) -> float:
    """Wait until the machine is quiet (under ``busy_below`` of its CPU busy in two
    ``window_s`` windows in a row), at most ``max_s``; returns the seconds waited.

    Each column of a comparison starts on a quiet machine: a system's processes can go on
    working after its ``shutdown()`` returns (exiting, unmapping gigabytes of shared
    memory), and the next system's run, started at once, paid for it (lumos after Ray,
    in one pair of runs: put 100 MiB 8.3 against 12.2 GB/s alone, 1 MiB ref-arg tasks
    3,469 against 9,017/s)."""
    waited = 0.0
    quiet = 0
    _, mark = read(None)
    if mark is None:
        return 0.0
    while waited < max_s:
        sleep(window_s)
        waited += window_s
        busy, mark = read(mark)
        if busy is None:
            return waited
        quiet = quiet + 1 if busy < busy_below else 0
        if quiet >= 2:
            break
    return waited


def compare(script: str, num_cpus: int, quick: bool, timeout_s: float, first_col: str,
            floor: bool = False) -> int:
    """Run ``script --impl ray`` and ``--impl lumos`` one after the other; print the ratio table.
    Each starts once the machine is quiet (``settle``).

    ``floor``: also ``--impl ppe`` (a ``ProcessPoolExecutor`` column for the rows it has)."""
    cols: dict[str, dict[str, float]] = {}
    for impl in ("ray", "lumos") + (("ppe",) if floor else ()):
        waited = settle()
        if waited > 1.0:
            print(f"(waited {waited:.1f} s for the machine to be quiet before the {impl} run)", file=sys.stderr)
        cmd = [sys.executable, script, "--impl", impl, "--json", "--num-cpus", str(num_cpus)]
        if quick:
            cmd.append("--quick")
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        if out.returncode != 0:
            print(f"{impl} failed:\n{out.stderr[-3000:]}", file=sys.stderr)
            return 1
        cols[impl] = json.loads(out.stdout.strip().splitlines()[-1])
    print(format_table(cols["ray"], cols["lumos"], first_col, cols.get("ppe")))
    load = os.getloadavg()
    print(f"\nload average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs after the run")
    return 0


def _ratio(key: str, other: float, lumos: float) -> float:
    """How many times better lumos is than ``other`` on row ``key``."""
    if _better(key):
        return lumos / other if other else float("inf")
    return other / lumos if lumos else float("inf")


def format_table(ray: dict[str, float], lumos: dict[str, float], first_col: str = "benchmark",
                 ppe: dict[str, float] | None = None) -> str:
    """A Markdown table: Ray, lumos, the ratio; with ``ppe``, a ProcessPoolExecutor column
    and lumos's ratio to it (rows it lacks are left blank)."""
    head = f"| {first_col} | Ray | lumos | lumos vs Ray |"
    rule = "|---|---:|---:|---:|"
    if ppe is not None:
        head += " ProcessPoolExecutor | lumos vs PPE |"
        rule += "---:|---:|"
    lines = [head, rule]
    for key in lumos:
        r, l = ray.get(key), lumos[key]
        if r is None:
            continue
        line = f"| {key} | {_fmt(r)} | {_fmt(l)} | {_ratio(key, r, l):.2f}x |"
        if ppe is not None:
            p = ppe.get(key)
            line += f" {_fmt(p)} | {_ratio(key, p, l):.2f}x |" if p is not None else " | |"
        lines.append(line)
    return "\n".join(lines)


def _fmt(v: float) -> str:
    if v >= 100:
        return f"{v:,.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def init_with_retries(ray: Any, impl: str, num_cpus: int, attempts: int = 3) -> None:
    """``ray.init`` for a benchmark, tried again when it fails: Ray's raylet aborts when
    its agents start slowly (a loaded machine)."""
    for attempt in range(attempts):
        try:
            ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
            return
        except Exception as e:
            ray.shutdown()
            if attempt == attempts - 1:
                raise
            print(f"{impl}.init() failed ({e}); trying again", file=sys.stderr)


def bench_main(run_fn: Callable[[str, int, bool], dict[str, float]], doc: str | None, script: str,
               first_col: str, timeout_s: float, floor: bool = False) -> int:
    """The command line shared by the benchmarks that run on Ray and lumos alike.

    ``floor``: ``run_fn`` also takes ``impl="ppe"``, and ``--compare`` shows that column."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--impl", choices=["ray", "lumos"] + (["ppe"] if floor else []), default="lumos")
    p.add_argument("--compare", action="store_true", help="run both and print the ratio")
    p.add_argument("--num-cpus", type=int, default=os.cpu_count() or 2)
    p.add_argument("--json", action="store_true", help="print results as one JSON line")
    p.add_argument("--quick", action="store_true", help="shorter runs (noisier)")
    args = p.parse_args()
    if args.compare:
        return compare(script, args.num_cpus, args.quick, timeout_s, first_col, floor)
    results = run_fn(args.impl, args.num_cpus, args.quick)
    if args.json:
        print(json.dumps(results))
    else:
        for k, v in results.items():
            print(f"{k:40s} {_fmt(v):>12s}")
    return 0


def main() -> int:
    return bench_main(run, __doc__, __file__, "benchmark", timeout_s=900, floor=True)


if __name__ == "__main__":
    sys.exit(main())
