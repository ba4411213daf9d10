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
import collections
import concurrent.futures
import copy
import hashlib
import logging
import os
import sys
import threading
import time
from typing import Any, Callable, Container

from lumos import exceptions as exc
from lumos import object_ref as object_ref_mod
from lumos._private import serialization as ser
from lumos._private.config import Config
from lumos._private.transport import eventloop
from lumos._private.core_worker.references import FAILED, PENDING, READY, Freed, ObjectTable, Waiter
from lumos._private.core_worker.tasks import (DONE, PUSHED, QUEUED, WAITING_ARGS, LeasedWorker,
                                              PendingTask, SchedulingQueue, TaskTemplate)
from lumos._private.ids import (TASK_ID_SIZE, is_put_object, new_task_id, put_object_id,
                                return_object_id, short, task_id_of)
from lumos._private.object_store.client import StoreClient
from lumos._private.protocol import messages as m
from lumos._private.raylet.memory_monitor import OOM_KILL_REASON
from lumos._private.transport.connection import (Connection, ConnectionCache, ConnectionLost, RemoteError, batch,
                                                 connect_with_retry,
                                                 RpcServer, connect)
from lumos.generator import GeneratorStream, ObjectRefGenerator
from lumos.object_ref import ObjectRef

logger = logging.getLogger(__name__)

DRIVER, WORKER = 0, 1
_STATUS_PENDING, _STATUS_READY, _STATUS_FREED, _STATUS_LOST = 0, 1, 2, 3
#: A finished streaming task's event names at most this many of its values.
STREAM_IDS_IN_EVENTS = 1000
#: Streams of at most this many values keep their lineage (their values can be rebuilt).
STREAM_LINEAGE_MAX_VALUES = 10_000
#: Argument bytes of the lineage one process keeps; tasks beyond it cannot be rebuilt.
LINEAGE_MAX_BYTES = 256 * 1024 * 1024


class _ArgRef(int):
    """Placeholder for the i-th top-level ref argument inside the pickled args."""

    __slots__ = ()

    def __reduce__(self) -> Any:
        return (_ArgRef, (int(self),))


ser._PLAIN_SCALARS = ser._PLAIN_SCALARS | {_ArgRef}  # pickles by reference: safe on the fast path


def _lineage_size(task: PendingTask) -> int:
    """What keeping ``task`` for lineage costs against ``LINEAGE_MAX_BYTES``."""
    return len(task.spec.args) + 512


def _stored_on(e: Any, nodes: Container[bytes]) -> bool:
    """``e`` is an owned, ready value whose only copy is in the store of one of ``nodes``."""
    return (e is not None and e.owned and e.state == READY and e.data is None
            and e.node_id is not None and e.node_id in nodes)


def error_blob(error: BaseException) -> bytes:
    """Serialize an error as a value whose ``get`` raises it."""
    try:
        return ser.serialize(error, ser.KIND_ERROR).to_bytes()
    except ser.SerializationError:
        fallback = exc.LumosSystemError(f"{type(error).__name__}: {error}")
        return ser.serialize(fallback, ser.KIND_ERROR).to_bytes()


