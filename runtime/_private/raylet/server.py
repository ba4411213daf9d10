"""The raylet process: one per node. Local scheduler, worker pool, object store manager.

```
          ┌────────────── RayletServer ──────────────┐
owners ──►│ RequestWorkerLease ─► LocalSchedulerState │──► WorkerPool: fork/spawn, reap
          │ CreateObject/Free  ─► ObjectStoreState    │──► files in /dev/shm/<store dir>
          │ PinObjects, RestoreSpilled ─┘   │ spill/  │    (spill, restore: raylet.spill
          │                                 └─────────│──► threads) <spill dir>/node-<id>
workers ─►│ RegisterClient, LogBatch, WorkerBlocked   │
          └───────────────┬──────────────────────────┘
                          └── RegisterNode, NodeHeartbeat, LogBatch ──► GCS
```
The two ``…State`` classes decide; this class owns the loop, sockets, timers, processes
and files, and executes their actions. Run as ``python -m lumos._private.raylet.server``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import logging
import os
import shutil
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Awaitable, Callable

from lumos._private.config import Config
from lumos._private.transport import eventloop
from lumos._private.core_worker.io_loop import spawn
from lumos._private.ids import NodeID, ObjectID, WorkerID, short
from lumos._private.object_store import store_state as st
from lumos._private.object_store import spill_io
from lumos._private.node import node_labels
from lumos._private.object_store.client import unlink_quietly
from lumos._private.process import (check_private_dir, die_with_parent, make_private_dir, process_stopped, read_token,
                                    report_ready, setup_logging, tune_gc_for_service)
from lumos._private.protocol import messages as m
from lumos._private.protocol.vocab import LEASE_REFUSALS, PlacementGroupRemoved
from lumos._private.raylet import memory_monitor as mm
from lumos._private.raylet.moved_sweep import MovedSweep
from lumos._private.raylet import node_report
from lumos._private.raylet import scheduler as sc
from lumos._private.raylet.object_manager import ObjectManager, ObjectUnavailable
from lumos._private.raylet.worker_pool import WorkerPool, WorkerProc
from lumos._private.transport.connection import (Connection, ConnectionLost, Refusal, RemoteError, RpcServer,
                                                 connect_with_retry,
                                                 parse_address)

logger = logging.getLogger(__name__)

_TICK_S = 0.1
#: Owners one ``OwnersStopped`` question names at most (the rest are not looked at).
MAX_OWNERS_ASKED = 1024


class RayletServer:
    def __init__(self, config: Config, token: bytes, *, node_id: NodeID, session_dir: str,
                 gcs_address: str, resources: dict[str, float], store_dir: str,
                 store_bytes: int, node_ip: str, is_head: bool, labels: dict[str, str]) -> None:
        self.config = config
        self.token = token
        self.node_id = node_id
        self.session_dir = session_dir
        self.gcs_address = gcs_address
        self.node_ip = node_ip
        self.is_head = is_head
        self.labels = node_labels(labels, node_id, resources)
        self.resources_total = resources
        self.store_dir = store_dir
        cpus = int(resources.get("CPU", 1))
        prestart = config.num_prestart_workers if config.num_prestart_workers >= 0 else cpus
        max_workers = config.max_workers_per_node if config.max_workers_per_node > 0 else 4 * cpus + 8
        self.scheduler = sc.LocalSchedulerState(resources, prestart, max_workers,
                                                config.worker_idle_timeout_s, validate=config.validate)
        #: This node's private spill directory ("" when spilling is off).
        self.spill_dir = ""
        if config.object_spilling_enabled:
            self.spill_dir = spill_io.node_spill_dir(config.object_spilling_directory, session_dir, node_id)
        self.store = st.ObjectStoreState(store_dir, store_bytes, config.object_store_recycle_bytes,
                                         config.object_store_full_timeout_s, validate=config.validate,
                                         spill_dir=self.spill_dir, spill_threshold=config.object_spilling_threshold,
                                         pool_idle_s=config.object_store_pool_idle_s)
        #: Spill, restore and on-disk preallocation run here, never on the loop.
        self._spill_io = ThreadPoolExecutor(2, thread_name_prefix="raylet.spill")
        #: Object id -> readers waiting for its restore.
        self._restore_waiters: dict[bytes, list[asyncio.Future[str | None]]] = {}
        self._spill_dir_made = False
        #: Worker processes: started (forked or spawned), watched, killed and refilled there.
        self.pool = WorkerPool(self, config.worker_start, prestart)
        #: Worker id -> process (workers) or registration (drivers); the pool's.
        self.procs = self.pool.procs
        #: Worker id -> exit description, kept after the process is gone; the pool's.
        self.exits = self.pool.exits
        #: Lease request id -> (owner connection, future of the reply).
        self._lease_waiters: dict[int, tuple[Connection, asyncio.Future[Any]]] = {}
        #: Lease id -> owner connection.
        self._lease_owner: dict[int, Connection] = {}
        #: Create request id -> future of the reply.
        self._create_waiters: dict[int, asyncio.Future[Any]] = {}
        #: Ids of the requests this raylet answers through its states' actions (leases,
        #: creates, reservations, bundles, kept copies), each read back by its asker.
        self._request_ids = itertools.count(1)
        self._warned_infeasible: set[int] = set()
        #: Leases whose frozen owner's worker is being checked (``_take_back_from_frozen_owners``).
        self._taking_back: set[int] = set()
        #: Nodes whose raylet is being asked which owners are stopped (``OwnersStopped``).
        self._asking_stopped: set[bytes] = set()
        #: Blocked task workers at which the next warning about them goes out (``_warn_blocked``).
        self._blocked_warn_at = self.scheduler.max_workers
        #: Bundle reservation request id -> [ok, reason, [[index, GPU ids], ...]] (answered within the same event).
        self._bundle_answers: dict[int, list[Any]] = {}
        #: Alive nodes of the cluster (this one included), from the GCS "nodes" channel.
        self.alive_nodes: dict[bytes, m.NodeInfo] = {}
        #: Owner worker id -> ids of the objects in this store it owns (made here for it,
        #: or copies pulled for its borrowers): freed when the owner dies (issue 12).
        self._owned: dict[WorkerID, set[ObjectID]] = {}
        #: Object id -> its owner's worker id (the inverse of ``_owned``).
        self._owner_of: dict[ObjectID, WorkerID] = {}
        self.gcs: Connection | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        #: Reservation answers, read back by the handler that asked (same call).
        self._slot_grants: dict[int, list[Any]] = {}
        #: Answers of ``CopiesKeepRequested``, read back by the handler that asked (same call).
        self._kept_copies: dict[int, list[ObjectID]] = {}
        self._unlinker = ThreadPoolExecutor(1, thread_name_prefix="raylet.unlink")
        #: Object files moved out of their names for the unlink thread (``_name_gone``).
        self._trashed = 0
        self._moved_sweep = MovedSweep(self.store, self._unlinker,
                                       lambda oids: self._store(st.MovedFilesFound(oids)))
        self.stopped = asyncio.Event()
        self.object_manager = ObjectManager(self)
        self.memory_monitor = mm.MemoryMonitorState(config.memory_usage_threshold, short(node_id),
                                                    validate=config.validate)
        self._stopping = False
        #: A reconnection to a restarted GCS is under way.
        self._gcs_reconnecting = False
        #: The GCS keeps its tables in durable storage (asked at registration): when it goes,
        #: wait for its restart rather than stop.
        self._gcs_durable = config.gcs_storage not in ("", "memory")
        #: ``_gcs_durable`` is the GCS's answer (not the guess from our own config): new
        #: workers are told it and do not ask the GCS themselves (issue 19).
        self.gcs_durable_known = False
        #: The store directory passed the ownership check (so ``stop`` may remove it).
        self._store_dir_checked = False
        self.unix_path = os.path.join(session_dir, "sockets", f"raylet-{node_id.hex()[:12]}.sock")
        handlers = {
            m.RegisterClient: self.pool.register_client,
            m.RequestWorkerLease: self._request_lease,
            m.RequestSpilledLease: lambda c, msg: self._request_lease(c, msg.request, msg.hops),
            m.ReturnWorker: self._return_worker,
            m.WorkerBlocked: lambda c, msg: self._sched(sc.WorkerBlocked(msg.worker_id)),
            m.WorkerUnblocked: lambda c, msg: self._sched(sc.WorkerUnblocked(msg.worker_id)),
            m.CreateObject: self._create_object,
            m.SealObject: self._seal_object,
            m.ReserveSlots: self._reserve_slots,
            m.FreeObjects: self._free_objects,
            m.FreeObjectCopies: self._free_copies,
            m.KeepObjectCopies: self._keep_copies,
            m.PullObject: self._pull_object,
            m.GetObjectSize: lambda c, msg: self.object_manager.object_size(msg.object_id),
            m.ReadObjectChunk: lambda c, msg: self.object_manager.read_chunk(msg.object_id, msg.offset, msg.length),
            m.MarkShared: lambda c, msg: self._store(st.MarkedShared(msg.object_ids)),
            m.PinObjects: self._pin_objects,
            m.RestoreSpilled: self._restore_spilled,
            m.GetWorkerExit: self.pool.get_worker_exit,
            m.KillWorker: self.pool.kill_worker_request,
            m.GetNodeStats: self._node_stats,
            m.OwnersStopped: self._stopped_owners_here,
            m.LogBatch: self._forward_logs,
            m.ShutdownNode: self._shutdown_request,
            m.ReserveBundles: self._reserve_bundles,
            m.ReleaseBundles: lambda c, msg: self._sched(sc.BundlesRemoved(msg.pg_id, msg.indices)),
        }
        self.server = RpcServer(token=token, config=config, handlers=handlers, name="raylet",
                                on_close=self._client_closed)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        # The parent made it 0700 before starting us; never use one someone else made (issue 11).
        check_private_dir(self.store_dir, "object store directory")
        self._store_dir_checked = True
        if self.spill_dir:
            os.makedirs(os.path.dirname(self.spill_dir), mode=0o700, exist_ok=True)
            make_private_dir(self.spill_dir, "spill directory")
            self._spill_dir_made = True
        os.makedirs(os.path.dirname(self.unix_path), exist_ok=True)
        await self.server.start(unix_path=self.unix_path, host=self.node_ip, port=0)
        self.object_manager.start(self.node_ip)
        self.pool.start()
        await self._connect_gcs(self.config.connect_timeout_s)
        self._spawn(self._heartbeat_loop(), "raylet.heartbeat")
        self._spawn(self._tick_loop(), "raylet.tick")
        if self.config.memory_monitor_refresh_ms > 0:
            self._spawn(self.pool.memory_loop(), "raylet.memory_monitor")
        logger.info("raylet %s up: %s, store %d MiB at %s (collector thresholds %s)", short(self.node_id),
                    self.resources_total, self.store.capacity_bytes >> 20, self.store_dir, gc.get_threshold())

    async def _connect_gcs(self, timeout_s: float) -> None:
        """Connect and register with the GCS (at start, and again after a GCS restart)."""
        gcs = await connect_with_retry(
            parse_address(self.gcs_address), token=self.token, config=self.config,
            handlers={m.Publish: self._on_publish, m.ShutdownNode: self._shutdown_request,
                      m.GetNodeLog: self._node_log, m.FlushLogs: self._flush_logs},
            name="raylet->gcs", on_close=self._gcs_lost, timeout_s=timeout_s)
        self.gcs = gcs
        await gcs.call(m.RegisterNode(self.node_info()), self.config.rpc_timeout_s)
        durable = await gcs.call(m.KvGet("cluster", b"gcs_storage_durable", 0.0), self.config.rpc_timeout_s)
        self._gcs_durable = durable == b"1"
        self.gcs_durable_known = True
        # Pre-started workers that registered here before the GCS connection was up were
        # not reported (``WorkerPool.report_worker`` needs it): report them now (a restarted GCS too).
        for proc in list(self.procs.values()):
            if proc.address is not None and not proc.is_driver and proc.exit_info is None:
                self.pool.report_worker(proc, "ALIVE")
        gcs.notify(m.Subscribe("jobs", None))
        gcs.notify(m.Subscribe("nodes", None))
        gcs.notify(m.Subscribe("worker_deaths", None))  # owners that die: their objects go
        gcs.notify(m.Subscribe("packages", None))  # working_dir packages no job uses any more
        for info in await gcs.call(m.GetAllNodes(), self.config.rpc_timeout_s):
            if info.state == "ALIVE":
                self.alive_nodes[info.node_id] = info

    async def _reconnect_gcs(self) -> None:
        """The GCS (on durable storage) went away: reach its restart within gcs_reconnect_timeout_s."""
        self._gcs_reconnecting = True
        try:
            await self._reconnect_gcs_until(self.config.gcs_reconnect_timeout_s)
        finally:
            self._gcs_reconnecting = False

    async def _reconnect_gcs_until(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        delay = 0.1
        while not self._stopping:
            try:
                await self._connect_gcs(max(0.1, deadline - time.monotonic()))
                logger.info("reconnected to the GCS at %s", self.gcs_address)
                return
            except (ConnectionLost, OSError, TimeoutError) as e:
                why = f"{type(e).__name__}: {e}"
            except RemoteError as e:  # e.g. declared dead while away: fenced, must exit
                logger.error("the restarted GCS refused this node (%s); stopping this node", e)
                await self.stop()
                return
            if time.monotonic() + delay > deadline:
                logger.error("could not reach the GCS at %s within gcs_reconnect_timeout_s=%.0fs (%s); "
                             "stopping this node", self.gcs_address, timeout_s, why)
                await self.stop()
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    def node_info(self) -> m.NodeInfo:
        address = m.Address(self.node_id, b"", self.unix_path, self.server.host, self.server.port)
        return m.NodeInfo(self.node_id, address, socket.gethostname(), os.getpid(),
                          dict(self.resources_total), "ALIVE", time.time(), self.store_dir,
                          self.store.capacity_bytes, self.session_dir, self.is_head, dict(self.labels),
                          [os.getpid()])

    async def stop(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        logger.info("raylet stopping")
        self.pool.stop()
        for task in list(self._tasks):
            task.cancel()
        if self.gcs is not None:
            self.gcs.close()
        await self.server.stop()
        self.object_manager.close()
        self._unlinker.shutdown(wait=True)
        self._spill_io.shutdown(wait=True, cancel_futures=True)
        if self._store_dir_checked:
            shutil.rmtree(self.store_dir, ignore_errors=True)
        if self._spill_dir_made:
            shutil.rmtree(self.spill_dir, ignore_errors=True)
        self.stopped.set()

    def _spawn(self, coro: Any, name: str) -> None:
        spawn(self._tasks, coro, name)

    def _gcs_lost(self, conn: Connection) -> None:
        if self._stopping or conn is not self.gcs or self._gcs_reconnecting:
            return
        if not self._gcs_durable:
            logger.error("lost the GCS connection; stopping this node")
            self._spawn(self.stop(), "raylet.stop")
            return
        # Its tables are in durable storage: a restarted GCS recovers them; workers keep running.
        logger.warning("lost the GCS connection; reconnecting for up to %.0fs (gcs_reconnect_timeout_s)",
                       self.config.gcs_reconnect_timeout_s)
        self._spawn(self._reconnect_gcs(), "raylet.gcs_reconnect")

    def _shutdown_request(self, conn: Connection, msg: m.ShutdownNode) -> None:
        logger.info("shutdown requested: %s", msg.reason)
        self._spawn(self.stop(), "raylet.stop")

    def _on_publish(self, conn: Connection, msg: m.Publish) -> None:
        if msg.channel == "jobs" and isinstance(msg.data, m.JobInfo) and msg.data.state != "RUNNING":
            self._sched(sc.JobFinished(msg.data.job_id))
        elif msg.channel == "nodes" and isinstance(msg.data, m.NodeInfo):
            if msg.data.node_id == self.node_id and msg.data.state == "DEAD":
                # Declared dead (frozen or cut off for too long): fenced, this node exits.
                logger.error("the GCS declared this node dead (%s); stopping", msg.data.death_reason)
                self._spawn(self.stop(), "raylet.stop")
                return
            if msg.data.state == "ALIVE":
                self.alive_nodes[msg.data.node_id] = msg.data
            else:
                self.alive_nodes.pop(msg.data.node_id, None)
                self.object_manager.node_gone(msg.data.node_id)
        elif msg.channel == "packages" and isinstance(msg.key, bytes):
            self._drop_package(msg.key)
        elif msg.channel == "worker_deaths" and isinstance(msg.data, m.WorkerInfo) and msg.data.state == "DEAD":
            self._free_owned_by(msg.data.worker_id, msg.data.exit_detail or "it died")
            self._end_leases_of(msg.data.worker_id, msg.data.exit_detail or "it died")

    def _drop_package(self, package: bytes) -> None:
        """The GCS dropped a working_dir package (its last job ended): remove this node's
        unpacked copy, which the job's workers made (``Executor._working_dir``) and which
        stayed for the session's life, one per version of the directory. Renamed away at
        once (a later job's worker unpacks it afresh, never into a half-removed one), then
        removed on a thread."""
        from lumos._private import working_dir  # (zipfile and the rest: not at every raylet start)
        name = package.decode("ascii", "replace")
        if not name.isalnum():
            return
        target = working_dir.unpacked_dir(self.session_dir, name)
        trash = f"{target}.dropped-{os.getpid()}-{time.monotonic_ns()}"
        try:
            os.rename(target, trash)
        except FileNotFoundError:
            return  # never unpacked here (or another node of this machine took it)
        except OSError as e:
            logger.warning("could not remove the working_dir package %s: %s", name, e)
            return
        threading.Thread(target=shutil.rmtree, args=(trash, True), name="raylet.drop_package", daemon=True).start()

    # ------------------------------------------------------------------ loops

    async def _heartbeat_loop(self) -> None:
        interval = self.config.heartbeat_interval_ms / 1000
        mem, mem_at = None, 0.0
        while True:
            assert self.gcs is not None
            s = self.scheduler
            workers = [p for p in self.procs.values() if not p.is_driver and p.exit_info is None]
            # A /proc read per worker (~33 us each): at most once a second, and less often
            # with many workers (every 5 s with a thousand actors), so it stays ~1% of a core.
            if mem is None or time.monotonic() - mem_at >= max(1.0, len(workers) / 200):
                mem, mem_at = node_report.sample_memory([os.getpid(), *(p.pid for p in workers)]), time.monotonic()
            group_total, group_available = node_report.group_resources(s.bundles) if s.bundles else ({}, {})
            self.gcs.notify(m.NodeHeartbeat(
                # Pooled free slots are given up as soon as a create needs the room: free.
                self.node_id, s.available_floats(), len(s.queue), self.store.used_bytes - self.store.pool_bytes,
                len(workers), s.infeasible_shapes(),
                mem.total_bytes, mem.available_bytes, mem.lumos_rss_bytes, mem.cpu_percent,
                self.store.pool_bytes, group_total, group_available))
            await asyncio.sleep(interval)

    async def _tick_loop(self) -> None:
        ticks = 0
        while True:
            await asyncio.sleep(_TICK_S)
            now = time.monotonic()
            self._sched(sc.Ticked())
            self._store(st.Ticked())
            self._warn_infeasible(now)
            self._warn_blocked()
            ticks += 1
            if ticks % 10 == 0:
                self.pool.tick()
                self._take_back_from_frozen_owners(now)

    def _take_back_from_frozen_owners(self, now: float) -> None:
        """A lease recalled ``RECALL_HOLD_S`` ago and not given back, whose owner is a
        stopped process (Ctrl-Z, ``SIGSTOP``, a debugger): its worker is stopped once it is
        idle (``_take_back``), so the lease's resources serve the owner that waits. Without
        it, a frozen driver kept them until it ran again, in Ray too. An owner on this node
        is looked at in ``/proc``; one on another node (its tasks spilled here) is asked of
        that node's raylet (``OwnersStopped``, one question per node at a time). A worker
        that owns objects, or runs or queues a task, is left alone."""
        remote: dict[bytes, list[tuple[int, WorkerID, bytes]]] = {}
        for lease in self.scheduler.task_leases.values():
            if not lease.recalled or now - lease.recalled_at < sc.RECALL_HOLD_S or lease.lease_id in self._taking_back:
                continue
            w = self.scheduler.workers.get(lease.worker_id)
            if w is None or w.owns_objects:
                continue
            owner = self.procs.get(lease.owner)
            if owner is not None:
                if owner.pid and process_stopped(owner.pid):
                    self._taking_back.add(lease.lease_id)
                    self._spawn(self._take_back(lease.lease_id, lease.worker_id, _stopped_here(owner.pid),
                                                f"pid {owner.pid}"), "raylet.take-back")
            elif lease.remote and lease.owner_node and lease.owner_node != self.node_id \
                    and lease.owner_node in self.alive_nodes and lease.owner_node not in self._asking_stopped:
                remote.setdefault(lease.owner_node, []).append((lease.lease_id, lease.worker_id, lease.owner))
        for node_id, leases in remote.items():
            self._asking_stopped.add(node_id)
            self._taking_back.update(lease_id for lease_id, _, _ in leases)
            self._spawn(self._take_back_from_node(node_id, leases), "raylet.take-back")

    async def _take_back_from_node(self, node_id: bytes, leases: list[tuple[int, WorkerID, bytes]]) -> None:
        """Ask ``node_id``'s raylet which of these leases' owners are stopped; take back theirs."""
        try:
            stopped = await self._owners_stopped(node_id, {owner for _, _, owner in leases})
            for lease_id, worker_id, owner in leases:
                if owner in stopped:
                    async def still(owner: bytes = owner) -> bool:
                        return owner in await self._owners_stopped(node_id, {owner})
                    await self._take_back(lease_id, worker_id, still,
                                          f"worker {short(owner)} on node {short(node_id)}")
        finally:
            self._asking_stopped.discard(node_id)
            self._taking_back.difference_update(lease_id for lease_id, _, _ in leases)

    async def _owners_stopped(self, node_id: bytes, owners: set[bytes]) -> set[bytes]:
        """Those of ``owners`` that ``node_id``'s raylet says are stopped (none if it does not answer)."""
        try:
            conn = await self.object_manager.peer(node_id)
            answer = await conn.call(m.OwnersStopped(sorted(owners)), self.config.rpc_timeout_s)
        except (ConnectionLost, OSError, TimeoutError, RemoteError, ObjectUnavailable):
            return set()
        return {bytes(w) for w in answer if isinstance(w, bytes)} & owners if isinstance(answer, list) else set()

    def _stopped_owners_here(self, conn: Connection, msg: m.OwnersStopped) -> list[WorkerID]:
        """``OwnersStopped``: which of these processes of this node are stopped."""
        out = []
        for worker_id in msg.worker_ids[:MAX_OWNERS_ASKED]:
            proc = self.procs.get(worker_id)
            if proc is not None and proc.pid and process_stopped(proc.pid):
                out.append(worker_id)
        return out

    async def _take_back(self, lease_id: int, worker_id: WorkerID, still_stopped: Callable[[], Awaitable[bool]],
                         owner: str) -> None:
        try:
            proc = self.procs.get(worker_id)
            if proc is None or proc.conn is None or proc.conn.is_closed:
                return
            try:
                stats = await proc.conn.call(m.GetCoreWorkerStats(brief=True), self.config.rpc_timeout_s)
            except (ConnectionLost, TimeoutError, RemoteError):
                return
            if stats.get("executing", True) or not await still_stopped():
                return
            lease = self.scheduler.leases.get(lease_id)  # (after the questions: still that worker's)
            if lease is None or lease.worker_id != worker_id:
                return
            logger.warning("lease %d: its owner (%s) is stopped and did not give it back; stopping its "
                           "idle worker %s so that the owners waiting here can run", lease_id, owner,
                           short(worker_id))
            self.pool.kill_worker(worker_id, f"its owner ({owner}) was stopped (SIGSTOP) holding its lease")
        finally:
            self._taking_back.discard(lease_id)

    def _warn_infeasible(self, now: float) -> None:
        for rid, req in self.scheduler.queue.items():
            if req.infeasible and rid not in self._warned_infeasible and \
                    now - req.since >= self.config.infeasible_warning_s:
                self._warned_infeasible.add(rid)
                text = (f"task {req.event.function_name or '?'} needs {req.event.resources}, but no node "
                        f"has that much (this node: {self.resources_total}); it stays pending until a node "
                        "that fits joins the cluster")
                logger.warning("%s", text)
                if self.gcs is not None:
                    self.gcs.notify(m.PublishError(req.event.job_id, "infeasible", text))

    def _warn_blocked(self) -> None:
        """Tell the jobs concerned when as many of this node's workers wait in get() or
        wait() as the cap on task workers, and again at each doubling: they are not
        counted against it, so nested tasks and tasks that wait for one another go on, and
        each is a process (runaway recursion shows here first)."""
        jobs = self.scheduler.blocked_jobs()
        cap = self.scheduler.max_workers
        if len(jobs) < cap // 2:
            self._blocked_warn_at = cap  # (a later episode is told again)
        if len(jobs) < self._blocked_warn_at:
            return
        self._blocked_warn_at = 2 * len(jobs)
        text = (f"{len(jobs)} worker processes on node {short(self.node_id)} run tasks that wait in "
                f"get() or wait() (the node starts at most {cap} for tasks that run): nested tasks, or "
                "tasks that wait for one another, each keep a process; if this number keeps growing, "
                "look for a task that submits and waits for itself without end")
        logger.warning("%s", text)
        if self.gcs is not None:
            for job_id in set(jobs):
                self.gcs.notify(m.PublishError(job_id, "workers", text))

    # ------------------------------------------------------------------ scheduler plumbing

    def _sched(self, event: sc.Event) -> None:
        for action in self.scheduler.handle(event, time.monotonic()):
            self._execute(action)

    def _execute(self, action: sc.Action) -> None:
        if isinstance(action, sc.GrantLease):
            waiter = self._lease_waiters.pop(action.request_id, None)
            proc = self.procs.get(action.worker_id)
            if waiter is None or proc is None or proc.address is None:
                # The owner gave up, or the worker vanished: hand the lease straight back.
                self._sched(sc.LeaseReturned(action.lease_id, proc is None))
                return
            conn, fut = waiter
            self._lease_owner[action.lease_id] = conn
            if not fut.done():
                fut.set_result(m.LeaseGrant(action.lease_id, action.worker_id, proc.address,
                                            action.resource_ids, self.node_id))
        elif isinstance(action, sc.StartWorker):
            self.pool.start_worker()
        elif isinstance(action, sc.StopWorker):
            if action.on_its_own:
                self.pool.note_exit_type(action.worker_id, action.exit_type)
            else:
                self.pool.stop_worker(action.worker_id, "" if action.quiet else action.reason, action.graceful_s,
                                      action.exit_type, clean_up=False)
        elif isinstance(action, sc.ReportInfeasible):
            logger.info("lease request %d for %s is infeasible here", action.request_id, action.resources)
        elif isinstance(action, sc.FailLease):
            waiter = self._lease_waiters.pop(action.request_id, None)
            if waiter is not None and not waiter[1].done():
                waiter[1].set_exception(PlacementGroupRemoved(action.reason) if action.group_removed
                                        else RuntimeError(action.reason))
        elif isinstance(action, sc.RecallLease):
            owner = self._lease_owner.get(action.lease_id)
            if owner is not None and not owner.is_closed:
                logger.debug("recalling lease %d: an owner on this node waits for its resources", action.lease_id)
                owner.notify(m.LeaseRecalled(action.lease_id))
        elif isinstance(action, sc.AnswerBundles):
            self._bundle_answers[action.request_id] = [action.ok, action.reason,
                                                       [[i, ids] for i, ids in action.gpu_ids.items()]]

    # ------------------------------------------------------------------ workers

    def worker_exited(self, proc: WorkerProc, desc: str) -> None:
        """The pool reaped a worker: its leases, objects and scheduler slot go."""
        worker_id = proc.worker_id
        w = self.scheduler.workers.get(worker_id)
        actor = w is not None and w.actor_id is not None  # (an actor's lease is the GCS's)
        for lease_id, conn in list(self._lease_owner.items()):
            lease = self.scheduler.leases.get(lease_id)
            if lease is not None and lease.worker_id == worker_id:
                del self._lease_owner[lease_id]
                # A task's owner may not see the connection close: a process the task
                # forked can hold a copy of it, and its tasks would wait as long as that
                # lives. (The GCS hears of an actor's worker from ReportWorker.)
                if not actor and not conn.is_closed:
                    conn.notify(m.LeasedWorkerExited(lease_id, worker_id))
        self._store(st.ClientGone(worker_id))
        self._free_owned_by(worker_id, desc)
        self._sched(sc.WorkerExited(worker_id))

    # ------------------------------------------------------------------ handlers

    async def _request_lease(self, conn: Connection, msg: m.RequestWorkerLease,
                             hops: int = 0) -> m.LeaseGrant | m.SpillbackReply:
        if hops == 0 and msg.owner_worker_id != sc.GCS_OWNER:
            await self._await_gcs_for_labels(msg)
        spill = self._should_spill(msg, hops)
        if spill:
            assert self.gcs is not None
            try:
                decision: m.SpillbackReply = await self.gcs.call(m.ScheduleLease(
                    msg.job_id, msg.resources, msg.strategy, msg.function_name, self.node_id,
                    msg.arg_bytes_by_node, msg.bundle, self.scheduler.available_floats(),
                    len(self.scheduler.queue)), None)
            except RemoteError as e:
                refusal = LEASE_REFUSALS.get(e.type_name)
                if refusal is not None:  # (the owner's tasks fail with it)
                    raise refusal(e.text) from None
                raise
            if decision.node_id != self.node_id:
                return decision
        rid = next(self._request_ids)
        fut: asyncio.Future[m.LeaseGrant] = asyncio.get_running_loop().create_future()
        self._lease_waiters[rid] = (conn, fut)
        # Whose request: an owner on this node (a driver or worker registered here) may
        # recall task leases granted to owners on other nodes (``RecallLease``).
        here = msg.owner_worker_id in self.pool.procs
        self._sched(sc.LeaseRequested(rid, msg.job_id, msg.resources, msg.function_name, msg.actor_id,
                                      _bundle_of(msg), msg.retry_budget, local_owner=here,
                                      remote_owner=not here and msg.owner_worker_id != sc.GCS_OWNER,
                                      owner=msg.owner_worker_id, owner_node=msg.owner_node_id or b""))
        try:
            while True:
                done, _ = await asyncio.wait({fut}, timeout=RESPILL_AFTER_S)
                if done:
                    return fut.result()
                # Still waiting here: the picture may have changed (another node freed up
                # since the first decision). Ask again; leave if another node is better now.
                # A request that was sent here (a spillback, or the GCS placing an actor)
                # leaves only for a node with room now: it would wait for ever behind work
                # that holds this node (an actor, a long task) while another node stood free.
                q = self._spill_query(msg, hops)
                moving = self.scheduler.may_move(q)
                if not moving and (not self.scheduler.should_spill(q) or q.bundle is not None):
                    continue
                assert self.gcs is not None
                try:
                    decision = await self.gcs.call(m.ScheduleLease(
                        msg.job_id, msg.resources, msg.strategy, msg.function_name, self.node_id,
                        msg.arg_bytes_by_node, msg.bundle, self.scheduler.available_floats(),
                        len(self.scheduler.queue), moving), self.config.rpc_timeout_s)
                except (ConnectionLost, TimeoutError, RemoteError):
                    continue
                if fut.done():
                    return fut.result()
                if isinstance(decision, m.SpillbackReply) and decision.node_id != self.node_id:
                    return decision
        finally:
            if self._lease_waiters.pop(rid, None) is not None:
                self._sched(sc.LeaseCancelled(rid))

    async def _await_gcs_for_labels(self, msg: m.RequestWorkerLease) -> None:
        """A request whose hard label conditions this node does not meet is the GCS's to
        place: while the GCS is away (restarting), it waits for it here rather than run on
        a node its ``label_selector`` excludes (a raylet without its GCS serves the rest)."""
        conditions = m.label_conditions_of(msg.strategy)
        if conditions is None or m.labels_match(self.labels, conditions):
            return
        while (self.gcs is None or self.gcs.is_closed) and not self._stopping:
            await asyncio.sleep(0.1)

    def _spill_query(self, msg: m.RequestWorkerLease, hops: int) -> sc.SpillQuery:
        conditions = m.label_conditions_of(msg.strategy)
        # (A node meeting the hard conditions but not the soft ones asks the GCS, which
        # knows whether a node meeting both has room; it may send the request back.)
        labels_ok = conditions is None or (m.labels_match(self.labels, conditions)
                                           and m.labels_match(self.labels, m.label_soft_of(msg.strategy)))
        return sc.SpillQuery(
            msg.resources, msg.strategy, _bundle_of(msg), msg.arg_bytes_by_node, hops,
            msg.owner_worker_id == sc.GCS_OWNER, self.node_id, self.gcs is not None and not self.gcs.is_closed,
            len(self.alive_nodes), self.node_id in self.alive_nodes, labels_ok)

    def _should_spill(self, msg: m.RequestWorkerLease, hops: int) -> bool:
        """Ask the local scheduler whether the GCS should place ``msg`` (see ``should_spill``)."""
        return self.scheduler.should_spill(self._spill_query(msg, hops))

    def _reserve_bundles(self, conn: Connection, msg: m.ReserveBundles) -> list[Any]:
        """Reserve all of ``msg.bundles`` here now, or none: ``[ok, reason, [[index, GPU ids], ...]]``."""
        rid = next(self._request_ids)
        bundles = [(int(i), dict(res)) for i, res in msg.bundles]
        self._sched(sc.BundlesRequested(rid, msg.pg_id, bundles))
        answer = self._bundle_answers.pop(rid, [False, "no answer", []])
        logger.info("bundles %s of placement group %s %s%s", [i for i, _ in bundles], short(msg.pg_id),
                    "reserved" if answer[0] else "not reserved: ", answer[1])
        return answer

    def _return_worker(self, conn: Connection, msg: m.ReturnWorker) -> None:
        self._lease_owner.pop(msg.lease_id, None)
        self._sched(sc.LeaseReturned(msg.lease_id, msg.disconnect, msg.exit_type))

    def _create_object(self, conn: Connection, msg: m.CreateObject) -> list[Any] | Awaitable[list[Any]]:
        """The grant itself when the store has room now (the reply leaves in this loop
        turn: no task, no wake-up); an awaitable only for a create that waits for space.
        The connection takes either (a handler's result may be awaitable)."""
        fut = self._request_create(msg.object_id, msg.size_bytes, msg.owner_worker_id)
        if not fut.done():
            return self._create_waited(fut, msg)
        return self._create_answer(fut, msg)

    async def _create_waited(self, fut: asyncio.Future[list[Any]], msg: m.CreateObject) -> list[Any]:
        await asyncio.wait((fut,))
        return self._create_answer(fut, msg)

    def _create_answer(self, fut: asyncio.Future[list[Any]], msg: m.CreateObject) -> list[Any]:
        """The grant of a done create, or its refusal raised. A grant, or an answer that
        the sealed object exists already (a re-run's of an id some process views, or of a
        copy pulled here), makes the creator's owner the object's: the first owner's death
        must no longer free it."""
        error = fut.exception()
        if error is None or isinstance(error, _ObjectExists):
            self._note_owner(msg.object_id, msg.owner or msg.owner_worker_id)
        return fut.result()

    def _seal_object(self, conn: Connection, msg: m.SealObject) -> None:
        if not msg.slot:
            self._store(st.ObjectSealed(msg.object_id, msg.size_bytes))
            return
        client = conn.peer_info
        if client is None:
            return
        self._store(st.ReservedSealed(client, msg.slot, msg.object_id, msg.size_bytes, msg.file_size))
        if msg.object_id in self.store.objects:
            self._note_owner(msg.object_id, msg.owner or client)

    def _reserve_slots(self, conn: Connection, msg: m.ReserveSlots) -> list[Any]:
        client = conn.peer_info
        if client is None:
            return []
        rid = next(self._request_ids)
        self._store(st.SlotsReserveRequested(rid, client, msg.size_bytes, msg.count))
        return self._slot_grants.pop(rid, [])

    # ------------------------------------------------------------------ ownership

    def _note_owner(self, object_id: ObjectID, owner: WorkerID) -> None:
        """``owner`` owns ``object_id``, which this store holds (a primary or a copy)."""
        if not owner or self._owner_of.get(object_id) == owner:
            return
        self._forget_owner([object_id])
        self._owner_of[object_id] = owner
        ids = self._owned.get(owner)
        if ids is None:
            ids = self._owned[owner] = set()
            if self._is_worker(owner):
                self._sched(sc.OwnershipChanged(owner, True))
        ids.add(object_id)

    def _forget_owner(self, object_ids: list[ObjectID]) -> None:
        for oid in object_ids:
            owner = self._owner_of.pop(oid, None)
            if owner is None:
                continue
            ids = self._owned.get(owner)
            if ids is not None:
                ids.discard(oid)
                if not ids:
                    del self._owned[owner]
                    if self._is_worker(owner):
                        self._sched(sc.OwnershipChanged(owner, False))

    def _is_worker(self, worker_id: WorkerID) -> bool:
        """A worker of this node's scheduler (not a driver: it is never an idle worker to
        end, and a sync loop's one owned object flipped a driver's ownership per call)."""
        proc = self.procs.get(worker_id)
        return proc is not None and not proc.is_driver

    def _free_owned_by(self, owner: WorkerID, why: str) -> None:
        """The process ``owner`` is gone: nobody can read or free its objects any more, so
        free those this store holds (and ask the other nodes to drop their copies)."""
        ids = self._owned.pop(owner, None)
        if not ids:
            return
        freed = list(ids)
        for oid in freed:
            self._owner_of.pop(oid, None)
        logger.info("freeing %d objects of %s, whose owner is gone (%s)", len(freed), short(owner), why)
        self._store(st.ObjectsFreed(freed, [False] * len(freed)))
        if len(self.alive_nodes) > 1:
            self.object_manager.free_copies(freed)

    def _end_leases_of(self, owner: WorkerID, why: str) -> None:
        """The GCS says the process ``owner`` died: the task leases it holds here go back,
        their workers stopped, and its waiting requests are dropped, as when its connection
        closes (``_client_closed``). Its connection may never close: an owner on a node
        declared dead because it froze (``SIGSTOP``) or vanished sends no FIN, and its
        leases held this node's resources until it ran again, or for good."""
        leases = [lid for lid in self._lease_owner
                  if (lease := self.scheduler.leases.get(lid)) is not None and lease.owner == owner]
        requests = [rid for rid in self._lease_waiters
                    if (req := self.scheduler.queue.get(rid)) is not None and req.event.owner == owner]
        if not leases and not requests:
            return
        logger.info("ending %d leases and %d lease requests of %s, which died (%s)", len(leases), len(requests),
                    short(owner), why)
        self._drop_owner_work(requests, leases)

    def _drop_owner_work(self, requests: list[int], leases: list[int]) -> None:
        """A gone owner's waiting lease requests are cancelled, then its leases taken back
        (their workers stopped: its owner is gone, so is the work)."""
        for rid in requests:
            _, fut = self._lease_waiters.pop(rid)
            fut.cancel()
            self._sched(sc.LeaseCancelled(rid))
        for lease_id in leases:
            del self._lease_owner[lease_id]
            self._sched(sc.LeaseReturned(lease_id, True))

    async def create_local(self, object_id: ObjectID, size_bytes: int, client: WorkerID) -> list[Any]:
        """Space for a new object: ``[slot, write path, final path, file size, reused]``."""
        return await self._request_create(object_id, size_bytes, client)

    def _request_create(self, object_id: ObjectID, size_bytes: int, client: WorkerID) -> asyncio.Future[list[Any]]:
        """Ask the store for space; the future is done already when it had room at once.
        A waiting create is answered (or dropped, when its creator went) by ``_store``."""
        rid = next(self._request_ids)
        fut: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self._create_waiters[rid] = fut
        self._store(st.CreateRequested(rid, object_id, size_bytes, client))
        if fut.done():
            self._create_waiters.pop(rid, None)
        else:
            fut.add_done_callback(lambda _, rid=rid: self._create_waiters.pop(rid, None))
        return fut

    def seal_local(self, object_id: ObjectID, size_bytes: int) -> None:
        self._store(st.ObjectSealed(object_id, size_bytes))
        self._store(st.MarkedShared([object_id]))

    def abort_local(self, object_id: ObjectID) -> None:
        obj = self.store.objects.get(object_id)
        if obj is not None and not obj.sealed:
            self._store(st.ObjectsFreed([object_id], [False]))

    def _free_objects(self, conn: Connection, msg: m.FreeObjects) -> None:
        self._forget_owner(msg.object_ids)
        self._store(st.ObjectsFreed(msg.object_ids, msg.recyclable))
        if len(self.alive_nodes) > 1:
            self.object_manager.free_copies(msg.object_ids)

    def _free_copies(self, conn: Connection, msg: m.FreeObjectCopies) -> None:
        self._forget_owner(msg.object_ids)
        self._store(st.ObjectsFreed(msg.object_ids, [False] * len(msg.object_ids)))

    async def _keep_copies(self, conn: Connection, msg: m.KeepObjectCopies) -> list[ObjectID]:
        """An owner's objects lost their primary with its node: the copies of them in
        ``msg.node_id``'s store become their primaries (this node's, or passed on to that
        node's raylet). Returns the ids kept; the others were not there (any more)."""
        ids = [oid for oid in msg.object_ids if isinstance(oid, bytes)]
        if msg.node_id != self.node_id:
            try:
                peer = await self.object_manager.peer(msg.node_id)
                kept = await peer.call(m.KeepObjectCopies(msg.node_id, ids), self.config.rpc_timeout_s)
            except (OSError, ConnectionLost, TimeoutError, RemoteError, ObjectUnavailable) as e:
                logger.info("cannot keep copies on node %s: %s", short(msg.node_id), e)
                return []
            return [oid for oid in kept if isinstance(oid, bytes)] if isinstance(kept, list) else []
        rid = next(self._request_ids)
        self._store(st.CopiesKeepRequested(rid, ids))
        return self._kept_copies.pop(rid, [])

    async def _pull_object(self, conn: Connection, msg: m.PullObject) -> bool:
        await self.object_manager.pull(msg.object_id, msg.from_node)
        if msg.object_id not in self._owner_of:
            self._note_owner(msg.object_id, msg.owner_worker_id)
        return True

    def _store(self, event: st.Event) -> None:
        for action in self.store.handle(event, time.monotonic()):
            if isinstance(action, st.GrantCreate):
                fut = self._create_waiters.pop(action.request, None)
                if fut is None or fut.done():  # the creator went away while waiting
                    self._store(st.ObjectsFreed([action.object_id], [False]))
                elif action.on_disk:
                    self._spawn(self._grant_on_disk(action, fut), "raylet.spill.create")
                else:
                    fut.set_result([action.slot, action.path, action.final_path, action.file_size, action.reused])
            elif isinstance(action, st.RejectCreate):
                fut = self._create_waiters.pop(action.request, None)
                if fut is not None and not fut.done():
                    fut.set_exception(_ObjectExists(action.reason) if action.exists else
                                      _OutOfDisk(action.reason) if action.out_of_disk else _StoreFull(action.reason))
            elif isinstance(action, st.GrantSlots):
                self._slot_grants[action.request] = [list(g) for g in action.slots]
            elif isinstance(action, st.CopiesKept):
                self._kept_copies[action.request] = action.object_ids
            elif isinstance(action, st.RenameFile):
                try:
                    os.rename(action.src, action.dst)
                except OSError as e:
                    logger.error("store rename %s -> %s failed: %s", action.src, action.dst, e)
            elif isinstance(action, st.UnlinkFile):
                path = self._name_gone(action.path)
                if path is None:
                    continue
                try:
                    self._unlinker.submit(unlink_quietly, path)
                except RuntimeError:  # stopping, its thread gone: a client's close frees files late
                    unlink_quietly(path)
            elif isinstance(action, st.DropSlot):
                if action.slot < 0:
                    continue
                proc = self.procs.get(action.client)
                if proc is not None and proc.conn is not None:
                    proc.conn.notify(m.DropSlots([action.slot]))
            elif isinstance(action, st.SpillObject):
                self._spawn(self._copy(action, st.SpillFinished), f"raylet.spill.{short(action.object_id)}")
            elif isinstance(action, st.RestoreObject):
                self._spawn(self._copy(action, st.RestoreFinished), f"raylet.restore.{short(action.object_id)}")
            elif isinstance(action, st.DropMappings):
                for proc in self.procs.values():
                    if proc.conn is not None:
                        proc.conn.notify(m.DropMappings(action.object_ids))
            elif isinstance(action, st.AnswerRestore):
                for fut in self._restore_waiters.pop(action.object_id, ()):
                    if not fut.done():
                        fut.set_result(action.path)
            elif isinstance(action, st.DiskFull):
                logger.warning("%s", action.message)
            elif isinstance(action, st.SweepMoved):
                check = self._moved_sweep.check(action)
                if check is not None:
                    self._spawn(self._moved_sweep.run(check), "raylet.store.sweep")

    def _name_gone(self, path: str) -> str | None:
        """Before an object's file is unlinked in the unlink thread, its name goes now: it
        is renamed ``trash-<n>``, which the thread unlinks (the costly part, its pages
        freed). The same object id can be created again at once (a task retried after its
        worker died puts the same ids; a restore writes the same name), and an unlink by
        name still queued took the new file: the object then had no file, its slot went
        to the pool without one, and a later put given that slot failed. Slot files
        (``pool-``, ``resv-``, ``lent-``) are never named again and go as they are.
        Returns the path to unlink, None when there is no file."""
        name = path.rpartition("/")[2]
        if not st.names_an_object(name):
            return path
        self._trashed += 1
        trash = f"{path[:len(path) - len(name)]}trash-{self._trashed}"
        try:
            os.rename(path, trash)
        except FileNotFoundError:
            return None
        except OSError as e:
            logger.warning("could not move %s out of its name (%s): unlinking it by name", path, e)
            return path
        return trash

    # ------------------------------------------------------------------ spilling

    async def _copy(self, action: st.SpillObject | st.RestoreObject, done: Any) -> None:
        """Run one spill or restore copy in a spill thread; report it to the store state."""
        loop = asyncio.get_running_loop()
        try:
            seconds = await loop.run_in_executor(self._spill_io, spill_io.copy_file, action.src, action.tmp,
                                                 action.dst, action.size_bytes)
        except OSError as e:
            what = "spilling" if done is st.SpillFinished else "restoring"
            logger.debug("%s %s failed: %s", what, short(action.object_id), e)
            if done is st.SpillFinished:
                self._store(st.SpillFinished(action.object_id, str(e), e.errno in spill_io.DISK_FULL_ERRNOS))
            else:
                self._store(st.RestoreFinished(action.object_id, str(e)))
            return
        self._store(done(action.object_id, seconds=seconds, started=time.monotonic() - seconds))

    async def _grant_on_disk(self, action: st.GrantCreate, fut: asyncio.Future[Any]) -> None:
        """An object larger than the store: preallocate its file in the spill dir, then
        let the creator write it through a mapping."""
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._spill_io, spill_io.preallocate, action.path, action.file_size)
        except OSError as e:
            full = e.errno in spill_io.DISK_FULL_ERRNOS
            self._store(st.DiskCreateFailed(action.object_id, str(e), full))
            mib = action.file_size / (1024 * 1024)
            why = (f"object of {mib:.1f} MiB is larger than the object store and the spill directory "
                   f"{self.spill_dir} has no room for it ({e}); free space there or set object_spilling_directory "
                   "to a larger disk")
            if not fut.done():
                fut.set_exception(_OutOfDisk(why) if full else _StoreFull(why))
            return
        if fut.done():  # the creator went away meanwhile
            self._store(st.ObjectsFreed([action.object_id], [False]))
            return
        fut.set_result([action.slot, action.path, action.final_path, action.file_size, action.reused])

    def _pin_objects(self, conn: Connection, msg: m.PinObjects) -> None:
        client = conn.peer_info
        if client is None:
            return
        self._store(st.ObjectsPinned(client, msg.object_ids) if msg.pinned else
                    st.ObjectsUnpinned(client, msg.object_ids))

    async def _restore_spilled(self, conn: Connection, msg: m.RestoreSpilled) -> str | None:
        fut: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        self._restore_waiters.setdefault(msg.object_id, []).append(fut)
        self._store(st.RestoreRequested(msg.object_id))
        obj = self.store.objects.get(msg.object_id)
        # A copy from disk: allow it 20 MiB/s at least, on top of the usual RPC deadline.
        slack_s = (obj.size_bytes / (20 * 1024 * 1024)) if obj is not None else 0.0
        async with asyncio.timeout(self.config.rpc_timeout_s + slack_s):
            return await fut

    def _node_stats(self, conn: Connection, msg: m.GetNodeStats) -> dict[str, Any]:
        return node_report.node_stats(self)

    def _node_log(self, conn: Connection, msg: m.GetNodeLog) -> m.NodeLog:
        """The end of this raylet's log or one of its workers' (asked through the GCS)."""
        return node_report.node_log(self.node_id, self.session_dir, msg)

    def _forward_logs(self, conn: Connection, msg: m.LogBatch) -> None:
        if self.gcs is not None:
            self.gcs.notify(msg)

    async def _flush_logs(self, conn: Connection, msg: m.FlushLogs) -> bool:
        # One more turn of the loop: output a worker sent before its reply reached the
        # driver (which asks only after) is read by then, and forwarded ahead of this answer.
        await asyncio.sleep(0)
        return True

    def _client_closed(self, conn: Connection) -> None:
        worker_id = conn.peer_info
        requests = [rid for rid, (owner, _) in self._lease_waiters.items() if owner is conn]
        leases = []
        durable_gcs = self._gcs_durable
        for lease_id, owner in list(self._lease_owner.items()):
            if owner is conn:
                lease = self.scheduler.leases.get(lease_id)
                w = self.scheduler.workers.get(lease.worker_id) if lease is not None else None
                if durable_gcs and w is not None and w.actor_id is not None:
                    del self._lease_owner[lease_id]  # an actor's lease, held by a GCS that restarts and takes it back
                else:
                    leases.append(lease_id)
        self._drop_owner_work(requests, leases)
        if worker_id is None:
            return
        proc = self.procs.get(worker_id)
        if proc is not None and proc.is_driver:
            del self.procs[worker_id]
            proc.exit_info = "the driver disconnected (it exited or was killed)"
            self.pool.report_worker(proc, "DEAD", proc.exit_info)
            self._store(st.ClientGone(worker_id))
            self._free_owned_by(worker_id, proc.exit_info)


