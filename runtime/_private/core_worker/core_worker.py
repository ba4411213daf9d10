"""The core worker: the part of every driver and worker process that talks to the cluster.

Data flow (each box names its module; ``…State`` classes are pure: events in, actions
out, touched by the ``lumos-io`` thread only; ``CoreWorker`` runs their actions)::

 user threads                      │ lumos-io thread (io_loop.py)                        │ peers
                                   │                                                     │
 submit_task ─ submission.py ─────►│ inbox ─► _on_submit                                 │
   pack args, TaskSpec, owned      │   ├─ ref args: OwnerState.resolve_args (owner.py)   │
   returns, SUBMITTED event        │   │     wait / FetchObject / RunAgain lost args     │
   (one post per call, batched)    │   ├─ actor calls: ActorSubmitter (actor_submitter)  │
                                   │   └─ TaskSubmitterState.enqueue (task_submitter.py) │
                                   │        RequestLease ─► _request_lease ─────────────►│ raylet(s)
                                   │        PushTask ─► _push ───────────────────────────►│ worker
 get / wait / future ─ objects.py  │ TaskReply ─► results.py: submitter accounting,      │◄── worker
   read the table under its lock,  │   retry (TaskSubmitterState) or record values       │
   Waiter.lock ◄───────────────────│   (ObjectTable.complete wakes waiters), lineage     │
 put ─ objects.py: inline, or      │   (OwnerState.keep_lineage), release args           │
   StoreClient.write ─► raylet     │ GeneratorItem ─► streams.py ─► ObjectRefGenerator   │◄── worker
 ObjectRef.__del__ ─► decrements   │ references.py: borrowers, releases, FreeObjects     │◄─► owners
   (drained at API entry / flush)  │ GetObjectStatus ─► objects.py (owner side)          │◄── borrowers
                                   │ ObjectCopied, node dead ─► copies.py                │◄── readers
                                   │ PushTask ─► executor.py (worker: main thread runs)  │◄── owners

Modules: ``io_loop.py`` the io thread, the inbox, ``run_sync`` and ``spawn``;
``submission.py`` submit/create_actor/cancel and the task-event buffer; ``owner.py``
``OwnerState`` (object table, argument resolution, lineage, reconstruction);
``task_submitter.py`` ``TaskSubmitterState`` (queues per scheduling key, leases,
pipelining depth, retries); ``results.py`` replies and results; ``objects.py``
put/get/wait/futures and object status; ``streams.py`` streaming generators;
``references.py`` the object table and reference counting across processes;
``copies.py`` copies of owned values on other nodes, one made the home of a value whose node died;
``actor_submitter.py`` actor calls; ``executor.py`` (+ ``arguments.py``) running pushed
tasks in a worker; ``actor_host.py`` the actor inside its worker; ``driver.py`` the driver's job config and
output printers; ``gcs_link.py`` reaching a restarted GCS again; ``tasks.py`` the records they share. This file wires it together: it opens the connections (GCS, local
raylet, peers), registers the RPC handlers, and carries out the states' actions.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import threading
import time
from typing import Any, Callable

import msgpack

from lumos import exceptions as exc
from lumos import object_ref as object_ref_mod
from lumos._private import interrupts, metrics
from lumos._private.config import Config
from lumos._private.core_worker import gcs_link
from lumos._private.core_worker import owner as ow
from lumos._private.core_worker import task_submitter as ts
from lumos._private.core_worker.driver import code_env, job_config, print_cluster_error, print_worker_lines
from lumos._private.core_worker.copies import CopiesMixin
from lumos._private.core_worker.io_loop import Claim, IoLoop
from lumos._private.core_worker.objects import ObjectsMixin, error_blob
from lumos._private.core_worker.references import ReferencesMixin
from lumos._private.core_worker.results import ResultsMixin
from lumos._private.core_worker.streams import StreamsMixin
from lumos._private.core_worker.submission import SubmissionMixin, flushes_held, function_id_of  # noqa: F401 (re-exported)
from lumos._private.core_worker.tasks import (DONE, DRIVER, WORKER, LeasedWorker, PendingTask, SchedulingQueue,
                                              TaskTemplate)
from lumos._private.ids import ActorID, JobID, NodeID, ObjectID, TaskID, WorkerID, new_task_id, short
from lumos._private.object_store.client import StoreClient
from lumos._private.protocol import messages as m
from lumos._private.protocol.vocab import LEASE_REFUSALS
from lumos._private.transport.connection import (Connection, ConnectionCache, ConnectionLost, RemoteError,
                                                 RpcServer, connect, connect_with_retry)
from lumos.generator import GeneratorStream

logger = logging.getLogger(__name__)

#: Every ``TaskKind`` (a spec built in this process may hold the plain int).
_TASK_KINDS = frozenset(m.TaskKind)

#: Worker connections a process lets user threads write to (each holds a duplicated fd).
MAX_DIRECT_CONNS = 256

#: After a raylet says a leased worker exited, how long its connection may still deliver
#: what the worker sent before it exited (``_handle_leased_worker_exited``).
LEASED_EXIT_GRACE_S = 1.0

#: A reply held back while more calls wait (``send_reply``'s ``hold``) leaves with the next
#: one sent after this long. Only the reply of a call shorter than a quarter of it is held:
#: the calls after a longer one would not come back in time to share its write, and a
#: hold may start the io thread's look (a wake-up).
REPLY_HOLD_S = 0.0005
#: How often the io thread looks at held replies (``_watch_held``): a reply waits
#: ``REPLY_HOLD_S + HELD_WATCH_S`` at most, whatever the calls after it do. (The loop's
#: timers count whole milliseconds: a shorter one fires at once, again and again.)
HELD_WATCH_S = 0.001


class CoreWorker(SubmissionMixin, ResultsMixin, ObjectsMixin, StreamsMixin, ReferencesMixin, CopiesMixin):
    def __init__(self, *, mode: int, config: Config, token: bytes, gcs_address: tuple[str, int],
                 raylet_socket: str, session_dir: str, node_id: NodeID, store_dir: str,
                 worker_id: WorkerID, node_ip: str = "127.0.0.1", namespace: str = "",
                 entrypoint: str = "", job_env_vars: dict[str, str] | None = None,
                 job_code: Any = None, gcs_durable: bool | None = None,
                 job_metadata: dict[str, str] | None = None) -> None:
        self.mode = mode
        self.config = config
        self.token = token
        self.gcs_address = gcs_address
        self.raylet_socket = raylet_socket
        self.session_dir = session_dir
        self.node_id = node_id
        self.node_ip = node_ip
        self.worker_id = worker_id
        self.namespace = namespace
        self.entrypoint = entrypoint
        #: Drivers: the job's environment variables (``init(runtime_env=...)``).
        self.job_env_vars = job_env_vars
        #: Drivers: the job's working_dir and py_modules, zipped (``working_dir.JobCode``).
        self.job_code = job_code
        #: The job's working_dir and py_modules as ``runtime_context.runtime_env`` shows them.
        self.job_code_env: dict[str, Any] = {}
        #: Drivers: ``JobConfig(metadata=...)``, for the job's row.
        self.job_metadata = job_metadata
        #: The running task's or actor's own environment variables, inherited by what it
        #: submits (Ray's runtime_env inheritance); None in drivers and plain tasks.
        self.inherited_env: dict[str, str] | None = None
        self.job_id: JobID = b""
        #: Objects, references, lineage and reconstruction decisions (owner.py).
        self.owner = ow.OwnerState(worker_id, validate=config.validate)
        self.owner.on_arg_ready = self._dep_ready
        #: The object table (shared with user threads under its lock; see owner.py).
        self.objects = self.owner.objects
        self.objects.local_node = node_id
        #: Whether this process follows other workers' deaths (to drop dead borrowers of
        #: what it owns): a driver from the start, a worker once it first lends an object,
        #: so that killing many actors does not tell every other worker of every death.
        self.follows_deaths = mode == DRIVER
        if not self.follows_deaths:
            self.objects.on_first_borrower = self.follow_worker_deaths
        #: Lineage (io thread): finished normal tasks that may run again, by task id.
        self.lineage = self.owner.lineage
        #: Nodes the GCS declared dead (io thread): values stored there are lost.
        self.dead_nodes = self.owner.dead_nodes
        #: Owned objects with copies on other nodes (io thread; ``copies.py``).
        self.copied: set[ObjectID] = set()
        self._copied_pruned_at = 0
        self.store = StoreClient(store_dir, config.memcpy_threads, config.memcpy_threshold_bytes,
                                 config.object_store_recycle_bytes)
        self.store.on_pin = self._store_pin_changed
        self.store.restore = self._restore_spilled
        self.store.on_free_later = self._free_after_views
        self.store.in_place_min_bytes = config.torch_in_place_min_bytes
        self.address: m.Address = m.Address(node_id, worker_id, "", "", 0)
        #: The driver's own task id (parent of what it submits); in workers the running task's.
        self.current_task_id: TaskID = new_task_id()
        self.current_task_name = ""
        #: Strategy that child tasks without one of their own inherit (a placement group
        #: that captures child tasks), set by the executor for the running task.
        self.capture_strategy: list[Any] | None = None
        self._captured_templates: dict[Any, tuple[TaskTemplate, TaskTemplate]] = {}
        self.current_resource_ids: dict[str, list[Any]] = {}
        self.current_actor_id: ActorID | None = None
        #: Task id -> method name of the latest calls this actor made to itself.
        self._calls_to_self: dict[bytes, str] = {}
        self._put_counter = 0
        #: Sizes with a ``ReserveSlots`` request in flight (io thread).
        self._reserving: set[int] = set()
        #: Sizes whose reserved slots ran low, asked for after the write in hand (objects.py).
        self._top_ups: set[int] = set()
        #: Replies the executor holds back to send in one write (``send_reply``), all to
        #: ``_held_conn``, the first since ``_held_since`` (monotonic).
        self._held: list[m.TaskReply] = []
        self._held_conn: Connection | None = None
        self._held_since = 0.0
        self._held_lock = threading.Lock()
        #: The io thread looks at the held group when it is due (``_watch_held``).
        self._held_watched = False
        #: Replies were held since the watch's last look: it looks again even when it finds
        #: none held (``_watch_held``).
        self._held_since_look = False
        #: Times the watch was started (a statistic: one per burst of held groups, not one
        #: per group; each start wakes the io thread).
        self.held_watches = 0
        #: The lumos-io thread, its loop and the inbox from user threads (io_loop.py).
        self.io = IoLoop()
        #: Hot-path hand-overs, bound once (``_post(fn, *args)`` runs ``fn`` on the io thread).
        self._post = self.io.post
        self._spawn = self.spawn = self.io.spawn
        self.run_sync = self.io.run_sync
        self.gcs: Connection | None = None
        #: The GCS keeps its tables in durable storage: when it goes, wait for its restart.
        self._gcs_durable = config.gcs_storage not in ("", "memory") if gcs_durable is None else gcs_durable
        #: Whether ``_gcs_durable`` is known (a worker's raylet passes the GCS's answer on),
        #: so the connection need not ask the GCS (issue 19).
        self._gcs_durable_known = gcs_durable is not None
        #: A reconnection to a restarted GCS is under way.
        self._gcs_reconnecting = False
        #: Function exports made while the GCS was away, sent again once it is back.
        self._gcs_backlog: list[Any] = []
        self.raylet: Connection | None = None
        self.server: RpcServer | None = None
        self.node_info: m.NodeInfo | None = None
        # io-thread state ------------------------------------------------------------
        #: Task id -> task submitted by this process and not answered.
        self.tasks: dict[bytes, PendingTask] = {}
        #: Scheduling queues, leases, pipelining and retry decisions (task_submitter.py),
        #: each event under ``_submit_lock``, which a user thread also holds to claim an
        #: idle worker for a task it writes itself (``push_direct``).
        self._submit_lock = threading.Lock()
        self.submitter = ts.Serialized(ts.TaskSubmitterState(
            max_tasks_in_flight_per_worker=config.max_tasks_in_flight_per_worker,
            pipeline_below_ms=config.pipeline_below_ms,
            max_pending_lease_requests=config.max_pending_lease_requests,
            max_leases_per_scheduling_key=config.max_leases_per_scheduling_key,
            task_oom_retry_delay_base_ms=config.task_oom_retry_delay_base_ms, validate=config.validate),
            self._submit_lock)
        #: Worker connections user threads may write to (each holds a duplicated fd).
        self._direct_conns = 0
        #: Tasks ``push_direct`` wrote (a statistic: not exact with several user threads).
        self.direct_tasks = 0
        #: Lease idle timers started (a statistic: one per idle spell that outlasts the
        #: timeout, not one per task; ``_idle_expired``).
        self.idle_timers_armed = 0
        #: Worker id -> open connection (or the future of one being opened).
        self._peers = ConnectionCache()
        #: Function ids already exported to the GCS for this job.
        self._exported: set[bytes] = set()
        #: Actors this process created whose RegisterActor is not answered yet (submission.py).
        self._registering: dict[bytes, Any] = {}
        #: Task id -> the values of a streaming generator task that arrived so far.
        self.streams: dict[bytes, GeneratorStream] = {}
        # cross-thread ---------------------------------------------------------------
        #: Task events not yet sent: tuples, turned into messages off the hot path.
        self._events: list[tuple[Any, ...]] = []
        #: Task id -> RUNNING event of a task executing here, until its reply or a flush.
        self._running_events: dict[bytes, tuple[Any, ...]] = {}
        #: Rows of tasks submitted just before the last flush, sent at the next
        #: (``_flush_events``), by task attempt.
        self._held_events: dict[Any, list[Any]] = {}
        #: Task id -> a task submitted here whose events ride on it (``PendingTask.ev_live``)
        #: and that no flush has reported yet; user threads add (under ``_fresh_lock``).
        self._fresh: dict[bytes, PendingTask] = {}
        self._fresh_lock = threading.Lock()
        #: Flushes of the flush loop a fresh task not ended is left for before one reports
        #: it (``task_event_hold_ms``; ``_report_fresh``).
        self._event_holds = flushes_held(config.task_event_hold_ms, config.task_event_flush_interval_ms)
        #: Whole attempts packed at their end for the next flush (io thread), with the
        #: packer that packs them.
        self._packed_rows: list[tuple[Any, ...]] = []
        self._event_packer = msgpack.Packer(use_bin_type=True, autoreset=True)
        #: Tasks whose returns a user thread freed, for the io thread to drop from the
        #: lineage at its next turn (``ReferencesMixin._release``).
        self._lineage_drops: collections.deque[bytes] = collections.deque()
        #: The flush loop waits with nothing buffered: the next buffering wakes it
        #: (``wake_flush``).
        self._flush_idle = False
        #: Set (on the io loop) to wake the idle flush loop.
        self._flush_armed = asyncio.Event()
        #: Flushes the flush loop has run (idle workers must not run any).
        self.flush_wakeups = 0
        #: The timer of the next application-metrics report (``report_metrics``), and
        #: when it may run (the io loop's clock): one per ``metrics_report_interval_ms``.
        self._metrics_timer: asyncio.TimerHandle | None = None
        self._metrics_next = 0.0
        #: Reports sent (a statistic).
        self.metrics_reports = 0
        #: Client drivers' reports held in ``_gcs_backlog`` (``forward_metrics``); a drop said.
        self._metrics_held = 0
        self._metrics_drop_said = False
        #: Called with batches of worker output lines (driver); replaceable by front ends.
        self.log_handler: Callable[[list[Any]], None] = print_worker_lines
        #: When worker output last arrived (monotonic; the exit drain waits for it to settle).
        self.last_log_at = 0.0
        self.error_handler: Callable[[str, str], None] = print_cluster_error
        self._closed = False
        self._blocked_depth = 0
        #: The io thread's spin after a reply (``ResultsMixin._spin_after_reply``): its
        #: length, its end (monotonic), whether it runs, and when the last reply that
        #: released a user thread's wait for one object came.
        self._spin_s = config.owner_spin_us / 1e6
        self._spin_until = 0.0
        self._spinning = False
        self._last_release_at = 0.0
        #: Replies that started or stretched the io thread's spin, and replies that came
        #: while it spun (statistics, for tests).
        self.spins = 0
        self.spin_catches = 0
        #: Hooks the executor (workers) installs.
        self.executor: Any = None
        #: Publish channel -> extra handler (front ends, actors).
        self.extra_publish_handlers: dict[str, Callable[[m.Publish], None]] = {}
        #: Actor id -> the last call this process submitted to it (stateful edges).
        self._last_actor_call: dict[bytes, bytes] = {}
        #: Why the cluster is unreachable (the GCS or the local raylet went away), else None.
        self.gone: str | None = None
        #: Peer key (worker id, or b"raylet:" + node id) -> the node it runs on (io thread).
        self._peer_nodes: dict[bytes, bytes] = {}
        #: Connections closed because their node was declared dead -> that node.
        self._node_of_conn: dict[Connection, bytes] = {}
        from lumos._private.core_worker.actor_submitter import ActorSubmitter
        self.actor_submitter = ActorSubmitter(self)

    # ================================================================== lifecycle

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        return self.io.loop

    def start(self) -> None:
        """Start the io thread, connect, register. Returns when ready to submit."""
        self.io.start(self._connect, self._close_leftovers, self.config.connect_timeout_s + 5)
        object_ref_mod._core_worker = self
        interrupts.set_later(self._later)

    def _later(self, fn: Callable[[], None]) -> bool:
        """``fn`` on the io thread ``interrupts.RESEND_AFTER_S`` from now (any thread; a
        SIGINT handler's, for a press that landed in a finalizer); False once closed."""
        loop = self.loop
        if self._closed or loop is None:
            return False
        try:
            self.io.post(loop.call_later, interrupts.RESEND_AFTER_S, fn)
        except exc.LumosSystemError:
            return False
        return True

    def _close_leftovers(self, loop: asyncio.AbstractEventLoop) -> None:
        """Whatever an interrupted close left open is closed here, so the loop can go (io thread)."""
        self._peers.close_all()
        for conn in (self.raylet, self.gcs):
            if conn is not None:
                conn.close()
        if self.server is not None:
            loop.run_until_complete(asyncio.wait_for(self.server.stop(), 2.0))

    async def _connect(self) -> None:
        cfg = self.config
        sock_dir = os.path.join(self.session_dir, "sockets")
        os.makedirs(sock_dir, exist_ok=True)
        handlers = {
            m.PushTask: self._handle_push_task,
            m.CancelTask: self._handle_cancel_task,
            m.GetObjectStatus: self._handle_get_object_status,
            m.AddBorrowers: self._handle_add_borrowers,
            m.RemoveBorrowers: self._handle_remove_borrowers,
            m.ObjectCopied: self._handle_object_copied,
            m.GetCoreWorkerStats: lambda c, msg: self.stats(msg.brief is True),
            m.ExitWorker: self._handle_exit_worker,
            m.TaskReply: self._handle_task_reply,
            m.WorkerBlocked: self._handle_worker_blocked,
            m.WorkerUnblocked: self._handle_worker_blocked,
        }
        self.server = RpcServer(token=self.token, config=cfg, handlers=handlers, name="core-worker")
        kind = "driver" if self.mode == DRIVER else "worker"
        await self.server.start(unix_path=os.path.join(sock_dir, f"{kind}-{self.worker_id.hex()[:12]}.sock"),
                                host=self.node_ip, port=0)
        self.address = m.Address(self.node_id, self.worker_id, self.server.unix_path,
                                 self.server.host, self.server.port)
        if self._gcs_durable:  # a worker started while the GCS restarts waits for it
            self.gcs = await connect_with_retry(self.gcs_address, token=self.token, config=cfg,
                                                handlers={m.Publish: self._handle_publish},
                                                name="core-worker->gcs", on_close=self._gcs_lost,
                                                timeout_s=cfg.gcs_reconnect_timeout_s)
        else:
            self.gcs = await connect(self.gcs_address, token=self.token, config=cfg,
                                     handlers={m.Publish: self._handle_publish}, name="core-worker->gcs",
                                     on_close=self._gcs_lost)
        self.raylet = await connect(self.raylet_socket, token=self.token, config=cfg,
                                    handlers={m.DropSlots: self._handle_drop_slots,
                                              m.DropMappings: lambda c, msg: self.store.drop_mappings(msg.object_ids),
                                              m.ExitWorker: self._handle_exit_worker,
                                              m.LeasedWorkerExited: self._handle_leased_worker_exited,
                                              m.LeaseRecalled: self._handle_lease_recalled,
                                              m.GetCoreWorkerStats: lambda c, msg: self.stats(msg.brief is True)},
                                    name="core-worker->raylet", on_close=self._raylet_lost)
        self.raylet.allow_write_now()  # seals and pins may leave from user threads (objects.py)
        if self.mode == DRIVER:
            job = await self.gcs.call(m.RegisterJob(self.address, os.getpid(), self.namespace, self.entrypoint,
                                                    metadata=self.job_metadata), cfg.rpc_timeout_s)
            self.job_id = job.job_id
            self.gcs.notify(m.Subscribe("logs", self.job_id))
            self.gcs.notify(m.Subscribe("errors", self.job_id))
            code, self.job_code = self.job_code, None  # (the GCS keeps the bytes: this process need not)
            if code is not None:
                for package_hash, data in code.packages():
                    await self.gcs.call(m.KvPut("pkg", package_hash.encode(), data, False), cfg.rpc_timeout_s)
            wd_hash = code.working_dir[0] if code and code.working_dir else None
            module_hashes = [h for h, _ in code.py_modules] if code else []
            self.job_code_env = code_env(wd_hash, module_hashes)
            await self.gcs.call(m.KvPut("job", self.job_id, job_config(
                self.namespace, self.job_env_vars, wd_hash, module_hashes, code.setup_hook if code else None,
                code.logging_config if code else None), True), cfg.rpc_timeout_s)
        if not self._gcs_durable_known:
            durable = await self.gcs.call(m.KvGet("cluster", b"gcs_storage_durable", 0.0), cfg.rpc_timeout_s)
            self._gcs_durable = durable == b"1"
        if self.follows_deaths:
            self.gcs.notify(m.Subscribe("worker_deaths", None))
        self.gcs.notify(m.Subscribe("nodes", None))
        self.node_info = await self.raylet.call(
            m.RegisterClient(self.worker_id, os.getpid(), self.address, self.mode == DRIVER,
                             self.job_id or None), cfg.rpc_timeout_s)
        self._spawn(self._flush_loop(), "core-worker.flush")
        metrics.BUFFER.wake = self._metrics_wake
        if metrics.BUFFER.pending():  # recorded before init()
            self._arm_metrics()

    def shutdown(self) -> None:
        """Flush, disconnect and stop the io thread (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self.io.closed = True
        if object_ref_mod._core_worker is self:
            object_ref_mod._core_worker = None
        interrupts.unset_later(self._later)
        loop = self.loop
        if loop is not None and self.io.is_alive():
            fut = asyncio.run_coroutine_threadsafe(self._aclose(), loop)
            try:
                fut.result(5.0)
            except Exception as e:  # the loop may already be gone with its peers
                logger.debug("core worker close: %s", e)
        if metrics.BUFFER.wake == self._metrics_wake:
            metrics.BUFFER.wake = None
        self.io.stop()
        self.store.close()

    async def _aclose(self) -> None:
        self._flush_events()
        if self.gcs is not None and self.mode == DRIVER and self.job_id and not self.gcs.is_closed:
            if self.config.log_to_driver:  # the lines the job's tasks printed last, before leaving
                with contextlib.suppress(ConnectionLost, TimeoutError, RemoteError):
                    await self.gcs.call(m.FlushLogs(self.job_id), 1.0)
            try:
                await self.gcs.call(m.MarkJobFinished(self.job_id), 2.0)
            except (ConnectionLost, TimeoutError, RemoteError):
                pass
        self._run(self.submitter.return_all())
        await asyncio.sleep(0)
        self.io.cancel_tasks()
        self._peers.close_all()
        if self.raylet is not None:
            self.raylet.close()
        if self.gcs is not None:
            self.gcs.close()
        if self.server is not None:
            await self.server.stop()

    def _gcs_lost(self, conn: Connection) -> None:
        if self._closed or conn is not self.gcs or self._gcs_reconnecting:
            return
        if self._gcs_durable:
            logger.warning("lost the connection to the GCS; reconnecting for up to %.0fs (gcs_reconnect_timeout_s)",
                           self.config.gcs_reconnect_timeout_s)
            self._gcs_reconnecting = True
            self._spawn(gcs_link.reconnect(self), "core-worker.gcs_reconnect")
            return
        logger.error("lost the connection to the GCS")
        self._cluster_gone("the GCS went away")

    async def _gcs_call(self, msg: Any, timeout_s: float | None) -> Any:
        """One GCS request. While a restarted GCS is being reached it waits: without a
        ``timeout_s``, as long as reconnecting lasts (``gcs_reconnect_timeout_s``), then
        ``rpc_timeout_s`` for the reply; with one, within ``timeout_s`` in all. Raises
        ``GetTimeoutError`` when the time is up (a GCS stopped, or not back yet)."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        while True:
            while self._gcs_reconnecting:
                if deadline is not None and loop.time() >= deadline:
                    raise self._gcs_timeout(msg, timeout_s, "the GCS went away and is not back yet")
                await asyncio.sleep(0.05)
            if self.gone is not None:
                raise ConnectionLost(self.gone)
            gcs = self.gcs
            if gcs is None:
                raise exc.LumosSystemError("not connected to the GCS")
            wait = self.config.rpc_timeout_s if deadline is None else max(0.01, deadline - loop.time())
            try:
                return await gcs.call(msg, wait)
            except TimeoutError:
                raise self._gcs_timeout(msg, wait if timeout_s is None else timeout_s,
                                        "the GCS did not answer (stopped, overloaded or cut off)") from None
            except ConnectionLost:
                # Lost under this call: with durable storage, a restarted GCS answers it (GCS
                # requests are idempotent: a retried RegisterActor returns the same actor).
                if not self._gcs_durable or self._closed:
                    raise
                if deadline is not None and loop.time() >= deadline:
                    raise self._gcs_timeout(msg, timeout_s, "the GCS went away and is not back yet") from None
                await asyncio.sleep(0.05)

    @staticmethod
    def _gcs_timeout(msg: Any, timeout_s: float | None, why: str) -> exc.GetTimeoutError:
        return exc.GetTimeoutError(
            f"{type(msg).__name__} timed out after {timeout_s:.3g}s: {why}. With GCS storage on Redis a "
            "restarted GCS answers later calls; check the head node with 'lumos status'.")

    def _raylet_lost(self, conn: Connection) -> None:
        if not self._closed:
            logger.error("lost the connection to the local raylet")
            self._cluster_gone("the local raylet went away")

    def _cluster_gone(self, why: str) -> None:
        if self.mode == WORKER:
            logger.info("exiting: %s", why)
            os._exit(1)
        # Driver: fail everything pending, and every later call at once (_on_submit), so
        # nothing waits forever: calls on actor handles included (issue 12).
        if self.gone is None:
            self.gone = f"{why}; the cluster is gone (connection lost)"
        for task in list(self.tasks.values()):
            self._fail_task(task, self._gone_error(task))

    def _gone_error(self, task: PendingTask) -> exc.ClusterUnavailableError:
        return exc.ClusterUnavailableError(
            f"{task.spec.name}() cannot run: {self.gone}. Call lumos.shutdown(), then lumos.init() "
            "to start or join a cluster again.")

    # ================================================================== thread handoff

    def drain_at_exit(self, timeout_s: float, settle_s: float = 0.3) -> int:
        """At a script's exit (user thread): wait until every task and actor call this
        process submitted has answered, then until worker output stops arriving for
        ``settle_s``, at most ``timeout_s`` in all. Returns the calls still unanswered."""
        deadline = time.monotonic() + timeout_s
        done_at = None
        while time.monotonic() < deadline and not self._closed:
            if self.io.inbox or self.io.deferred or self.tasks:
                done_at = None
            elif done_at is None:
                done_at = time.monotonic()  # output travels worker -> raylet -> GCS -> here
            elif time.monotonic() - max(done_at, self.last_log_at) >= settle_s:
                return 0
            time.sleep(0.02)
        return len(self.tasks)

    def call_gcs(self, msg: Any, timeout_s: float | None = None) -> Any:
        """One GCS request from a user thread. Without ``timeout_s`` it waits for a GCS
        being restarted (see ``_gcs_call``); ``GetTimeoutError`` once ``timeout_s`` (or,
        without one, ``rpc_timeout_s`` for the reply) is up; ``ClusterUnavailableError``
        when the GCS is gone for good."""
        if self.gcs is None:
            raise exc.LumosSystemError("not connected to the GCS")
        cfg = self.config
        outer = (cfg.gcs_reconnect_timeout_s + cfg.rpc_timeout_s if timeout_s is None else timeout_s) + 1
        try:
            return self.run_sync(self._gcs_call(msg, timeout_s), outer)
        except exc.GetTimeoutError:
            raise
        except TimeoutError:  # run_sync's own bound: the io thread did not answer either
            raise self._gcs_timeout(msg, outer, "the lumos-io thread did not answer") from None
        except (ConnectionLost, OSError) as e:
            raise self._unavailable("the GCS", msg, e) from None

    def call_raylet(self, msg: Any, timeout_s: float | None = None, claim: Claim | None = None) -> Any:
        """One request to this node's raylet from a user thread. Raises
        ``ClusterUnavailableError`` when the raylet cannot be reached. ``claim``: see
        ``IoLoop.run_sync``."""
        raylet = self.raylet
        if raylet is None:
            raise exc.LumosSystemError("not connected to the raylet")
        try:
            return self.run_sync(raylet.call(msg, timeout_s or self.config.rpc_timeout_s),
                                 (timeout_s or self.config.rpc_timeout_s) + 1, claim)
        except (ConnectionLost, OSError) as e:
            raise self._unavailable("this node's raylet", msg, e) from None

    def _unavailable(self, what: str, msg: Any, error: BaseException) -> exc.ClusterUnavailableError:
        why = self.gone or f"the connection to {what} was lost ({error})"
        return exc.ClusterUnavailableError(
            f"{type(msg).__name__} failed: {why}. The cluster is unreachable; check it with "
            "'lumos status', then call lumos.shutdown() and lumos.init() again.")

    # ================================================================== io thread: owner (owner.py)

    def _on_submit(self, task: PendingTask) -> None:
        self.tasks[task.spec.task_id] = task
        if self.gone is not None:
            self._fail_task(task, self._gone_error(task))
            return
        self.export_function(task.template)
        if task.spec.kind == m.TaskKind.ACTOR_TASK:
            self.actor_submitter.add(task)
            if task.state == DONE:
                return
        if task.dep_ids:
            self._resolve_deps(task)
        else:
            self._enqueue(task)

    def _resolve_deps(self, task: PendingTask) -> None:
        self._run_owner(self.owner.resolve_args(task))

    def _dep_ready(self, task: PendingTask) -> None:
        self._run_owner(self.owner.arg_ready(task))

    def _run_owner(self, actions: list[ow.Action]) -> None:
        """Carry out what the owner state decided (io thread)."""
        for a in actions:
            t = type(a)
            if t is ow.EnqueueTask:
                self._enqueue(a.task)  # type: ignore[union-attr]
            elif t is ow.FetchObject:
                self._start_fetch(a.object_id, a.owner)  # type: ignore[union-attr]
            elif t is ow.FailTask:
                self._fail_task(a.task, a.error)  # type: ignore[union-attr]
            elif t is ow.FailTaskWithValue:
                self._fail_task_with_blob(a.task, a.blob)  # type: ignore[union-attr]
            elif t is ow.RunAgain:
                task = a.task  # type: ignore[union-attr]
                self._next_attempt(task, a.why)  # type: ignore[union-attr]
                self.tasks[task.spec.task_id] = task
                if task.dep_ids:
                    self._resolve_deps(task)
                else:
                    self._enqueue(task)
            else:
                raise AssertionError(f"unknown owner action {a!r}")

    # ================================================================== io thread: submitter (task_submitter.py)

    def _enqueue(self, task: PendingTask, front: bool = False) -> None:
        if task.spec.kind == m.TaskKind.ACTOR_TASK:
            self.actor_submitter.enqueue(task)
            return
        self._run(self.submitter.enqueue(task, front))

    def _pump(self, q: SchedulingQueue) -> None:
        self._run(self.submitter.pump(q))

    def _run(self, actions: list[ts.Action]) -> None:
        """Carry out what the task submitter decided (io thread)."""
        for a in actions:
            t = type(a)
            if t is ts.PushTask:
                self._push(a.task, a.lease)  # type: ignore[union-attr]
            elif t is ts.RequestLease:
                self._spawn(self._request_lease(a.queue), "lease")  # type: ignore[union-attr]
            elif t is ts.ReturnLease:
                lease = a.lease  # type: ignore[union-attr]
                if lease.idle_timer is not None:
                    lease.idle_timer.cancel()
                    lease.idle_timer = None
                if not lease.raylet.is_closed:
                    lease.raylet.notify(m.ReturnWorker(lease.lease_id, a.disconnect,  # type: ignore[union-attr]
                                                       lease.exiting))
            elif t is ts.StartIdleTimer:
                lease = a.lease  # type: ignore[union-attr]
                loop = self.loop
                if loop is not None:
                    lease.idle_since = loop.time()
                    if lease.idle_timer is None:
                        self.idle_timers_armed += 1
                        lease.idle_timer = loop.call_later(self.config.lease_idle_timeout_ms / 1000,
                                                           self._idle_expired, lease)
            elif t is ts.FailTask:
                self._fail_task(a.task, a.error)  # type: ignore[union-attr]
            elif t is ts.RetryTask:
                if a.delay_s > 0:  # type: ignore[union-attr]
                    self._spawn(self._retry_later(a.task, a.why, a.delay_s), "oom-retry")  # type: ignore[union-attr]
                else:
                    self._retry(a.task, a.why)  # type: ignore[union-attr]
            elif t is ts.AwaitWorkerExit:
                self._spawn(self._handle_worker_death(a.lease, a.tasks), "worker-death")  # type: ignore[union-attr]
            elif t is ts.CancelIdleTimer:
                a.lease.idle_since = None  # type: ignore[union-attr]  # (its timer finds it busy)
            elif t is ts.PumpLater:
                if self.loop is not None:
                    self.loop.call_later(a.delay_s, self._pump, a.queue)  # type: ignore[union-attr]
            else:
                raise AssertionError(f"unknown task submitter action {a!r}")

    def _arg_bytes_by_node(self, q: SchedulingQueue) -> dict[bytes, int] | None:
        """Where the next task's large arguments are, for locality-aware placement."""
        if not q.tasks:
            return None
        out: dict[bytes, int] = {}
        for dep in q.tasks[0].spec.deps:
            if dep.data is None and dep.node_id is not None:
                e = self.objects.entries.get(dep.object_id)
                out[dep.node_id] = out.get(dep.node_id, 0) + (e.size if e is not None else 0)
        return out or None

    async def _request_lease(self, q: SchedulingQueue) -> None:
        t = q.template
        raylet = self.raylet
        at_local = True
        try:
            assert raylet is not None
            request = m.RequestWorkerLease(self.job_id, t.resources, self.worker_id, t.strategy, t.function_name,
                                           arg_bytes_by_node=self._arg_bytes_by_node(q), retry_budget=t.max_retries,
                                           owner_node_id=self.node_id)
            reply = await raylet.call(request)
            hops = 0
            # Bottom-up scheduling: a raylet that does not serve the request names another node.
            while isinstance(reply, m.SpillbackReply):
                hops += 1
                at_local = reply.retry_at.node_id == self.node_id
                raylet = await self._raylet_at(reply.retry_at)
                reply = await raylet.call(m.RequestSpilledLease(request, hops))
            grant: m.LeaseGrant = reply
        except (ConnectionLost, OSError, TimeoutError, RemoteError) as e:
            elsewhere = not at_local and not isinstance(e, RemoteError) and not self._closed and self.gone is None
            if elsewhere:
                # Another node's raylet went away (or was declared dead) while it held the
                # request: ask again from here.
                logger.info("lease request for %s at another node failed (%s); asking again",
                            t.function_name, e)
            elif self._closed:
                q.requesting -= 1
                return
            elif isinstance(e, RemoteError) and e.type_name in LEASE_REFUSALS:
                logger.info("lease request for %s failed: %s", t.function_name, e)  # (the task's error says it)
            else:
                logger.warning("lease request for %s failed: %s", t.function_name, e)
            self._run(self.submitter.lease_request_failed(q, e, elsewhere))
            return
        lease = LeasedWorker(grant, q, raylet)
        self.submitter.lease_granted(q, lease)
        try:
            conn = await self._peer(grant.worker_address)
        except (OSError, ConnectionLost, TimeoutError) as e:
            logger.warning("cannot reach leased worker %s: %s", short(grant.worker_id), e)
            self._run(self.submitter.lease_unreachable(lease))
            return
        lease.direct = self.allow_direct_writes(conn)
        self._run(self.submitter.lease_connected(lease, conn))

    async def _raylet_at(self, address: m.Address) -> Connection:
        """The raylet a spillback named: the local one, or a shared TCP connection to another node's."""
        if address.node_id == self.node_id and self.raylet is not None:
            return self.raylet
        return await self._peer(m.Address(address.node_id, b"raylet:" + address.node_id, "",
                                          address.host, address.port))

    def _push(self, task: PendingTask, lease: LeasedWorker) -> None:
        lease.idle_since = None  # busy: its idle timer, if any, finds it so (``_idle_expired``)
        spec = task.spec
        if spec.enable_task_events:
            self.record_scheduled(task, time.time(), lease.node_id, lease.worker_id, lease.resource_ids)
        assert lease.conn is not None
        if spec.deps:
            self.keep_lent_local(spec, lease.node_id)
        lease.conn.notify(m.PushTask(spec, lease.resource_ids))

    def _idle_expired(self, lease: LeasedWorker) -> None:
        """A lease's idle timer fired. The timer is not cancelled when the worker gets a
        task, nor started anew when it idles again (a sync task's round trip paid both, a
        timer handle each): here, a busy worker is left alone (``after_reply`` starts the
        timer again when it idles) and one that idled again later waits out the rest."""
        lease.idle_timer = None
        self.io.drain_pending()  # a task a user thread wrote to it is booked first
        since = lease.idle_since
        if since is None or lease.dead:
            return
        loop = self.loop
        left = since + self.config.lease_idle_timeout_ms / 1000 - loop.time() if loop is not None else 0.0
        if left > 0.001:
            self.idle_timers_armed += 1
            lease.idle_timer = loop.call_later(left, self._idle_expired, lease)  # type: ignore[union-attr]
            return
        self._run(self.submitter.idle_expired(lease))

    def push_direct(self, task: PendingTask) -> bool:
        """User thread: write a ready task straight to an idle leased worker of its shape,
        saving the io thread's wake-up (a sync task's round trip has one hop fewer). Only
        when the io thread has nothing in hand but bookings of such writes to other
        workers (``IoLoop.clear_for``: tasks a get waits for together go straight to each
        idle worker) and no task of that shape is queued; the io thread books it at its
        next turn (``_on_direct_task``), which a reply, a worker's close, a node's death or
        an idle timer makes happen first. False: post it as usual."""
        io = self.io
        if not io.clear_for(None):  # (a claimed lease's connection has no booking waiting)
            return False
        q = self.submitter.queues.get(task.template.key)
        if q is None or q.tasks:
            return False
        state = self.submitter.state
        try:
            with self._submit_lock:
                lease = state.claim_idle(q, task)
            if lease is None:
                return False
            # The write is outside the submitter's lock: a claimed lease is never returned or
            # pushed to, and the io thread's events on other leases need not wait for it.
            spec = task.spec
            if spec.enable_task_events:  # (before the write: the task may run and end before it returns)
                self.record_scheduled(task, time.time(), lease.node_id, lease.worker_id, lease.resource_ids)
            if spec.deps:
                self.keep_lent_local(spec, lease.node_id)
            sent = io.write_then_book(lease.conn, m.PushTask(spec, lease.resource_ids), spec.task_id,
                                      self._on_direct_task, task, lease)
        except BaseException:
            # The stop button (a KeyboardInterrupt in this thread) between the claim and
            # the booking's queueing: nothing would ever give the lease back. The io thread
            # settles it after whatever of this task's booking was queued before.
            try:
                io.post(self._settle_claim, task, q)
            except exc.LumosSystemError:  # (shut down meanwhile: the lease goes with the rest)
                pass
            raise
        if not sent:
            return True  # the booking job queues it the usual way (and records it sent then)
        self.direct_tasks += 1
        return True

    def _settle_claim(self, task: PendingTask, q: SchedulingQueue) -> None:
        """io thread: ``push_direct`` was interrupted. A lease of ``q`` still claimed for
        ``task`` got no booking (any booking queued before ran first): the task is
        booked as not sent, so it is queued the usual way and the lease is free again."""
        for lease in q.leases:
            if lease.claimed and lease.claimed_for is task:
                self._on_direct_task(task, lease, False)
                return

    def _on_direct_task(self, task: PendingTask, lease: LeasedWorker, was_sent: bool) -> None:
        self.tasks[task.spec.task_id] = task
        if not was_sent:
            self.unrecord_scheduled(task)
        if self.gone is not None:
            with self._submit_lock:
                lease.claimed = False
                lease.claimed_for = None
            self._fail_task(task, self._gone_error(task))
            return
        self.export_function(task.template)
        self._run(self.submitter.direct_pushed(task, lease, was_sent))

    # The surface actor_submitter.py uses (it reaches no private member).

    async def peer(self, address: m.Address) -> Connection:
        """The open connection to the core worker (or raylet) at ``address`` (io thread)."""
        return await self._peer(address)

    def allow_direct_writes(self, conn: Connection) -> bool:
        """io thread: let user threads write calls and tasks to ``conn``, a worker's (each
        such connection holds a duplicated fd: at most ``MAX_DIRECT_CONNS`` of them).
        Returns whether they may."""
        if not conn.direct_writes and self._direct_conns < MAX_DIRECT_CONNS:
            conn.allow_write_now()
            self._direct_conns += 1
        return conn.direct_writes

    def register_call(self, task: PendingTask) -> bool:
        """io thread: an actor call a user thread sent itself is now this owner's to track;
        False if this core worker is shutting down (the call failed)."""
        self.tasks[task.spec.task_id] = task
        if self.gone is not None:
            self._fail_task(task, self._gone_error(task))
            return False
        return True

    def fail_task(self, task: PendingTask, error: BaseException) -> None:
        """Fail ``task``: every return becomes ``error`` (io thread)."""
        self._fail_task(task, error)

    def unpin(self, ids: list[bytes]) -> None:
        """Drop the submitted-task counts of ``ids`` (io thread)."""
        self._unpin(ids)

    async def _peer(self, address: m.Address) -> Connection:
        wid = address.worker_id

        async def open_conn() -> Connection:
            conn = await connect(address, token=self.token, config=self.config,
                                 handlers={m.TaskReply: self._handle_task_reply,
                                           m.GeneratorItem: self._handle_generator_item,
                                           m.GetObjectStatus: self._handle_get_object_status,
                                           m.AddBorrowers: self._handle_add_borrowers,
                                           m.RemoveBorrowers: self._handle_remove_borrowers,
                                           m.ObjectCopied: self._handle_object_copied,
                                           m.WorkerBlocked: self._handle_worker_blocked,
                                           m.WorkerUnblocked: self._handle_worker_blocked,
                                           m.LeasedWorkerExited: self._handle_leased_worker_exited,
                                           m.LeaseRecalled: self._handle_lease_recalled},
                                 name=f"core-worker->{short(wid)}", on_close=self._peer_closed,
                                 use_unix=address.node_id == self.node_id)
            conn.peer_info = wid
            return conn

        if address.node_id in self.dead_nodes:
            # Fenced: nothing is sent to, or taken from, a node the GCS declared dead.
            raise ConnectionLost(f"node {short(address.node_id)} was declared dead")
        self._peer_nodes[wid] = address.node_id
        return await self._peers.get(wid, open_conn)

    def _handle_worker_blocked(self, conn: Connection, msg: m.WorkerBlocked | m.WorkerUnblocked) -> None:
        """A worker running a task of this process's waits in get() or wait() (or no longer does)."""
        self.io.drain_pending()  # (a task a user thread pushed to it is booked first)
        blocked = type(msg) is m.WorkerBlocked
        for lease in self.submitter.leases_where(conn=conn):
            if lease.worker_id == msg.worker_id:
                self._run(self.submitter.worker_blocked(lease, blocked))

    def _handle_leased_worker_exited(self, conn: Connection, msg: m.LeasedWorkerExited) -> None:
        """A raylet says a worker leased to this process exited: its tasks are retried or
        fail as when its connection closes, which a process the task forked, holding a copy
        of that connection, can put off for as long as it lives. Not at once: a reply the
        worker sent just before it exited (``max_calls``) may still be on its way on the
        worker's own connection; meanwhile the lease takes no more tasks."""
        self.io.drain_pending()  # (a task a user thread pushed to it is booked first)
        for lease in self.submitter.leases_where(worker_id=msg.worker_id):
            if lease.lease_id == msg.lease_id and self.loop is not None:
                self._run(self.submitter.worker_blocked(lease, True))  # (no more pushes)
                self.loop.call_later(LEASED_EXIT_GRACE_S, self._leased_worker_gone, lease)

    def _handle_lease_recalled(self, conn: Connection, msg: m.LeaseRecalled) -> None:
        """Another node's raylet wants a lease it granted here back (an owner on its node
        waits for the resources): the worker takes nothing more and is returned once its
        tasks in flight are done; the tasks still queued go to other workers."""
        self.io.drain_pending()  # (a task a user thread pushed to it is booked first)
        self._run(self.submitter.recalled(conn, msg.lease_id))

    def _leased_worker_gone(self, lease: LeasedWorker) -> None:
        if not lease.dead and not self._closed:  # (else its connection closed meanwhile)
            self._run(self.submitter.worker_failed(lease))

    def _peer_closed(self, conn: Connection) -> None:
        self.io.drain_pending()  # what user threads wrote to it is booked first
        self._peers.discard(conn.peer_info, conn)
        if self._peers.conns.get(conn.peer_info) is None:
            self._peer_nodes.pop(conn.peer_info, None)
        if self._closed:
            return
        for lease in self.submitter.leases_where(conn=conn):
            self._run(self.submitter.worker_failed(lease))
        node = self._node_of_conn.pop(conn, None)
        self.actor_submitter.connection_lost(
            conn, f"its node {short(node)} was declared dead" if node else "the actor's connection dropped")

    def _node_died(self, node_id: NodeID) -> None:
        """The GCS declared ``node_id`` dead (io thread). It may only be frozen or cut off,
        not crashed: act exactly as if every connection to it had closed (tasks and actor
        calls in flight there are retried per their policy, its leases are given up), and
        close those connections, so nothing more it sends is taken (gray failure, issue 12).
        """
        self.io.drain_pending()  # what user threads wrote there is booked first
        if not self.owner.node_died(node_id):
            return
        if node_id != self.node_id:
            self.move_to_copies(node_id)  # (before anything reads its objects as lost)
        if node_id == self.node_id and self.mode == WORKER:
            logger.error("this node was declared dead by the GCS; exiting")
            self._flush_events()
            os._exit(1)
        if node_id == self.node_id and self.gone is None:
            # A driver's own node (its raylet frozen or cut off): its store and scheduler
            # are gone for it; everything pending fails, and so does what comes later
            # (gets waited for ever, puts until the raylet call timed out).
            logger.error("this driver's node was declared dead by the GCS")
            self.gone = ("this driver's node was declared dead by the GCS (its raylet stopped answering); "
                         "the cluster is gone for this driver")
            if self.raylet is not None:
                _sever(self.raylet)  # (its close fails what waits on it)
            self._cluster_gone(self.gone)
        for key, node in list(self._peer_nodes.items()):
            if node != node_id:
                continue
            del self._peer_nodes[key]
            conn = self._peers.conns.pop(key, None)
            if conn is not None and not conn.is_closed:
                self._node_of_conn[conn] = node_id
                _sever(conn)
        # Leases whose connection is not open yet: the worker will never answer.
        for lease in self.submitter.leases_where(node_id=node_id):
            self._run(self.submitter.worker_failed(lease))
        self.actor_submitter.node_died(node_id)

    async def _handle_worker_death(self, lease: LeasedWorker, tasks: list[PendingTask]) -> None:
        cause = None
        if lease.node_id in self.dead_nodes:
            cause = ts.NODE_DIED_CAUSE
        else:
            try:
                cause = await lease.raylet.call(m.GetWorkerExit(lease.worker_id, 2.0), 5.0)
            except ConnectionLost:
                # The worker's raylet went with it: its node died (before the GCS says so).
                cause = ts.NODE_GONE_CAUSE
            except (TimeoutError, RemoteError):
                pass
        self._run(self.submitter.worker_died(lease, tasks, cause))

    async def _retry_later(self, task: PendingTask, why: str, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        self._run(self.submitter.retry_due(task, why))

    # -------------------------------------------------------------- io thread: lineage (owner.py)

    def _keep_lineage(self, task: PendingTask) -> None:
        self.owner.keep_lineage(task)

    def _drop_lineage(self, task_ids: list[TaskID]) -> None:
        """Returns of these tasks were freed: forget the tasks none of whose returns is
        left, and let their arguments go."""
        for task in self.owner.drop_lineage(task_ids):
            self._release_args(task)

    def drop_deferred_lineage(self) -> None:
        """io thread: drop from the lineage the tasks user threads found freed since the
        last turn (at the next reply, else the flush loop's next interval)."""
        drops = self._lineage_drops
        ids = []
        while drops:  # (popleft: a user thread may append meanwhile)
            ids.append(drops.popleft())
        if ids:
            self._drop_lineage(ids)

    def _reconstruct(self, oid: ObjectID, lost_node: bytes | None) -> str | None:
        """Run again the task that made ``oid`` (owned here), lost with node ``lost_node``.
        Returns None once the new run is under way (or already was), else why it cannot."""
        why, actions = self.owner.reconstruct(oid, lost_node)
        self._run_owner(actions)
        return why

    # ================================================================== executor side

    def _handle_push_task(self, conn: Connection, msg: m.PushTask) -> None:
        if self.executor is None:
            raise ValueError("this process does not execute tasks")
        if not well_formed_push(msg):
            raise ValueError("malformed PushTask")
        conn.allow_write_now()  # the reply may leave from the executor's thread (send_reply)
        self.executor.push(conn, msg)

    def _handle_cancel_task(self, conn: Connection, msg: m.CancelTask) -> None:
        if self.executor is not None:
            self.executor.cancel(msg.task_id, msg.force, msg.recursive)

    def _handle_exit_worker(self, conn: Connection, msg: m.ExitWorker) -> None:
        """The raylet asks this worker to go: an actor's worker runs the actor's clean-up
        first (every handle to it went out of scope), any other, or one whose job ended
        (``clean_up`` False), sends what it holds (task events, output, metrics) and leaves."""
        logger.info("asked to exit: %s", msg.reason)
        with self._held_lock:
            if self._held:
                self._send_held()
        actor = self.executor.actor if self.executor is not None else None
        if self.mode == WORKER and actor is not None and msg.clean_up is not False:
            actor.stopped(msg.reason)
        elif self.mode == WORKER:
            self._flush_events()
            self.loop.call_later(0.05, os._exit, 0)  # type: ignore[union-attr]

    def send_reply(self, conn: Connection, reply: m.TaskReply, hold: int = 0) -> None:
        """Executor: send a finished task's reply (or a generator's item). Straight to the
        socket when the io thread has nothing in hand that must leave first (nothing
        posted, no output to flush): that saves the io thread's wake-up on every call;
        else through the io thread, after what was posted before it.

        ``hold`` (the main thread, more calls waiting in its queue): the reply of a call
        shorter than a quarter of ``REPLY_HOLD_S`` may wait for the next ones, ``hold`` of
        them held at most and for ``REPLY_HOLD_S`` since the first, and leave with them in
        one write: in a burst a reply per write cost a ``write`` (~4-7 us) per call here
        and as many reads and frames at the owner. The io thread sends a group a longer
        call keeps (``_watch_held``): no reply waits more than ``REPLY_HOLD_S +
        HELD_WATCH_S``. A worker that dies meanwhile takes its held replies along: their
        calls were in flight at its death (retried or failed as such), as a reply not yet
        written always was."""
        ex = self.executor
        if self._running_events:
            self.reply_sent(reply)
        output = ex is not None and ex._output
        if not (hold and not output and self._hold_reply(conn, reply, hold)):
            self._release_replies(conn, [reply], output)
        if self._top_ups:
            self.top_up_reserved()

    def send_replies(self, conn: Connection, replies: list[m.TaskReply]) -> None:
        """``send_reply`` of several replies on one connection, in one write where it can
        (an async actor's calls that finished in one turn of its loop)."""
        if self._running_events:
            for r in replies:
                self.reply_sent(r)
        ex = self.executor
        self._release_replies(conn, replies, ex is not None and bool(ex._output))
        if self._top_ups:
            self.top_up_reserved()

    def _release_replies(self, conn: Connection, replies: list[Any], output: Any) -> None:
        """Send ``replies`` on ``conn``, after the held group when it is held for ``conn``
        (else the group goes first, on its own connection); through the io thread, after
        the executor's output, when there is ``output``."""
        if self._held:
            with self._held_lock:
                held, held_conn = self._held, self._held_conn
                self._held, self._held_conn = [], None
            if held_conn is conn:
                replies = held + replies
            elif held:
                self._send_replies(held_conn, held)  # type: ignore[arg-type]
        if output:  # the tasks' output leaves before their replies
            self._post(self.executor.flush_output)  # type: ignore[union-attr]
            for r in replies:
                self._post(conn.notify, r)
        else:
            self._send_replies(conn, replies)

    def _send_replies(self, conn: Connection, replies: list[Any]) -> None:
        if not (self.io.idle() and (conn.write_now(replies[0]) if len(replies) == 1
                                    else conn.write_all_now(replies))):
            for r in replies:
                self._post(conn.notify, r)

    def _hold_reply(self, conn: Connection, reply: Any, most: int) -> bool:
        """``send_reply``: keep ``reply`` with the held group if it may wait (see there)."""
        if type(reply) is not m.TaskReply or reply.end_time - reply.start_time >= REPLY_HOLD_S / 4:
            return False
        now = time.monotonic()
        with self._held_lock:
            held = self._held
            if held:
                if self._held_conn is not conn or len(held) >= most or now - self._held_since >= REPLY_HOLD_S:
                    return False
                held.append(reply)
                return True
            if not self._held_watched:
                # (straight to the loop, not through ``_post``: the inbox would make the
                # io thread look busy, and the replies after this one take its path)
                try:
                    self.loop.call_soon_threadsafe(self._watch_held)  # type: ignore[union-attr]
                except (AttributeError, RuntimeError):  # no loop (any more): send it now
                    return False
                self._held_watched = True
                self.held_watches += 1
            self._held = [reply]
            self._held_conn = conn
            self._held_since = now
            self._held_since_look = True
        return True

    def _watch_held(self) -> None:
        """io thread, every ``HELD_WATCH_S`` while replies are held: send a group held
        ``REPLY_HOLD_S`` already (the executor is inside a longer call); stop at a look
        that finds none held and none held since the last. A burst costs a look per
        ``HELD_WATCH_S``, not a wake-up per group: the executor sends each group itself,
        so most looks find none held, and a watch that stopped at such a look had the
        executor wake this thread again for the next group."""
        with self._held_lock:
            held_since, self._held_since_look = self._held_since_look, False
            if self._held:
                if time.monotonic() - self._held_since >= REPLY_HOLD_S:
                    self._send_held()
            elif not held_since:
                self._held_watched = False
                return
        self.loop.call_later(HELD_WATCH_S, self._watch_held)  # type: ignore[union-attr]

    def _send_held(self) -> None:
        """io thread, under ``_held_lock``: queue the held replies on their connection.
        (The list is emptied after: until then an executor about to send one after them
        waits for the lock, then finds them queued and its own goes the same way.)"""
        conn = self._held_conn
        for r in self._held:
            conn.notify(r)  # type: ignore[union-attr]
        self._held, self._held_conn = [], None

    # ================================================================== pub/sub, events

    def follow_worker_deaths(self) -> None:
        """This worker lent an object for the first time (any thread): from now on it
        hears of workers' deaths, and drops the borrowers that died before it listened."""
        self.follows_deaths = True
        self._post(self._follow_deaths_now)

    def _follow_deaths_now(self) -> None:
        gcs = self.gcs
        if gcs is None or gcs.is_closed:
            return  # the reconnect subscribes (``follows_deaths`` is set)
        gcs.notify(m.Subscribe("worker_deaths", None))
        self._spawn(self._drop_borrowers_already_dead(gcs), "core-worker.deaths")

    async def _drop_borrowers_already_dead(self, gcs: Connection) -> None:
        try:
            workers = await gcs.call(m.GetAllWorkers(), self.config.rpc_timeout_s)
        except (ConnectionLost, TimeoutError, RemoteError) as e:
            logger.debug("workers' states for the borrowers of this worker's objects: %s", e)
            return
        dead = _dead_workers(workers) if isinstance(workers, list) else set()
        if dead:
            freed = self.objects.remove_borrowers_on(dead)
            if freed:
                self._release(freed)

    def _handle_publish(self, conn: Connection, msg: m.Publish) -> None:
        if msg.channel == "logs":
            self.last_log_at = time.monotonic()
            try:
                self.log_handler(msg.data)
            except Exception:
                logger.exception("log handler failed")
        elif msg.channel == "errors":
            kind, text = msg.data
            self.error_handler(kind, text)
        elif msg.channel == "nodes" and isinstance(msg.data, m.NodeInfo) and msg.data.state == "DEAD":
            self._node_died(msg.data.node_id)
        elif msg.channel == "worker_deaths" and isinstance(msg.data, m.WorkerInfo) and msg.data.state == "DEAD":
            freed = self.objects.remove_borrowers_on({msg.data.worker_id})
            if freed:
                self._release(freed)
        handler = self.extra_publish_handlers.get(msg.channel)
        if handler is not None:
            handler(msg)


def _dead_workers(workers: Any) -> set[bytes]:
    return {w.worker_id for w in workers if isinstance(w, m.WorkerInfo) and w.state == "DEAD"}


def well_formed_push(msg: m.PushTask) -> bool:
    """The fields of a pushed task that the executor relies on have their types."""
    spec = msg.spec
    return not (type(spec) is not m.TaskSpec or type(spec.task_id) is not bytes or type(spec.args) is not bytes
                or type(spec.deps) is not list or spec.kind not in _TASK_KINDS or type(spec.num_returns) is not int
                or type(spec.enable_task_events) is not bool)


def _sever(conn: Connection) -> None:
    """Close ``conn`` now, dropping unsent bytes: its peer may be frozen and never read them
    (a plain close waits for the write buffer to drain before it reports the close)."""
    conn.close()
    transport = getattr(conn, "_transport", None)
    if transport is not None:
        transport.abort()


__all__ = ["CoreWorker", "DRIVER", "WORKER", "TaskTemplate", "error_blob", "function_id_of"]

