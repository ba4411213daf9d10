"""What a raylet tells about its own machine: real memory use (for its heartbeat), its
workers, store and resources (``GetNodeStats``) and the ends of its log files (``GetNodeLog``,
forwarded by the GCS). The dashboard and
``lumos.state`` read them through the GCS, so they work for nodes on any machine.

```
raylet ──NodeHeartbeat(memory_*, lumos_rss_bytes)──► GCS ──GetClusterStatus──► state API, dashboard
client ──GetNodeLog(node_id, worker_id)──► GCS ──GetNodeLog──► that node's raylet ──NodeLog──┘
```

Log paths are made from validated ids only (``raylet-<node id[:12]>.<suffix>``,
``worker-<worker id[:12]>.<suffix>`` under ``<session>/logs/``), never from a path a
client sent; files are opened without following symlinks and only their last
``MAX_TAIL_BYTES`` are read.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psutil

from lumos._private.ids import NodeID, WorkerID, short
from lumos._private.protocol import messages as m

if TYPE_CHECKING:
    from lumos._private.raylet.server import RayletServer

#: Most lines and bytes one ``GetNodeLog`` returns.
MAX_TAIL_LINES = 200
MAX_TAIL_BYTES = 64 * 1024
#: Log file kinds a client may ask for.
SUFFIXES = ("log", "out")


@dataclass(slots=True)
class MemorySample:
    total_bytes: int
    available_bytes: int
    #: Resident memory of the given processes (raylet and workers), bytes.
    lumos_rss_bytes: int
    #: The machine's CPU load since the previous sample, percent of all cores.
    cpu_percent: float


def sample_memory(pids: list[int]) -> MemorySample:
    """The machine's memory (one read of /proc/meminfo), its CPU load since the previous
    call and the RSS sum of ``pids``."""
    vm = psutil.virtual_memory()
    rss = 0
    for pid in pids:
        rss += _rss_bytes(pid)
    return MemorySample(int(vm.total), int(vm.available), rss, float(psutil.cpu_percent(interval=None)))


_PROC_STATM = os.path.exists("/proc/self/statm")
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if _PROC_STATM else 4096


def _rss_bytes(pid: int) -> int:
    """A process's resident memory; 0 once it has exited. One small read where /proc
    has it (``psutil.Process(pid)`` reads /proc/<pid>/stat first): with a thousand
    actors this runs once a second over a thousand pids."""
    try:
        if _PROC_STATM:
            with open(f"/proc/{pid}/statm", "rb") as f:
                return int(f.read().split()[1]) * _PAGE_SIZE
        return int(psutil.Process(pid).memory_info().rss)
    except (OSError, ValueError, IndexError, psutil.Error):
        return 0


def log_name(node_id: NodeID, worker_id: WorkerID | None, suffix: str) -> str:
    """The file name of a node's raylet log or one of its workers' (ids checked here)."""
    if suffix not in SUFFIXES:
        raise ValueError(f"suffix must be one of {', '.join(SUFFIXES)}, got {suffix!r}")
    if worker_id is None:
        return f"raylet-{node_id.hex()[:12]}.{suffix}"
    if not isinstance(worker_id, bytes) or len(worker_id) != 16:
        raise ValueError(f"worker_id must be a 16-byte worker id, got {worker_id!r:.60}")
    return f"worker-{worker_id.hex()[:12]}.{suffix}"


def check_tail_lines(tail_lines: object) -> int:
    if isinstance(tail_lines, bool) or not isinstance(tail_lines, int) or tail_lines < 1:
        raise ValueError(f"tail must be a positive number of lines (at most {MAX_TAIL_LINES}), got {tail_lines!r}")
    return min(tail_lines, MAX_TAIL_LINES)


def tail(path: str, lines: int) -> tuple[str, bool]:
    """The last ``lines`` lines of ``path`` (a regular file, not a symlink) and whether
    the file held more. Raises ``FileNotFoundError`` or ``OSError``."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{os.path.basename(path)} is not a regular file")
        start = max(0, st.st_size - MAX_TAIL_BYTES)
        os.lseek(fd, start, os.SEEK_SET)
        data = os.read(fd, MAX_TAIL_BYTES)
    finally:
        os.close(fd)
    text = data.decode("utf-8", "replace")
    if start:
        text = text.split("\n", 1)[-1]  # drop the partial first line
    all_lines = text.rstrip("\n").split("\n") if text else []
    return "\n".join(all_lines[-lines:]), bool(start) or len(all_lines) > lines