#: A lease request still queued here after this long is offered to the GCS again.
RESPILL_AFTER_S = 0.5

def _stopped_here(pid: int) -> Callable[[], Awaitable[bool]]:
    """``_take_back``'s second look at a local owner: still stopped?"""
    async def still() -> bool:
        return process_stopped(pid)
    return still


def _bundle_of(msg: m.RequestWorkerLease) -> tuple[bytes, int] | None:
    """``(placement group id, bundle index)`` of a request in a placement group, else None."""
    ref = msg.bundle
    if ref is None and msg.strategy and msg.strategy[0] == "PG":
        ref = msg.strategy[1:3]
    if ref is None:
        return None
    return bytes(ref[0]), int(ref[1])


class _StoreFull(Refusal):
    """Surfaces at the client as RemoteError('_StoreFull', reason)."""


class _OutOfDisk(Refusal):
    """Surfaces at the client as RemoteError('_OutOfDisk', reason): OutOfDiskError."""


class _ObjectExists(Refusal):
    """Surfaces at the client as RemoteError('_ObjectExists', reason): the store already
    holds the sealed object, with the same size."""


async def _amain(args: argparse.Namespace) -> None:
    import json
    config = Config.from_json(args.config) if args.config else Config.resolve()
    token = read_token(args.token_file)
    raylet = RayletServer(
        config, token, node_id=bytes.fromhex(args.node_id), session_dir=args.session_dir,
        gcs_address=args.gcs_address, resources=json.loads(args.resources),
        store_dir=args.store_dir, store_bytes=args.object_store_memory, node_ip=args.node_ip,
        is_head=args.head, labels=json.loads(args.labels))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: asyncio.ensure_future(raylet.stop()))
    try:
        await raylet.start()
    except (OSError, ConnectionLost, TimeoutError) as e:
        logger.error("raylet could not start: %s", e)
        await raylet.stop()
        raise SystemExit(1)
    report_ready(args.ready_fd, {"unix_path": raylet.unix_path, "host": raylet.server.host,
                                 "port": raylet.server.port, "pid": os.getpid(),
                                 "node_id": raylet.node_id.hex()})
    stopped = threading.Event()
    if config.session_dirs_kept > 0:
        threading.Thread(target=_sweep_sessions, args=(os.path.dirname(os.path.abspath(args.session_dir)),
                                                       config.session_dirs_kept, stopped),
                         name="lumos-session-sweep", daemon=True).start()
    await raylet.stopped.wait()
    stopped.set()


