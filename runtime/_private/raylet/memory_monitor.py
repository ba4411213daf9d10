"""The raylet's memory monitor: kill a worker before the kernel's OOM killer picks one.

Every ``memory_monitor_refresh_ms`` the raylet samples the node's memory (the cgroup's
limit and usage when the raylet runs in a memory-limited cgroup, v2 or v1; else the
machine's, from psutil) and hands it, with the workers it could kill, to
``MemoryMonitorState``. Above ``memory_usage_threshold`` the state picks one victim:

1. retriable work before work that would be lost: tasks with ``max_retries`` other than
   0 (the owner retries them, with backoff) and actors with ``max_restarts`` other than
   0, before tasks with ``max_retries=0`` and actors that cannot restart (the lease
   request carries the budget, ``RequestWorkerLease.retry_budget``);
2. then a worker running tasks before a worker hosting an actor;
3. then the newest lease first (the work that has run least is lost).

It kills one worker at a time: the next victim is chosen only once the last one is gone
(or did not die within ``kill_timeout_s``), so memory freed by one kill is seen before
another. The kill reason starts with ``OOM_KILL_REASON``; owners recognise it and raise
``OutOfMemoryError`` (naming the task, the node and these figures) when no retry is left.

```
RayletServer ──sample every refresh_ms──► read_memory() + candidates
      ▲                                        │ MemorySampled
      └──── KillForMemory(worker, reason) ◄── MemoryMonitorState
```
"""

from __future__ import annotations

import dataclasses
import logging
import os

from lumos._private.ids import WorkerID

logger = logging.getLogger(__name__)

#: How every kill reason of the memory monitor starts (owners match on it).
OOM_KILL_REASON = "killed by the memory monitor"

TASK, ACTOR = "task", "actor"
_GIB = 1024 ** 3
_MIB = 1024 ** 2


@dataclasses.dataclass(slots=True)
class MemoryUsage:
    used_bytes: int
    total_bytes: int
    #: Where the figures come from: "cgroup v2", "cgroup v1" or "node".
    source: str = "node"

    @property
    def fraction(self) -> float:
        return self.used_bytes / self.total_bytes if self.total_bytes > 0 else 0.0


@dataclasses.dataclass(slots=True)
class Candidate:
    """A worker the monitor may kill: leased to run tasks, or hosting an actor."""

    worker_id: WorkerID
    pid: int
    #: TASK or ACTOR.
    kind: str
    #: Larger is newer (the raylet's lease id).
    lease_order: int
    rss_bytes: int = 0
    #: Killing it loses nothing for good: the task is retried or the actor restarted.
    retriable: bool | None = None

    def __post_init__(self) -> None:
        if self.retriable is None:
            self.retriable = is_retriable(self.kind, None)


def is_retriable(kind: str, retry_budget: int | None) -> bool:
    """Whether work of ``kind`` with that ``max_retries``/``max_restarts`` survives a kill
    (None: not told by an older owner: tasks count as retriable, actors not)."""
    if retry_budget is None:
        return kind == TASK
    return retry_budget != 0


@dataclasses.dataclass(slots=True)
class MemorySampled:
    usage: MemoryUsage
    candidates: list[Candidate]
    now: float


@dataclasses.dataclass(slots=True)
class KillForMemory:
    worker_id: WorkerID
    pid: int
    reason: str