class CoreWorker:
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
        self.objects = ObjectTable(worker_id)
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
        self.loop: asyncio.AbstractEventLoop | None = None
        self._io_thread: threading.Thread | None = None
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
        self._queues: dict[Any, SchedulingQueue] = {}
        #: Leased workers with nothing to run, kept a moment for more of their key's tasks.
        self._idle_leases: set[LeasedWorker] = set()
        #: Worker id -> open connection (or the future of one being opened).
        self._peers = ConnectionCache()
        #: Function ids already exported to the GCS for this job.
        self._exported: set[bytes] = set()
        #: Task id -> the values of a streaming generator task that arrived so far.
        self.streams: dict[bytes, GeneratorStream] = {}
        self._bg: set[asyncio.Task[Any]] = set()
        # cross-thread ---------------------------------------------------------------
        self._inbox: collections.deque[tuple[Callable[..., Any], tuple[Any, ...]]] = collections.deque()
        self._wake_pending = False
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
        #: Lineage (io thread): finished normal tasks whose values in an object store are
        #: still referenced, by task id. Enough to run such a task again when its node dies
        #: with the value (its arguments stay pinned while it is kept).
        self.lineage: dict[bytes, PendingTask] = {}
        #: Nodes the GCS declared dead (io thread): values stored there are lost.
        self.dead_nodes: set[bytes] = set()
        #: Why the cluster is unreachable (the GCS or the local raylet went away), else None.
        self.gone: str | None = None
        #: Peer key (worker id, or b"raylet:" + node id) -> the node it runs on (io thread).
        self._peer_nodes: dict[bytes, bytes] = {}
        #: Connections closed because their node was declared dead -> that node.
        self._node_of_conn: dict[Connection, bytes] = {}
        self._lineage_bytes = 0
        from lumos._private.core_worker.actor_submitter import ActorSubmitter
        self.actor_submitter = ActorSubmitter(self)

    # ================================================================== lifecycle

    def start(self) -> None:
        """Start the io thread, connect, register. Returns when ready to submit."""
        ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._io_thread = threading.Thread(target=self._run_loop, args=(ready,), name="lumos-io", daemon=True)
        self._io_thread.start()
        try:
            ready.result(self.config.connect_timeout_s + 5)
        except BaseException:
            self._stop_thread()
            raise
        object_ref_mod._core_worker = self

    def _run_loop(self, ready: concurrent.futures.Future[None]) -> None:
        loop = eventloop.new_event_loop()
        self.loop = loop
        asyncio.set_event_loop(loop)

        async def boot() -> None:
            try:
                await self._connect()
            except BaseException as e:
                ready.set_exception(e)
                return
            ready.set_result(None)

        loop.run_until_complete(boot())
        if ready.exception() is None:
            loop.run_forever()
        try:
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for t in pending:
                t.cancel()
            if pending:
                loop.run_until_complete(asyncio.wait(pending, timeout=1.0))
            # Whatever an interrupted close left open is closed here, so the loop can go.
            self._peers.close_all()
            for conn in (self.raylet, self.gcs):
                if conn is not None:
                    conn.close()
            if self.server is not None:
                loop.run_until_complete(asyncio.wait_for(self.server.stop(), 2.0))
            loop.run_until_complete(asyncio.sleep(0.01))
            loop.run_until_complete(loop.shutdown_asyncgens())
        except Exception as e:
            logger.debug("io loop clean-up: %s", e)
        finally:
            try:
                loop.close()
            except OSError as e:  # a handle libuv still counts as active
                logger.debug("io loop close: %s", e)

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
        self.gcs.notify(m.Subscribe("worker_deaths", None))
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
        if object_ref_mod._core_worker is self:
            object_ref_mod._core_worker = None
        loop = self.loop
        if loop is not None and self._io_thread is not None and self._io_thread.is_alive():
            fut = asyncio.run_coroutine_threadsafe(self._aclose(), loop)
            try:
                fut.result(5.0)
            except Exception as e:  # the loop may already be gone with its peers
                logger.debug("core worker close: %s", e)
        self._stop_thread()
        self.store.close()

    async def _aclose(self) -> None:
        self._flush_events()
        if self.gcs is not None and self.mode == DRIVER and self.job_id and not self.gcs.is_closed:
            try:
                await self.gcs.call(m.MarkJobFinished(self.job_id), 2.0)
            except (ConnectionLost, TimeoutError, RemoteError):
                pass
        for q in self._queues.values():
            for lease in list(q.leases):
                self._return_lease(lease, disconnect=False)
        await asyncio.sleep(0)
        for t in list(self._bg):
            t.cancel()
        self._peers.close_all()
        if self.raylet is not None:
            self.raylet.close()
        if self.gcs is not None:
            self.gcs.close()
        if self.server is not None:
            await self.server.stop()

    def _stop_thread(self) -> None:
        loop = self.loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(loop.stop)
            except RuntimeError:
                pass
        if self._io_thread is not None and self._io_thread is not threading.current_thread():
            self._io_thread.join(5.0)

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
                    gcs.notify(m.Subscribe("worker_deaths", None))
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

    def _spawn(self, coro: Any, name: str) -> asyncio.Task[Any]:
        assert self.loop is not None
        task = self.loop.create_task(coro, name=name)
        self._bg.add(task)

        def done(t: asyncio.Task[Any]) -> None:
            self._bg.discard(t)
            if not t.cancelled() and t.exception() is not None:
                logger.error("%s failed", name, exc_info=t.exception())
        task.add_done_callback(done)
        return task

    # ================================================================== thread handoff

    def _post(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the io thread; batched: one wake-up per burst."""
        self._inbox.append((fn, args))
        if not self._wake_pending:
            self._wake_pending = True
            loop = self.loop
            if loop is None or loop.is_closed():
                raise exc.LumosSystemError("lumos is shut down")
            loop.call_soon_threadsafe(self._drain_inbox)

    def _drain_inbox(self) -> None:
        self._wake_pending = False
        inbox = self._inbox
        with batch():  # what the jobs send leaves at the end, without another loop turn
            while inbox:
                fn, args = inbox.popleft()
                try:
                    fn(*args)
                except Exception:
                    logger.exception("io-thread job %s failed", getattr(fn, "__name__", fn))

    def drain_at_exit(self, timeout_s: float, settle_s: float = 0.3) -> int:
        """At a script's exit (user thread): wait until every task and actor call this
        process submitted has answered, then until worker output stops arriving for
        ``settle_s``, at most ``timeout_s`` in all. Returns the calls still unanswered."""
        deadline = time.monotonic() + timeout_s
        done_at = None
        while time.monotonic() < deadline and not self._closed:
            if self._inbox or self.tasks:
                done_at = None
            elif done_at is None:
                done_at = time.monotonic()  # output travels worker -> raylet -> GCS -> here
            elif time.monotonic() - max(done_at, self.last_log_at) >= settle_s:
                return 0
            time.sleep(0.02)
        return len(self.tasks)

    def run_sync(self, coro: Any, timeout_s: float | None = None) -> Any:
        """Run a coroutine on the io thread and wait for it (from a user thread)."""
        if threading.current_thread() is self._io_thread:
            coro.close()
            raise RuntimeError("a blocking lumos call was made from the lumos-io thread; "
                               "use 'await ref' in async code instead")
        if self.loop is None or self._closed:
            coro.close()
            raise exc.LumosSystemError("lumos is shut down")
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result(timeout_s)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise TimeoutError(f"lumos control call timed out after {timeout_s}s") from None
        finally:
            # A raised error's traceback holds this frame; the future holds the error. Left
            # alone, that cycle keeps every caller's frame (and the ObjectRefs in them)
            # alive until the garbage collector runs.
            del fut

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
        lineage = self.lineage
        dropped: list[bytes] = []
        for f in freed:
            e = f.entry
            if lineage and e.owned and f.object_id[:TASK_ID_SIZE] in lineage:
                dropped.append(f.object_id[:TASK_ID_SIZE])
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

    def _store_pin_changed(self, object_id: bytes, pinned: bool) -> None:
        """Tell the raylet whether this process views ``object_id`` (viewed objects are
        never spilled). Any thread, also garbage collection at exit."""
        if self._closed or self.loop is None or self.loop.is_closed():
            return
        try:
            self._post(self._notify_raylet, m.PinObjects([object_id], pinned))
        except exc.LumosSystemError:
            pass  # shutting down: the raylet forgets this process's pins when it goes

    def _free_after_views(self, object_id: bytes) -> None:
        """An object we freed while viewing it lost its last view here (any thread, GC
        included): free it in the store now, its slot reusable if nobody else views it."""
        if self._closed or self.loop is None or self.loop.is_closed():
            return
        try:
            self._post(self._send_releases, [object_id], [True], {})
        except exc.LumosSystemError:
            pass  # shutting down: the raylet frees what this process owned when it goes

    def _restore_spilled(self, object_id: bytes) -> str | None:
        """The object's store file is missing: ask the raylet to restore it (user threads).
        Returns None (not on this node), "" (back in the store) or a spill file to map."""
        if self.raylet is None or threading.current_thread() is self._io_thread:
            return None
        try:
            answer = self.call_raylet(m.RestoreSpilled(object_id), 3600.0)  # the raylet bounds it by size
        except (RemoteError, TimeoutError, exc.LumosSystemError) as e:
            logger.warning("restoring spilled object %s failed: %s", short(object_id), e)
            return None
        return answer if isinstance(answer, str) else None

    # ================================================================== put

    def put(self, value: Any, *, _owner: m.Address | None = None, _kind: int = ser.KIND_VALUE) -> ObjectRef:
        """``_kind=KIND_ERROR``: ``get`` raises ``value`` (a dynamic generator's error)."""
        if isinstance(value, ObjectRef):
            raise TypeError("lumos.put() of an ObjectRef is not allowed; pass the ref itself instead")
        self.drain_refs()
        sv = ser.serialize(value, _kind)
        self._put_counter += 1
        oid = put_object_id(self.current_task_id, self._put_counter)
        nested = [(r._id, r._owner or self.address) for r in sv.nested_refs]
        if sv.total_size < self.config.max_inline_object_bytes:
            data = sv.to_bytes()
            with self.objects.lock:
                e = self.objects.add_owned(oid)
                e.state = READY
                e.data = data
                e.size = len(data)
        else:
            self._write_to_store(oid, sv, keep_mapping=True)
            with self.objects.lock:
                e = self.objects.add_owned(oid)
                e.state = READY
                e.node_id = self.node_id
                e.size = sv.total_size
        if nested:
            self.objects.add_contained(nested, registered=True)
            with self.objects.lock:
                e.nested = nested
                for noid, _ in nested:
                    ne = self.objects.entries.get(noid)
                    if ne is not None:
                        ne.shared = True
        return ObjectRef(oid, self.address, True)

    def _write_to_store(self, oid: bytes, sv: ser.SerializedValue, keep_mapping: bool,
                        owner: bytes = b"") -> None:
        """Create the object in this node's store and copy the value in (user thread).
        ``owner``: the owning process's worker id when it is not this one."""
        try:
            slot, path, final_path, file_size, reused = self.call_raylet(
                m.CreateObject(oid, sv.total_size, self.worker_id, owner),
                self.config.object_store_full_timeout_s + self.config.rpc_timeout_s)
        except RemoteError as e:
            if e.type_name == "_StoreFull":
                raise exc.ObjectStoreFullError(e.text) from None
            if e.type_name == "_OutOfDisk":
                raise exc.OutOfDiskError(e.text) from None
            if e.type_name == "_ObjectExists":
                return  # a task run again where a copy of its result was pulled earlier
            raise
        try:
            self.store.write(oid, path, final_path, slot, file_size, reused, sv.total_size,
                             lambda dest, copy: sv.write_into(dest, copy), keep_mapping)
        except BaseException:
            self._post(self._send_releases, [oid], [False], {})
            raise
        self._post(self._notify_raylet, m.SealObject(oid, sv.total_size))

    def _notify_raylet(self, msg: Any) -> None:
        if self.raylet is not None:
            self.raylet.notify(msg)

    # ================================================================== get / wait

    def get(self, refs: list[ObjectRef], timeout: float | None) -> list[Any]:
        deadline = None if timeout is None else time.monotonic() + timeout
        self.drain_refs()
        entries = self.objects.entries
        missing: list[ObjectRef] = []
        for ref in refs:
            e = entries.get(ref._id)
            if e is None or e.state == PENDING:
                missing.append(ref)
        if missing:
            self._wait_for(missing, len({r._id for r in missing}), timeout, fetch=True, for_get=True)
        if len(refs) > 1:
            self._pull_remote_together(refs)
        return [self._value_of(ref, deadline) for ref in refs]

    def _pull_remote_together(self, refs: list[ObjectRef]) -> None:
        """Copy the objects of ``refs`` that live on other nodes here, all pulls at once
        (then each read finds its copy local; a failed pull is reported by that read)."""
        entries = self.objects.entries
        remote: dict[bytes, bytes] = {}
        for ref in refs:
            e = entries.get(ref._id)
            if e is not None and e.state == READY and e.data is None and e.node_id is not None \
                    and e.node_id != self.node_id:
                remote[ref._id] = e.node_id
        if len(remote) < 2 or self.raylet is None:
            return
        raylet = self.raylet

        async def pull_all() -> None:
            await asyncio.gather(*(raylet.call(m.PullObject(oid, node, 0, self._owner_id_of(oid)))
                                   for oid, node in remote.items()), return_exceptions=True)

        try:
            self.run_sync(pull_all(), 3600.0)
        except (TimeoutError, exc.LumosSystemError):
            pass

    def _wait_for(self, refs: list[ObjectRef], num: int, timeout: float | None, fetch: bool,
                  for_get: bool = False) -> list[bytes]:
        """Block until ``num`` of ``refs`` are ready. Returns ids in completion order.

        ``for_get``: raise ``GetTimeoutError`` at the deadline (``wait`` just returns).
        """
        waiter = Waiter(num)
        to_fetch: list[tuple[bytes, m.Address]] = []
        seen: set[bytes] = set()
        with self.objects.lock:
            for ref in refs:
                oid = ref._id
                if oid in seen:
                    continue
                seen.add(oid)
                e = self.objects.entries.get(oid)
                if e is None:
                    waiter.hit(oid)  # unknown here: _value_of explains
                elif e.state != PENDING:
                    waiter.hit(oid)
                else:
                    if e.waiters is None:
                        e.waiters = []
                    e.waiters.append(waiter)
                    if not e.owned and not e.fetching and e.owner is not None:
                        e.fetching = True
                        to_fetch.append((oid, e.owner))
                if waiter.remaining <= 0:
                    break
        if waiter.remaining <= 0:
            return waiter.order
        for oid, owner in to_fetch:
            self._post(self._start_fetch, oid, owner)
        deadline = None if timeout is None else time.monotonic() + timeout
        self._set_blocked(True)
        try:
            while True:
                slice_s = self.config.wait_slice_s
                if deadline is not None:
                    slice_s = min(slice_s, deadline - time.monotonic())
                    if slice_s <= 0:
                        break
                if waiter.lock.acquire(timeout=slice_s):
                    break
        except KeyboardInterrupt:
            self._cancel_refs_on_interrupt(refs)
            raise
        finally:
            self._set_blocked(False)
            if waiter.remaining > 0:
                with self.objects.lock:
                    for ref in refs:
                        e = self.objects.entries.get(ref._id)
                        if e is not None and e.waiters and waiter in e.waiters:
                            e.waiters.remove(waiter)
        if waiter.remaining > 0 and for_get:
            raise exc.GetTimeoutError(
                f"get timed out after {timeout}s: {waiter.remaining} of {num} objects not ready")
        return waiter.order

    def _set_blocked(self, blocked: bool) -> None:
        if self.mode != WORKER or self.executor is None or not self.executor.running_task():
            return
        if blocked:
            self._blocked_depth += 1
            if self._blocked_depth == 1:
                self._post(self._notify_raylet, m.WorkerBlocked(self.worker_id))
                self.executor.requeue_waiting()
        else:
            self._blocked_depth -= 1
            if self._blocked_depth == 0:
                self._post(self._notify_raylet, m.WorkerUnblocked(self.worker_id))

    def _cancel_refs_on_interrupt(self, refs: list[ObjectRef]) -> None:
        for ref in refs:
            e = self.objects.entries.get(ref._id)
            if e is not None and e.owned and e.state == PENDING:
                try:
                    self.cancel(ref, force=False, recursive=True)
                except Exception:
                    logger.exception("cancel on Ctrl-C failed")

    def wait(self, refs: list[ObjectRef], num_returns: int, timeout: float | None,
             fetch_local: bool) -> tuple[list[ObjectRef], list[ObjectRef]]:
        if self.objects.decrements:
            self.drain_refs()
        # Fast path: enough of them are done already (one pass, no waiter).
        get = self.objects.entries.get
        done: list[ObjectRef] = []
        rest: list[ObjectRef] = []
        with self.objects.lock:
            if num_returns == len(refs):
                for r in refs:
                    e = get(r._id)
                    if e is not None and e.state == PENDING:
                        break
                else:
                    return list(refs), []
            for r in refs:
                e = get(r._id)
                if (e is None or e.state != PENDING) and len(done) < num_returns:
                    done.append(r)
                else:
                    rest.append(r)
        if len(done) >= num_returns or timeout == 0:
            return done, rest
        by_id: dict[bytes, ObjectRef] = {}
        for ref in refs:
            by_id.setdefault(ref._id, ref)
        order = self._wait_for(refs, num_returns, timeout, fetch=fetch_local)
        ready_ids = order[:num_returns]
        ready_set = set(ready_ids)
        # Several objects may have become ready at once: add any others already done.
        if len(ready_ids) < num_returns:
            with self.objects.lock:
                for oid in by_id:
                    if oid not in ready_set:
                        e = self.objects.entries.get(oid)
                        if e is not None and e.state != PENDING and len(ready_ids) < num_returns:
                            ready_ids.append(oid)
                            ready_set.add(oid)
        ready = [by_id[oid] for oid in ready_ids if oid in by_id]
        not_ready = [r for r in refs if r._id not in ready_set]
        return ready, not_ready

    def _value_of(self, ref: ObjectRef, deadline: float | None = None) -> Any:
        e = self.objects.entries.get(ref._id)
        if e is None:
            raise exc.ObjectFreedError(ref._id.hex(), "no reference to it is held in this process "
                                       "(was the ObjectRef created by hand?)")
        data = e.data
        if data is not None:
            kind, value = ser.deserialize(data)
        elif e.node_id is not None:
            lost_detail = None
            try:
                kind, value = self._read_from_store(ref._id, e.node_id)
            except exc.ObjectLostError as lost:
                if e.data is not None or (not e.owned and e.owner is None):
                    raise
                lost_detail = lost.detail
            if lost_detail is not None:
                # Outside the handler: the caught error's traceback would keep this frame,
                # and ``ref`` with it, alive in a cycle.
                if e.owned:
                    kind, value = self._rebuild_and_read(ref, e.node_id, lost_detail, deadline)
                else:
                    kind, value = self._refetch_and_read(ref, e.owner, e.node_id, lost_detail, deadline)
        else:
            raise exc.ObjectLostError(ref._id.hex(), "its value was never recorded")
        if kind == ser.KIND_ERROR:
            if isinstance(value, exc.TaskError):
                raise value.as_instanceof_cause()
            raise value
        return value

    def _read_from_store(self, oid: bytes, node_id: bytes) -> tuple[int, Any]:
        view = self.store.view(oid, restore=node_id == self.node_id)
        if view is None and node_id != self.node_id:
            self.pull_to_local(oid, node_id)
            view = self.store.view(oid)
        if view is None:
            if node_id != self.node_id:
                raise exc.ObjectLostError(oid.hex(), f"it lives on node {short(node_id)}, and this "
                                          "process cannot read it")
            raise exc.ObjectLostError(oid.hex(), "its file is gone from this node's object store")
        return ser.deserialize(view)

    def _rebuild_and_read(self, ref: ObjectRef, node_id: bytes, detail: str,
                          deadline: float | None) -> tuple[int, Any]:
        """An object this process owns was lost with its node: run the task that made it
        again (lineage reconstruction), wait for the new value and read it (user thread)."""
        oid = ref._id

        def rebuild(node: bytes, detail: str) -> tuple[bytes | None, bytes | None] | None:
            async def run() -> str | None:
                return self._reconstruct(oid, node)

            why = self.run_sync(run(), self.config.rpc_timeout_s)
            if why is not None:
                raise exc.ObjectLostError(oid.hex(), f"{detail}; it cannot be rebuilt: {why}")
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            self._wait_for([ref], 1, remaining, fetch=False, for_get=True)
            e = self.objects.entries.get(oid)
            if e is None or (e.data is None and e.node_id is None):
                return None
            return e.data, e.node_id

        return self._read_rebuilt(oid, node_id, detail, rebuild)

    def _refetch_and_read(self, ref: ObjectRef, owner: m.Address, node_id: bytes, detail: str,
                          deadline: float | None) -> tuple[int, Any]:
        """A borrowed object's value was lost with its node: its owner rebuilds it from the
        lineage, then the new copy is read (user thread)."""
        oid = ref._id

        def rebuild(node: bytes, detail: str) -> tuple[bytes | None, bytes | None]:
            st = self.ask_owner_to_rebuild(oid, owner, node, deadline)
            self.objects.complete(oid, READY, st.data, st.node_id, st.size, None)
            return st.data, st.node_id

        return self._read_rebuilt(oid, node_id, detail, rebuild)

    def _read_rebuilt(self, oid: bytes, node_id: bytes, detail: str,
                      rebuild: Callable[[bytes, str], tuple[bytes | None, bytes | None] | None]) -> tuple[int, Any]:
        """Read a value lost with node ``node_id`` once ``rebuild(node_id, detail)`` made it
        again: it gives the new ``(data, node_id)``, or None when no value was recorded. A
        copy lost again is rebuilt again, a few times at most (user thread)."""
        for _ in range(4):
            where = rebuild(node_id, detail)
            if where is None:
                break
            data, new_node = where
            if data is not None:
                return ser.deserialize(data)
            assert new_node is not None
            again = None
            try:
                return self._read_from_store(oid, new_node)
            except exc.ObjectLostError as lost:
                again = lost.detail  # kept outside the handler: its traceback would hold this frame
            detail, node_id = again, new_node
        raise exc.ObjectLostError(oid.hex(), f"{detail}; rebuilding it did not succeed")

    def ask_owner_to_rebuild(self, oid: bytes, owner: m.Address, lost_node: bytes,
                             deadline: float | None) -> m.ObjectStatus:
        """Tell ``oid``'s owner that its value cannot be read from ``lost_node``; the owner
        runs the task that made it again when it can. Returns the new location, or raises
        why there is none (user threads, blocking until the value is rebuilt)."""
        if owner.worker_id == self.worker_id:
            raise exc.ObjectLostError(oid.hex(), "its value is gone and this process owns it")

        async def ask() -> m.ObjectStatus:
            conn = await self._peer(owner)
            return await conn.call(m.GetObjectStatus(oid, True, self.address, lost_node))  # type: ignore[no-any-return]

        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        self._set_blocked(True)  # the rebuild may need this worker's CPU
        try:
            st: m.ObjectStatus = self.run_sync(ask(), remaining)
        except TimeoutError:
            raise exc.GetTimeoutError(f"get timed out while {short(oid)} was being rebuilt") from None
        except (OSError, ConnectionLost) as e:
            raise exc.OwnerDiedError(oid.hex(), f"its value was lost with node {short(lost_node)} and its "
                                     f"owner {short(owner.worker_id)} is unreachable: {e}") from None
        except RemoteError as e:
            raise exc.ObjectLostError(oid.hex(), str(e)) from None
        finally:
            self._set_blocked(False)
        if st.status == _STATUS_READY and (st.data is not None or st.node_id is not None):
            return st
        if st.status == _STATUS_FREED:
            raise exc.ObjectFreedError(oid.hex(), st.error or "its owner freed it")
        raise exc.ObjectLostError(oid.hex(), st.error or "its owner lost it")

    def _owner_id_of(self, oid: bytes) -> bytes:
        """The worker id of ``oid``'s owner (a pulled copy is freed when that process dies)."""
        e = self.objects.entries.get(oid)
        if e is not None and not e.owned and e.owner is not None:
            return e.owner.worker_id
        return self.worker_id

    def pull_to_local(self, oid: bytes, node_id: bytes, owner_id: bytes | None = None) -> None:
        """Have the local raylet copy ``oid`` from node ``node_id`` into this node's store (blocks).
        ``owner_id``: the object's owner, when this process has no entry for it."""
        try:
            self.call_raylet(m.PullObject(oid, node_id, 0, owner_id or self._owner_id_of(oid)), 3600.0)
        except (RemoteError, ConnectionLost, TimeoutError) as e:
            raise exc.ObjectLostError(oid.hex(), f"it lives on node {short(node_id)} and could not be "
                                      f"copied to this node: {e}") from None

    def _start_fetch(self, oid: bytes, owner: m.Address) -> None:
        self._spawn(self._fetch(oid, owner), "fetch")

    async def _fetch(self, oid: bytes, owner: m.Address) -> None:
        """Ask a borrowed object's owner for its value (long poll)."""
        try:
            conn = await self._peer(owner)
            st: m.ObjectStatus = await conn.call(m.GetObjectStatus(oid, True, self.address))
        except (OSError, ConnectionLost, TimeoutError) as e:
            self._complete_error(oid, exc.OwnerDiedError(oid.hex(), f"owner {short(owner.worker_id)} "
                                                         f"unreachable: {e}"))
            return
        except RemoteError as e:
            self._complete_error(oid, exc.ObjectLostError(oid.hex(), str(e)))
            return
        if st.status == _STATUS_READY:
            freed = []
            e = self.objects.complete(oid, READY, st.data, st.node_id, st.size, None)
            if e is not None:
                e.fetching = False
            self._run_callbacks(oid, e)
            if freed:
                self._release(freed)
        elif st.status == _STATUS_FREED:
            self._complete_error(oid, exc.ObjectFreedError(oid.hex(), st.error or "its owner freed it"))
        else:
            self._complete_error(oid, exc.ObjectLostError(oid.hex(), st.error or "its owner lost it"))

    def _complete_error(self, oid: bytes, error: BaseException) -> None:
        e = self.objects.complete(oid, FAILED, error_blob(error), None, 0, None)
        if e is not None:
            e.fetching = False
        self._run_callbacks(oid, e)

    def _handle_get_object_status(self, conn: Connection, msg: m.GetObjectStatus) -> Any:
        e = self.objects.entries.get(msg.object_id)
        if e is None or not e.owned:
            return m.ObjectStatus(_STATUS_FREED, None, None, 0, "its owner no longer holds it")
        if msg.borrower is not None:
            e.shared = True
        lost = msg.lost_node
        if lost is not None and e.state == READY and e.data is None and e.node_id == lost:
            why = self._reconstruct(msg.object_id, lost)
            if why is not None:
                return m.ObjectStatus(_STATUS_LOST, None, None, 0, f"its value was lost with node {short(lost)} "
                                      f"and it cannot be rebuilt: {why}")
        if e.state != PENDING or not msg.wait:
            return self._status_of(e)
        fut: asyncio.Future[m.ObjectStatus] = asyncio.get_running_loop().create_future()

        def ready(entry: Any) -> None:
            if not fut.done():
                fut.set_result(self._status_of(entry) if entry is not None else
                               m.ObjectStatus(_STATUS_FREED, None, None, 0, "freed while pending"))
        with self.objects.lock:
            if e.state != PENDING:
                return self._status_of(e)
            if e.callbacks is None:
                e.callbacks = []
            e.callbacks.append(ready)
        return fut

    @staticmethod
    def _status_of(e: Any) -> m.ObjectStatus:
        if e.state == PENDING:
            return m.ObjectStatus(_STATUS_PENDING, None, None, 0)
        return m.ObjectStatus(_STATUS_READY, e.data, e.node_id, e.size)

    def _run_callbacks(self, oid: bytes, e: Any) -> None:
        if e is None:
            return
        with self.objects.lock:
            cbs, e.callbacks = e.callbacks, None
        if cbs:
            for cb in cbs:
                try:
                    cb(e)
                except Exception:
                    logger.exception("object-ready callback failed")

    def future_of(self, ref: ObjectRef) -> concurrent.futures.Future[Any]:
        """A future resolved with the value when the object is ready (never blocks)."""
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.drain_refs()

        def resolve(_: Any = None) -> None:
            try:
                fut.set_result(self._value_of(ref))
            except BaseException as e:  # the future carries the error to the awaiting side
                fut.set_exception(e)

        def on_io() -> None:
            e = self.objects.entries.get(ref._id)
            if e is None or e.state != PENDING:
                threading.Thread(target=resolve, name="lumos-future", daemon=True).start() \
                    if (e is not None and e.node_id is not None and e.data is None) else resolve()
                return
            with self.objects.lock:
                if e.callbacks is None:
                    e.callbacks = []
                e.callbacks.append(lambda entry: resolve())
            if not e.owned and not e.fetching and e.owner is not None:
                e.fetching = True
                self._start_fetch(ref._id, e.owner)
        self._post(on_io)
        return fut

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
        task.state = WAITING_ARGS
        waiting = 0
        entries = self.objects.entries
        for dep in task.spec.deps:
            e = entries.get(dep.object_id)
            if e is None:
                self._fail_task(task, exc.ObjectFreedError(dep.object_id.hex(), "an argument was freed"))
                return
            with self.objects.lock:
                if e.state == PENDING:
                    waiting += 1
                    if e.callbacks is None:
                        e.callbacks = []
                    e.callbacks.append(lambda entry, t=task: self._dep_ready(t))
                    if not e.owned and not e.fetching and e.owner is not None:
                        e.fetching = True
                        self._start_fetch(dep.object_id, e.owner)
        task.deps_waiting = waiting
        if waiting == 0:
            self._deps_done(task)

    def _dep_ready(self, task: PendingTask) -> None:
        task.deps_waiting -= 1
        if task.deps_waiting == 0 and task.state == WAITING_ARGS:
            self._deps_done(task)

    def _deps_done(self, task: PendingTask) -> None:
        if task.cancelled:
            return
        entries = self.objects.entries
        if self.dead_nodes and self._rebuild_lost_deps(task):
            return
        for dep in task.spec.deps:
            e = entries.get(dep.object_id)
            if e is None:
                self._fail_task(task, exc.ObjectFreedError(dep.object_id.hex(), "an argument was freed"))
                return
            if e.state == FAILED or (e.data is not None and ser.kind_of(e.data) == ser.KIND_ERROR):
                self._fail_task_with_blob(task, e.data or error_blob(exc.ObjectLostError(dep.object_id.hex())))
                return
            dep.data = e.data
            dep.node_id = e.node_id
            if e.owned:
                e.shared = True
        self._enqueue(task)

    def _rebuild_lost_deps(self, task: PendingTask) -> bool:
        """Arguments owned here whose only copy died with its node are rebuilt from their
        lineage before the task runs. True when the task now waits for them (or failed)."""
        entries = self.objects.entries
        lost = []
        for dep in task.spec.deps:
            e = entries.get(dep.object_id)
            if _stored_on(e, self.dead_nodes):
                lost.append((dep.object_id, e.node_id))
        if not lost:
            return False
        for oid, node in lost:
            why = self._reconstruct(oid, node)
            if why is not None:
                self._fail_task(task, exc.ObjectLostError(
                    oid.hex(), f"an argument of {task.spec.name} was lost with node {short(node)}, and it "
                    f"cannot be rebuilt: {why}"))
                return True
        self._resolve_deps(task)
        return True

    # -------------------------------------------------------------- io thread: scheduling

    def _enqueue(self, task: PendingTask, front: bool = False) -> None:
        if task.spec.kind == 2:
            self.actor_submitter.enqueue(task)
            return
        key = task.template.key
        q = self._queues.get(key)
        if q is None:
            q = self._queues[key] = SchedulingQueue(key, task.template)
        task.state = QUEUED
        task.queue = q
        if front:
            q.tasks.appendleft(task)
        else:
            q.tasks.append(task)
        self._pump(q)

    def _pump(self, q: SchedulingQueue) -> None:
        # Pipelining hides the round trip for short tasks; long or unknown ones go one per
        # worker so a slow task never holds others back while a worker idles.
        mean = q.mean_exec_s
        depth = (self.config.max_tasks_in_flight_per_worker
                 if mean is not None and mean * 1000 < self.config.pipeline_below_ms else 1)
        tasks = q.tasks
        while tasks:
            best = None
            for lease in q.leases:
                if lease.conn is not None and not lease.dead and not lease.blocked and not lease.exiting \
                        and len(lease.tasks) < depth and (
                        best is None or len(lease.tasks) < len(best.tasks)):
                    best = lease
                    if not lease.tasks:
                        break
            if best is None:
                break
            task = tasks.popleft()
            if task.cancelled:
                continue
            self._push(task, best)
        if tasks:
            usable = sum(1 for l in q.leases if not l.dead and not l.exiting)
            want = min(len(tasks), self.config.max_pending_lease_requests,
                       self.config.max_leases_per_scheduling_key - usable)
            if q.requesting < want and self._idle_leases:
                # Workers this process holds idle for other functions would keep this one's
                # request waiting until they time out (issue 14: after a burst of f, the
                # first g waited ~1.2 s): give them back first.
                for idle in [l for l in self._idle_leases if l.queue is not q]:
                    self._return_lease(idle, disconnect=False)
            while q.requesting < want:
                q.requesting += 1
                self._spawn(self._request_lease(q), "lease")

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
        except (ConnectionLost, OSError, TimeoutError) as e:
            q.requesting -= 1
            if not at_local and not self._closed and self.gone is None:
                # Another node's raylet went away (or was declared dead) while it held the
                # request: ask again from here.
                logger.info("lease request for %s at another node failed (%s); asking again",
                            t.function_name, e)
                if self.loop is not None:
                    self.loop.call_later(0.1, self._pump, q)
                return
            if not self._closed:
                logger.warning("lease request for %s failed: %s", t.function_name, e)
                for task in list(q.tasks):
                    q.tasks.remove(task)
                    self._fail_task(task, exc.LumosSystemError(f"could not lease a worker: {e}"))
            return
        except RemoteError as e:
            q.requesting -= 1
            if not self._closed:
                logger.warning("lease request for %s failed: %s", t.function_name, e)
                for task in list(q.tasks):
                    q.tasks.remove(task)
                    self._fail_task(task, exc.LumosSystemError(f"could not lease a worker: {e}"))
            return
        q.requesting -= 1
        lease = LeasedWorker(grant, q, raylet)
        q.leases.append(lease)
        try:
            lease.conn = await self._peer(grant.worker_address)
        except (OSError, ConnectionLost, TimeoutError) as e:
            logger.warning("cannot reach leased worker %s: %s", short(grant.worker_id), e)
            self._lease_failed(lease)
            return
        if not q.tasks:
            # Granted after its tasks went to other workers: keeping it idle would hold a
            # worker (and a later request queued behind it at the raylet) for nothing.
            self._return_lease(lease, disconnect=False)
            return
        self._pump(q)

    async def _raylet_at(self, address: m.Address) -> Connection:
        """The raylet a spillback named: the local one, or a shared TCP connection to another node's."""
        if address.node_id == self.node_id and self.raylet is not None:
            return self.raylet
        return await self._peer(m.Address(address.node_id, b"raylet:" + address.node_id, "",
                                          address.host, address.port))

    def _push(self, task: PendingTask, lease: LeasedWorker) -> None:
        task.state = PUSHED
        task.lease = lease
        lease.tasks[task.spec.task_id] = task
        if lease.idle_timer is not None:
            lease.idle_timer.cancel()
            lease.idle_timer = None
            self._idle_leases.discard(lease)
        spec = task.spec
        if spec.enable_task_events:
            self._events.append((spec.task_id, spec.attempt, "SCHEDULED", time.time(),
                                 {"resource_ids": lease.resource_ids} if lease.resource_ids else None,
                                 lease.node_id, lease.worker_id, None))
        assert lease.conn is not None
        lease.conn.notify(m.PushTask(spec, lease.resource_ids))

    def _start_idle_timer(self, lease: LeasedWorker) -> None:
        if lease.idle_timer is None and self.loop is not None:
            lease.idle_timer = self.loop.call_later(self.config.lease_idle_timeout_ms / 1000,
                                                    self._idle_expired, lease)
            self._idle_leases.add(lease)

    def _idle_expired(self, lease: LeasedWorker) -> None:
        lease.idle_timer = None
        self._idle_leases.discard(lease)
        if not lease.tasks and not lease.queue.tasks:
            self._return_lease(lease, disconnect=False)

    def _return_lease(self, lease: LeasedWorker, disconnect: bool) -> None:
        q = lease.queue
        if lease in q.leases:
            q.leases.remove(lease)
        self._idle_leases.discard(lease)
        if lease.idle_timer is not None:
            lease.idle_timer.cancel()
            lease.idle_timer = None
        if lease.dead:
            return  # returned already (a worker that said it exits, then closed)
        lease.dead = True
        if not lease.raylet.is_closed:
            lease.raylet.notify(m.ReturnWorker(lease.lease_id, disconnect))

    def _lease_failed(self, lease: LeasedWorker) -> None:
        self._return_lease(lease, disconnect=True)
        self._pump(lease.queue)

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
        for q in list(self._queues.values()):
            for lease in list(q.leases):
                if lease.conn is conn:
                    self._worker_failed(lease)
        node = self._node_of_conn.pop(conn, None)
        self.actor_submitter.connection_lost(
            conn, f"its node {short(node)} was declared dead" if node else "the actor's connection dropped")

    def _node_died(self, node_id: bytes) -> None:
        """The GCS declared ``node_id`` dead (io thread). It may only be frozen or cut off,
        not crashed: act exactly as if every connection to it had closed (tasks and actor
        calls in flight there are retried per their policy, its leases are given up), and
        close those connections, so nothing more it sends is taken (gray failure, issue 12).
        """
        if node_id in self.dead_nodes:
            return
        self.dead_nodes.add(node_id)
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
        for q in list(self._queues.values()):
            for lease in list(q.leases):
                if lease.node_id == node_id and (lease.conn is None or lease.conn.is_closed):
                    self._worker_failed(lease)
        self.actor_submitter.node_died(node_id)

    def _worker_failed(self, lease: LeasedWorker) -> None:
        """The connection to a leased worker dropped: its in-flight tasks failed (or, from
        a worker that said it exits, never ran: they are queued again, using no retry)."""
        in_flight = list(lease.tasks.values())
        lease.tasks.clear()
        self._return_lease(lease, disconnect=True)
        if in_flight and lease.exiting:
            for task in reversed(in_flight):
                if task.state != DONE:
                    task.lease = None
                    task.state = QUEUED
                    lease.queue.tasks.appendleft(task)
        elif in_flight:
            self._spawn(self._handle_worker_death(lease, in_flight), "worker-death")
        self._pump(lease.queue)

    async def _handle_worker_death(self, lease: LeasedWorker, tasks: list[PendingTask]) -> None:
        cause = None
        if lease.node_id in self.dead_nodes:
            cause = "its node was declared dead by the GCS"
        else:
            try:
                cause = await lease.raylet.call(m.GetWorkerExit(lease.worker_id, 2.0), 5.0)
            except (ConnectionLost, TimeoutError, RemoteError):
                pass
        for task in tasks:
            if task.state == DONE:
                continue
            if task.force_cancelled or task.cancelled:
                self._fail_task(task, exc.TaskCancelledError(task.spec.task_id.hex(), "force-cancelled"))
                continue
            name = task.spec.name
            text = (f"worker {short(lease.worker_id)} on node {short(lease.node_id)} died"
                    f" ({cause or 'cause unknown'}) while running {name}()")
            oom = cause is not None and OOM_KILL_REASON in cause
            if task.retries_left != 0:
                if task.retries_left > 0:
                    task.retries_left -= 1
                if oom:  # memory is short now: give it time to recover before running again
                    delay = self.config.task_oom_retry_delay_base_ms / 1000 * 2 ** min(task.spec.attempt, 5)
                    self._spawn(self._retry_later(task, text, delay), "oom-retry")
                else:
                    self._retry(task, text)
            else:
                tries = task.template.max_retries
                self._fail_task(task, (exc.OutOfMemoryError if oom else exc.WorkerCrashedError)(
                    f"{text}. " + (f"Retried {tries} times (max_retries={tries})." if tries > 0 else
                                   "Not retried (max_retries=0).")))

    async def _retry_later(self, task: PendingTask, why: str, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        if task.state == DONE:
            return
        if task.force_cancelled or task.cancelled:
            self._fail_task(task, exc.TaskCancelledError(task.spec.task_id.hex(), "cancelled"))
            return
        self._retry(task, why)

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
        if reply.error_kind == "requeue" and task.spec.kind == 0 and lease is not None:
            # The worker blocked in get() with this task queued behind: run it elsewhere.
            lease.tasks.pop(reply.task_id, None)
            lease.blocked = True
            task.lease = None
            task.state = QUEUED
            lease.queue.tasks.appendleft(task)
            self._pump(lease.queue)
            return
        if lease is not None:
            lease.tasks.pop(reply.task_id, None)
            lease.blocked = False
            q = lease.queue
            took = reply.end_time - reply.start_time
            q.mean_exec_s = took if q.mean_exec_s is None else 0.8 * q.mean_exec_s + 0.2 * took
        if task.spec.kind == 2:
            self.actor_submitter.on_reply(task, reply)
        if reply.error_kind == "exiting" and lease is not None:
            # The worker reached max_calls and exits after this reply: push nothing more to
            # it. Tasks already pushed come back requeued, or are requeued when it closes.
            lease.exiting = True
        if reply.system_error is not None:
            if reply.error_kind == "cancelled" or task.cancelled:
                self._fail_task(task, exc.TaskCancelledError(task.spec.task_id.hex(), reply.system_error))
            elif reply.error_kind == "actor_died":
                self._fail_task(task, exc.ActorDiedError((task.spec.actor_id or b"").hex(), reply.system_error))
            else:
                self._fail_task(task, exc.LumosSystemError(reply.system_error))
        elif reply.app_error and reply.retryable and task.retries_left != 0 and not task.cancelled:
            if task.retries_left > 0:
                task.retries_left -= 1
            self._free_orphan_returns(reply)
            self._retry(task, "the task raised a retryable exception")
        else:
            self._finish_task(task, reply)
        if lease is not None and not lease.dead:
            if not lease.tasks and not lease.queue.tasks and not lease.exiting:
                self._start_idle_timer(lease)
            self._pump(lease.queue)

    def _executor_of(self, task: PendingTask) -> bytes | None:
        """The worker running ``task``'s current attempt (None: unknown)."""
        if task.spec.kind == 2:
            return self.actor_submitter.worker_of(task)
        return task.lease.worker_id if task.lease is not None else None

    # -------------------------------------------------------------- io thread: streams

    def _handle_generator_item(self, conn: Connection, msg: m.GeneratorItem) -> None:
        ret = msg.item
        if type(msg.index) is not int or msg.index < 0 or type(ret) is not m.ReturnObject \
                or type(msg.task_id) is not bytes or len(msg.task_id) != TASK_ID_SIZE \
                or ret.object_id != return_object_id(msg.task_id, msg.index + 1) \
                or (ret.data is None) == (ret.node_id is None) or type(ret.size) is not int \
                or not isinstance(ret.data or ret.node_id, bytes) or type(ret.nested_refs) is not list \
                or not all(type(r) is list and len(r) == 2 and type(r[0]) is bytes and type(r[1]) is m.Address
                           for r in ret.nested_refs):
            raise ValueError("malformed GeneratorItem")
        task = self.tasks.get(msg.task_id)
        stream = self.streams.get(msg.task_id)
        if task is None or task.state == DONE:
            self._free_orphan_items([ret])
        elif stream is not None:
            self._stream_item(stream, msg.index, ret)
        else:  # a finished stream run again from its lineage: refill the values lost
            e = self.objects.entries.get(ret.object_id)
            if e is not None and e.state == PENDING:
                self._complete_item(ret)
            else:
                self._free_orphan_items([ret])

    def _stream_item(self, stream: GeneratorStream, index: int, ret: m.ReturnObject) -> None:
        """A streaming task's value number ``index`` arrived (io thread)."""
        if stream.dropped:
            self._free_orphan_items([ret])
            return
        if index != stream.count:
            return  # sent again by a retried run (the first copy stays), or out of order
        with self.objects.lock:
            self.objects.add_owned(ret.object_id)  # the stream's count, handed to the user's ref
        self._complete_item(ret)
        with stream.cond:
            stream.count = index + 1
            stream.cond.notify_all()

    def _complete_item(self, ret: m.ReturnObject) -> None:
        """Record a streamed value in its (owned) entry and wake who waits for it."""
        objects = self.objects
        nested = [(r[0], r[1]) for r in ret.nested_refs] if ret.nested_refs else None
        if nested:
            objects.add_contained(nested, registered=True)
        e = objects.complete(ret.object_id, READY, ret.data, ret.node_id, ret.size, nested)
        if e is not None:
            e.shared = True
            self._run_callbacks(ret.object_id, e)

    def _end_stream(self, task: PendingTask, error_blob: bytes | None = None) -> GeneratorStream | None:
        """A streaming task ended; an error becomes the value after the last one (io thread)."""
        stream = self.streams.pop(task.spec.task_id, None)
        if stream is None:
            return None
        if error_blob is not None:
            oid = return_object_id(task.spec.task_id, stream.count + 1)
            self._stream_item(stream, stream.count, m.ReturnObject(oid, error_blob, len(error_blob), None, []))
        with stream.cond:
            stream.finished = True
            stream.cond.notify_all()
        return stream

    def drop_stream(self, stream: GeneratorStream) -> None:
        """The user's generator went away: release the values it did not take (io thread).
        A running task's later values are freed as they arrive (``dropped``)."""
        with stream.cond:
            stream.dropped = True
            untaken = range(stream.taken, stream.count)
            stream.taken = stream.count
        for index in untaken:
            self.objects.decrements.append(return_object_id(stream.task_id, index + 1))
        self.drain_refs()

    def _free_orphan_items(self, returns: list[m.ReturnObject]) -> None:
        ids = [r.object_id for r in returns if r.data is None and r.node_id is not None
               and r.object_id not in self.objects.entries]
        if ids and self.raylet is not None:
            self.raylet.notify(m.FreeObjects(ids, [False] * len(ids)))

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

    def _finish_stream(self, task: PendingTask, reply: m.TaskReply) -> None:
        task.state = DONE
        self.tasks.pop(task.spec.task_id, None)
        # The error that ended it, if any, becomes the value after the last one delivered
        # (a retried run may fail before reaching the values an earlier run sent).
        error = reply.returns[0].data if reply.app_error and reply.returns else None
        stream = self._end_stream(task, error)
        info = None
        if stream is not None:  # (None: a lineage re-run; its values were completed as they came)
            ids = [return_object_id(task.spec.task_id, i + 1) for i in range(stream.count)]
            # The values it made, for the task graph and the state API (the first ones only:
            # a graph of more would not be read), and for lineage (short streams only).
            info = {"returns": ids[:STREAM_IDS_IN_EVENTS]}
            task.return_ids = ids if len(ids) <= STREAM_LINEAGE_MAX_VALUES else []
        if not reply.app_error and task.retries_left != 0:
            self._keep_lineage(task)
        self._task_done(task, reply, info)

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
        """Keep a finished task that can run again while its stored values are referenced
        (inline values live here: nothing to rebuild)."""
        entries = self.objects.entries
        for oid in task.return_ids:
            e = entries.get(oid)
            if e is not None and e.data is None and e.node_id is not None:
                break
        else:
            return
        size = _lineage_size(task)
        if self._lineage_bytes + size > LINEAGE_MAX_BYTES:
            return
        self.lineage[task.spec.task_id] = task
        self._lineage_bytes += size

    def _drop_lineage(self, task_ids: list[bytes]) -> None:
        """Returns of these tasks were freed: once none is left, forget the task and let
        its arguments go."""
        entries = self.objects.entries
        for tid in task_ids:
            task = self.lineage.get(tid)
            if task is None or any(oid in entries for oid in task.return_ids):
                continue
            del self.lineage[tid]
            self._lineage_bytes -= _lineage_size(task)
            self._release_args(task)

    def _reconstruct(self, oid: bytes, lost_node: bytes | None) -> str | None:
        """Run again the task that made ``oid`` (owned here), lost with node ``lost_node``.

        Returns None once the new run is under way (or already was), else why it cannot.
        Arguments of the task that were lost on the same node are rebuilt first.
        """
        e = self.objects.entries.get(oid)
        if e is None:
            return "no reference to it is held here"
        if e.state == PENDING:
            return None  # already being rebuilt
        tid = task_id_of(oid)
        task = self.lineage.get(tid)
        if task is None:
            if is_put_object(oid):
                return "it was stored with put(), which has no lineage"
            return ("the task that made it cannot run again (max_retries=0, retries used up, or "
                    "its lineage was not kept)")
        entries = self.objects.entries
        for dep_id in task.dep_ids:
            if lost_node is not None and _stored_on(entries.get(dep_id), (lost_node,)):
                why = self._reconstruct(dep_id, lost_node)
                if why is not None:
                    return f"its argument {short(dep_id)} was lost too and {why}"
        del self.lineage[tid]
        self._lineage_bytes -= _lineage_size(task)
        if task.retries_left > 0:
            task.retries_left -= 1
        for rid in task.return_ids:
            self.objects.reset_pending(rid)
        self._next_attempt(task, f"lineage reconstruction: its value was lost with node {short(lost_node or b'')}")
        task.cancelled = task.force_cancelled = False
        self.tasks[task.spec.task_id] = task
        if task.dep_ids:
            self._resolve_deps(task)
        else:
            self._enqueue(task)
        return None

    def _release_args(self, task: PendingTask) -> None:
        if task.spec.task_id in self.lineage:
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
        if task.lease is not None:
            task.lease.tasks.pop(task.spec.task_id, None)
        if task.queue is not None and task in task.queue.tasks:
            task.queue.tasks.remove(task)
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
        elif msg.channel == "worker_deaths" and isinstance(msg.data, m.WorkerInfo) and msg.data.state == "DEAD":
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

    def describe_object(self, oid: bytes) -> dict[str, Any]:
        e = self.objects.entries.get(oid)
        if e is None:
            return {"state": "unknown"}
        state = {PENDING: "pending", READY: "ready", FAILED: "failed"}[e.state]
        return {"state": state, "size": e.size, "owned": e.owned,
                "owner": (e.owner.worker_id.hex() if e.owner else self.worker_id.hex()),
                "node_id": (e.node_id or (self.node_id if e.data is not None else b"")).hex(),
                "inline": e.data is not None}

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