#: How long after its start a raylet sweeps old session directories (off the start's path).
SESSION_SWEEP_DELAY_S = 5.0


def _sweep_sessions(root: str, keep: int, stopped: threading.Event) -> None:
    """A raylet's background thread, once: remove the session directories of this
    user's clusters that ended, all but the newest ``keep`` (``node.sweep_old_sessions``)."""
    if stopped.wait(SESSION_SWEEP_DELAY_S):
        return
    from lumos._private.node import sweep_old_sessions
    started = time.monotonic()
    try:
        removed = sweep_old_sessions(root, keep)
    except Exception:  # (a background chore: logged, never fatal)
        logger.exception("sweeping old session directories in %s failed", root)
        return
    if removed:
        logger.info("removed %d session directories of clusters that ended (%.1f MiB) in %.2f s, keeping the "
                    "newest %d: %s ... %s", len(removed), sum(size for _, size in removed) / (1 << 20),
                    time.monotonic() - started, keep, os.path.basename(removed[0][0]),
                    os.path.basename(removed[-1][0]))


def main() -> None:
    p = argparse.ArgumentParser(prog="lumos-raylet")
    p.add_argument("--node-id", required=True)
    p.add_argument("--session-dir", required=True)
    p.add_argument("--token-file", required=True)
    p.add_argument("--gcs-address", required=True)
    p.add_argument("--resources", required=True)
    p.add_argument("--store-dir", required=True)
    p.add_argument("--object-store-memory", type=int, required=True)
    p.add_argument("--node-ip", default="127.0.0.1")
    p.add_argument("--head", action="store_true")
    p.add_argument("--labels", default="{}")
    p.add_argument("--config", default="")
    p.add_argument("--ready-fd", type=int, default=-1)
    p.add_argument("--die-with-parent", type=int, default=0)
    args = p.parse_args()
    if args.die_with_parent:
        die_with_parent(args.die_with_parent, signal.SIGTERM)
    setup_logging(os.path.join(args.session_dir, "logs"), f"raylet-{args.node_id[:12]}")
    tune_gc_for_service()
    eventloop.run(_amain(args))


if __name__ == "__main__":
    main()
