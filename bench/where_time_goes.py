"""Where the time of a task and of an actor call goes, by process, thread and function.

    python bench/where_time_goes.py [--markdown | --json] [--quick] [--python-only] [--top 8]

Starts a private local lumos cluster (2 CPUs), lets it settle and warms it up, then runs
four workloads: a no-op task's sync round trip (``get(f.remote())``) and its async form
(1,000 submitted, then got), and a 1:1 actor call, sync and async. For each it prints:

1. **CPU per call by process role and thread**: the driver's user thread and its
   ``lumos-io`` thread, the worker's (or actor's) ``lumos-io`` and executor threads, the
   raylet, the GCS, the rest (dashboard, fork server, idle workers); from each thread's
   ``/proc/<pid>/task/<tid>/schedstat`` before and after N calls (the median of
   ``--repeat`` runs), with the share spent in the kernel (``stat``'s stime, in clock
   ticks). Beside them: the whole machine's busy time (``/proc/stat``, other users' work
   included), wall time per call, and the driver's garbage collections and their CPU.
2. **Wake-ups per call** per thread: ``voluntary_ctxt_switches`` from
   ``/proc/<pid>/task/<tid>/status`` (a thread that blocks and is woken again counts
   one), and the time each thread spent runnable but waiting for a CPU (schedstat's run
   delay): on a sync round trip these hand-overs, not the Python work, set the latency.
   Under the tables, what one wake-up costs on this machine (a pipe ping-pong on one core
   and across two, and the CPU of the ``write`` that wakes the peer).
3. **Top functions per role** from ``py-spy record --native --idle`` (one per process, all
   in parallel, in a second pass of the same loop, so the sampling, which pauses each
   process at every sample, does not disturb items 1 and 2). 100 samples a second by
   default: at 1,000 the pauses slowed a sync call here 200-fold (16 calls/s), at 100
   about 2-fold. Samples parked in a sleeping call (``epoll_pwait``, a futex or GIL wait)
   are dropped, which leaves those running or runnable; each is charged to its innermost
   Python function, with the native function most of that function's own samples were
   in. Printed: own and inclusive share of the thread's samples, and own share times the
   thread's CPU from item 1 in microseconds per call (an estimate: a runnable thread
   waiting at a system call's return is sampled in that call). ``--python-only`` (or a
   py-spy without ``--native`` support, which is then used so) samples Python frames
   only, without pausing, at 1,000 a second; there a parked thread cannot be told from a
   busy one. Skipped with a message when ``py-spy`` is not installed
   (``pip install -e ".[bench]"``) or cannot attach (it needs ptrace rights).
4. The hop chain of one sync call, thread by thread, with the file of each hop.

Threads are named in-process for the driver (``threading``), for the others by the
kernel's name of the thread (lumos's io thread names itself ``lumos-io`` there) and their
known structure (a worker's main thread runs the executor; ``libuv-worker`` threads are
the event loop's pool), refined by ``py-spy dump`` when it is there. Run on an otherwise
idle machine for figures to quote; the load average is printed with them.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable

import psutil

#: Workloads in print order: (key, column title).
SCENARIOS = (("task_sync", "task sync"), ("task_async", "task async"),
             ("actor_sync", "actor sync"), ("actor_async", "actor async"))
#: Row order of the per-thread tables; rows with no thread in a run are left out.
ROWS = (
    ("driver", "user thread"), ("driver", "lumos-io"), ("driver", "other threads"),
    ("worker", "lumos-io"), ("worker", "executor"), ("worker", "other threads"),
    ("raylet", "main loop"), ("raylet", "other threads"),
    ("gcs", "main loop"), ("gcs", "other threads"),
    ("rest", "dashboard"), ("rest", "fork server"), ("rest", "idle workers"),
)
#: The roles every run must show (the test checks them).
REQUIRED_ROWS = (("driver", "user thread"), ("driver", "lumos-io"), ("worker", "lumos-io"),
                 ("worker", "executor"), ("raylet", "main loop"), ("gcs", "main loop"))
BATCH = 1000
CLK_TCK = os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------------- /proc readers

@dataclass(slots=True)
class Counters:
    """One thread's counters (cumulative since it started)."""
    cpu_ns: int = 0  #: on a CPU (schedstat field 1)
    wait_ns: int = 0  #: runnable, waiting for a CPU (schedstat field 2: run delay)
    voluntary: int = 0  #: blocked, then woken: one wake-up
    involuntary: int = 0  #: preempted
    kernel_ticks: int = 0  #: stime, in clock ticks
    user_ticks: int = 0  #: utime, in clock ticks


