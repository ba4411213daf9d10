"""Real use of nodes (memory, CPU load) and log tails for the status page.

Every raylet reports its machine's memory, CPU load and its processes' RSS in its
heartbeat, and the GCS serves the latest figures with the node's resources
(``NodeResources``): ``reported_usage`` turns them into a ``NodeUsage``, for nodes on
any machine. Log tails come the same way (``StateClient.node_log``: the GCS asks the
node's raylet, see ``lumos._private.raylet.node_report``). What remains here is the
fallback for a node whose raylet has not reported yet: read its processes directly when
it runs on the dashboard's own machine.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any

import psutil


@dataclass(slots=True)
class NodeUsage:
    """Real use on a node's machine."""

    #: Host memory in use (total - available) and total, bytes.
    memory_used_bytes: int
    memory_total_bytes: int
    #: Resident memory of the node's lumos processes (raylet and workers), bytes.
    lumos_rss_bytes: int
    #: Host CPU load, percent of all cores, since the previous call.
    cpu_percent: float


def reported_usage(status: Any) -> NodeUsage | None:
    """The figures a node's raylet last reported to the GCS (None: none reported yet)."""
    total = getattr(status, "memory_total_bytes", 0) if status is not None else 0
    if not total:
        return None
    return NodeUsage(memory_used_bytes=int(total - status.memory_available_bytes), memory_total_bytes=int(total),
                     lumos_rss_bytes=int(status.lumos_rss_bytes), cpu_percent=float(status.cpu_percent))


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
