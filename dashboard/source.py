"""The dashboard's mirror of GCS state: one per cluster, shared by every open page.

It owns a ``lumos.state.StateClient`` on the process's asyncio loop (the dashboard's
tornado loop or the Jupyter server's), subscribes to the nodes/jobs/workers/actors
channels and polls the task log for changed records (``task_updates``), the resource
view and the placement groups (few rows, removed ones bounded by the GCS) every
``poll_interval_s``. Pages read its dicts from the same loop, so no locks are needed.

It polls only while someone looks: pages call ``touch()`` from their periodic
callbacks, and after ``idle_after_s`` without a touch the poll loop sleeps. An idle
dashboard therefore costs the GCS nothing (the "never slows tasks" requirement).

```
GCS ──task_updates / node_resources / placement_groups (poll)──► ClusterSource ──tasks, nodes, tick──► pages
    ──subscribe(nodes | jobs | workers | actors)──►
    ──node_log (only the tails pages asked for, ``request_log``)──► logs
raylets ──spill_stats (while a page asks, ``request_spill``)──► spill
```
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from dataclasses import dataclass
from typing import Any, Iterable

from lumos.state import (PENDING_TASK_STATES, TASK_ROW_FIELDS, TASK_ROW_ID_FIELDS, TASK_ROW_ID_LIST_FIELDS,
                         TERMINAL_TASK_STATES, ActorInfo, JobInfo, NodeInfo, NodeResources, PlacementGroupInfo,
                         RemoteError, StateClient, TaskKind, WorkerInfo)

logger = logging.getLogger(__name__)

PENDING_STATES = PENDING_TASK_STATES
TERMINAL_STATES = TERMINAL_TASK_STATES
#: The one task-row schema (``lumos.state.TASK_ROW_FIELDS``): a ``Task`` has an attribute per field.
ROW_FIELDS = TASK_ROW_FIELDS
_IDX = {name: i for i, name in enumerate(ROW_FIELDS)}


class Task:
    """One task as the dashboard knows it: the fields of a task row, ids in hex."""

    __slots__ = ROW_FIELDS + ("first_seen",)

    task_id: str
    job_id: str
    name: str
    function_name: str
    type: str
    state: str
    attempt: int
    retries: int
    parent: str | None
    actor_id: str | None
    caller_id: str | None
    prev_call: str | None
    args: list[str]
    returns: list[str]
    node_id: str | None
    worker_id: str | None
    error: str | None
    submitted_time: float | None
    start_time: float | None
    end_time: float | None
    resources: dict[str, float]
    resource_ids: dict[str, list[Any]] | None
    events: list[list[Any]]
    error_type: str | None
    placement_group_id: str | None
    first_seen: int

    def __init__(self, row: list[Any], tick: int) -> None:
        self.first_seen = tick
        self.update(row)

    def update(self, row: list[Any]) -> None:
        for name, value in zip(ROW_FIELDS, row):
            if name in TASK_ROW_ID_FIELDS:
                value = value.hex() if isinstance(value, bytes) and value else None
            elif name in TASK_ROW_ID_LIST_FIELDS:
                value = [v.hex() for v in value if isinstance(v, bytes)]
            setattr(self, name, value)

    @property
    def reran(self) -> bool:
        """Retried or rebuilt by lineage reconstruction (a later attempt ran)."""
        return bool(self.retries) or self.attempt > 0

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in ROW_FIELDS}


#: Most log tails kept (one per node/worker/kind a page asked for).
MAX_LOGS = 64
#: Dead actors and dead workers kept each, the last to come (the GCS keeps about
#: as many: ``maximum_gcs_destroyed_actor_cached_count`` and its worker table's bound).
MAX_DEAD_ROWS = 10_000
#: Seconds between two reads of the nodes' spill stats (each asks every raylet).
SPILL_POLL_S = 2.0
#: The application metrics (``lumos.state.metrics``) are read this often while a page asks.
METRICS_POLL_S = 2.0


@dataclass(slots=True)
class LogTail:
    """The end of one log file, as the node's raylet sent it (through the GCS)."""

    #: The file's name ("" when it could not be read).
    name: str
    text: str
    #: Why it could not be read ("" when fine).
    error: str
    #: ``time.time()`` of the fetch.
    fetched_at: float