def thread_counters(pid: int) -> dict[int, Counters]:
    """tid -> counters of every thread of ``pid``; {} when the process is gone, and a
    thread that ends while we read is skipped."""
    out: dict[int, Counters] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for t in tids:
        base = f"/proc/{pid}/task/{t}"
        try:
            c = Counters()
            with open(f"{base}/stat") as f:
                stat = f.read().rsplit(")", 1)[1].split()
            c.user_ticks, c.kernel_ticks = int(stat[11]), int(stat[12])
            try:
                with open(f"{base}/schedstat") as f:
                    fields = f.read().split()
                c.cpu_ns, c.wait_ns = int(fields[0]), int(fields[1])
            except FileNotFoundError:  # a kernel without CONFIG_SCHED_INFO: ticks, no run delay
                c.cpu_ns = (c.user_ticks + c.kernel_ticks) * 1_000_000_000 // CLK_TCK
            with open(f"{base}/status") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches"):
                        c.voluntary = int(line.split()[1])
                    elif line.startswith("nonvoluntary_ctxt_switches"):
                        c.involuntary = int(line.split()[1])
        except (OSError, ValueError, IndexError):
            continue
        out[int(t)] = c
    return out


def thread_comm(pid: int, tid: int) -> str:
    try:
        with open(f"/proc/{pid}/task/{tid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


def machine_busy_s() -> float:
    """Busy CPU seconds of the whole machine since boot (``/proc/stat``: all but idle and
    iowait; guest time is already inside user)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    busy = sum(fields[:8]) - fields[3] - fields[4]
    return busy / CLK_TCK


# ---------------------------------------------------------------------- processes and threads

@dataclass
class Proc:
    """A process of the cluster (or the driver) and what its threads are called."""
    pid: int
    role: str  # driver | worker | raylet | gcs | rest
    label: str  # what `rest` is: dashboard | fork server | idle workers
    #: tid -> Python thread name, where known.
    names: dict[int, str] = field(default_factory=dict)


def _cmdline(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return ""


def cluster_processes() -> list[Proc]:
    """This driver and every lumos process under it. Workers get their role once measured
    (``measure_counters``): those that ran the workload are `worker`, the rest idle."""
    procs = [Proc(os.getpid(), "driver", "",
                  {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None})]
    for p in psutil.Process().children(recursive=True):
        cmd = _cmdline(p)
        if "lumos._private.gcs.server" in cmd:
            procs.append(Proc(p.pid, "gcs", ""))
        elif "lumos._private.raylet.server" in cmd:
            procs.append(Proc(p.pid, "raylet", ""))
        elif "lumos.dashboard" in cmd:
            procs.append(Proc(p.pid, "rest", "dashboard"))
        elif "fork_server" in cmd:
            procs.append(Proc(p.pid, "rest", "fork server"))
        elif "lumos._private.worker" in cmd:
            procs.append(Proc(p.pid, "worker", "unmeasured"))
    return procs


def row_of(proc: Proc, tid: int) -> tuple[str, str]:
    """The (role, thread) row a thread's figures go to."""
    if proc.role == "rest":
        return ("rest", proc.label)
    name = proc.names.get(tid)
    if proc.role == "driver":
        if name == "MainThread":
            return ("driver", "user thread")
        return ("driver", "lumos-io") if name == "lumos-io" else ("driver", "other threads")
    if tid == proc.pid:  # the main thread: the executor in a worker, the loop in a raylet/GCS
        return (proc.role, "executor" if proc.role == "worker" else "main loop")
    if proc.role == "worker" and (name == "lumos-io" or thread_comm(proc.pid, tid) == "lumos-io"):
        return ("worker", "lumos-io")  # (it names itself in the kernel)
    return (proc.role, "other threads")


def py_spy_path() -> str | None:
    """The py-spy next to this interpreter, else on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return here if os.access(here, os.X_OK) else shutil.which("py-spy")


def name_threads(procs: list[Proc], py_spy: str | None) -> None:
    """Fill in Python thread names of the non-driver processes from ``py-spy dump``."""
    if py_spy is None:
        return
    for proc in procs:
        if proc.role in ("driver", "rest"):
            continue
        try:
            r = subprocess.run([py_spy, "dump", "--json", "-p", str(proc.pid)], capture_output=True,
                               text=True, timeout=20)
            threads = json.loads(r.stdout) if r.returncode == 0 else []
        except (subprocess.TimeoutExpired, json.JSONDecodeError, OSError):
            continue
        for t in threads:
            if t.get("os_thread_id") and t.get("thread_name"):
                proc.names[int(t["os_thread_id"])] = str(t["thread_name"])


def wakeup_costs(cross_core: bool, n: int = 5000) -> tuple[float, float] | None:
    """(median µs of one wake-up, median CPU µs of the ``write`` that wakes the peer): half
    a pipe round trip between this process and a forked child, both on the first allowed
    CPU or on two (None where there is one CPU only)."""
    cpus = sorted(os.sched_getaffinity(0))
    if cross_core and len(cpus) < 2:
        return None
    mine, theirs = cpus[0], cpus[1] if cross_core else cpus[0]
    saved = os.sched_getaffinity(0)
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        try:
            os.sched_setaffinity(0, {theirs})
            while os.read(r1, 1) == b"x":
                os.write(w2, b"x")
        finally:
            os._exit(0)
    lat, cpu = [], []
    try:
        os.sched_setaffinity(0, {mine})
        for _ in range(n):
            t = time.perf_counter_ns()
            c = time.thread_time_ns()
            os.write(w1, b"x")
            cpu.append(time.thread_time_ns() - c)
            os.read(r2, 1)
            lat.append(time.perf_counter_ns() - t)
    finally:
        os.write(w1, b"q")
        os.waitpid(pid, 0)
        os.sched_setaffinity(0, saved)
        for fd in (r1, w1, r2, w2):
            os.close(fd)
    lat, cpu = sorted(lat[n // 10:]), sorted(cpu[n // 10:])
    return lat[len(lat) // 2] / 2e3, cpu[len(cpu) // 2] / 1e3


def write_cpu_us(n: int = 5000) -> float:
    """Median CPU µs of a one-byte pipe ``write`` that wakes nobody."""
    r, w = os.pipe()
    cpu = []
    try:
        for i in range(n):
            c = time.thread_time_ns()
            os.write(w, b"x")
            cpu.append(time.thread_time_ns() - c)
            if i % 1000 == 999:
                os.read(r, 1000)
    finally:
        os.close(r)
        os.close(w)
    cpu.sort()
    return cpu[len(cpu) // 2] / 1e3


# ---------------------------------------------------------------------- item 1 and 2

def measure_counters(procs: list[Proc], run: Callable[[], int]) -> dict[str, Any]:
    """Per-row CPU microseconds and wake-ups per call over ``run()`` (which returns the
    number of calls it made), with the machine's busy time and the wall time."""
    before = {p.pid: thread_counters(p.pid) for p in procs}
    gc0 = [g["collections"] for g in gc.get_stats()]
    gc_ns = [0, 0]  # [total, start of the collection under way]

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        # CPU time of the collecting thread: a collection runs on one thread, holding the GIL
        if phase == "start":
            gc_ns[1] = time.thread_time_ns()
        else:
            gc_ns[0] += time.thread_time_ns() - gc_ns[1]

    gc.callbacks.append(on_gc)
    m0 = machine_busy_s()
    t0 = time.perf_counter()
    try:
        n = run()
    finally:
        wall = time.perf_counter() - t0
        m1 = machine_busy_s()
        gc.callbacks.remove(on_gc)
    gc1 = [g["collections"] for g in gc.get_stats()]
    after = {p.pid: thread_counters(p.pid) for p in procs}
    for p in procs:
        if p.label == "unmeasured":
            # A worker ran the workload when its main thread (the executor) spent at least
            # 1 us a call; an idle one sleeps in its queue.
            c0 = before[p.pid].get(p.pid, Counters()).cpu_ns
            c1 = after[p.pid].get(p.pid, Counters(cpu_ns=c0)).cpu_ns
            p.role, p.label = ("worker", "") if c1 - c0 >= 1000 * n else ("rest", "idle workers")
    cpu: dict[tuple[str, str], float] = defaultdict(float)
    wait: dict[tuple[str, str], float] = defaultdict(float)
    vol: dict[tuple[str, str], float] = defaultdict(float)
    ticks: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    invol = 0.0
    for p in procs:
        b = before[p.pid]
        for tid, c in after[p.pid].items():
            c0 = b.get(tid, Counters())  # a thread started meanwhile counts from 0
            row = row_of(p, tid)
            cpu[row] += (c.cpu_ns - c0.cpu_ns) / 1e3 / n
            wait[row] += (c.wait_ns - c0.wait_ns) / 1e3 / n
            vol[row] += (c.voluntary - c0.voluntary) / n
            invol += (c.involuntary - c0.involuntary) / n
            ticks[row][0] += c.kernel_ticks - c0.kernel_ticks
            ticks[row][1] += c.user_ticks - c0.user_ticks
    lumos_us = sum(cpu.values())
    machine_us = (m1 - m0) * 1e6 / n
    return {
        "calls": n,
        "cpu_us": {f"{r[0]} / {r[1]}": v for r, v in cpu.items()},
        "wakeups": {f"{r[0]} / {r[1]}": v for r, v in vol.items()},
        "cpu_wait_us": {f"{r[0]} / {r[1]}": v for r, v in wait.items()},
        # stime / (utime + stime): clock ticks, so only a long run gives a figure
        "kernel_share": {f"{r[0]} / {r[1]}": k / (k + u) for r, (k, u) in ticks.items() if k + u >= 10},
        "involuntary": invol,
        "lumos_cpu_us": lumos_us,
        "machine_cpu_us": machine_us,
        "wall_us": wall * 1e6 / n,
        # the driver's garbage collections per 1,000 calls, by generation
        "driver_gc_per_1000": [(b - a) * 1000 / n for a, b in zip(gc0, gc1)],
        "driver_gc_us": gc_ns[0] / 1e3 / n,
    }


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure's median over repeated measurements (rows missing from a run count 0)."""
    def med(values: list[float]) -> float:
        values = sorted(values)
        return values[len(values) // 2]
    out: dict[str, Any] = {}
    for k, v in runs[0].items():
        if isinstance(v, dict):
            keys = {key for r in runs for key in r[k]}
            if k == "kernel_share":  # a share, where a run had enough ticks for one
                out[k] = {key: med([r[k][key] for r in runs if key in r[k]]) for key in keys}
            else:
                out[k] = {key: med([r[k].get(key, 0.0) for r in runs]) for key in keys}
        elif isinstance(v, list):
            out[k] = [med([r[k][i] for r in runs]) for i in range(len(v))]
        else:
            out[k] = med([r[k] for r in runs])
    return out


# ---------------------------------------------------------------------- item 3: py-spy

_LINE = re.compile(r":\d+\)$")
_ADDR = re.compile(r"^0x[0-9a-fA-F]+ \((.*)\)$")


def _frame_key(frame: str) -> str:
    """A function, not a line: ``f (path/x.py:12)`` -> ``f (x.py)`` (py-spy prints file
    names only, unless ``--full-filenames``); native addresses fold into their library."""
    a = _ADDR.match(frame)
    if a:
        return f"[{a.group(1)}]"
    frame = _LINE.sub(")", frame)
    i = frame.rfind(" (")
    if i >= 0:
        return f"{frame[:i]} ({os.path.basename(frame[i + 2:-1])})"
    return frame


def parse_raw(text: str) -> list[tuple[int, str, list[str], int]]:
    """``py-spy record -f raw --threads`` output -> (tid, thread name, frames root first, count)."""
    out = []
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        m = re.match(r"thread \((\d+)\)(?:: (.*))?$", frames[0])
        if m is None:
            continue
        out.append((int(m.group(1)), m.group(2) or "", frames[1:], int(count)))
    return out


#: Native functions a thread sleeps in: a sample whose innermost named native frame is
#: one of these is off-CPU (py-spy's own idle test misses threads parked in uvloop's
#: epoll_pwait or in a futex). pthread_cond_*wait also covers waits for the GIL.
IDLE_FUNCS = frozenset({
    "epoll_pwait", "epoll_wait", "poll", "ppoll", "select", "pselect", "clock_nanosleep", "nanosleep",
    "pthread_cond_wait", "pthread_cond_timedwait", "pthread_cond_clockwait", "sem_wait", "sem_timedwait",
    "sem_clockwait", "PyThread_acquire_lock_timed", "accept", "accept4", "recvfrom", "waitpid", "wait4",
})


def _is_python(key: str) -> bool:
    return key.endswith(".py)") or key.endswith(">)")  # x.py, or <frozen os>


def on_cpu(keys: list[str]) -> bool:
    """False when the sample's innermost named native frame is a sleeping call."""
    for k in reversed(keys):
        if k.startswith("["):
            continue  # an address without a symbol: look at its caller
        return k.split(" (", 1)[0] not in IDLE_FUNCS
    return True


def top_functions(samples: list[tuple[list[str], int]], top: int,
                  native: bool) -> tuple[int, list[dict[str, Any]], list[tuple[str, float]]]:
    """(samples not parked, the ``top`` Python functions by own samples with own and
    inclusive shares, the three native functions most samples were in with their shares).
    Native frames (``--native``) are charged to the innermost Python function above them,
    and name where most of its own samples were (``native``)."""
    total = 0
    own: dict[str, int] = defaultdict(int)
    incl: dict[str, int] = defaultdict(int)
    leaf: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    natives: dict[str, int] = defaultdict(int)
    for frames, c in samples:
        keys = [_frame_key(f) for f in frames]
        if native and not on_cpu(keys):
            continue
        total += c
        py = [k for k in keys if _is_python(k)]
        fn = py[-1] if py else (keys[-1] if keys else "?")
        own[fn] += c
        if keys and keys[-1] != fn:
            leaf[fn][keys[-1]] += c
            natives[keys[-1]] += c
        for k in set(py):
            incl[k] += c
    if total == 0:
        return 0, [], []
    rows = sorted(own, key=lambda k: (-own[k], k))[:top]
    out = []
    for k in rows:
        entry: dict[str, Any] = {"function": k, "own": own[k] / total, "inclusive": max(incl[k], own[k]) / total}
        if leaf[k]:
            name, n = max(leaf[k].items(), key=lambda kv: kv[1])
            entry["native"] = name
            entry["native_share"] = n / own[k]
        out.append(entry)
    hot = sorted(natives.items(), key=lambda kv: -kv[1])[:3]
    return total, out, [(k, v / total) for k, v in hot]


def profile(procs: list[Proc], run: Callable[[], int], py_spy: str, native: bool, rate: int, out_dir: str,
            tag: str) -> tuple[dict[tuple[str, str], list[tuple[list[str], int]]], list[str]]:
    """Run ``run()`` under one ``py-spy record`` per process; samples per row, and notes
    about processes it could not sample."""
    spies: list[tuple[Proc, subprocess.Popen[bytes], str]] = []
    notes: list[str] = []
    # The driver's sampler starts last: it would sample this thread starting the others.
    for p in sorted(procs, key=lambda p: p.role == "driver"):
        if p.role == "rest":
            continue
        path = os.path.join(out_dir, f"{tag}-{p.role}-{p.pid}.txt")
        cmd = [py_spy, "record", "-r", str(rate), "-f", "raw", "--threads", "-p", str(p.pid), "-o", path]
        # --idle: every sample, parked or not; on_cpu() sorts them (py-spy's own test both
        # keeps threads parked in epoll_pwait and drops busy ones: 4 of ~70 of a worker's
        # io-thread samples were left in one run).
        cmd += ["--native", "--idle"] if native else ["--nonblocking"]
        spies.append((p, subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE), path))
    time.sleep(1.0)  # py-spy attaches
    try:
        run()
    finally:
        for _, sp, _ in spies:
            if sp.poll() is None:
                sp.send_signal(signal.SIGINT)
    samples: dict[tuple[str, str], list[tuple[list[str], int]]] = defaultdict(list)
    for p, sp, path in spies:
        try:
            _, err = sp.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            sp.kill()
            _, err = sp.communicate()
        try:
            with open(path) as f:
                text = f.read()
        except OSError:
            tail = err.decode(errors="replace").strip().splitlines()[-1:] if err else []
            notes.append(f"py-spy wrote nothing for the {p.role} (pid {p.pid}): {' '.join(tail) or 'no output'}")
            continue
        for tid, name, frames, count in parse_raw(text):
            if name and tid not in p.names:
                p.names[tid] = name
            samples[row_of(p, tid)].append((frames, count))
    return samples, notes


# ---------------------------------------------------------------------- the workloads

def workloads(ray: Any, arg_kib: int = 0, return_kib: int = 0) -> dict[str, Callable[[int], int]]:
    """The four loops; each runs about ``n`` calls and returns how many it made. With
    ``arg_kib``, every call carries a numpy array of that many KiB by value; with
    ``return_kib``, every call returns one (made once, in the worker)."""
    import numpy as np

    args = (np.ones(arg_kib * 1024, dtype=np.uint8),) if arg_kib else ()
    # (Travels with the functions. None unless asked for: a worker that unpickles an array
    # imports numpy, whose threads would blur which of its threads is which.)
    value = np.ones(return_kib * 1024, dtype=np.uint8) if return_kib else None

    @ray.remote
    def noop(*a: Any) -> Any:
        return value

    @ray.remote
    class Echo:
        def ping(self, *a: Any) -> Any:
            return value

    actor: list[Any] = []

    def get_actor() -> Any:
        if not actor:
            actor.append(Echo.remote())
            ray.get(actor[0].ping.remote(), timeout=60)
        return actor[0]

    def task_sync(n: int) -> int:
        for _ in range(n):
            ray.get(noop.remote(*args), timeout=60)
        return n

    def task_async(n: int) -> int:
        batches = max(1, n // BATCH)
        for _ in range(batches):
            ray.get([noop.remote(*args) for _ in range(BATCH)], timeout=120)
        return batches * BATCH

    def actor_sync(n: int) -> int:
        a = get_actor()
        for _ in range(n):
            ray.get(a.ping.remote(*args), timeout=60)
        return n

    def actor_async(n: int) -> int:
        a = get_actor()
        batches = max(1, n // BATCH)
        for _ in range(batches):
            ray.get([a.ping.remote(*args) for _ in range(BATCH)], timeout=120)
        return batches * BATCH

    return {"task_sync": task_sync, "task_async": task_async, "actor_sync": actor_sync,
            "actor_async": actor_async}


def settle(timeout_s: float = 15.0, window_s: float = 0.2, busy: float = 0.05) -> float:
    """Wait until the cluster's processes (not this driver) use under ``busy`` of a CPU
    over ``window_s``: a fresh cluster still starts workers and warms its fork server for
    a while, which the first table's rows would otherwise carry. Returns seconds waited."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        procs = [p for p in cluster_processes() if p.role != "driver"]
        before = {p.pid: thread_counters(p.pid) for p in procs}
        time.sleep(window_s)
        used = 0
        for p in procs:
            b = before[p.pid]
            used += sum(c.cpu_ns - b.get(t, Counters()).cpu_ns for t, c in thread_counters(p.pid).items())
        if used < busy * window_s * 1e9:
            break
    return time.monotonic() - t0


def _for(seconds: float, loop: Callable[[int], int], step: int) -> int:
    """Run ``loop`` in steps of ``step`` calls for at least ``seconds``; calls made."""
    n = 0
    end = time.perf_counter() + seconds
    while True:
        n += loop(step)
        if time.perf_counter() >= end:
            return n


def run_all(quick: bool, native: bool, top: int, use_py_spy: bool, profile_keys: list[str],
            rate: int | None = None, profile_s: float | None = None, repeat: int | None = None,
            arg_kib: int = 0, return_kib: int = 0) -> dict[str, Any]:
    """Run every workload on a fresh private cluster; the result that ``markdown`` prints."""
    import lumos as ray

    py_spy = py_spy_path() if use_py_spy else None
    notes: list[str] = []
    if use_py_spy and py_spy is None:
        notes.append("py-spy is not installed (pip install -e '.[bench]'): no top functions")
    sync_n, async_n, warm_s, spy_s = (300, BATCH, 0.3, 1.5) if quick else (3000, 5 * BATCH, 0.5, 6.0)
    spy_s = profile_s or spy_s
    repeat = repeat or (1 if quick else 3)
    out: dict[str, Any] = {"load_average": os.getloadavg(), "cpus": os.cpu_count(), "quick": quick, "repeat": repeat,
                           "arg_kib": arg_kib, "return_kib": return_kib, "scenarios": {}, "profiles": {},
                           "notes": notes}
    # Before the cluster starts: the fork copies nothing of it.
    same, cross = wakeup_costs(False), wakeup_costs(True)
    out["wakeup"] = {"same_core_us": same[0] if same else None, "across_cores_us": cross[0] if cross else None,
                     "write_waking_across_cores_cpu_us": cross[1] if cross else None,
                     "write_waking_nobody_cpu_us": write_cpu_us()}
    ray.init(num_cpus=2)
    tmp = tempfile.mkdtemp(prefix="where-time-goes-")
    try:
        loops = workloads(ray, arg_kib, return_kib)
        for key, _ in SCENARIOS:
            loop = loops[key]
            n = sync_n if key.endswith("_sync") else async_n
            step = 50 if n == sync_n else BATCH
            loop(1)  # the function exported, the actor created
            out.setdefault("settle_s", {})[key] = settle()
            _for(warm_s, loop, step)  # wake-ups are slow for a while after an idle spell
            procs = cluster_processes()
            name_threads(procs, py_spy)
            _for(0.1, loop, step)
            runs = [measure_counters(procs, lambda: loop(n)) for _ in range(repeat)]
            out["scenarios"][key] = median_of(runs)
            if py_spy is not None and key in profile_keys:
                samples, spy_notes = profile(procs, lambda: _for(spy_s, loop, step), py_spy, native,
                                             rate or (100 if native else 1000), tmp, key)
                if native and not samples:
                    notes.append(f"{key}: py-spy --native sampled nothing here; Python frames only "
                                 "(shares include samples of parked threads)")
                    native = False
                    samples, spy_notes = profile(procs, lambda: _for(spy_s, loop, step), py_spy, False,
                                                 rate or 1000, tmp, key)
                notes.extend(f"{key}: {s}" for s in spy_notes)
                cpu = out["scenarios"][key]["cpu_us"]
                prof: dict[str, Any] = {}
                for row in ROWS:
                    if row not in samples:
                        continue
                    label = f"{row[0]} / {row[1]}"
                    total, funcs, hot = top_functions(samples[row], top, native)
                    if total == 0:
                        continue  # never on a CPU while sampled
                    for fn in funcs:
                        fn["own_us"] = fn["own"] * cpu.get(label, 0.0)
                    prof[label] = {"samples": total, "cpu_us": cpu.get(label, 0.0), "top": funcs, "native": hot}
                out["profiles"][key] = prof
                out["native"] = native
                out["rate"] = rate or (100 if native else 1000)
    finally:
        ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    out["load_average_end"] = os.getloadavg()
    out["hops"] = HOPS
    return out


# ---------------------------------------------------------------------- item 4: the hop chain

HOPS = {
    "task": [
        ("driver user thread", "`../remote_function.py` `RemoteFunction._remote` → `core_worker/submission.py` "
         "`submit_task` packs the arguments, builds the `TaskSpec`, records the returns as owned, "
         "then `core_worker/core_worker.py` `CoreWorker.push_direct`: the lease of the previous call "
         "is still held and idle (`lease_idle_timeout_ms`) and the io thread has nothing in hand, so "
         "the lease is claimed (`TaskSubmitterState.claim_idle`, under the submitter's lock) and the "
         "`PushTask` written straight to the worker's Unix socket (`Connection.write_now`); its "
         "booking is queued for the io thread without waking it (`IoLoop.append_quiet`). Otherwise "
         "`IoLoop.post` (a wake-up of the driver's `lumos-io`), which enqueues and pushes it there"),
        ("driver user thread", "`../api.py` `get` → `core_worker/objects.py` `get` → `_wait_for` blocks on "
         "`Waiter.lock` (`core_worker/references.py`)"),
        ("worker main thread", "idle between tasks, it holds the reading of its owner's "
         "connection (`transport/connection.py` `SharedReader.take`) and reads the `PushTask` itself "
         "(`core_worker/executor.py` `Executor._next_task`): for up to `worker_spin_us` (400 us) "
         "after its last reply without sleeping (the spin in `_read_task`), so a caller's next "
         "sync call finds it awake and the write that sends it wakes nobody; later than that, "
         "asleep in `poll` (**a wake-up**). It gives the reading back to the worker's "
         "`lumos-io` before the task runs, so cancels and the owner's other frames are handled during "
         "it. A burst of frames, another owner's connection, threaded or async actors take the old way: "
         "`lumos-io` reads, `Executor.push` queues and wakes the main thread"),
        ("worker main thread", "`Executor._run_one` → `execute` (arguments, the function, the "
         "`TaskReply`) → takes the reading back → `CoreWorker.send_reply` → `Connection.write_now`: "
         "the reply leaves from this thread, not through the worker's io thread"),
        ("driver lumos-io", "awake when the reply to the call before released the caller's get within "
         "`owner_spin_us` of the one before that (300 us: `core_worker/results.py` `_spin_after_reply` keeps "
         "it polling, yielding the CPU between loop turns; else asleep in `epoll`, **a wake-up**): "
         "`_handle_task_reply` first books the "
         "task (`IoLoop.drain_pending` → `CoreWorker._on_direct_task` → `direct_pushed`), then "
         "`TaskSubmitterState.reply_done` (the lease idles) → `_finish_task` → `ObjectTable.complete` → "
         "`Waiter.hit` "
         "releases the lock (**a wake-up**: the driver's user thread, which returns the value); the "
         "lease's idle timer is left running (when it fires it finds the worker busy, or idle since "
         "later, and waits out the rest)"),
        ("raylet, GCS", "not on the path while a lease is held; the raylet grants a lease "
         "(`raylet/server.py` `_request_lease`) when the idle timer has returned it, and task "
         "events reach the GCS in batches, one event per short task (`gcs/task_log.py`)"),
    ],
    "actor": [
        ("driver user thread", "`../actor.py` `ActorMethod.remote` → `ActorHandle._submit` → "
         "`core_worker/submission.py` `submit_task` → `core_worker/actor_submitter.py` "
         "`ActorSubmitter.send_direct`: a call with no arguments to wait for, while the io thread has "
         "nothing in hand and the actor's line is empty, is written straight to the actor's connection "
         "(`Connection.write_now`, with the call's sequence number) and its booking queued for the io "
         "thread without waking it (`IoLoop.append_quiet`); otherwise `IoLoop.post` (a wake-up of the "
         "driver's `lumos-io`) and `ActorSubmitter.add`/`_send` there. Then `get` blocks on "
         "`Waiter.lock`"),
        ("actor main thread", "reads the call from the driver's connection itself "
         "(`SharedReader`, as a worker does, awake for `worker_spin_us` after its last reply) when it "
         "is a sync actor and idle; `Executor._run_one` → "
         "`execute` → `core_worker/actor_host.py` `after_call` → `send_reply` → `Connection.write_now`"),
        ("driver lumos-io", "awake within `owner_spin_us` of the reply before (as for a task; else "
         "**a wake-up**): `core_worker/results.py` `_handle_task_reply` first books "
         "the call (`IoLoop.drain_pending` → `ActorSubmitter._on_direct`), then `ObjectTable.complete` → "
         "`Waiter.hit` (**a wake-up**: the driver's user thread)"),
    ],
}


# ---------------------------------------------------------------------- output

def _fmt(v: float) -> str:
    if v >= 100:
        return f"{v:,.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def _present_rows(result: dict[str, Any]) -> list[str]:
    """The rows to print: the required ones, and the others where a figure is not ~0."""
    keep = {f"{r[0]} / {r[1]}" for r in REQUIRED_ROWS}
    for sc in result["scenarios"].values():
        for metric, floor in (("cpu_us", 0.05), ("wakeups", 0.005)):
            keep.update(k for k, v in sc[metric].items() if v >= floor)
    return [f"{r[0]} / {r[1]}" for r in ROWS if f"{r[0]} / {r[1]}" in keep]


def markdown(result: dict[str, Any]) -> str:
    keys = [k for k, _ in SCENARIOS if k in result["scenarios"]]
    titles = dict(SCENARIOS)
    sc = result["scenarios"]
    la = ", ".join(f"{x:.2f}" for x in result["load_average"])
    if "load_average_end" in result:
        la += " at the start, " + ", ".join(f"{x:.2f}" for x in result["load_average_end"]) + " at the end"
    lines = [f"CPU microseconds per call by process and thread, with the share spent in the kernel in "
             f"brackets (load average {la}; {result['cpus']} CPUs; median of {result['repeat']} runs of "
             + ", ".join(f"{titles[k]} {sc[k]['calls']:,}" for k in keys)
             + (f"; every call carries a {result['arg_kib']} KiB numpy array by value" if result.get("arg_kib") else "")
             + (f"; every call returns a {result['return_kib']} KiB numpy array" if result.get("return_kib") else "")
             + ")",
             "", "| process / thread | " + " | ".join(titles[k] for k in keys) + " |",
             "|---|" + "---:|" * len(keys)]
    rows = _present_rows(result)
    def cpu_cell(k: str, row: str) -> str:
        cell = _fmt(sc[k]["cpu_us"].get(row, 0.0))
        share = sc[k].get("kernel_share", {}).get(row)
        return cell if share is None else f"{cell} ({share:.0%})"

    for row in rows:
        lines.append(f"| {row} | " + " | ".join(cpu_cell(k, row) for k in keys) + " |")
    lines.append("| **all lumos processes** | " + " | ".join(f"**{_fmt(sc[k]['lumos_cpu_us'])}**" for k in keys) + " |")
    lines.append("| machine busy (`/proc/stat`) | " + " | ".join(_fmt(sc[k]["machine_cpu_us"]) for k in keys) + " |")
    lines.append("| wall time per call | " + " | ".join(_fmt(sc[k]["wall_us"]) for k in keys) + " |")
    lines.append("| driver's garbage collections per 1,000 calls (gen 0/1/2) | " + " | ".join(
        "/".join(f"{x:.0f}" if x >= 10 or x == 0 else f"{x:.1f}" for x in sc[k]["driver_gc_per_1000"])
        for k in keys) + " |")
    lines.append("| driver's garbage collector, CPU µs per call | "
                 + " | ".join(_fmt(sc[k].get("driver_gc_us", 0.0)) for k in keys) + " |")
    def per_thread(title: str, field: str) -> None:
        """A table of ``sc[k][field]`` by thread, with its total over all threads."""
        lines.extend(["", title, "", "| process / thread | " + " | ".join(titles[k] for k in keys) + " |",
                      "|---|" + "---:|" * len(keys)])
        for row in rows:
            lines.append(f"| {row} | " + " | ".join(_fmt(sc[k][field].get(row, 0.0)) for k in keys) + " |")
        lines.append("| **all threads** | "
                     + " | ".join(f"**{_fmt(sum(sc[k][field].values()))}**" for k in keys) + " |")

    per_thread("Wake-ups (voluntary context switches) per call", "wakeups")
    lines.append("| involuntary (preempted), all threads | "
                 + " | ".join(_fmt(sc[k]["involuntary"]) for k in keys) + " |")
    per_thread("Microseconds per call spent runnable but waiting for a CPU (schedstat run delay)", "cpu_wait_us")
    for key, prof in result["profiles"].items():
        what = ("samples not parked in a wait (running, or runnable and waiting for a CPU)"
                if result.get("native") else "samples, parked ones included")
        lines += ["", f"Top functions, {titles[key]} (py-spy at {result.get('rate')} Hz; share of the thread's "
                  f"{what}; µs/call: own share × the thread's CPU above, an estimate; native: where most "
                  "of the function's own samples were)",
                  "", "| process / thread | function | own | incl. | own µs/call | native |",
                  "|---|---|---:|---:|---:|---|"]
        for label, p in prof.items():
            first = True
            for fn in p["top"]:
                head = f"{label} ({p['samples']:,})" if first else ""
                first = False
                nat = f"`{fn['native']}` {fn['native_share']:.0%}" if fn.get("native") else ""
                lines.append(f"| {head} | `{fn['function']}` | {fn['own']:.0%} | {fn['inclusive']:.0%} | "
                             f"{_fmt(fn['own_us'])} | {nat} |")
            if p.get("native"):
                hot = ", ".join(f"`{name}` {share:.0%}" for name, share in p["native"])
                lines.append(f"| | *native functions of the whole thread: {hot}* | | | | |")
    wk = result.get("wakeup") or {}
    if wk.get("same_core_us") is not None:
        text = (f"One wake-up on this machine (half a pipe round trip between two processes, median): "
                f"{_fmt(wk['same_core_us'])} µs on one core")
        if wk.get("across_cores_us") is not None:
            text += (f", {_fmt(wk['across_cores_us'])} µs across cores, where the `write` that wakes the "
                     f"peer costs its writer {_fmt(wk['write_waking_across_cores_cpu_us'])} µs of CPU "
                     f"({_fmt(wk['write_waking_nobody_cpu_us'])} µs waking nobody)")
        lines += ["", text + "."]
    for kind, hops in result["hops"].items():
        lines += ["", f"The hops of one sync {'task' if kind == 'task' else 'actor call'} (files under "
                  "`runtime/_private/` unless named otherwise):", ""]
        lines += [f"{i}. **{who}**: {what}" for i, (who, what) in enumerate(hops, 1)]
    if result["notes"]:
        lines += [""] + [f"Note: {n}" for n in result["notes"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    out = p.add_mutually_exclusive_group()
    out.add_argument("--markdown", action="store_true", help="Markdown tables (the default)")
    out.add_argument("--json", action="store_true", help="one JSON object")
    p.add_argument("--quick", action="store_true", help="few calls, short profiles (a smoke test)")
    p.add_argument("--python-only", action="store_true",
                   help="py-spy without --native: cannot tell parked threads from busy ones")
    p.add_argument("--no-py-spy", action="store_true", help="skip the top functions")
    p.add_argument("--rate", type=int, default=None,
                   help="py-spy samples per second (default 100 with native frames, else 1000)")
    p.add_argument("--profile-s", type=float, default=None,
                   help="seconds each profile samples (default 6; 1.5 with --quick)")
    p.add_argument("--repeat", type=int, default=None,
                   help="measurements per workload, medians printed (default 3; 1 with --quick)")
    p.add_argument("--top", type=int, default=8, help="functions per thread (default 8)")
    p.add_argument("--arg-kib", type=int, default=0,
                   help="every call carries a numpy array of this many KiB by value (default: none)")
    p.add_argument("--return-kib", type=int, default=0,
                   help="every call returns a numpy array of this many KiB (default: None)")
    p.add_argument("--profile", nargs="+", default=["task_sync", "actor_sync"],
                   choices=[k for k, _ in SCENARIOS], help="workloads to profile (default: the sync ones)")
    args = p.parse_args(argv)
    result = run_all(args.quick, not args.python_only, args.top, not args.no_py_spy, args.profile, args.rate,
                     args.profile_s, args.repeat, args.arg_kib, args.return_kib)
    result["hops"] = {k: [list(h) for h in v] for k, v in result["hops"].items()}
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(markdown(result))


if __name__ == "__main__":
    main()
