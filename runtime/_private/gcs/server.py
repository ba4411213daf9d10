"""The GCS process: control-state tables, pub/sub, node health, task-event log.

One per cluster, on the head node. Raylets, drivers and workers connect to it (TCP,
authenticated). It holds the node, job, worker and KV tables, the task-event log and the
application metrics, publishes changes to subscribers, and marks nodes dead when heartbeats stop or their
raylet's connection drops.

```
raylet ──RegisterNode, NodeHeartbeat, LogBatch──►┐
driver ──RegisterJob, Kv*, AddTaskEvents───────► GcsServer ──Publish(nodes|jobs|logs|...)──► subscribers
worker ──Kv*, AddTaskEvents, ReportWorker──────►┘   (drivers and workers: ReportMetrics)
```
Run as ``python -m lumos._private.gcs.server``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import inspect
import json
import logging
import os
import shutil
import signal
import time
from collections import OrderedDict
from typing import Any

from lumos._private.config import Config
from lumos._private.transport import eventloop
from lumos._private.core_worker.io_loop import spawn
from lumos._private.gcs.actor_manager import ActorManager
from lumos._private.gcs.metrics import MetricsTable
from lumos._private.gcs.raylet_pool import RayletPool
from lumos._private.gcs.storage import (GcsStorage, StorageHealthState, StorageUnavailable, StorageWriter,
                                        create_storage, pack_value, unpack_value)
from lumos._private.gcs.task_log import StreamTrim, TaskEventTable, events_of
from lumos._private.ids import JobID, NodeID, new_job_id, short
from lumos._private.process import (die_with_parent, read_private_file, read_token, report_ready,
                                    setup_logging, tune_gc_for_service)
from lumos._private.protocol import messages as m
from lumos._private.transport.connection import Connection, ConnectionLost, RemoteError, RpcServer

logger = logging.getLogger(__name__)

#: Errors a raylet's ``GetNodeLog`` handler raises, re-raised by the GCS with their type.
_LOG_ERRORS: dict[str, type[Exception]] = {
    "LookupError": LookupError, "ValueError": ValueError,
    "PermissionError": PermissionError, "TimeoutError": TimeoutError}


class GcsServer:
    """Owns the GCS tables and the RPC server that exposes them."""

    def __init__(self, config: Config, token: bytes, storage: GcsStorage, session_dir: str,
                 private_cluster: bool = False) -> None:
        self.config = config
        self.token = token
        self.storage = storage
        #: Writes every table change through to a durable storage (None: memory, nothing to keep).
        self.writer: StorageWriter | None = StorageWriter(
            storage, max_pending_append_bytes=config.task_event_max_bytes) if storage.durable else None
        self.storage_health = StorageHealthState(config.gcs_storage_unavailable_exit_s)
        #: Exit status for the process once ``stopped`` is set (1: the storage was lost).
        self.exit_code = 0
        self._writing_back: asyncio.Task[None] | None = None
        self.session_dir = session_dir
        #: Exit when the first job's driver disconnects (a cluster started by init()).
        self.private_cluster = private_cluster
        #: Application metrics (``lumos.util.metrics``), summed over every process's reports.
        self.metrics = MetricsTable(config.metrics_max_series)
        #: Node id -> NodeInfo (alive and dead).
        self.nodes: dict[bytes, m.NodeInfo] = {}
        #: Node id -> latest heartbeat.
        self.node_load: dict[bytes, m.NodeHeartbeat] = {}
        self._last_heartbeat: dict[bytes, float] = {}
        self._node_conns: dict[bytes, Connection] = {}
        #: Job id -> JobInfo.
        self.jobs: OrderedDict[bytes, m.JobInfo] = OrderedDict()
        self._job_conns: dict[Connection, bytes] = {}
        #: Jobs whose driver said they finished (``MarkJobFinished``), the newest 10,000:
        #: their driver's row says it exited as its user meant.
        self._jobs_ended_by_driver: dict[bytes, None] = {}
        #: Private clusters: the job whose driver started the cluster (the first one).
        self._owner_job: bytes | None = None
        #: Worker id -> WorkerInfo.
        self.workers: dict[bytes, m.WorkerInfo] = {}
        #: (namespace, key) -> value.
        self.kv: dict[tuple[str, bytes], bytes] = {}
        #: Job id -> its KV entries that serve only its own processes: the functions and
        #: classes it exported ("fn") and its config ("job"). Dropped once the job has
        #: finished and no detached actor of it lives (``drop_job_kv_if_unused``), as Ray
        #: drops a finished job's function table; ``_jobs_kv_dropped``: the newest 10,000
        #: such jobs, whose late puts are not kept.
        self._job_kv: dict[bytes, set[tuple[str, bytes]]] = {}
        self._jobs_kv_dropped: dict[bytes, None] = {}
        #: working_dir package ("pkg" key, its content hash) -> the jobs that use it (those
        #: that uploaded it, even when it was there already, and those whose config names
        #: it): dropped with the last of them.
        self._pkg_jobs: dict[bytes, set[bytes]] = {}
        self._kv_waiters: dict[tuple[str, bytes], list[asyncio.Future[bytes]]] = {}
        self.task_events = TaskEventTable(config.task_event_max_records,
                                          os.path.join(session_dir, "logs", "task_events.msgpack"),
                                          config.task_event_max_bytes, config.task_event_archive_max_bytes)
        #: How much of the task-event stream to keep (with durable storage).
        self._stream_trim = StreamTrim()
        #: channel -> {connection: the keys it follows, or None for every key}
        self._subscribers: dict[str, dict[Connection, set[bytes] | None]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self.stopped = asyncio.Event()
        self._stop_started = False
        handlers = {
            m.RegisterNode: self._register_node,
            m.NodeHeartbeat: self._heartbeat,
            m.GetAllNodes: lambda c, msg: list(self.nodes.values()),
            m.RegisterJob: self._register_job,
            m.MarkJobFinished: self._mark_job_finished,
            m.GetAllJobs: lambda c, msg: list(self.jobs.values()),
            m.KvPut: self._kv_put,
            m.KvGet: self._kv_get,
            m.KvDel: self._kv_del,
            m.KvKeys: self._kv_keys,
            m.AddTaskEvents: self._add_task_events,
            m.GetTasks: lambda c, msg: self.task_events.list(msg.job_id, msg.limit),
            m.GetTaskUpdates: lambda c, msg: self.task_events.updates(msg.since, msg.limit),
            m.ReportMetrics: lambda c, msg: self.metrics.report(msg.rows),
            m.GetMetrics: lambda c, msg: self.metrics.answer(),
            m.Subscribe: self._subscribe,
            m.ReportWorker: self._report_worker,
            m.GetAllWorkers: lambda c, msg: list(self.workers.values()),
            m.LogBatch: self._log_batch,
            m.FlushLogs: self._flush_logs,
            m.PublishError: self._publish_error,
            m.GetClusterStatus: self._cluster_status,
            m.GetNodeLog: self._node_log,
            m.ShutdownNode: self._shutdown_request,
        }
        #: The GCS's connections to raylets (actor leases, bundle reservations), one per node.
        self.raylets = RayletPool(lambda node_id: self.nodes[node_id].address, token, config)
        self.actors = ActorManager(self)
        handlers.update(self.actors.handlers())
        # Multi-node: the global scheduler serves lease requests that raylets spill.
        from lumos._private.gcs.global_scheduler import GlobalScheduler
        self.global_scheduler = GlobalScheduler(self)
        handlers.update(self.global_scheduler.handlers())
        # Placement groups; their ScheduleLease wraps the global scheduler's (bundles' nodes first).
        from lumos._private.gcs.placement_groups import PlacementGroupTable
        self.placement_groups = PlacementGroupTable(self)
        handlers.update(self.placement_groups.handlers())
        if self.writer is not None:
            handlers = {t: self._durable(h) for t, h in handlers.items()}
        self.server = RpcServer(token=token, config=config, handlers=handlers, name="gcs",
                                on_close=self._conn_closed)

    # ------------------------------------------------------------------ lifecycle

    async def start(self, host: str, port: int, unix_path: str | None = None) -> None:
        if self.writer is not None:
            await self.recover()
            self.writer.start()
        # Clients ask this to know whether to wait for a restarted GCS when this one goes.
        self.kv[("cluster", b"gcs_storage_durable")] = b"1" if self.writer is not None else b"0"
        self.kv[("cluster", b"gcs_storage_health")] = b"ok"
        await self.server.start(unix_path=unix_path, host=host, port=port)
        self._spawn(self._health_loop(), "gcs.health")
        if self.writer is not None:
            self._spawn(self._storage_health_loop(), "gcs.storage_health")
        logger.info("GCS listening on %s:%d (collector thresholds %s)", self.server.host, self.server.port,
                    gc.get_threshold())

    async def stop(self) -> None:
        if self._stop_started:  # (a second SIGTERM, a shutdown request meanwhile)
            return
        self._stop_started = True
        for node_id, conn in list(self._node_conns.items()):
            conn.notify(m.ShutdownNode("cluster is shutting down"))
        if self.writer is not None:
            self._persist_cluster_stopped()
        await asyncio.sleep(0.05)
        for task in list(self._tasks):
            task.cancel()
        self.raylets.close()
        await self.server.stop()
        self.task_events.close()
        if self.writer is not None:
            await self.writer.aclose()
        await self.storage.aclose()
        if self.private_cluster:
            # The driver that owns this session may be gone (SIGKILL): its socket and those
            # of killed workers would be left behind.
            shutil.rmtree(os.path.join(self.session_dir, "sockets"), ignore_errors=True)
        self.stopped.set()

    def _spawn(self, coro: Any, name: str) -> None:
        self._spawn_task(coro, name)

    def _spawn_task(self, coro: Any, name: str) -> asyncio.Task[Any]:
        return spawn(self._tasks, coro, name)

    # ------------------------------------------------------------------ storage

    def persist(self, table: str, key: bytes, row: Any) -> None:
        """Write a table row through to durable storage (no-op with memory storage)."""
        if self.writer is not None:
            self.writer.put_nowait(table, key, pack_value(row))

    def unpersist(self, table: str, key: bytes) -> None:
        if self.writer is not None:
            self.writer.delete_nowait(table, key)

    def _durable(self, handler: Any) -> Any:
        """``handler``, replying only once the table writes it made are in the storage."""
        writer = self.writer
        assert writer is not None

        async def after(result: Any, before: int) -> Any:
            if inspect.isawaitable(result):
                result = await result
            if writer.enqueued != before:
                await writer.wait_written(writer.enqueued)
            return result

        def run(conn: Connection, msg: Any) -> Any:
            before = writer.enqueued
            result = handler(conn, msg)
            if inspect.isawaitable(result) or writer.enqueued != before:
                return after(result, before)
            return result
        return run

    async def recover(self) -> None:
        """Load the tables a previous GCS wrote to this storage (a restart on Redis).

        Nodes listed alive get a fresh heartbeat deadline: a raylet that reconnects in time
        keeps its node; one that does not is declared dead, and its actors restart or die
        as their ``max_restarts`` says.
        """
        st = self.storage
        now = time.monotonic()
        jobs = sorted((unpack_value(v) for v in (await st.get_all("jobs")).values()),
                      key=lambda j: j.start_time)
        for job in jobs:
            self.jobs[job.job_id] = job
            if job.state != "RUNNING":  # its actors are not restarted
                self.actors.on_job_finished(job.job_id, recovered=True)
        for value in (await st.get_all("nodes")).values():
            node: m.NodeInfo = unpack_value(value)
            self.nodes[node.node_id] = node
            if node.state == "ALIVE":
                self._last_heartbeat[node.node_id] = now
        for key, value in (await st.get_all("kv")).items():
            ns, _, k = key.partition(b"\0")
            self.kv[(ns.decode(), k)] = value
            self._index_job_kv((ns.decode(), k), value)
        actors = [unpack_value(v) for v in (await st.get_all("actors")).values()]
        for row in sorted(actors, key=lambda r: r[0].start_time):
            self.actors.restore(*row)
        for value in (await st.get_all("placement_groups")).values():
            self.placement_groups.restore(unpack_value(value))
        batches = await st.read_stream("task_events")
        for blob in batches:
            self._stream_trim.appended(self.task_events.add(unpack_value(blob)), len(self.task_events.records))
        # Actors and bundles on nodes that were dead already (a cluster stopped before) move on now.
        for node_id, node in self.nodes.items():
            if node.state == "DEAD":
                self.placement_groups.on_node_dead(node_id)
                self.actors.on_node_dead(node_id, node.death_reason or "it was dead when the GCS restarted")
        for job in jobs:
            self.drop_job_kv_if_unused(job.job_id)
        running = [j.job_id for j in jobs if j.state == "RUNNING"]
        if running:
            self._spawn(self._finish_unclaimed_jobs(running), "gcs.unclaimed_jobs")
        if jobs or self.nodes or self.kv or actors:
            logger.info("recovered from %s: %d jobs, %d nodes, %d KV entries, %d actors, %d placement groups, "
                        "%d task-event batches", st.description, len(jobs), len(self.nodes), len(self.kv),
                        len(actors), len(self.placement_groups.groups), len(batches))

    async def _storage_health_loop(self) -> None:
        """Check the storage answers and still holds our tables; exit if it stays away too long."""
        interval = self.config.gcs_storage_check_interval_ms / 1000
        health = self.storage_health
        desc = self.storage.description
        write_outages = 0
        while True:
            await asyncio.sleep(interval)
            try:
                async with asyncio.timeout(self.config.gcs_storage_timeout_s):
                    lost = await self.storage.lost_parts()
            except (StorageUnavailable, TimeoutError) as e:
                now = time.monotonic()
                first = health.healthy
                must_exit = health.failed(str(e) or type(e).__name__, now)
                self.kv[("cluster", b"gcs_storage_health")] = health.describe(now).encode()
                if first:
                    logger.error("GCS unhealthy: its storage %s does not answer (%s); it keeps retrying and "
                                 "exits after gcs_storage_unavailable_exit_s=%gs", desc, e, health.exit_after_s)
                if must_exit:
                    self._spawn(self.abort(f"its storage {desc} did not answer for "
                                           f"gcs_storage_unavailable_exit_s={health.exit_after_s:g}s ({e})"),
                                "gcs.abort")
                    return
                continue
            lasted = health.answered(time.monotonic())
            if lasted is not None:
                self.kv[("cluster", b"gcs_storage_health")] = b"ok"
                logger.warning("GCS healthy again: its storage %s answers after %.1fs", desc, lasted)
            assert self.writer is not None
            write_outage = self.writer.outages != write_outages and not self.writer.failing
            if write_outage:  # writes were refused in between checks, and are taken again
                write_outages = self.writer.outages
            if ((lost or lasted is not None or write_outage)
                    and (self._writing_back is None or self._writing_back.done())):
                self._writing_back = self._spawn_task(self._write_tables_back(lost), "gcs.write_back")

    async def _write_tables_back(self, lost: list[str]) -> None:
        """Write every live table row to the storage again, then mark it as holding them.

        With ``lost`` (a Redis restarted empty) that restores its data; after an outage
        without loss it covers writes a Redis killed mid-``appendfsync`` may have dropped.
        """
        if lost:
            logger.warning("GCS storage %s: %s came back without the GCS's data; writing the live tables back "
                           "(%d nodes, %d jobs, %d KV entries, %d actors, %d placement groups)",
                           self.storage.description, ", ".join(lost), len(self.nodes), len(self.jobs),
                           len(self.kv), len(self.actors.actors), len(self.placement_groups.groups))
        for node_id, node in self.nodes.items():
            self.persist("nodes", node_id, node)
        for job_id, job in self.jobs.items():
            self.persist("jobs", job_id, job)
        assert self.writer is not None
        for (ns, k), value in self.kv.items():
            if ns == "cluster" and k in (b"gcs_storage_durable", b"gcs_storage_health"):
                continue  # this process's own view, never stored
            self.writer.put_nowait("kv", ns.encode() + b"\0" + k, value)
        self.actors.persist_all()
        self.placement_groups.persist_all()
        await self.writer.flush()
        await self.storage.mark_parts()
        if lost:
            logger.warning("GCS storage %s: the live tables are written back", self.storage.description)

    async def abort(self, reason: str) -> None:
        """Exit at once, as a crash would: nodes and drivers wait for a restarted GCS."""
        logger.error("the GCS exits: %s; restart it once the storage is back (raylets and drivers wait "
                     "gcs_reconnect_timeout_s=%gs for it)", reason, self.config.gcs_reconnect_timeout_s)
        me = asyncio.current_task()
        for task in list(self._tasks):
            if task is not me:
                task.cancel()
        self.raylets.close()
        await self.server.stop()
        self.task_events.close()
        if self.writer is not None:
            await self.writer.aclose(timeout_s=0.1)
        await self.storage.aclose()
        self.exit_code = 1
        self.stopped.set()

    async def _finish_unclaimed_jobs(self, job_ids: list[bytes]) -> None:
        """Jobs whose driver did not reconnect to this restarted GCS in time have ended."""
        await asyncio.sleep(self.config.gcs_reconnect_timeout_s + self.config.rpc_timeout_s)
        claimed = set(self._job_conns.values())
        for job_id in job_ids:
            if job_id not in claimed:
                logger.info("job %s: its driver did not reconnect after the GCS restart", job_id.hex())
                self._finish_job(job_id)

    def _persist_cluster_stopped(self) -> None:
        """A cluster stopped on purpose: its nodes and jobs are over, also for a later GCS on this storage."""
        now = time.time()
        for node_id, info in self.nodes.items():
            if info.state == "ALIVE":
                info.state, info.end_time, info.death_reason = "DEAD", now, "the cluster was stopped"
                self.persist("nodes", node_id, info)
        for job_id, job in self.jobs.items():
            if job.state == "RUNNING":
                job.state, job.end_time = "FINISHED", now
                self.persist("jobs", job_id, job)

    # ------------------------------------------------------------------ pub/sub

    def publish(self, channel: str, key: bytes | None, data: Any) -> None:
        subs = self._subscribers.get(channel)
        if not subs:
            return
        msg = m.Publish(channel, key, data)
        for conn, want in list(subs.items()):
            if want is None or key in want:
                conn.notify(msg)

    def _subscribe(self, conn: Connection, msg: m.Subscribe) -> None:
        subs = self._subscribers.setdefault(msg.channel, {})
        if msg.key is None:
            subs[conn] = None
        elif conn not in subs:
            subs[conn] = {msg.key}
        else:
            keys = subs[conn]
            if keys is not None:
                keys.add(msg.key)

    # ------------------------------------------------------------------ nodes

    async def _register_node(self, conn: Connection, msg: m.RegisterNode) -> None:
        info = msg.info
        old = self.nodes.get(info.node_id)
        if old is not None and old.state == "DEAD":
            # Fenced: a node declared dead (perhaps only frozen or cut off) may come back only
            # as a new node, with a new id: its old workers and objects are gone for everyone.
            self._fence(conn, info.node_id)
            raise ValueError(f"node {short(info.node_id)} was declared dead ({old.death_reason}); "
                             "it may rejoin only as a new node: restart it")
        info.state = "ALIVE"
        self.nodes[info.node_id] = info
        self._node_conns[info.node_id] = conn
        conn.peer_info = ("node", info.node_id)
        self._last_heartbeat[info.node_id] = time.monotonic()
        self.persist("nodes", info.node_id, info)
        logger.info("node %s joined (%s, %s)", short(info.node_id), info.hostname, info.resources_total)
        self.publish("nodes", info.node_id, info)
        self.actors.nodes_changed()
        self.placement_groups.nodes_changed()

    def _heartbeat(self, conn: Connection, msg: m.NodeHeartbeat) -> None:
        info = self.nodes.get(msg.node_id)
        if info is None:
            return
        if info.state != "ALIVE":
            self._fence(conn, msg.node_id)  # its heartbeats resumed: it must not act as alive
            return
        self.node_load[msg.node_id] = msg
        self._last_heartbeat[msg.node_id] = time.monotonic()

    def _fence(self, conn: Connection, node_id: NodeID) -> None:
        """Tell a node declared dead to exit: its raylet stops and kills its workers."""
        info = self.nodes.get(node_id)
        why = info.death_reason if info is not None else "unknown"
        logger.warning("node %s, declared dead (%s), spoke again: telling it to exit", short(node_id), why)
        conn.notify(m.ShutdownNode(f"this node was declared dead by the GCS ({why}); it must exit and "
                                   "may rejoin only as a new node"))

    def mark_node_dead(self, node_id: NodeID, reason: str) -> None:
        info = self.nodes.get(node_id)
        if info is None or info.state == "DEAD":
            return
        info.state = "DEAD"
        info.end_time = time.time()
        info.death_reason = reason
        self.node_load.pop(node_id, None)
        conn = self._node_conns.pop(node_id, None)
        if conn is not None and not conn.is_closed:
            # A frozen or cut-off raylet reads this first when it runs again (issue 12).
            self._fence(conn, node_id)
        self.persist("nodes", node_id, info)
        logger.warning("node %s marked dead: %s", short(node_id), reason)
        gone = []
        for w in self.workers.values():
            if w.node_id == node_id and w.state == "ALIVE":
                w.state = "DEAD"
                w.end_time = time.time()
                w.exit_detail = f"node died: {reason}"
                w.exit_type = m.WorkerExitType.SYSTEM_ERROR
                gone.append(w)
        self.publish("nodes", node_id, info)
        for w in gone:  # borrowers drop them, raylets free what they owned
            self.publish("workers", w.worker_id, w)
            self.publish("worker_deaths", w.worker_id, w)
        self.raylets.discard(node_id)
        self.global_scheduler.state.node_removed(node_id)  # its recent placements and spread count
        self.placement_groups.on_node_dead(node_id)
        self.actors.on_node_dead(node_id, reason, [w.worker_id for w in gone])

    async def _health_loop(self) -> None:
        interval = self.config.heartbeat_interval_ms / 1000
        timeout = self.config.node_death_timeout_ms / 1000
        last = time.monotonic()
        while True:
            await asyncio.sleep(interval)
            await asyncio.sleep(0)  # heartbeats already waiting in the sockets are read first
            now = time.monotonic()
            stall = now - last - interval
            last = now
            if stall > interval:
                # This process was held up (stopped, swapped, starved of CPU): the silence
                # is ours, not the raylets'. Their deadlines move on by as long as we stood still.
                self._excuse_stall(stall, now)
            for node_id, info in list(self.nodes.items()):
                if info.state == "ALIVE" and now - self._last_heartbeat.get(node_id, now) > timeout:
                    self.mark_node_dead(node_id, f"no heartbeat for {timeout:.1f}s")

    def _excuse_stall(self, stall: float, now: float) -> None:
        """Move every node's last heartbeat on by the time the GCS itself stood still, so a
        stopped or starved GCS does not declare healthy nodes dead when it resumes."""
        beats = self._last_heartbeat
        for node_id, at in beats.items():
            beats[node_id] = min(at + stall, now)
        logger.info("the GCS stood still for %.1fs; node heartbeat deadlines moved on by as much", stall)

    def _cluster_status(self, conn: Connection, msg: m.GetClusterStatus) -> list[m.NodeResources]:
        out = []
        for node_id, info in self.nodes.items():
            if info.state != "ALIVE":
                continue
            hb = self.node_load.get(node_id)
            out.append(m.NodeResources(
                node_id, info.resources_total,
                hb.resources_available if hb else dict(info.resources_total),
                hb.queue_length if hb else 0, hb.store_used_bytes if hb else 0,
                info.object_store_bytes, hb.num_workers if hb else 0,
                hb.infeasible if hb else [],
                hb.memory_total_bytes if hb else 0, hb.memory_available_bytes if hb else 0,
                hb.lumos_rss_bytes if hb else 0, hb.cpu_percent if hb else 0.0,
                hb.store_pooled_bytes if hb else 0, hb.group_total if hb else {},
                hb.group_available if hb else {}))
        return out

    async def _node_log(self, conn: Connection, msg: m.GetNodeLog) -> m.NodeLog:
        """Forward to the node's raylet, which reads its own files (see raylet/node_report.py)."""
        info = self.nodes.get(msg.node_id) if isinstance(msg.node_id, bytes) else None
        node_conn = self._node_conns.get(msg.node_id) if info is not None and info.state == "ALIVE" else None
        if node_conn is None or node_conn.is_closed:
            raise LookupError(f"no alive node {msg.node_id!r:.60}; lumos.state.list_nodes() lists the nodes")
        try:
            reply = await node_conn.call(msg, self.config.rpc_timeout_s)
        except RemoteError as e:  # the raylet's typed refusal, passed on with its type
            raise _LOG_ERRORS.get(e.type_name, RuntimeError)(e.text) from None
        except (ConnectionLost, TimeoutError) as e:
            raise TimeoutError(f"node {short(msg.node_id)} did not answer for its log: {e}") from None
        if not isinstance(reply, m.NodeLog):
            raise RuntimeError(f"node {short(msg.node_id)} answered {type(reply).__name__}, not NodeLog")
        return reply

    # ------------------------------------------------------------------ jobs

    def _register_job(self, conn: Connection, msg: m.RegisterJob) -> m.JobInfo:
        known = self.jobs.get(msg.job_id) if msg.job_id else None
        if known is not None:  # its driver, back after a GCS restart
            self._job_conns[conn] = known.job_id
            conn.peer_info = ("job", known.job_id)
            logger.info("job %s: its driver reconnected", known.job_id.hex())
            return known
        metadata = msg.metadata
        if metadata is not None:
            m.check_job_metadata(metadata)
        job_id = new_job_id()
        while job_id in self.jobs:
            job_id = new_job_id()
        info = m.JobInfo(job_id, msg.driver, msg.pid, msg.namespace, msg.entrypoint, "RUNNING",
                         time.time(), 0.0, metadata or None)
        self.jobs[job_id] = info
        self._job_conns[conn] = job_id
        if self._owner_job is None:
            self._owner_job = job_id
        conn.peer_info = ("job", job_id)
        self.persist("jobs", job_id, info)
        logger.info("job %s started (driver pid %d)", job_id.hex(), msg.pid)
        self.publish("jobs", job_id, info)
        return info

    def _mark_job_finished(self, conn: Connection, msg: m.MarkJobFinished) -> None:
        self._jobs_ended_by_driver[msg.job_id] = None
        while len(self._jobs_ended_by_driver) > 10_000:
            del self._jobs_ended_by_driver[next(iter(self._jobs_ended_by_driver))]
        self._finish_job(msg.job_id)

    def _finish_job(self, job_id: JobID) -> None:
        info = self.jobs.get(job_id)
        if info is None or info.state != "RUNNING":
            return
        info.state = "FINISHED"
        info.end_time = time.time()
        self.persist("jobs", job_id, info)
        logger.info("job %s finished", job_id.hex())
        self.publish("jobs", job_id, info)
        self.actors.on_job_finished(job_id)
        self.placement_groups.on_job_finished(job_id)
        self.drop_job_kv_if_unused(job_id)
        live = {a.info.actor_id for a in self.actors.state.actors.values() if a.info.state != "DEAD"}
        orphans = self.task_events.orphans_failed(job_id, info.end_time, "its job finished (the driver exited) "
                                                  "before it did; its worker was stopped", live)
        if orphans:
            self._record_task_events(orphans)

    # ------------------------------------------------------------------ workers

    def _report_worker(self, conn: Connection, msg: m.ReportWorker) -> None:
        info = msg.info
        node = self.nodes.get(info.node_id)
        if node is not None and node.state == "DEAD" and info.state == "ALIVE":
            return  # from a fenced node: its workers count as dead
        before = self.workers.get(info.worker_id)
        if before is not None and before.start_time:
            info.start_time = before.start_time  # (the raylet stamps each report with its time)
        if info.state == "DEAD" and info.is_driver and info.exit_type is None:
            # A driver that said its job finished (``shutdown``, its interpreter's exit)
            # ended as its user meant; one that only disconnected was killed or crashed.
            info.exit_type = (m.WorkerExitType.INTENDED_USER_EXIT if info.job_id in self._jobs_ended_by_driver
                              else m.WorkerExitType.SYSTEM_ERROR)
        self.workers[info.worker_id] = info
        if len(self.workers) > 20_000:  # keep the dead ones bounded
            for wid in [w for w, i in self.workers.items() if i.state != "ALIVE"][:5_000]:
                del self.workers[wid]
        self.publish("workers", info.worker_id, info)
        if info.state == "DEAD":
            # Core workers and raylets only need deaths: every worker hearing of every
            # other's start would cost n^2 messages for n actors (issue 19).
            self.publish("worker_deaths", info.worker_id, info)
            self.actors.on_worker_dead(info.worker_id, info.exit_detail)

    # ------------------------------------------------------------------ KV

    def _kv_put(self, conn: Connection, msg: m.KvPut) -> bool:
        key = (msg.namespace, msg.key)
        if msg.namespace == "pkg" and conn.peer_info and conn.peer_info[0] == "job":
            # (before the answer "there already": the job that uploaded it first may end
            # before this one's config, naming it, comes)
            self._pkg_jobs.setdefault(msg.key, set()).add(conn.peer_info[1])
        if not msg.overwrite and key in self.kv:
            return False
        if _job_of_kv_key(key) in self._jobs_kv_dropped:
            return True  # (a late export of a job that is over: nothing will read it)
        self.kv[key] = msg.value
        self._index_job_kv(key, msg.value)
        for fut in self._kv_waiters.pop(key, []):
            if not fut.done():
                fut.set_result(msg.value)
        if self.writer is not None:
            self.writer.put_nowait("kv", msg.namespace.encode() + b"\0" + msg.key, msg.value)
        return True

    async def _kv_get(self, conn: Connection, msg: m.KvGet) -> bytes | None:
        key = (msg.namespace, msg.key)
        value = self.kv.get(key)
        if value is not None or msg.wait_s <= 0:
            return value
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._kv_waiters.setdefault(key, []).append(fut)
        try:
            async with asyncio.timeout(min(msg.wait_s, 300.0)):
                return await fut
        except TimeoutError:
            return None
        finally:
            waiters = self._kv_waiters.get(key)
            if waiters and fut in waiters:
                waiters.remove(fut)
                if not waiters:
                    del self._kv_waiters[key]

    def _index_job_kv(self, key: tuple[str, bytes], value: bytes) -> None:
        """Count a KV entry among its job's (``_job_of_kv_key``); a job config also counts
        the job among the users of the packages it names."""
        job_id = _job_of_kv_key(key)
        if job_id is not None:
            self._job_kv.setdefault(job_id, set()).add(key)
            if key[0] == "job":
                self._note_package_of(job_id, value)

    def drop_job_kv_if_unused(self, job_id: JobID) -> None:
        """Drop a job's exported functions and config once it has finished and no
        detached actor of it lives (one restarting needs its class and config; tasks it
        submits export under its job). A cluster that outlives many drivers (notebook
        kernels, scripts) kept every function each of them ever sent, closures and all."""
        info = self.jobs.get(job_id)
        if info is None or info.state == "RUNNING":
            return
        if any(a.info.job_id == job_id and a.info.detached and a.info.state != "DEAD"
               for a in self.actors.state.actors.values()):
            return
        self._jobs_kv_dropped[job_id] = None
        while len(self._jobs_kv_dropped) > 10_000:
            del self._jobs_kv_dropped[next(iter(self._jobs_kv_dropped))]
        keys = self._job_kv.pop(job_id, set())
        for pkg in [p for p, jobs in self._pkg_jobs.items() if job_id in jobs]:
            jobs = self._pkg_jobs[pkg]
            jobs.discard(job_id)
            if not jobs:
                del self._pkg_jobs[pkg]
                keys.add(("pkg", pkg))
                self.publish("packages", pkg, "dropped")  # (raylets remove their unpacked copies)
        for key in keys:
            if self.kv.pop(key, None) is not None:
                self.unpersist("kv", key[0].encode() + b"\0" + key[1])
        if keys:
            logger.info("job %s: dropped %d KV entries (its exported functions and config, working_dir "
                        "packages no other job uses)", job_id.hex(), len(keys))

    def _note_package_of(self, job_id: JobID, config: bytes) -> None:
        """Count the job among the users of the packages its config names (its working_dir
        and py_modules)."""
        try:
            conf = json.loads(config)
            pkgs = [conf.get("working_dir")] + list(conf.get("py_modules") or [])
        except (ValueError, AttributeError, TypeError):
            return
        for pkg in pkgs:
            if isinstance(pkg, str) and pkg:
                self._pkg_jobs.setdefault(pkg.encode(), set()).add(job_id)

    def _kv_del(self, conn: Connection, msg: m.KvDel) -> bool:
        job_id = _job_of_kv_key((msg.namespace, msg.key))
        if job_id is not None:
            self._job_kv.get(job_id, set()).discard((msg.namespace, msg.key))
        found = self.kv.pop((msg.namespace, msg.key), None) is not None
        self.unpersist("kv", msg.namespace.encode() + b"\0" + msg.key)
        return found

    def _kv_keys(self, conn: Connection, msg: m.KvKeys) -> list[bytes]:
        return [k for (ns, k) in self.kv if ns == msg.namespace and k.startswith(msg.prefix)]

    # ------------------------------------------------------------------ events and logs

    def _add_task_events(self, conn: Connection, msg: m.AddTaskEvents) -> None:
        events, bad = events_of(msg)
        if bad:
            logger.error("left out %d malformed task event rows from %s", bad, conn.peer)
        self._record_task_events(events)

    def _record_task_events(self, events: list[Any]) -> None:
        created = self.task_events.add(events)
        if self.writer is not None:  # a stream of the batches the table's records came from: XADD ... MAXLEN ~
            self.writer.append_nowait("task_events", pack_value(events),
                                      self._stream_trim.appended(created, len(self.task_events.records)))
        self.publish("task_events", None, len(events))

    def _log_batch(self, conn: Connection, msg: m.LogBatch) -> None:
        by_job: dict[bytes | None, list[Any]] = {}
        for line in msg.lines:
            by_job.setdefault(line[0], []).append(line)
        for job_id, lines in by_job.items():
            self.publish("logs", job_id, lines)

    async def _flush_logs(self, conn: Connection, msg: m.FlushLogs) -> bool:
        """Answered once each alive raylet has forwarded the output it held (``FlushLogs``)."""
        conns = [c for node_id, c in self._node_conns.items()
                 if not c.is_closed and (info := self.nodes.get(node_id)) is not None and info.state == "ALIVE"]
        await asyncio.gather(*(c.call(msg, self.config.rpc_timeout_s) for c in conns), return_exceptions=True)
        return True

    def _publish_error(self, conn: Connection, msg: m.PublishError) -> None:
        self.publish("errors", msg.job_id, [msg.kind, msg.text])

    # ------------------------------------------------------------------ disconnects

    def _conn_closed(self, conn: Connection) -> None:
        for subs in self._subscribers.values():
            subs.pop(conn, None)
        info = conn.peer_info
        if not info:
            return
        kind, ident = info
        if kind == "node" and self._node_conns.get(ident) is conn:
            self.mark_node_dead(ident, "its raylet disconnected")
        elif kind == "job":
            self._job_conns.pop(conn, None)
            self._finish_job(ident)
            if self.private_cluster and ident == self._owner_job:
                logger.info("the driver that started this private cluster disconnected; shutting down")
                self._spawn(self.stop(), "gcs.stop")

    def _shutdown_request(self, conn: Connection, msg: m.ShutdownNode) -> None:
        logger.info("shutdown requested: %s", msg.reason)
        self._spawn(self.stop(), "gcs.stop")