class ClusterSource:
    """Mirror of one cluster's GCS state, refreshed while pages look at it."""

    def __init__(self, client: StateClient, *, poll_interval_s: float = 0.25, idle_after_s: float = 15.0,
                 max_tasks: int = 200_000, label: str = "") -> None:
        self.client = client
        self.poll_interval_s = poll_interval_s
        self.idle_after_s = idle_after_s
        self.max_tasks = max_tasks
        #: Shown in page headers (session directory name or GCS address).
        self.label = label
        #: Node id (hex) -> NodeInfo.
        self.nodes: dict[str, NodeInfo] = {}
        #: Node id (hex) -> NodeResources (load as of the last heartbeat).
        self.status: dict[str, NodeResources] = {}
        #: Worker id (hex) -> WorkerInfo.
        self.workers: dict[str, WorkerInfo] = {}
        #: Job id (hex) -> JobInfo.
        self.jobs: dict[str, JobInfo] = {}
        #: Actor id (hex) -> ActorInfo.
        self.actors: dict[str, ActorInfo] = {}
        #: Placement group id (hex) -> PlacementGroupInfo, for groups not removed.
        self.placement_groups: dict[str, PlacementGroupInfo] = {}
        #: Task id (hex) -> Task, in the order first seen.
        self.tasks: dict[str, Task] = {}
        #: Object id (hex) -> id of the task that returns it.
        self.producer: dict[str, str] = {}
        #: (node id, worker id or "", suffix, lines) -> the latest tail fetched for ``request_log``.
        self.logs: dict[tuple[str, str, str, int], LogTail] = {}
        self._wanted_logs: set[tuple[str, str, str, int]] = set()
        #: Node id (hex) -> its row of ``lumos.state.spill_stats()`` (asked of the raylets
        #: every ``SPILL_POLL_S`` while a page calls ``request_spill``).
        self.spill: dict[str, dict[str, Any]] = {}
        #: ``time.time()`` of the last spill fetch (0: none yet).
        self.spill_fetched_at = 0.0
        self._want_spill = False
        #: The application metrics as ``lumos.state.metrics()`` gives them (read every
        #: ``METRICS_POLL_S`` while a page calls ``request_metrics``).
        self.metrics: list[dict[str, Any]] = []
        #: Records the GCS refused, by metric (``StateClient.dropped_metrics``).
        self.metrics_dropped: list[dict[str, Any]] = []
        self.metrics_fetched_at = 0.0
        self._want_metrics = False
        #: Increases whenever anything changed; pages compare it with theirs.
        self.tick = 0
        self._changes: collections.deque[tuple[int, list[str]]] = collections.deque(maxlen=200)
        self._seq = 0
        self.connected = False
        #: Why the last connection attempt or poll failed ("" when fine).
        self.error = ""
        self.last_poll = 0.0
        self._last_touch = 0.0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start the poll loop on the running loop (idempotent)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="dashboard.source")

    def close(self) -> None:
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            self._task = None
        self.client.close()

    def touch(self) -> None:
        """A page is looking: keep (or start) polling."""
        self._last_touch = time.monotonic()
        self.start()
        self._wake.set()

    def request_log(self, node_id: str, worker_id: str | None, suffix: str, lines: int) -> None:
        """Fetch that log's tail (through the GCS, from the node's raylet) at the next poll;
        the result lands in ``logs``."""
        self._wanted_logs.add((node_id, worker_id or "", suffix, lines))
        self.touch()

    def request_spill(self) -> None:
        """Refresh ``spill`` at the next poll (at most every ``SPILL_POLL_S``)."""
        self._want_spill = True
        self.touch()

    def request_metrics(self) -> None:
        """Refresh ``metrics`` at the next poll (at most every ``METRICS_POLL_S``)."""
        self._want_metrics = True
        self.touch()

    async def _fetch_metrics(self) -> None:
        self._want_metrics = False
        self.metrics = await self.client.metrics()
        self.metrics_dropped = self.client.dropped_metrics
        self.metrics_fetched_at = time.time()

    async def _fetch_spill(self) -> None:
        self._want_spill = False
        self.spill = {row["node_id"]: row for row in await self.client.spill_stats()}
        self.spill_fetched_at = time.time()

    async def _fetch_logs(self) -> None:
        wanted, self._wanted_logs = self._wanted_logs, set()
        for key in wanted:
            node_id, worker_id, suffix, lines = key
            try:
                reply = await self.client.node_log(node_id, worker_id or None, lines, suffix)
                tail = LogTail(reply.name, reply.text, "", time.time())
            except (LookupError, ValueError, PermissionError, TimeoutError, RemoteError) as e:
                tail = LogTail("", "", str(e), time.time())
            self.logs.pop(key, None)
            self.logs[key] = tail
        while len(self.logs) > MAX_LOGS:
            del self.logs[next(iter(self.logs))]

    async def _run(self) -> None:
        backoff = 0.1
        for channel, cb in (("nodes", self._on_node), ("jobs", self._on_job), ("workers", self._on_worker),
                            ("actors", self._on_actor)):
            self.client.subscribe(channel, cb)
        while not self._closed:
            try:
                if not self.client.connected:
                    await self.client.connect(timeout_s=5.0)
                    await self._load_tables()
                    self.connected = True
                    self.error = ""
                    backoff = 0.1
                await self.poll()
            except asyncio.CancelledError:
                raise
            except (OSError, TimeoutError, RemoteError) as e:
                self.connected = False
                self.error = f"{type(e).__name__}: {e}"
                self.client.close()
                self._bump([])
                logger.info("GCS unreachable (%s); retrying in %.1fs", self.error, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                await self._idle_wait()  # a gone cluster nobody looks at is not retried
                continue
            except Exception:
                logger.exception("dashboard poll failed")
                await asyncio.sleep(1.0)
                continue
            if not await self._idle_wait():
                await asyncio.sleep(self.poll_interval_s)

    async def _idle_wait(self) -> bool:
        """Sleep until a page touches the source again, if none did lately; True if it slept."""
        if time.monotonic() - self._last_touch <= self.idle_after_s:
            return False
        self._wake.clear()
        await self._wake.wait()
        return True

    async def _load_tables(self) -> None:
        client = self.client
        self.nodes = {n.node_id.hex(): n for n in await client.nodes()}
        self.jobs = {j.job_id.hex(): j for j in await client.jobs()}
        self.workers = {w.worker_id.hex(): w for w in await client.workers()}
        self.actors = {a.actor_id.hex(): a for a in await client.actors()}

    async def poll(self) -> None:
        """One refresh: changed task records (all pages of them), the resource view and placement groups."""
        changed: list[str] = []
        more = True
        while more:
            last, rows, more = await self.client.task_updates(self._seq, 5000)
            if last < self._seq:  # the GCS restarted: its log starts over
                self.tasks.clear()
                self.producer.clear()
            self._seq = last
            changed.extend(self._apply_rows(rows))
        self.status = {s.node_id.hex(): s for s in await self.client.node_resources()}
        if self._wanted_logs:
            await self._fetch_logs()
        if self._want_spill and time.time() - self.spill_fetched_at >= SPILL_POLL_S:
            await self._fetch_spill()
        if self._want_metrics and time.time() - self.metrics_fetched_at >= METRICS_POLL_S:
            await self._fetch_metrics()
        self.placement_groups = {g.pg_id.hex(): g for g in await self.client.placement_groups()
                                 if g.state != "REMOVED"}
        self.last_poll = time.time()
        self._bump(changed)

    def _apply_rows(self, rows: Iterable[list[Any]]) -> list[str]:
        tasks = self.tasks
        tick = self.tick + 1
        out = []
        i_id = _IDX["task_id"]
        for row in rows:
            tid = row[i_id].hex()
            task = tasks.get(tid)
            if task is None:
                task = tasks[tid] = Task(row, tick)
                for oid in task.returns:
                    self.producer[oid] = tid
            else:
                task.update(row)
            out.append(tid)
        if len(tasks) > self.max_tasks:
            self._trim(len(tasks) - self.max_tasks)
        return out

    def _trim(self, n: int) -> None:
        for tid in list(self.tasks)[:n * 2]:
            if n <= 0:
                break
            task = self.tasks[tid]
            if task.state in TERMINAL_STATES:
                del self.tasks[tid]
                for oid in task.returns:
                    self.producer.pop(oid, None)
                n -= 1

    def _bump(self, changed: list[str]) -> None:
        self.tick += 1
        self._changes.append((self.tick, changed))

    def changes_since(self, tick: int) -> set[str] | None:
        """Task ids changed after ``tick``, or None when that is too long ago (rebuild)."""
        if tick >= self.tick:
            return set()
        if not self._changes or self._changes[0][0] > tick + 1:
            return None
        out: set[str] = set()
        for t, ids in self._changes:
            if t > tick:
                out.update(ids)
        return out

    # ------------------------------------------------------------------ subscriptions

    def _on_node(self, info: NodeInfo) -> None:
        self.nodes[info.node_id.hex()] = info
        self._bump([])

    def _on_job(self, info: JobInfo) -> None:
        self.jobs[info.job_id.hex()] = info
        self._bump([])

    def _on_worker(self, info: WorkerInfo) -> None:
        key = info.worker_id.hex()
        new = key not in self.workers
        self.workers[key] = info
        if new:
            _trim_dead(self.workers)
        self._bump([])

    def _on_actor(self, info: ActorInfo) -> None:
        key = info.actor_id.hex()
        old = self.actors.get(key)
        if old is None or getattr(info, "version", 0) >= getattr(old, "version", 0):
            self.actors[key] = info
            if old is None:
                _trim_dead(self.actors)
            self._bump([])

    # ------------------------------------------------------------------ derived views

    def worker_label(self, worker_id: str | None) -> str:
        if not worker_id:
            return "?"
        w = self.workers.get(worker_id)
        if w is None:
            return f"worker {worker_id[:8]}"
        return f"{w.node_id.hex()[:6]} pid {w.pid}"

    def counts_by_state(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.tasks.values():
            out[t.state] = out.get(t.state, 0) + 1
        return out

    def lineage(self, object_id: str, max_tasks: int = 2000) -> list[Task]:
        """Tasks that produced ``object_id``, transitively through their arguments."""
        seen: set[str] = set()
        out: list[Task] = []
        todo = [object_id]
        while todo and len(out) < max_tasks:
            tid = self.producer.get(todo.pop())
            if tid is None or tid in seen:
                continue
            seen.add(tid)
            task = self.tasks.get(tid)
            if task is None:
                continue
            out.append(task)
            todo.extend(task.args)
            if task.prev_call:  # an actor call depends on the actor's state: its earlier calls
                prev = self.tasks.get(task.prev_call)
                if prev is not None:
                    todo.extend(prev.returns[:1])
        return out

    def pending_calls(self, actor_id: str) -> int:
        return sum(1 for t in self.tasks.values()
                   if t.actor_id == actor_id and t.type == TaskKind.ACTOR_TASK.name and t.state not in TERMINAL_STATES)


def _trim_dead(table: dict[str, Any]) -> None:
    """``table`` (actors or workers) just got a new row: drop its dead rows beyond
    ``MAX_DEAD_ROWS``, the first to come first (the pages list rows in that order). A
    dashboard that lives as long as its cluster held a row for every actor and worker the
    cluster ever ran. (It looks once per 256 new rows: a scan of every row at each one
    would cost a cluster of many live actors more than the rows.)"""
    keep = MAX_DEAD_ROWS
    if len(table) <= keep or len(table) % 256:
        return
    dead = [k for k, row in table.items() if row.state == "DEAD"]
    for key in dead[:max(0, len(dead) - keep)]:
        del table[key]
