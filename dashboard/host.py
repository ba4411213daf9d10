"""What the dashboard's own machine can say about nodes running on it: real memory and
CPU use (psutil) and log tails. The GCS knows reservations (``memory`` as a resource),
not what processes use; the dashboard runs on the head node, so for every node on this
machine it reads the processes and log files directly. Nodes on other machines show
their reservations only ("not on this machine").

Log files are read only under ``<node session dir>/logs/``, by names made from ids
(``raylet-<node id[:12]>.log``, ``worker-<worker id[:12]>.log``), never following a
symlink, and only their last ``TAIL_BYTES``. Callers escape the text before showing it.
"""

from __future__ import annotations

import os
import socket
import stat
from dataclasses import dataclass
from typing import Any

import psutil

#: How much of a log file's end is read for a tail.
TAIL_BYTES = 16 * 1024


@dataclass(slots=True)
class NodeUsage:
    """Real use on a node's machine (None: the node is not on this machine)."""

    #: Host memory in use (total - available) and total, bytes.
    memory_used_bytes: int
    memory_total_bytes: int
    #: Resident memory of the node's lumos processes (raylet and workers), bytes.
    lumos_rss_bytes: int
    #: Host CPU load, percent of all cores, since the previous call.
    cpu_percent: float


def is_local(info: Any) -> bool:
    """The node runs on this machine (its session directory and raylet pid are here)."""
    if info.hostname not in (socket.gethostname(), "localhost"):
        return False
    return bool(info.session_dir) and os.path.isdir(info.session_dir)


def node_usage(info: Any, worker_pids: list[int]) -> NodeUsage | None:
    if not is_local(info):
        return None
    vm = psutil.virtual_memory()
    rss = 0
    for pid in [info.pid, *worker_pids]:
        try:
            rss += psutil.Process(pid).memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return NodeUsage(memory_used_bytes=int(vm.total - vm.available), memory_total_bytes=int(vm.total),
                     lumos_rss_bytes=rss, cpu_percent=float(psutil.cpu_percent(interval=None)))


def log_path(info: Any, kind: str, ident: str) -> str | None:
    """The log file of a node's raylet (``kind="raylet"``, ``ident`` its node id) or one
    of its workers (``kind="worker"``), when it is on this machine."""
    if kind not in ("raylet", "worker") or not ident.isalnum() or not is_local(info):
        return None
    return os.path.join(info.session_dir, "logs", f"{kind}-{ident[:12]}.log")


def tail(path: str, lines: int = 40) -> str:
    """The last ``lines`` lines of ``path`` (a regular file, not a symlink)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{path} is not a regular file")
        start = max(0, st.st_size - TAIL_BYTES)
        os.lseek(fd, start, os.SEEK_SET)
        data = os.read(fd, TAIL_BYTES)
    finally:
        os.close(fd)
    text = data.decode("utf-8", "replace")
    if start:
        text = text.split("\n", 1)[-1]  # drop the partial first line
    return "\n".join(text.rstrip("\n").split("\n")[-lines:])