def group_resources(bundles: Any) -> tuple[dict[str, float], dict[str, float]]:
    """The node's reserved placement-group bundles under Ray's resource names, ``(total,
    available)``: ``CPU_group_<i>_<pg>`` per bundle, ``CPU_group_<pg>`` summed over the
    group's bundles here, and ``bundle_group_<i>_<pg>`` / ``bundle_group_<pg>`` (1000 per
    bundle, as Ray's). Shown by ``cluster_resources()``/``available_resources()`` only:
    lumos schedules into a bundle by its reference, not by these names."""
    total: dict[str, float] = {}
    avail: dict[str, float] = {}
    for (pg, index), b in bundles.items():
        pg_hex = pg.hex()
        for out, amounts in ((total, b.pool.as_floats(b.pool.total)), (avail, b.pool.as_floats(b.pool.available))):
            for name, amount in [*amounts.items(), ("bundle", 1000.0)]:
                out[f"{name}_group_{index}_{pg_hex}"] = amount
                out[f"{name}_group_{pg_hex}"] = out.get(f"{name}_group_{pg_hex}", 0.0) + amount
    return total, avail


def node_stats(raylet: RayletServer) -> dict[str, Any]:
    """``GetNodeStats``: this raylet's workers, store, spilling, resources, queue and bundles."""
    sched = raylet.scheduler
    workers = []
    for p in raylet.procs.values():
        lease = sched.lease_of_worker(p.worker_id)
        workers.append({
            "worker_id": p.worker_id.hex(), "pid": p.pid if p.process else None,
            "is_driver": p.is_driver, "job_id": p.job_id.hex() if p.job_id else None,
            "state": "LEASED" if lease else ("IDLE" if p.address else "STARTING"),
            "resources": sched.resources.as_floats(lease.units) if lease else {},
            "resource_ids": lease.resource_ids if lease else {},
        })
    return {"node_id": raylet.node_id.hex(), "store": raylet.store.stats(), "workers": workers,
            "spill": raylet.store.spill_stats(),
            "available": sched.available_floats(), "total": dict(raylet.resources_total),
            "queue_length": len(sched.queue), "infeasible": sched.infeasible_shapes(),
            "transfer": raylet.object_manager.stats(),
            "group_resources": group_resources(sched.bundles),
            "bundles": [{"placement_group_id": pg.hex(), "index": i,
                         "total": b.pool.as_floats(b.pool.total), "node_ids": b.node_ids,
                         "available": {k: v for k, v in b.pool.as_floats(b.pool.available).items()}}
                        for (pg, i), b in sched.bundles.items()]}


def node_log(node_id: NodeID, session_dir: str, msg: m.GetNodeLog) -> m.NodeLog:
    """``GetNodeLog``: the end of this node's raylet log or one of its workers'."""
    if msg.node_id != node_id:
        raise LookupError(f"this is node {short(node_id)}, not {msg.node_id!r:.40}; ask the GCS")
    name = log_name(node_id, msg.worker_id, msg.suffix)
    lines = check_tail_lines(msg.tail_lines)
    try:
        text, truncated = tail(os.path.join(session_dir, "logs", name), lines)
    except FileNotFoundError:
        raise LookupError(f"node {short(node_id)} has no log file {name} (no such worker "
                          "on this node, or it has not logged yet)") from None
    except OSError as e:  # a symlink (O_NOFOLLOW) or unreadable: refuse, typed
        raise PermissionError(f"node {short(node_id)} cannot read {name}: {e.strerror}") from None
    return m.NodeLog(name, text, truncated)
