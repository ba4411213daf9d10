"""What a raylet tells about its own machine: real memory use (for its heartbeat) and the
ends of its log files (``GetNodeLog``, forwarded by the GCS). The dashboard and
``lumos.state`` read both through the GCS, so they work for nodes on any machine.

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

import psutil

from lumos._private.ids import NodeID, WorkerID

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
        try:
            rss += psutil.Process(pid).memory_info().rss
        except psutil.Error:  # exited since: it uses nothing now
            continue
    return MemorySample(int(vm.total), int(vm.available), rss, float(psutil.cpu_percent(interval=None)))


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