class MemoryMonitorState:
    """Decides which worker (if any) to kill for memory; pure (events in, actions out)."""

    def __init__(self, threshold: float, node_label: str, kill_timeout_s: float = 5.0,
                 validate: bool = False) -> None:
        if not 0 < threshold <= 1:
            raise ValueError(f"memory_usage_threshold must be > 0 and <= 1, got {threshold}")
        self.threshold = threshold
        #: Shown in kill reasons (the node's short id).
        self.node_label = node_label
        self.kill_timeout_s = kill_timeout_s
        self.validate = validate
        #: The last victim while it may still be dying: (worker id, when it was killed).
        self.pending: tuple[bytes, float] | None = None
        #: Workers killed so far (for logs and the dashboard).
        self.kills = 0

    def handle(self, event: MemorySampled) -> list[KillForMemory]:
        actions = self._handle(event)
        if self.validate:
            assert len(actions) <= 1, "the memory monitor kills one worker at a time"
            assert not actions or self.pending == (actions[0].worker_id, event.now)
        return actions

    def _handle(self, event: MemorySampled) -> list[KillForMemory]:
        alive = {c.worker_id for c in event.candidates}
        if self.pending is not None:
            wid, since = self.pending
            if wid in alive and event.now - since < self.kill_timeout_s:
                return []  # wait for the last victim to go before judging memory again
            self.pending = None
        usage = event.usage
        if usage.fraction <= self.threshold or not event.candidates:
            return []
        victim = max(event.candidates, key=lambda c: (bool(c.retriable), c.kind == TASK, c.lease_order))
        self.pending = (victim.worker_id, event.now)
        self.kills += 1
        if victim.kind == TASK:
            what = ("a worker running retriable tasks" if victim.retriable else
                    "a worker running tasks with max_retries=0 (no retriable work to kill)")
        else:
            what = ("an actor's worker that can restart (no retriable task to kill)" if victim.retriable else
                    "an actor's worker that cannot restart (no retriable work to kill)")
        reason = (f"{OOM_KILL_REASON}: node {self.node_label} used {usage.used_bytes / _GIB:.2f} GiB of "
                  f"{usage.total_bytes / _GIB:.2f} GiB ({usage.source}), {usage.fraction:.0%}, above "
                  f"memory_usage_threshold={self.threshold:g}; killed {what}, the newest, pid {victim.pid} "
                  f"using {victim.rss_bytes / _MIB:.0f} MiB. Use less memory per task, fewer tasks at once "
                  "(num_cpus or memory= per task), or a node with more memory")
        return [KillForMemory(victim.worker_id, victim.pid, reason)]


# ----------------------------------------------------------------------------- sampling


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    if not text or text == "max":
        return None
    try:
        return int(text)
    except ValueError:
        return None


def _stat_value(path: str, name: str) -> int:
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.partition(" ")
                if key == name:
                    return int(value)
    except (OSError, ValueError):
        pass
    return 0


def _own_cgroup(proc_cgroup: str, controller: str) -> str:
    """This process's cgroup path for ``controller`` ("" for the v2 unified hierarchy)."""
    try:
        with open(proc_cgroup) as f:
            for line in f:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                if controllers.split(",") == [controller] or (not controller and controllers == ""):
                    return path
                if controller and controller in controllers.split(","):
                    return path
    except (OSError, ValueError):
        pass
    return "/"


def cgroup_memory(root: str = "/sys/fs/cgroup", proc_cgroup: str = "/proc/self/cgroup") -> MemoryUsage | None:
    """Usage against the memory limit of this process's cgroup; None without a limit.

    Usage leaves out inactive file pages (the page cache the kernel reclaims before any
    OOM kill), as ``docker stats`` and Ray do.
    """
    path = _own_cgroup(proc_cgroup, "")
    for d in (os.path.join(root, path.lstrip("/")), root):  # v2: own cgroup, or a container's root
        limit = _read_int(os.path.join(d, "memory.max"))
        current = _read_int(os.path.join(d, "memory.current"))
        if limit is not None and current is not None:
            inactive = _stat_value(os.path.join(d, "memory.stat"), "inactive_file")
            return MemoryUsage(max(0, current - inactive), limit, "cgroup v2")
    path = _own_cgroup(proc_cgroup, "memory")
    for d in (os.path.join(root, "memory", path.lstrip("/")), os.path.join(root, "memory")):
        limit = _read_int(os.path.join(d, "memory.limit_in_bytes"))
        usage = _read_int(os.path.join(d, "memory.usage_in_bytes"))
        if limit is not None and usage is not None and limit < 1 << 60:  # v1 says "no limit" with ~2^63
            inactive = _stat_value(os.path.join(d, "memory.stat"), "total_inactive_file")
            return MemoryUsage(max(0, usage - inactive), limit, "cgroup v1")
    return None


def read_memory() -> MemoryUsage:
    """This node's memory use: the tighter of the machine's and its cgroup limit's."""
    import psutil
    vm = psutil.virtual_memory()
    node = MemoryUsage(vm.total - vm.available, vm.total, "node")
    cg = cgroup_memory()
    if cg is not None and cg.total_bytes < node.total_bytes:
        return cg
    return node
