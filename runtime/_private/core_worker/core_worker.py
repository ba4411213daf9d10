"""The core worker: the part of every driver and worker process that talks to the cluster.

It owns the ``lumos-io`` thread and its event loop, the connections to the GCS, the
local raylet and peer core workers, the object table (ownership and reference counts),
and the owner side of task submission (dependency resolution, leases, pipelining,
retries). User threads hand work over without a syscall per call when the io thread is
already awake (``_post``), and wait on per-call locks in short slices.

```
 user thread                       lumos-io thread                          peers
 submit_task ─► _inbox ──wake──►  resolve args ─► SchedulingQueue ─► lease ─► PushTask ─► worker
 get ◄──── Waiter.lock ◄──────────  TaskReply: ObjectTable.complete ◄──────────────────── worker
 put (small) ─► ObjectTable                                        GetObjectStatus ◄──── borrowers
 put (large) ─► StoreClient.write (in the user thread) ─► CreateObject/SealObject ─► raylet
```
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import logging
import os
import sys
import threading
import time
from typing import Any, Callable

from lumos import exceptions as exc
from lumos import object_ref as object_ref_mod
from lumos._private import serialization as ser
from lumos._private.config import Config
from lumos._private.core_worker import owner as ow
from lumos._private.core_worker import task_submitter as ts
from lumos._private.core_worker.io_loop import IoLoop
from lumos._private.core_worker.objects import ObjectsMixin, error_blob
from lumos._private.core_worker.references import FAILED, PENDING, READY, Freed
from lumos._private.core_worker.streams import StreamsMixin
from lumos._private.core_worker.tasks import (DRIVER, WORKER, DONE, PUSHED, QUEUED, WAITING_ARGS, LeasedWorker,
                                              PendingTask, SchedulingQueue, TaskTemplate)
from lumos._private.ids import new_task_id, return_object_id, short
from lumos._private.object_store.client import StoreClient
from lumos._private.protocol import messages as m
from lumos._private.transport.connection import (Connection, ConnectionCache, ConnectionLost, RemoteError,
                                                 connect_with_retry,
                                                 RpcServer, connect)
from lumos.generator import GeneratorStream, ObjectRefGenerator
from lumos.object_ref import ObjectRef

logger = logging.getLogger(__name__)

class _ArgRef(int):
    """Placeholder for the i-th top-level ref argument inside the pickled args."""

    __slots__ = ()

    def __reduce__(self) -> Any:
        return (_ArgRef, (int(self),))


ser._PLAIN_SCALARS = ser._PLAIN_SCALARS | {_ArgRef}  # pickles by reference: safe on the fast path


class CoreWorker(ObjectsMixin, StreamsMixin):
    def __init__(self, *, mode: int, config: Config, token: bytes, gcs_address: tuple[str, int],
                 raylet_socket: str, session_dir: str, node_id: bytes, store_dir: str,
                 worker_id: bytes, node_ip: str = "127.0.0.1", namespace: str = "",
                 entrypoint: str = "", job_env_vars: dict[str, str] | None = None,
                 job_package: tuple[str, bytes] | None = None) -> None:
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
        #: Drivers: the job's working_dir, zipped: (content hash, bytes); see working_dir.py.
        self.job_package = job_package
        #: The running task's or actor's own environment variables, inherited by what it
        #: submits (Ray's runtime_env inheritance); None in drivers and plain tasks.
        self.inherited_env: dict[str, str] | None = None
        self.job_id: bytes = b""
        #: Objects, references, lineage and reconstruction decisions (owner.py).
        self.owner = ow.OwnerState(worker_id, validate=config.validate)
        self.owner.on_arg_ready = self._dep_ready
        #: The object table (shared with user threads under its lock; see owner.py).
        self.objects = self.owner.objects
        #: Lineage (io thread): finished normal tasks that may run again, by task id.
        self.lineage = self.owner.lineage
        #: Nodes the GCS declared dead (io thread): values stored there are lost.
        self.dead_nodes = self.owner.dead_nodes
        self.store = StoreClient(store_dir, config.memcpy_threads, config.memcpy_threshold_bytes,
                                 config.object_store_recycle_bytes)
        self.store.on_pin = self._store_pin_changed
        self.store.restore = self._restore_spilled
        self.store.on_free_later = self._free_after_views
        self.address: m.Address = m.Address(node_id, worker_id, "", "", 0)
        #: The driver's own task id (parent of what it submits); in workers the running task's.
        self.current_task_id: bytes = new_task_id()
        self.current_task_name = ""
        #: Strategy that child tasks without one of their own inherit (a placement group
        #: that captures child tasks), set by the executor for the running task.
        self.capture_strategy: list[Any] | None = None
        self._captured_templates: dict[Any, tuple[TaskTemplate, TaskTemplate]] = {}
        self.current_resource_ids: dict[str, list[Any]] = {}
        self.current_actor_id: bytes | None = None
        self._put_counter = 0
        #: The lumos-io thread, its loop and the inbox from user threads (io_loop.py).
        self.io = IoLoop()
        #: Hot-path hand-overs, bound once (``_post(fn, *args)`` runs ``fn`` on the io thread).
        self._post = self.io.post
        self._spawn = self.io.spawn
        self.run_sync = self.io.run_sync
        self.gcs: Connection | None = None
        #: The GCS keeps its tables in durable storage: when it goes, wait for its restart.
        self._gcs_durable = config.gcs_storage not in ("", "memory")
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
        #: Scheduling queues, leases, pipelining and retry decisions (task_submitter.py).
        self.submitter = ts.TaskSubmitterState(
            max_tasks_in_flight_per_worker=config.max_tasks_in_flight_per_worker,
            pipeline_below_ms=config.pipeline_below_ms,
            max_pending_lease_requests=config.max_pending_lease_requests,
            max_leases_per_scheduling_key=config.max_leases_per_scheduling_key,
            task_oom_retry_delay_base_ms=config.task_oom_retry_delay_base_ms, validate=config.validate)
        #: Worker id -> open connection (or the future of one being opened).
        self._peers = ConnectionCache()
        #: Function ids already exported to the GCS for this job.
        self._exported: set[bytes] = set()
        #: Task id -> the values of a streaming generator task that arrived so far.
        self.streams: dict[bytes, GeneratorStream] = {}
        # cross-thread ---------------------------------------------------------------
        #: Task events not yet sent: tuples, turned into messages off the hot path.
        self._events: list[tuple[Any, ...]] = []
        #: Called with batches of worker output lines (driver); replaceable by front ends.
        self.log_handler: Callable[[list[Any]], None] = _print_worker_lines
        #: When worker output last arrived (monotonic; the exit drain waits for it to settle).
        self.last_log_at = 0.0
        self.error_handler: Callable[[str, str], None] = _print_cluster_error
        self._closed = False
        self._blocked_depth = 0
        #: Hooks the executor (workers) installs.
        self.executor: Any = None
        self.on_closed: Callable[[], None] | None = None
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

    @property
    def _io_thread(self) -> threading.Thread | None:
        return self.io.thread

    def start(self) -> None:
        """Start the io thread, connect, register. Returns when ready to submit."""
        self.io.start(self._connect, self._close_leftovers, self.config.connect_timeout_s + 5)
        object_ref_mod._core_worker = self

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
            m.GetCoreWorkerStats: lambda c, msg: self.stats(),
            m.ExitWorker: self._handle_exit_worker,
            m.TaskReply: self._handle_task_reply,
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
                                              m.ExitWorker: self._handle_exit_worker},
                                    name="core-worker->raylet", on_close=self._raylet_lost)
        if self.mode == DRIVER:
            job = await self.gcs.call(m.RegisterJob(self.address, os.getpid(), self.namespace, self.entrypoint),
                                      cfg.rpc_timeout_s)
            self.job_id = job.job_id
            self.gcs.notify(m.Subscribe("logs", self.job_id))
            self.gcs.notify(m.Subscribe("errors", self.job_id))
            package_hash = None
            if self.job_package is not None:
                package_hash, data = self.job_package
                await self.gcs.call(m.KvPut("pkg", package_hash.encode(), data, False), cfg.rpc_timeout_s)
                self.job_package = None  # the GCS has it; do not keep the bytes
            await self.gcs.call(m.KvPut("job", self.job_id, _job_config(self.namespace, self.job_env_vars,
                                                                         package_hash), True),
                                  cfg.rpc_timeout_s)
        durable = await self.gcs.call(m.KvGet("cluster", b"gcs_storage_durable", 0.0), cfg.rpc_timeout_s)
        self._gcs_durable = durable == b"1"
        self.gcs.notify(m.Subscribe("workers", None))
        self.gcs.notify(m.Subscribe("nodes", None))
        self.node_info = await self.raylet.call(
            m.RegisterClient(self.worker_id, os.getpid(), self.address, self.mode == DRIVER,
                             self.job_id or None), cfg.rpc_timeout_s)
        self._spawn(self._flush_loop(), "core-worker.flush")

    def shutdown(self) -> None:
        """Flush, disconnect and stop the io thread (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self.io.closed = True
        if object_ref_mod._core_worker is self:
            object_ref_mod._core_worker = None
        loop = self.loop
        if loop is not None and self.io.is_alive():
            fut = asyncio.run_coroutine_threadsafe(self._aclose(), loop)
            try:
                fut.result(5.0)
            except Exception as e:  # the loop may already be gone with its peers
                logger.debug("core worker close: %s", e)
        self.io.stop()
        self.store.close()

    async def _aclose(self) -> None:
        self._flush_events()
        if self.gcs is not None and self.mode == DRIVER and self.job_id and not self.gcs.is_closed:
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
            self._spawn(self._reconnect_gcs(), "core-worker.gcs_reconnect")
            return
        logger.error("lost the connection to the GCS")
        self._cluster_gone("the GCS went away")

    async def _reconnect_gcs(self) -> None:
        """Reach the restarted GCS (durable storage) with backoff, within gcs_reconnect_timeout_s."""
        cfg = self.config
        deadline = time.monotonic() + cfg.gcs_reconnect_timeout_s
        delay = 0.1
        try:
            while not self._closed:
                try:
                    gcs = await connect_with_retry(self.gcs_address, token=self.token, config=cfg,
                                                   handlers={m.Publish: self._handle_publish},
                                                   name="core-worker->gcs", on_close=self._gcs_lost,
                                                   timeout_s=max(0.1, deadline - time.monotonic()))
                    if self.mode == DRIVER:
                        await gcs.call(m.RegisterJob(self.address, os.getpid(), self.namespace, self.entrypoint,
                                                     self.job_id), cfg.rpc_timeout_s)
                        gcs.notify(m.Subscribe("logs", self.job_id))
                        gcs.notify(m.Subscribe("errors", self.job_id))
                    gcs.notify(m.Subscribe("workers", None))
                    gcs.notify(m.Subscribe("nodes", None))
                    self.gcs = gcs
                    for msg in self._gcs_backlog:
                        gcs.notify(msg)
                    self._gcs_backlog = []
                    for q in list(self.actor_submitter.actors.values()):
                        if q.subscribed:
                            q.subscribed = False
                            self.actor_submitter.track(q.actor_id)
                    logger.info("reconnected to the GCS")
                    return
                except (ConnectionLost, OSError, TimeoutError, RemoteError) as e:
                    why = f"{type(e).__name__}: {e}"
                if time.monotonic() + delay > deadline:
                    logger.error("could not reach the GCS again within gcs_reconnect_timeout_s=%.0fs (%s)",
                                 cfg.gcs_reconnect_timeout_s, why)
                    self._cluster_gone(f"the GCS went away and was not back within gcs_reconnect_timeout_s="
                                       f"{cfg.gcs_reconnect_timeout_s:.0f}s")
                    return
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
        finally:
            self._gcs_reconnecting = False

    async def _gcs_call(self, msg: Any, timeout_s: float) -> Any:
        """One GCS request; while a restarted GCS is being reached, it waits (within ``timeout_s``)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            while self._gcs_reconnecting and loop.time() < deadline:
                await asyncio.sleep(0.05)
            gcs = self.gcs
            if gcs is None:
                raise exc.LumosSystemError("not connected to the GCS")
            try:
                return await gcs.call(msg, max(0.1, deadline - loop.time()))
            except ConnectionLost:
                # Lost under this call: with durable storage, a restarted GCS answers it (GCS
                # requests are idempotent: a retried RegisterActor returns the same actor).
                if not self._gcs_durable or self._closed or loop.time() >= deadline:
                    raise
                await asyncio.sleep(0.05)

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
            if self.io.inbox or self.tasks:
                done_at = None
            elif done_at is None:
                done_at = time.monotonic()  # output travels worker -> raylet -> GCS -> here
            elif time.monotonic() - max(done_at, self.last_log_at) >= settle_s:
                return 0
            time.sleep(0.02)
        return len(self.tasks)

    def call_gcs(self, msg: Any, timeout_s: float | None = None) -> Any:
        """One GCS request from a user thread. Raises ``ClusterUnavailableError`` when the
        GCS cannot be reached."""
        if self.gcs is None:
            raise exc.LumosSystemError("not connected to the GCS")
        try:
            return self.run_sync(self._gcs_call(msg, timeout_s or self.config.rpc_timeout_s),
                                 (timeout_s or self.config.rpc_timeout_s) + 1)
        except (ConnectionLost, OSError) as e:
            raise self._unavailable("the GCS", msg, e) from None

    def call_raylet(self, msg: Any, timeout_s: float | None = None) -> Any:
        """One request to this node's raylet from a user thread. Raises
        ``ClusterUnavailableError`` when the raylet cannot be reached."""
        raylet = self.raylet
        if raylet is None:
            raise exc.LumosSystemError("not connected to the raylet")
        try:
            return self.run_sync(raylet.call(msg, timeout_s or self.config.rpc_timeout_s),
                                 (timeout_s or self.config.rpc_timeout_s) + 1)
        except (ConnectionLost, OSError) as e:
            raise self._unavailable("this node's raylet", msg, e) from None

    def _unavailable(self, what: str, msg: Any, error: BaseException) -> exc.ClusterUnavailableError:
        why = self.gone or f"the connection to {what} was lost ({error})"
        return exc.ClusterUnavailableError(
            f"{type(msg).__name__} failed: {why}. The cluster is unreachable; check it with "
            "'lumos status', then call lumos.shutdown() and lumos.init() again.")

    # ================================================================== references

    def on_ref_deserialized(self, object_id: bytes, owner: m.Address | None) -> ObjectRef:
        e = self.objects.ref_created(object_id, owner, self.worker_id)
        if not e.owned and not e.registered and owner is not None:
            if self._in_arg_context():
                # Passed in a task's arguments: the executor reports it with the reply if
                # the task keeps it (the caller then registers this process as borrower).
                self.executor.note_arg_borrow(object_id, owner)
            else:
                e.registered = True
                self._post(self._send_add_borrower, object_id, owner)
        return ObjectRef(object_id, owner, True)

    def _in_arg_context(self) -> bool:
        ex = self.executor
        return ex is not None and ex.deserializing_args()

    def _send_add_borrower(self, object_id: bytes, owner: m.Address) -> None:
        self._spawn(self._notify_peer(owner, m.AddBorrowers([object_id], self.address)), "add-borrower")

    async def _notify_peer(self, address: m.Address, msg: Any) -> None:
        try:
            conn = await self._peer(address)
        except (OSError, ConnectionLost, TimeoutError) as e:
            logger.debug("cannot reach %s for %s: %s", short(address.worker_id), type(msg).__name__, e)
            return
        conn.notify(msg)

    def drain_refs(self) -> None:
        """Apply dropped ObjectRefs (user threads call this at API entry)."""
        if self.objects.decrements:
            freed = self.objects.drain()
            if freed:
                self._release(freed)

    def _release(self, freed: list[Freed]) -> None:
        """Entries went away: free owned values, release borrowed ones (any thread)."""
        store_frees: list[bytes] = []
        recyclable: list[bool] = []
        unborrow: dict[bytes, tuple[m.Address, list[bytes]]] = {}
        dropped = self.owner.lineage_hit(freed)
        for f in freed:
            e = f.entry
            if e.owned:
                if e.node_id is not None and e.data is None:
                    # Readers elsewhere may still view it: the raylet checks their pins.
                    r = self.store.release(f.object_id, False)
                    if r is None:
                        continue  # viewed here: freed when the last view goes (_free_after_views)
                    store_frees.append(f.object_id)
                    recyclable.append(r)
            else:
                self.store.release(f.object_id, True)
                if e.registered and e.owner is not None:
                    unborrow.setdefault(e.owner.worker_id, (e.owner, []))[1].append(f.object_id)
        if store_frees or unborrow:
            self._post(self._send_releases, store_frees, recyclable, unborrow)
        if dropped:
            self._post(self._drop_lineage, dropped)

    def _send_releases(self, store_frees: list[bytes], recyclable: list[bool],
                       unborrow: dict[bytes, tuple[m.Address, list[bytes]]]) -> None:
        if store_frees and self.raylet is not None:
            self.raylet.notify(m.FreeObjects(store_frees, recyclable))
        for owner, ids in unborrow.values():
            self._spawn(self._notify_peer(owner, m.RemoveBorrowers(ids, self.worker_id)), "remove-borrower")

    def _handle_add_borrowers(self, conn: Connection, msg: m.AddBorrowers) -> bool:
        for oid in msg.object_ids:
            self.objects.add_borrower(oid, msg.borrower)
        return True

    def _handle_remove_borrowers(self, conn: Connection, msg: m.RemoveBorrowers) -> None:
        freed = self.objects.remove_borrower(msg.object_ids, msg.borrower_worker_id)
        if freed:
            self._release(freed)

    def _handle_drop_slots(self, conn: Connection, msg: m.DropSlots) -> None:
        for slot in msg.slots:
            self.store.drop_slot(slot)

    # ================================================================== submission

    def export_function(self, template: TaskTemplate) -> None:
        if template.function_id in self._exported or template.pickled_function is None:
            return
        self._exported.add(template.function_id)
        assert self.gcs is not None
        msg = m.KvPut("fn", self.job_id + template.function_id, template.pickled_function, True)
        if self._gcs_reconnecting:
            self._gcs_backlog.append(msg)
        else:
            self.gcs.notify(msg)

    def _pack_args(self, args: tuple[Any, ...], kwargs: dict[str, Any], template: TaskTemplate
                   ) -> tuple[ser.SerializedValue, list[ObjectRef]]:
        """Serialize a call's arguments; top-level refs become placeholders listed in deps."""
        deps: list[ObjectRef] = []
        if any(type(a) is ObjectRef for a in args):
            new_args: list[Any] = []
            for a in args:
                if type(a) is ObjectRef:
                    new_args.append(_ArgRef(len(deps)))
                    deps.append(a)
                else:
                    new_args.append(a)
            args = tuple(new_args)
        if kwargs and any(type(v) is ObjectRef for v in kwargs.values()):
            kwargs = dict(kwargs)
            for k, v in kwargs.items():
                if type(v) is ObjectRef:
                    kwargs[k] = _ArgRef(len(deps))
                    deps.append(v)
        payload: Any = (args, kwargs) if kwargs else args
        try:
            sv = ser.serialize(payload)
        except ser.SerializationError as e:
            raise self._argument_error(template, args, kwargs, e) from e.__cause__
        if sv.total_size > self.config.max_inline_arg_bytes:
            payload, sv, deps = self._promote_large_args(args, kwargs, deps)
        return sv, deps

    @staticmethod
    def _argument_error(template: TaskTemplate, args: tuple[Any, ...], kwargs: dict[str, Any],
                        error: ser.SerializationError) -> ser.SerializationError:
        """Which argument of a call could not be serialized, and why (the failure path only)."""
        names = _parameter_names(template)
        for i, value in enumerate(args):
            cause = ser._pickles(value)
            if cause is not None:
                name = f" (`{names[i]}`)" if i < len(names) else ""
                where = f"argument {i + 1}{name}"
                break
        else:
            for key, value in kwargs.items():
                cause = ser._pickles(value)
                if cause is not None:
                    where = f"keyword argument `{key}`"
                    break
            else:
                return error
        return ser.SerializationError(
            f"could not serialize {where} of {template.name}(): {ser.describe_culprit(value, cause)}. "
            "Arguments of tasks and actors must be picklable (cloudpickle); objects holding locks, "
            "sockets or open files are not: pass what rebuilds them instead (a path, a config).")

    def submit_task(self, template: TaskTemplate, args: tuple[Any, ...], kwargs: dict[str, Any],
                    actor_fields: tuple[Any, ...] | None = None) -> list[ObjectRef]:
        """Submit one call (user thread). Returns refs to its ``num_returns`` results."""
        if self.objects.decrements:
            self.drain_refs()
        if self.capture_strategy is not None and template.strategy is None and template.kind != 2:
            template = self._captured(template)
        sv, deps = self._pack_args(args, kwargs, template)
        task_id = new_task_id()
        n = template.num_returns
        return_ids = [return_object_id(task_id, i + 1) for i in range(n)] if n > 0 else []
        nested = sv.nested_refs
        spec = m.TaskSpec(
            task_id, self.job_id, self.current_task_id, template.kind, template.name,
            template.function_id, template.function_name, sv.to_bytes(), [], 
            [[r._id, r._owner or self.address] for r in nested] if nested else [],
            n, template.resources, template.max_retries, template.retry_exceptions,
            template.retry_exception_types, self.address, 0, template.strategy)
        if actor_fields is not None:
            spec.actor_id, spec.sequence_no, spec.caller_id, spec.actor_options = actor_fields
        else:
            if template.runtime_env is not None or self.inherited_env is not None:
                spec.runtime_env = self._env_for(template)
            if template.max_calls:
                spec.max_calls = template.max_calls
        events_on = template.enable_task_events
        if not events_on:
            spec.enable_task_events = False
        spec.root_task_id = self.root_task_id()
        dep_ids = [d._id for d in deps]
        task = PendingTask(spec, template, return_ids, dep_ids, [r._id for r in nested], time.time())
        spec.deps = [m.Dep(d._id, d._owner or self.address, None, None) for d in deps]
        objects = self.objects
        with objects.lock:
            for oid in return_ids:
                objects.add_owned(oid)
            if dep_ids:
                objects.add_submitted(dep_ids)
            if task.nested_ids:
                objects.add_submitted(task.nested_ids)
        if events_on:
            self._events.append((task_id, 0, "SUBMITTED", task.submit_time, self._event_info(task), None, None,
                                 None))
        address = self.address
        if n == -1:
            stream = self.streams[task_id] = GeneratorStream(task_id)
            self._post(self._on_submit, task)
            return [ObjectRefGenerator(stream, address, self)]  # type: ignore[list-item]
        self._post(self._on_submit, task)
        return [ObjectRef(oid, address, True) for oid in return_ids]

    def create_actor(self, template: TaskTemplate, args: tuple[Any, ...], kwargs: dict[str, Any],
                     actor_id: bytes, actor_options: dict[str, Any]) -> m.ActorInfo:
        """Register an actor with the GCS, which creates it (user thread).

        Returns the GCS's row for the actor: a different actor's row when
        ``get_if_exists`` found one with the same name.
        """
        if self.objects.decrements:
            self.drain_refs()
        if self.capture_strategy is not None and template.strategy is None:
            template = self._captured(template)
        sv, deps = self._pack_args(args, kwargs, template)
        nested = sv.nested_refs
        task_id = new_task_id()
        spec = m.TaskSpec(
            task_id, self.job_id, self.current_task_id, 1, template.name, template.function_id,
            template.function_name, sv.to_bytes(), [m.Dep(d._id, d._owner or self.address, None, None) for d in deps],
            [[r._id, r._owner or self.address] for r in nested] if nested else [], 1, template.resources, 0, 0,
            None, self.address, 0, template.strategy, actor_id=actor_id, actor_options=actor_options,
            enable_task_events=template.enable_task_events)
        spec.root_task_id = self.root_task_id()
        if template.runtime_env is not None or self.inherited_env is not None:
            spec.runtime_env = self._env_for(template)
        pinned = [d._id for d in deps] + [r._id for r in nested]
        if pinned:
            with self.objects.lock:
                self.objects.add_submitted(pinned)

        async def register() -> m.ActorInfo:
            self.export_function(template)
            return await self._gcs_call(m.RegisterActor(spec), self.config.rpc_timeout_s)  # type: ignore[no-any-return]

        try:
            info: m.ActorInfo = self.run_sync(register(), self.config.rpc_timeout_s + 1)
        except BaseException as e:
            self._post(self._unpin, pinned)
            if isinstance(e, RemoteError) and e.type_name in ("ValueError", "TypeError"):
                raise (ValueError if e.type_name == "ValueError" else TypeError)(e.text) from None
            if isinstance(e, ConnectionLost):
                raise self._unavailable("the GCS", m.RegisterActor(spec), e) from None
            if isinstance(e, RemoteError):
                raise exc.LumosSystemError(f"could not create actor {template.name}: {e}") from None
            raise
        if info.actor_id != actor_id:  # get_if_exists: an existing actor
            self._post(self._unpin, pinned)
        elif spec.enable_task_events:
            self._events.append((task_id, 0, "SUBMITTED", time.time(), {
                "name": template.name, "function_name": template.function_name,
                "parent": self.current_task_id, "args": pinned, "returns": [],
                "resources": template.resources, "type": "ACTOR_CREATION_TASK", "actor_id": actor_id}, None, None, None))
            if pinned:
                self._post(self.actor_submitter.pin_creation_args, actor_id, pinned)
        self._post(self.actor_submitter.track, info.actor_id, info)
        return info

    def _env_for(self, template: TaskTemplate) -> dict[str, str] | None:
        """A new task's or actor's environment variables: its own over its parent's."""
        inherited, own = self.inherited_env, template.runtime_env
        if inherited and own:
            return {**inherited, **own}
        return own or inherited

    def _captured(self, template: TaskTemplate) -> TaskTemplate:
        """``template`` scheduled into the placement group that captures this task's children."""
        strategy = self.capture_strategy
        key = (id(template), bytes(strategy[1]) if strategy else b"")
        hit = self._captured_templates.get(key)
        if hit is not None and hit[0] is template:
            return hit[1]  # type: ignore[no-any-return]
        t = copy.copy(template)
        t.strategy = strategy
        t.key = (template.function_id, tuple(sorted(template.resources.items())), repr(strategy))
        if len(self._captured_templates) > 10_000:
            self._captured_templates.clear()
        self._captured_templates[key] = (template, t)
        return t

    def _unpin(self, ids: list[bytes]) -> None:
        if ids:
            freed = self.objects.remove_submitted(ids)
            if freed:
                self._release(freed)

    def root_task_id(self) -> bytes:
        ex = self.executor
        if ex is not None:
            root = ex.current_root_task_id()
            if root:
                return root  # type: ignore[no-any-return]
        return self.current_task_id

    def _promote_large_args(self, args: tuple[Any, ...], kwargs: dict[str, Any],
                            deps: list[ObjectRef]) -> tuple[Any, ser.SerializedValue, list[ObjectRef]]:
        """Put large by-value arguments into the object store and pass them by ref."""
        limit = self.config.max_inline_arg_bytes // 4
        deps = list(deps)
        keep: list[ObjectRef] = []

        def promote(v: Any) -> Any:
            if type(v) is _ArgRef:
                return v
            try:
                size = ser.serialize(v).total_size
            except ser.SerializationError:
                raise
            if size <= limit:
                return v
            ref = self.put(v)
            keep.append(ref)
            deps.append(ref)
            return _ArgRef(len(deps) - 1)

        new_args = tuple(promote(a) for a in args)
        new_kwargs = {k: promote(v) for k, v in kwargs.items()}
        payload: Any = (new_args, new_kwargs) if new_kwargs else new_args
        return payload, ser.serialize(payload), deps

    def _event_info(self, task: PendingTask) -> dict[str, Any]:
        spec = task.spec
        info: dict[str, Any] = {"name": spec.name, "function_name": spec.function_name,
                                "parent": spec.parent_task_id, "args": task.dep_ids + task.nested_ids,
                                "returns": task.return_ids, "resources": spec.resources,
                                "type": ("NORMAL_TASK", "ACTOR_CREATION_TASK", "ACTOR_TASK")[spec.kind]}
        if spec.actor_id:
            info["actor_id"] = spec.actor_id
            info["caller_id"] = spec.caller_id
            if spec.kind == 2:
                prev = self._last_actor_call.get(spec.actor_id)
                if prev is not None:
                    info["prev_call"] = prev
                self._last_actor_call[spec.actor_id] = spec.task_id
        return info

    # -------------------------------------------------------------- io thread: args

    def _on_submit(self, task: PendingTask) -> None:
        self.tasks[task.spec.task_id] = task
        if self.gone is not None:
            self._fail_task(task, self._gone_error(task))
            return
        self.export_function(task.template)
        if task.spec.kind == 2:
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

    # -------------------------------------------------------------- io thread: scheduling

    def _enqueue(self, task: PendingTask, front: bool = False) -> None:
        if task.spec.kind == 2:
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
                    lease.raylet.notify(m.ReturnWorker(lease.lease_id, a.disconnect))  # type: ignore[union-attr]
            elif t is ts.StartIdleTimer:
                lease = a.lease  # type: ignore[union-attr]
                if self.loop is not None:
                    lease.idle_timer = self.loop.call_later(self.config.lease_idle_timeout_ms / 1000,
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
                                           arg_bytes_by_node=self._arg_bytes_by_node(q))
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
        self._run(self.submitter.lease_connected(lease, conn))

    async def _raylet_at(self, address: m.Address) -> Connection:
        """The raylet a spillback named: the local one, or a shared TCP connection to another node's."""
        if address.node_id == self.node_id and self.raylet is not None:
            return self.raylet
        return await self._peer(m.Address(address.node_id, b"raylet:" + address.node_id, "",
                                          address.host, address.port))

    def _push(self, task: PendingTask, lease: LeasedWorker) -> None:
        if lease.idle_timer is not None:
            lease.idle_timer.cancel()
            lease.idle_timer = None
        spec = task.spec
        if spec.enable_task_events:
            self._events.append((spec.task_id, spec.attempt, "SCHEDULED", time.time(),
                                 {"resource_ids": lease.resource_ids} if lease.resource_ids else None,
                                 lease.node_id, lease.worker_id, None))
        assert lease.conn is not None
        lease.conn.notify(m.PushTask(spec, lease.resource_ids))

    def _idle_expired(self, lease: LeasedWorker) -> None:
        self._run(self.submitter.idle_expired(lease))

    async def _peer(self, address: m.Address) -> Connection:
        wid = address.worker_id

        async def open_conn() -> Connection:
            conn = await connect(address, token=self.token, config=self.config,
                                 handlers={m.TaskReply: self._handle_task_reply,
                                           m.GeneratorItem: self._handle_generator_item,
                                           m.GetObjectStatus: self._handle_get_object_status,
                                           m.AddBorrowers: self._handle_add_borrowers,
                                           m.RemoveBorrowers: self._handle_remove_borrowers},
                                 name=f"core-worker->{short(wid)}", on_close=self._peer_closed,
                                 use_unix=address.node_id == self.node_id)
            conn.peer_info = wid
            return conn

        if address.node_id in self.dead_nodes:
            # Fenced: nothing is sent to, or taken from, a node the GCS declared dead.
            raise ConnectionLost(f"node {short(address.node_id)} was declared dead")
        self._peer_nodes[wid] = address.node_id
        return await self._peers.get(wid, open_conn)

    def _peer_closed(self, conn: Connection) -> None:
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

    def _node_died(self, node_id: bytes) -> None:
        """The GCS declared ``node_id`` dead (io thread). It may only be frozen or cut off,
        not crashed: act exactly as if every connection to it had closed (tasks and actor
        calls in flight there are retried per their policy, its leases are given up), and
        close those connections, so nothing more it sends is taken (gray failure, issue 12).
        """
        if not self.owner.node_died(node_id):
            return
        if node_id == self.node_id and self.mode == WORKER:
            logger.error("this node was declared dead by the GCS; exiting")
            self._flush_events()
            os._exit(1)
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
            cause = "its node was declared dead by the GCS"
        else:
            try:
                cause = await lease.raylet.call(m.GetWorkerExit(lease.worker_id, 2.0), 5.0)
            except (ConnectionLost, TimeoutError, RemoteError):
                pass
        self._run(self.submitter.worker_died(lease, tasks, cause))

    async def _retry_later(self, task: PendingTask, why: str, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        self._run(self.submitter.retry_due(task, why))

    def _retry(self, task: PendingTask, why: str) -> None:
        self._next_attempt(task, why)
        if task.spec.kind == 0:
            self._enqueue(task, front=True)
        else:
            self._enqueue(task)

    def _next_attempt(self, task: PendingTask, why: str) -> None:
        """Record that ``task`` runs again (a retry or a rebuild) and start its next attempt."""
        spec = task.spec
        logger.info("running %s (%s) again: %s", spec.name, short(spec.task_id), why)
        if spec.enable_task_events:
            self._events.append((spec.task_id, spec.attempt, "RETRIED", time.time(), None, None, None, why))
        spec.attempt += 1
        task.lease = None

    # -------------------------------------------------------------- io thread: replies

    def _handle_task_reply(self, conn: Connection, reply: m.TaskReply) -> None:
        task = self.tasks.get(reply.task_id)
        if task is None or task.state == DONE:
            self._free_orphan_returns(reply)
            return
        if task.state != PUSHED or reply.worker_id != self._executor_of(task):
            # From an attempt given up on (its worker's node was declared dead, or the task
            # was put back): the current attempt's reply is the one that counts.
            logger.info("refused a reply for %s from worker %s, which does not run its current attempt",
                        short(reply.task_id), short(reply.worker_id or b""))
            return
        lease = task.lease
        submitter = self.submitter
        if lease is not None:
            if reply.error_kind == "requeue" and task.spec.kind == 0:
                self._run(submitter.task_requeued(task))
                return
            submitter.reply_arrived(lease, reply.task_id, reply.end_time - reply.start_time,
                                    reply.error_kind == "exiting")
        if task.spec.kind == 2:
            self.actor_submitter.on_reply(task, reply)
        if reply.system_error is not None:
            if reply.error_kind == "cancelled" or task.cancelled:
                self._fail_task(task, exc.TaskCancelledError(task.spec.task_id.hex(), reply.system_error))
            elif reply.error_kind == "actor_died":
                self._fail_task(task, exc.ActorDiedError((task.spec.actor_id or b"").hex(), reply.system_error))
            else:
                self._fail_task(task, exc.LumosSystemError(reply.system_error))
        elif reply.app_error and reply.retryable and submitter.use_retry(task):
            self._free_orphan_returns(reply)
            self._retry(task, "the task raised a retryable exception")
        else:
            self._finish_task(task, reply)
        if lease is not None:
            self._run(submitter.after_reply(lease))

    def _executor_of(self, task: PendingTask) -> bytes | None:
        """The worker running ``task``'s current attempt (None: unknown)."""
        if task.spec.kind == 2:
            return self.actor_submitter.worker_of(task)
        return task.lease.worker_id if task.lease is not None else None

    # -------------------------------------------------------------- io thread: results

    def _finish_task(self, task: PendingTask, reply: m.TaskReply) -> None:
        if task.spec.num_returns == -1:
            self._finish_stream(task, reply)
            return
        task.state = DONE
        self.tasks.pop(task.spec.task_id, None)
        spec = task.spec
        objects = self.objects
        orphans: list[bytes] = []
        for ret in reply.returns:
            nested = [(r[0], r[1]) for r in ret.nested_refs] if ret.nested_refs else None
            if nested:
                objects.add_contained(nested, registered=True)
            e = objects.complete(ret.object_id, READY, ret.data, ret.node_id, ret.size, nested)
            if e is None:
                if ret.data is None and ret.node_id is not None:
                    orphans.append(ret.object_id)
                if nested:
                    freed = objects.release_nested(nested)
                    if freed:
                        self._release(freed)
            else:
                e.shared = True
                self._run_callbacks(ret.object_id, e)
        if orphans and self.raylet is not None:
            self.raylet.notify(m.FreeObjects(orphans, [False] * len(orphans)))
        if spec.kind == 0 and not reply.app_error and task.retries_left != 0:
            self._keep_lineage(task)
        self._task_done(task, reply)

    def _task_done(self, task: PendingTask, reply: m.TaskReply, info: dict[str, Any] | None = None) -> None:
        """A task finished (its values recorded): its event, then its arguments' release
        (after the executor's borrowed refs are registered with their owners)."""
        spec = task.spec
        if spec.enable_task_events:
            state = "FAILED" if reply.app_error else "FINISHED"
            if reply.start_time:
                # The executor sends its own RUNNING event in its next batch, which a reader may
                # not see yet (or ever, if it exits first): the finished row has its start time.
                self._events.append((spec.task_id, spec.attempt, "RUNNING", reply.start_time, None, None,
                                     reply.worker_id, None))
            self._events.append((spec.task_id, spec.attempt, state, reply.end_time or time.time(), info,
                                 None, reply.worker_id, _error_text(reply) if reply.app_error else None))
        if reply.borrowed:
            executor = (task.lease.address if task.lease is not None
                        else self.actor_submitter.address_of(spec.actor_id or b""))
            self._spawn(self._register_borrowers(task, reply.borrowed, executor), "borrowers")
        else:
            self._release_args(task)

    async def _register_borrowers(self, task: PendingTask, borrowed: list[Any],
                                  executor: m.Address | None) -> None:
        """The executor kept refs from the arguments: make their owners know, then let go."""
        if executor is not None:
            by_owner: dict[bytes, tuple[m.Address, list[bytes]]] = {}
            for oid, owner in borrowed:
                if owner.worker_id == self.worker_id:
                    self.objects.add_borrower(oid, executor)
                else:
                    by_owner.setdefault(owner.worker_id, (owner, []))[1].append(oid)
            for owner, ids in by_owner.values():
                try:
                    conn = await self._peer(owner)
                    await conn.call(m.AddBorrowers(ids, executor), self.config.rpc_timeout_s)
                except (OSError, ConnectionLost, TimeoutError, RemoteError) as e:
                    logger.debug("could not register borrower at %s: %s", short(owner.worker_id), e)
        self._release_args(task)

    # -------------------------------------------------------------- io thread: lineage

    def _keep_lineage(self, task: PendingTask) -> None:
        self.owner.keep_lineage(task)

    def _drop_lineage(self, task_ids: list[bytes]) -> None:
        """Returns of these tasks were freed: forget the tasks none of whose returns is
        left, and let their arguments go."""
        for task in self.owner.drop_lineage(task_ids):
            self._release_args(task)

    def _reconstruct(self, oid: bytes, lost_node: bytes | None) -> str | None:
        """Run again the task that made ``oid`` (owned here), lost with node ``lost_node``.
        Returns None once the new run is under way (or already was), else why it cannot."""
        why, actions = self.owner.reconstruct(oid, lost_node)
        self._run_owner(actions)
        return why

    def _release_args(self, task: PendingTask) -> None:
        if self.owner.pins_args(task):
            return  # pinned while the task may run again; _drop_lineage lets them go
        ids = task.dep_ids + task.nested_ids
        if ids:
            freed = self.objects.remove_submitted(ids)
            if freed:
                self._release(freed)

    def _free_orphan_returns(self, reply: m.TaskReply) -> None:
        ids = [r.object_id for r in reply.returns if r.data is None and r.node_id is not None]
        if ids and self.raylet is not None:
            self.raylet.notify(m.FreeObjects(ids, [False] * len(ids)))

    def _fail_task(self, task: PendingTask, error: BaseException) -> None:
        self._fail_task_with_blob(task, error_blob(error), str(error))

    def _fail_task_with_blob(self, task: PendingTask, blob: bytes, text: str = "") -> None:
        if task.state == DONE:
            return
        task.state = DONE
        self.tasks.pop(task.spec.task_id, None)
        self.submitter.task_gone(task)
        for oid in task.return_ids:
            e = self.objects.complete(oid, FAILED, blob, None, len(blob), None)
            self._run_callbacks(oid, e)
        if task.spec.num_returns == -1:
            self._end_stream(task, blob)
        spec = task.spec
        if spec.enable_task_events:
            state = "CANCELLED" if task.cancelled else "FAILED"
            self._events.append((spec.task_id, spec.attempt, state, time.time(), None, None, None,
                                 text or "failed"))
        if spec.kind == 2:
            self.actor_submitter.on_failed(task)
        self._release_args(task)

    # -------------------------------------------------------------- cancel

    def cancel(self, ref: ObjectRef, force: bool, recursive: bool) -> None:
        self._post(self._cancel, ref._id[:16], force, recursive)

    def _cancel(self, task_id: bytes, force: bool, recursive: bool) -> None:
        task = self.tasks.get(task_id)
        if task is None or task.state == DONE:
            return
        task.cancelled = True
        if task.state in (WAITING_ARGS, QUEUED):
            self._fail_task(task, exc.TaskCancelledError(task_id.hex(), "cancelled before it started"))
            return
        if task.spec.kind == 2:
            conn = self.actor_submitter.connection_of(task.spec.actor_id or b"")
            if conn is not None and not force:
                conn.notify(m.CancelTask(task_id, False, recursive))
            return
        lease = task.lease
        if lease is None or lease.conn is None:
            return
        if force:
            task.force_cancelled = True
            lease.raylet.notify(m.KillWorker(lease.worker_id, f"force-cancelled task {task.spec.name}"))
        else:
            lease.conn.notify(m.CancelTask(task_id, False, recursive))

    def cancel_children(self, parent_task_id: bytes, force: bool) -> None:
        """Cancel every task this process submitted from ``parent_task_id`` (io thread)."""
        for task in list(self.tasks.values()):
            if task.spec.parent_task_id == parent_task_id:
                self._cancel(task.spec.task_id, force, True)

    # ================================================================== executor side

    def _handle_push_task(self, conn: Connection, msg: m.PushTask) -> None:
        if self.executor is None:
            raise ValueError("this process does not execute tasks")
        spec = msg.spec
        if type(spec) is not m.TaskSpec or type(spec.task_id) is not bytes or type(spec.args) is not bytes \
                or type(spec.deps) is not list or spec.kind not in (0, 1, 2) or type(spec.num_returns) is not int \
                or type(spec.enable_task_events) is not bool:
            raise ValueError("malformed PushTask")
        self.executor.push(conn, msg)

    def _handle_cancel_task(self, conn: Connection, msg: m.CancelTask) -> None:
        if self.executor is not None:
            self.executor.cancel(msg.task_id, msg.force, msg.recursive)

    def _handle_exit_worker(self, conn: Connection, msg: m.ExitWorker) -> None:
        logger.info("asked to exit: %s", msg.reason)
        if self.mode == WORKER:
            self._flush_events()
            self.loop.call_later(0.05, os._exit, 0)  # type: ignore[union-attr]

    def send_reply(self, conn: Connection, reply: m.TaskReply) -> None:
        """Executor (main thread) hands a finished task's reply to the io thread."""
        ex = self.executor
        if ex is not None and ex._output:  # the task's output leaves before its reply
            self._post(ex.flush_output)
        self._post(conn.notify, reply)

    # ================================================================== pub/sub, events

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
        elif msg.channel == "workers" and isinstance(msg.data, m.WorkerInfo) and msg.data.state == "DEAD":
            freed = self.objects.remove_borrowers_on({msg.data.worker_id})
            if freed:
                self._release(freed)
        handler = self.extra_publish_handlers.get(msg.channel)
        if handler is not None:
            handler(msg)

    def record_event(self, task_id: bytes, attempt: int, state: str, t: float,
                     node_id: bytes | None = None, worker_id: bytes | None = None,
                     error: str | None = None, info: Any = None) -> None:
        self._events.append((task_id, attempt, state, t, info, node_id, worker_id, error))

    async def _flush_loop(self) -> None:
        interval = self.config.task_event_flush_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            self._flush_events()
            if self.objects.decrements:
                freed = self.objects.drain()
                if freed:
                    self._release(freed)
            if self.executor is not None:
                self.executor.flush_output()

    def _flush_events(self) -> None:
        if not self._events or self.gcs is None or self.gcs.is_closed:
            return
        raw, self._events = self._events, []
        job = self.job_id
        events = [m.TaskEvent(tid, attempt, state, t, job, info, node, worker, err)
                  for (tid, attempt, state, t, info, node, worker, err) in raw]
        self.gcs.notify(m.AddTaskEvents(events))

    # ================================================================== introspection

    def stats(self) -> dict[str, Any]:
        objects = []
        with self.objects.lock:
            for oid, e in list(self.objects.entries.items())[:10_000]:
                objects.append({
                    "object_id": oid.hex(), "owned": e.owned,
                    "state": {PENDING: "PENDING", READY: "READY", FAILED: "FAILED"}[e.state],
                    "size_bytes": e.size, "local_refs": e.local, "submitted_refs": e.submitted,
                    "contained_refs": e.contained, "borrowers": len(e.borrowers or ()),
                    "in_store": e.data is None and e.node_id is not None,
                    "node_id": (e.node_id or b"").hex() or None,
                })
        return {"worker_id": self.worker_id.hex(), "pid": os.getpid(), "job_id": self.job_id.hex(),
                "node_id": self.node_id.hex(), "is_driver": self.mode == DRIVER,
                "num_pending_tasks": len(self.tasks), "objects": objects, "store": self.store.stats()}


def _parameter_names(template: TaskTemplate) -> list[str]:
    """Positional parameter names of a task's function or an actor's ``__init__`` (for
    error messages; empty when they cannot be known here, as for actor methods)."""
    import inspect
    if template.pickled_function is None:
        return []
    try:
        fn = ser.deserialize_code(template.pickled_function)
        if template.kind == 1:
            names = list(inspect.signature(fn.__init__).parameters)[1:]
        else:
            names = list(inspect.signature(fn).parameters)
    except (ValueError, TypeError, ser.DeserializationError):
        return []
    return names


def _sever(conn: Connection) -> None:
    """Close ``conn`` now, dropping unsent bytes: its peer may be frozen and never read them
    (a plain close waits for the write buffer to drain before it reports the close)."""
    conn.close()
    transport = getattr(conn, "_transport", None)
    if transport is not None:
        transport.abort()


def _job_config(namespace: str, env_vars: dict[str, str] | None = None, working_dir: str | None = None) -> bytes:
    import json
    paths = [p for p in sys.path if p and os.path.isdir(p)]
    main = sys.modules.get("__main__")
    main_file = getattr(main, "__file__", None)
    if main_file:
        paths.insert(0, os.path.dirname(os.path.abspath(main_file)))
    return json.dumps({"cwd": os.getcwd(), "sys_path": [os.getcwd()] + paths, "namespace": namespace,
                       "env_vars": env_vars or {}, "working_dir": working_dir}).encode()


def _error_text(reply: m.TaskReply) -> str:
    """The last line of a failed task's error (for the task-event log), at most 500 chars."""
    blob = reply.returns[0].data if reply.returns else None
    if not blob:
        return "application error"
    try:
        _kind, err = ser.deserialize(blob)
        lines = [ln for ln in str(err).splitlines() if ln.strip()]
        return (lines[-1] if lines else type(err).__name__)[:500]
    except Exception:
        return "application error"


def _print_worker_lines(lines: list[Any]) -> None:
    for rec in lines:
        _job, _task_id, task_name, pid, is_stderr, text = rec[:6]
        stream = sys.stderr if is_stderr else sys.stdout
        prefix = f"({task_name} pid={pid}) " if task_name else f"(pid={pid}) "
        try:
            stream.write("".join(prefix + line + "\n" for line in text.split("\n")))
            stream.flush()
        except (ValueError, OSError):
            pass


def _print_cluster_error(kind: str, text: str) -> None:
    try:
        sys.stderr.write(f"lumos warning ({kind}): {text}\n")
        sys.stderr.flush()
    except (ValueError, OSError):
        pass


def function_id_of(pickled: bytes) -> bytes:
    return hashlib.sha256(pickled).digest()[:16]


__all__ = ["CoreWorker", "DRIVER", "WORKER", "TaskTemplate", "error_blob", "function_id_of"]