async def _amain(args: argparse.Namespace) -> None:
    config = Config.from_json(args.config) if args.config else Config.resolve()
    token = read_token(args.token_file)
    url = read_private_file(args.storage_file).decode().strip() if args.storage_file else args.storage
    storage = create_storage(url, config.gcs_storage_timeout_s)
    try:
        await storage.start()
    except StorageUnavailable as e:
        logger.error("cannot use the GCS storage %s: %s", storage.description, e)
        await storage.aclose()
        raise SystemExit(1) from None
    gcs = GcsServer(config, token, storage, args.session_dir, private_cluster=args.private)
    await gcs.start(args.host, args.port, args.unix_path or None)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: asyncio.ensure_future(gcs.stop()))
    report_ready(args.ready_fd, {"host": gcs.server.host, "port": gcs.server.port, "pid": os.getpid()})
    await gcs.stopped.wait()
    if gcs.exit_code:
        raise SystemExit(gcs.exit_code)


def _job_of_kv_key(key: tuple[str, bytes]) -> JobID | None:
    """The job whose own processes alone read ``key``: an exported function or class
    (``"fn"``, job id + function id) or the job's config (``"job"``, the job id)."""
    ns, k = key
    if ns == "fn" and len(k) > 4:
        return JobID(k[:4])
    if ns == "job" and len(k) == 4:
        return JobID(k)
    return None


def main() -> None:
    p = argparse.ArgumentParser(prog="lumos-gcs")
    p.add_argument("--session-dir", required=True)
    p.add_argument("--token-file", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--unix-path", default="")
    p.add_argument("--storage", default="memory", help="GCS storage URL without a password")
    p.add_argument("--storage-file", default="", help="private file holding the GCS storage URL")
    p.add_argument("--config", default="")
    p.add_argument("--ready-fd", type=int, default=-1)
    p.add_argument("--private", action="store_true")
    p.add_argument("--die-with-parent", type=int, default=0)
    args = p.parse_args()
    if args.die_with_parent:
        die_with_parent(args.die_with_parent, signal.SIGTERM)
    setup_logging(os.path.join(args.session_dir, "logs"), "gcs")
    tune_gc_for_service()
    eventloop.run(_amain(args))


if __name__ == "__main__":
    main()
