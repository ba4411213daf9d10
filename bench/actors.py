"""Actor creation: how fast actors start and how much memory each one costs.

    python bench/actors.py --impl lumos --actors 1000
    python bench/actors.py --compare                 # Ray and lumos, one after the other

Creates ``--actors`` actors with ``num_cpus=0`` (so none waits for a CPU), calls a
method on each, and reports the creation rate (actors answering per second, from the
first ``.remote()`` to the last answer) and the memory of one actor's process: USS
(``Private_Clean + Private_Dirty`` of ``/proc/<pid>/smaps_rollup``: what the process
alone holds, and what goes back when it exits), PSS and RSS, as medians over a sample.
Each implementation runs in its own subprocess on a fresh local cluster.

It also reports the CPU one creation costs in each role (driver, GCS, raylet, fork
server, the new worker; Ray's processes by their names), summed over every process this
benchmark started: ``/proc/<pid>/task/*/schedstat`` deltas around the timed run, plus
what each process waited for from its exited children (the fork server's, Ray's
helpers'). A worker's CPU counts from its fork to the end of the run (it idles after
its answer).

Ray starts a full interpreter for every actor; ``--ray-actors`` (default 100) keeps its
run within this machine's memory, and the table shows the memory 1,000 of its actors
would take at the measured USS. The machine's load average is printed with the table:
actor creation is CPU-bound, and numbers taken while other work runs are noisy.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

MiB = 1024 * 1024
#: Actors whose memory is read (reading all 1,000 smaps_rollup files would be fine too,
#: but a sample is enough for a median).
SAMPLE = 50


def memory_of(pid: int) -> dict[str, int] | None:
    """Bytes of USS, PSS and RSS of one process, from ``/proc/<pid>/smaps_rollup``."""
    fields: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3 and parts[2] == "kB":
                    fields[parts[0].rstrip(":")] = int(parts[1]) * 1024
    except OSError:
        return None
    return {"uss": fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0),
            "pss": fields.get("Pss", 0), "rss": fields.get("Rss", 0)}


_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def _role(pid: int) -> str:
    if pid == os.getpid():
        return "driver"
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
    for key, role in (("fork_server", "fork server"), ("--worker-id", "worker"), ("worker.main", "worker"),
                      ("raylet", "raylet"), ("gcs", "GCS"), ("ray::", "worker")):
        if key in cmd:
            return role
    return "other"


def _cpu_ns(pid: int) -> int:
    """CPU time of all of ``pid``'s threads, plus its waited-for children's."""
    total = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[0])
            except OSError:
                continue
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        fields = stat[stat.rindex(")") + 2:].split()
        total += (int(fields[13]) + int(fields[14])) * 10**9 // _CLK_TCK  # cutime + cstime
    except (OSError, ValueError, IndexError):
        pass
    return total


def cpu_snapshot() -> dict[int, tuple[str, int]]:
    """pid -> (role, CPU ns) of this process and everything it started."""
    out = {}
    for pid in _descendants(os.getpid()):
        role = _role(pid)
        if role:
            out[pid] = (role, _cpu_ns(pid))
    return out


def cpu_per_creation(before: dict[int, tuple[str, int]], after: dict[int, tuple[str, int]],
                     n: int) -> dict[str, float]:
    """Milliseconds of CPU per creation by role (processes gone by ``after`` are lost)."""
    by_role: dict[str, int] = {}
    for pid, (role, ns) in after.items():
        by_role[role] = by_role.get(role, 0) + ns - (before[pid][1] if pid in before else 0)
    out = {f"CPU per creation, {role} (ms)": ns / n / 1e6 for role, ns in sorted(by_role.items())}
    out["CPU per creation, all (ms)"] = sum(by_role.values()) / n / 1e6
    return out


def run(impl: str, num_cpus: int, actors: int, timeout_s: float) -> dict[str, Any]:
    ray = importlib.import_module(impl)
    from microbench import init_with_retries  # (this script's folder is first on sys.path)
    init_with_retries(ray, impl, num_cpus)
    try:
        @ray.remote(num_cpus=0)
        class Box:
            def pid(self) -> int:
                return os.getpid()

        # Warm-up: the first actor pays for cluster start-up and (lumos) the fork server.
        warm = Box.remote()
        ray.get(warm.pid.remote(), timeout=120)
        ray.kill(warm)
        time.sleep(1.0)
        cpu_before = cpu_snapshot()
        t0 = time.perf_counter()
        boxes = [Box.remote() for _ in range(actors)]
        refs = [b.pid.remote() for b in boxes]
        ready, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        elapsed = time.perf_counter() - t0
        cpu_after = cpu_snapshot()
        pids = ray.get(ready, timeout=60)
        out: dict[str, Any] = {"actors asked": actors, "actors answering": len(pids),
                               "seconds": elapsed, "creation (/s)": len(pids) / elapsed}
        out.update(cpu_per_creation(cpu_before, cpu_after, max(1, len(pids))))
        mems = [m for m in (memory_of(p) for p in pids[:: max(1, len(pids) // SAMPLE)]) if m]
        if mems:
            for key in ("uss", "pss", "rss"):
                out[f"{key.upper()} per actor (MiB)"] = statistics.median(m[key] for m in mems) / MiB
            out["1,000 actors' USS (GiB)"] = out["USS per actor (MiB)"] * 1000 / 1024
        for b in boxes:
            ray.kill(b)
        return out
    finally:
        ray.shutdown()


def microbench_rows(ray: Any, results: dict[str, float], num_cpus: int, scale: float) -> None:
    """``bench/microbench.py``'s rows from this benchmark, on its running cluster: a burst
    of ``num_cpus=0`` actors (the same count for Ray and lumos, small enough for Ray's
    memory), each answering one call, and the median USS of one of them."""
    n = max(10, int(50 * scale))

    @ray.remote(num_cpus=0)
    class Box:
        def pid(self) -> int:
            return os.getpid()

    t0 = time.perf_counter()
    boxes = [Box.remote() for _ in range(n)]
    pids = ray.get([b.pid.remote() for b in boxes], timeout=300)
    results[f"actor creation, {n} num_cpus=0 at once (/s)"] = n / (time.perf_counter() - t0)
    mems = [m for m in (memory_of(p) for p in pids) if m]
    if mems:
        results["memory per actor, USS (MiB)"] = statistics.median(m["uss"] for m in mems) / MiB
    for b in boxes:
        ray.kill(b)


def main() -> int:
    doc = __doc__
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--impl", choices=["ray", "lumos"], default="lumos")
    p.add_argument("--compare", action="store_true", help="run Ray, then lumos, and print both")
    p.add_argument("--actors", type=int, default=1000, help="lumos actors (default 1000)")
    p.add_argument("--ray-actors", type=int, default=100, help="Ray actors in --compare (default 100)")
    p.add_argument("--num-cpus", type=int, default=os.cpu_count() or 2)
    p.add_argument("--timeout-s", type=float, default=600.0, help="longest wait for the actors to answer")
    p.add_argument("--json", action="store_true", help="print results as one JSON line")
    args = p.parse_args()
    if args.compare:
        cols: dict[str, dict[str, Any]] = {}
        for impl, n in (("ray", args.ray_actors), ("lumos", args.actors)):
            cmd = [sys.executable, __file__, "--impl", impl, "--json", "--actors", str(n),
                   "--num-cpus", str(args.num_cpus), "--timeout-s", str(args.timeout_s)]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout_s + 300)
            if proc.returncode != 0:
                print(f"{impl} failed:\n{proc.stderr[-3000:]}", file=sys.stderr)
                cols[impl] = {}
                continue
            cols[impl] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"load average before/after: {' '.join(f'{x:.1f}' for x in os.getloadavg())} "
              f"({os.cpu_count()} CPUs)")
        keys = list(dict.fromkeys([*cols.get("lumos", {}), *cols.get("ray", {})]))
        print("| actors | Ray | lumos |\n|---|---:|---:|")
        for key in keys:
            print(f"| {key} | {_fmt(cols['ray'].get(key))} | {_fmt(cols['lumos'].get(key))} |")
        return 0 if cols.get("lumos") else 1
    load = os.getloadavg()
    results = run(args.impl, args.num_cpus, args.actors, args.timeout_s)
    results["load average (1 min)"] = max(load[0], os.getloadavg()[0])
    if args.json:
        print(json.dumps(results))
    else:
        for k, v in results.items():
            print(f"{k:36s} {_fmt(v):>12s}")
    return 0


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, int) or v >= 100:
        return f"{v:,.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


if __name__ == "__main__":
    sys.exit(main())
