"""The client side of client mode: ``ClientWorker`` stands in for the core worker.

``lumos.init("lumos://HOST:PORT")`` installs a ``ClientWorker`` as the process's core
worker; the public API (``api``, ``remote_function``, ``actor``, ``object_ref``) calls
it as it would call a ``CoreWorker``, and it forwards each call over the link to the
client's session on the head (``session.py``), which runs it on a real driver.

Threads: the caller's (requests wait for their reply in short slices, so Ctrl-C
works), ``lumos-client.reader`` (replies, worker output), ``lumos-client.heartbeat``
(pings; sends the ref releases that ``ObjectRef.__del__`` queued; sends again a press
that landed in a finalizer, ``interrupts.set_later``) and, after a broken link,
``lumos-client.reconnect``.

The stop button (a ``KeyboardInterrupt`` in the caller's thread) gets through only
while a request waits for its reply (``_call``): a message is always sent whole (a
press midway left half a frame on the link, and the session dropped it), and what the
reply of a request its caller left gives (refs, an actor) is let go when it comes
(``_abandon``).
"""

from __future__ import annotations

import collections
import concurrent.futures
import itertools
import logging
import os
import pickle
import socket
import threading
import time
from typing import Any, Callable

from lumos._private import interrupts, metrics
from lumos._private import serialization as ser
from lumos._private.client import wire
from lumos._private.config import Config
from lumos._private.ids import random_id
from lumos._private.protocol import auth
from lumos._private.protocol.framing import ProtocolError
from lumos.object_ref import ObjectRef

logger = logging.getLogger(__name__)

SCHEME = "lumos://"
#: The link's reader thread (replies, worker output, future callbacks run on it).
_READER = "lumos-client.reader"


#: Requests whose replies give the client refs or an actor.
_GIVING = frozenset(("submit", "put", "create_actor"))


def parse_client_address(address: str) -> tuple[str, int]:
    """``lumos://HOST:PORT`` -> (host, port). Raises ``ValueError`` naming the expected form."""
    rest = address[len(SCHEME):]
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"a client address looks like lumos://HOST:PORT (the `client address` that "
                         f"`lumos start --head` printed), got {address!r}")
    return host.strip("[]"), int(port)


def client_token(token_arg: str | None) -> bytes:
    """The cluster token from ``_token`` (the token, or a path to the token file),
    ``LUMOS_CLUSTER_TOKEN`` or ``LUMOS_CLUSTER_TOKEN_FILE``."""
    text = token_arg or os.environ.get("LUMOS_CLUSTER_TOKEN")
    path = None
    if text and os.path.isfile(os.path.expanduser(text)):
        path = os.path.expanduser(text)
    elif not text and os.environ.get("LUMOS_CLUSTER_TOKEN_FILE"):
        path = os.path.expanduser(os.environ["LUMOS_CLUSTER_TOKEN_FILE"])
    if path is not None:
        try:
            with open(path, "rb") as f:
                return f.read(4096).strip()
        except OSError as e:
            raise ConnectionError(f"cannot read the cluster token file {path}: {e}") from None
    if not text:
        raise ConnectionError("client mode needs the cluster token: pass _token=TOKEN or _token=PATH (a copy of "
                              "the head's token file, printed by `lumos start --head`), or set LUMOS_CLUSTER_TOKEN "
                              "or LUMOS_CLUSTER_TOKEN_FILE")
    return text.strip().encode()


class _Refs:
    """What ``ObjectRef`` touches on its core worker: counts go to the session in batches."""

    def __init__(self) -> None:
        #: Stand-ins collected (``ObjectRef.__del__`` appends, from any thread).
        self.decrements: list[bytes] = []
        #: Stand-ins copied (``copy.copy(ref)``).
        self.increments: list[bytes] = []
        #: The client owns nothing itself (``api.cancel`` looks here).
        self.entries: dict[bytes, Any] = {}

    def ref_created(self, object_id: bytes, owner: Any, worker_id: bytes) -> None:
        self.increments.append(object_id)


class _ActorCalls:
    """What ``actor.py`` calls on ``core_worker.actor_submitter``."""

    def __init__(self, cw: "ClientWorker") -> None:
        self._cw = cw

    def release_handle(self, actor_id: bytes) -> None:
        self._cw._one_way({"op": "actor_release", "actor_id": actor_id})

    def track(self, actor_id: bytes, info: Any) -> None:
        self._cw._one_way({"op": "actor_track", "actor_id": actor_id, "info": pickle.dumps(info)})

    def reserve_call(self, actor_id: bytes, limit: int) -> bool:
        return bool(self._cw._call({"op": "reserve_call", "actor_id": actor_id, "limit": limit})[0]["value"])

    def pending_calls(self, actor_id: bytes) -> int:
        return int(self._cw._call({"op": "pending_calls", "actor_id": actor_id})[0]["value"])


def _take(lst: list[Any]) -> list[Any]:
    n = len(lst)
    out = lst[:n]
    del lst[:n]
    return out


class ClientWorker:
    """A driver's core worker whose work runs in its session on the head."""

    #: ``ObjectRef.__del__`` wakes an idle flush loop; the client sends its counts in batches.
    _flush_idle = False

    def __init__(self, config: Config, address: str, token: bytes, namespace: str,
                 runtime_env: dict[str, Any] | None, job_metadata: dict[str, str] | None = None) -> None:
        self.config = config
        self.client_address = address
        self.host, self.port = parse_client_address(address)
        #: How errors name the head.
        self.head = f"{self.host}:{self.port}"
        self.token = token
        self._namespace_wanted = namespace
        self._runtime_env = runtime_env
        #: ``JobConfig(metadata=...)``: the session's driver registers its job with it.
        self._job_metadata = job_metadata
        self.client_id = random_id(16).hex()
        self.objects = _Refs()
        self.actor_submitter = _ActorCalls(self)
        self.tasks: dict[bytes, Any] = {}
        self.executor: Any = None
        self.current_actor_id: bytes | None = None
        self.current_task_name = ""
        self.current_resource_ids: dict[str, Any] = {}
        self.capture_strategy: Any = None
        self.inherited_env: dict[str, str] | None = None
        self.job_env_vars = dict((runtime_env or {}).get("env_vars") or {})
        self.raylet: Any = None
        from lumos._private.core_worker.driver import print_cluster_error, print_worker_lines
        self.log_handler: Callable[[list[Any]], None] = print_worker_lines
        self.error_handler: Callable[[str, str], None] = print_cluster_error
        self.last_log_at = 0.0
        self._closed = False
        self._ids = itertools.count(1)
        self._pending: dict[int, concurrent.futures.Future[Any]] = {}
        #: Ids of pending requests whose replies give refs or an actor (submit, put, create_actor).
        self._giving: set[int] = set()
        #: Such requests whose replies the link's break lost: named in the next hello, so
        #: the session releases what they gave.
        self._unanswered: list[int] = []
        self._send_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._connected = threading.Event()
        #: Why the session is gone for good (set once reconnecting failed), else None.
        self.gone: str | None = None
        self._reconnect_until = 0.0
        #: How long the session waits for a reconnect (the head's setting, from its welcome).
        self.grace_s = config.client_reconnect_grace_s
        self._lost_why = ""
        #: id(template) -> (template, the id the session knows it by).
        self._templates: dict[int, tuple[Any, int]] = {}
        self._template_ids = itertools.count(1)
        self._stop = threading.Event()
        self.welcome: dict[str, Any] = {}
        #: Jobs for the heartbeat thread's next turn (``_later``).
        self._later_jobs: collections.deque[Callable[[], None]] = collections.deque()

    # ------------------------------------------------------------------ link

    def start(self) -> None:
        from lumos import object_ref as object_ref_mod
        self.welcome = self._open(resume=False)
        w = self.welcome
        self.job_id: bytes = w["job_id"]
        self.worker_id: bytes = w["worker_id"]
        self.node_id: bytes = w["node_id"]
        self.node_ip: str = w["node_ip"]
        self.namespace: str = w["namespace"]
        self.session_dir: str = w["session_dir"]
        self.gcs_address: str = w["gcs_address"]
        self.address = pickle.loads(w["owner"])
        self.current_task_id = b"\0" * 16
        self.grace_s = float(w["grace_s"])
        object_ref_mod._core_worker = self
        threading.Thread(target=self._heartbeat, name="lumos-client.heartbeat", daemon=True).start()
        interrupts.set_later(self._later)

    def _later(self, fn: Callable[[], None]) -> bool:
        """``fn`` on the heartbeat thread at its next turn (within 50 ms: ``interrupts``'
        resend of a press that landed in a finalizer); False once closed."""
        if self._closed:
            return False
        self._later_jobs.append(fn)
        return True

    def _open(self, resume: bool) -> dict[str, Any]:
        """Connect, authenticate, say hello, read the welcome; starts the reader."""
        timeout_s = self.config.connect_timeout_s
        try:
            sock = socket.create_connection((self.host, self.port), timeout=timeout_s)
        except OSError as e:
            raise ConnectionError(f"cannot reach the lumos head at {self.head}: {e}") from None
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            wire.client_handshake(sock, self.token, timeout_s)
            unanswered = list(self._unanswered)
            hello = {"op": "hello", "client_id": self.client_id, "resume": resume, "unanswered": unanswered,
                     "wire": auth.WIRE_VERSION,
                     "namespace": self._namespace_wanted,
                     "runtime_env": pickle.dumps(self._runtime_env) if self._runtime_env else None,
                     "job_metadata": self._job_metadata}
            sock.settimeout(timeout_s + 60)  # a new session starts a driver first
            wire.send(sock, hello)
            welcome, _ = wire.recv(sock)
        except (OSError, ProtocolError) as e:
            sock.close()
            what = "refused the cluster token" if "token" in str(e) or isinstance(e, ConnectionResetError) else ""
            raise ConnectionError(f"the lumos head at {self.head} {what or 'did not complete the handshake'}: "
                                  f"{e or type(e).__name__}") from None
        if welcome.get("op") != "welcome":
            sock.close()
            raise ConnectionError(f"the lumos head at {self.head} refused this client: "
                                  f"{welcome.get('message', welcome.get('op'))}")
        sock.settimeout(self.config.client_heartbeat_timeout_s)
        with self._state_lock:
            if self._closed:  # shut down while this reconnect was under way
                sock.close()
                raise ConnectionError("lumos was shut down in this process")
            del self._unanswered[:len(unanswered)]
            self._sock = sock
            self._connected.set()
        threading.Thread(target=self._read, args=(sock,), name=_READER, daemon=True).start()
        return welcome

    def _read(self, sock: socket.socket) -> None:
        why = "the head closed the connection"
        try:
            self._read_replies(sock)
        except TimeoutError:
            why = f"no answer for {self.config.client_heartbeat_timeout_s:g}s"
        except ProtocolError as e:
            why = f"bad message: {e}"
        except (OSError, ConnectionError) as e:
            why = str(e) or type(e).__name__
        except BaseException as e:
            why = f"the reader failed: {e!r}"
            raise
        finally:
            self._lost(sock, why)

    def _read_replies(self, sock: socket.socket) -> None:
        while True:
            control, payload = wire.recv(sock)
            op = control["op"]
            if op == "reply":
                fut = self._pending.pop(control.get("id"), None)
                self._giving.discard(control.get("id"))
                if fut is not None:
                    try:
                        fut.set_result((control, payload))
                    except concurrent.futures.InvalidStateError:
                        pass  # cancelled by its caller
            elif op == "logs":
                self.last_log_at = time.monotonic()
                try:
                    self.log_handler(pickle.loads(control["data"]))
                except Exception:
                    logger.exception("worker output handler failed")
            elif op == "error_event":
                try:
                    self.error_handler(control["kind"], control["text"])
                except Exception:
                    logger.exception("error event handler failed")

    def _lost(self, sock: socket.socket, why: str) -> None:
        with self._state_lock:
            if self._sock is not sock:  # already replaced or shut down: only make sure it is closed
                sock.close()
                return
            self._sock = None
            self._connected.clear()
            self._lost_why = why
            self._reconnect_until = time.monotonic() + self.grace_s
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        sock.close()
        error = ConnectionError(f"lost the connection to the lumos head at {self.head} ({why}); "
                                f"reconnecting for up to {self.grace_s:g}s")
        for rid in list(self._pending):
            fut = self._pending.pop(rid, None)
            if rid in self._giving:
                self._giving.discard(rid)
                self._unanswered.append(rid)
            if fut is not None and not fut.done():
                fut.set_exception(error)
        if self._closed:
            return
        logger.warning("%s", error)
        threading.Thread(target=self._reconnect, name="lumos-client.reconnect", daemon=True).start()

    def _reconnect(self) -> None:
        last = ""
        while not self._stop.is_set() and time.monotonic() < self._reconnect_until:
            try:
                self._open(resume=True)
                logger.info("reconnected to the lumos head at %s", self.head)
                return
            except ConnectionError as e:
                last = str(e)
                if "refused this client" in last:
                    break
            self._stop.wait(0.5)
        self.gone = (f"the connection to the lumos head at {self.head} was lost ({self._lost_why}) and could not "
                     f"be re-established ({last or 'gave up'}); this client's session, objects and actors are "
                     "gone: call lumos.shutdown() and lumos.init() again")

    def _heartbeat(self) -> None:
        interval = self.config.client_heartbeat_interval_s
        next_ping = 0.0
        #: Application metrics go with the heartbeat's turn, once per report interval.
        metrics_interval = self.config.metrics_report_interval_ms / 1000
        next_metrics = 0.0
        jobs = self._later_jobs
        while not self._stop.wait(0.05):
            while jobs:
                try:
                    jobs.popleft()()
                except Exception:
                    logger.exception("client job failed")
            sock = self._sock
            if sock is None:
                continue
            try:
                self._flush_refs(sock)
                if metrics.BUFFER.pending() and time.monotonic() >= next_metrics:
                    next_metrics = time.monotonic() + metrics_interval
                    rows = metrics.BUFFER.take()
                    try:
                        with self._send_lock:
                            wire.send(sock, {"op": "metrics", "rows": rows})
                    except OSError:
                        metrics.BUFFER.put_back(rows)
                        raise
                if time.monotonic() >= next_ping:
                    next_ping = time.monotonic() + interval
                    with self._send_lock:
                        wire.send(sock, {"op": "ping"})
            except OSError as e:
                self._lost(sock, f"send failed: {e}")

    def _flush_refs(self, sock: socket.socket) -> None:
        inc = _take(self.objects.increments)
        dec = _take(self.objects.decrements)
        if inc or dec:
            with self._send_lock:
                if inc:
                    wire.send(sock, {"op": "incref", "ids": inc})
                if dec:
                    wire.send(sock, {"op": "release", "ids": dec})

    def _link(self) -> socket.socket:
        """The live link, waiting for a reconnect in progress. Raises ``ConnectionError``."""
        if self._closed:
            raise ConnectionError("lumos was shut down in this process; call lumos.init() again")
        while True:
            sock = self._sock
            if sock is not None:
                return sock
            if self.gone is not None:
                raise ConnectionError(self.gone)
            left = self._reconnect_until - time.monotonic()
            if left <= 0 and self.gone is None:
                left = 1.0  # the reconnect thread is about to give its verdict
            with interrupts.Window():  # (nothing sent yet: the stop button works while a reconnect goes on)
                self._connected.wait(min(left, 0.1))

    def _send(self, control: dict[str, Any], payload: wire.Payload | None = None) -> None:
        sock = self._link()
        try:
            self._flush_refs(sock)  # releases and copies go before what follows them
            with self._send_lock:
                wire.send(sock, control, payload)
        except OSError as e:
            self._lost(sock, f"send failed: {e}")
            raise ConnectionError(f"lost the connection to the lumos head at {self.head} ({e})") from None

    def _one_way(self, control: dict[str, Any]) -> None:
        try:
            self._send(control)
        except ConnectionError as e:
            logger.debug("dropped %s: %s", control["op"], e)

    def _call_async(self, control: dict[str, Any], payload: wire.Payload | None = None
                    ) -> concurrent.futures.Future[Any]:
        rid = next(self._ids)
        control["id"] = rid
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._pending[rid] = fut
        if control["op"] in _GIVING:
            self._giving.add(rid)
        # The stop button waits for the whole message (stopped midway, it left half a
        # frame on the link, which the session took for garbage and dropped).
        held = interrupts.hold()
        try:
            self._send(control, payload)
        except BaseException:
            self._pending.pop(rid, None)
            self._giving.discard(rid)
            if held:
                interrupts.release()
            raise
        if held:
            try:
                interrupts.release()
            except KeyboardInterrupt:
                self._abandon(fut, control)  # (sent: its reply comes all the same)
                raise
        return fut

    def _abandon(self, fut: concurrent.futures.Future[Any], control: dict[str, Any]) -> None:
        """The caller left before the reply (the stop button): what the reply gives (refs,
        an actor) is let go when it comes; kept, it lived as long as the session."""
        op = control["op"]
        if op not in _GIVING:
            return

        def let_go(f: concurrent.futures.Future[Any]) -> None:
            try:
                reply, _ = f.result()
            except BaseException:
                return  # (the link broke first: the session hears of it as it reconnects)
            if "error" in reply:
                return
            if op == "create_actor":
                self._one_way({"op": "actor_release", "actor_id": control["actor_id"]})
            else:
                self._refs_of(reply)  # made and dropped: released as any dropped ref

        fut.add_done_callback(let_go)

    def _call(self, control: dict[str, Any], payload: wire.Payload | None = None,
              make: Callable[[dict[str, Any]], Any] | None = None) -> tuple[dict[str, Any], Any]:
        """Send a request and wait for its reply: (reply, its payload), or (reply,
        ``make(reply)``) where ``make`` makes what the reply gives (refs)."""
        if threading.current_thread().name == _READER:
            raise RuntimeError("a blocking lumos call from a done-callback or output handler would wait for "
                               "the thread that delivers its own reply; hand the work to another thread")
        # The stop button: only the wait for the reply lets it through, and what the reply
        # gives is then let go when it comes (``_abandon``); else ``make`` makes the refs.
        held = interrupts.hold()
        try:
            fut = self._call_async(control, payload)
            try:
                with interrupts.Window():
                    while True:
                        try:
                            reply, data = fut.result(0.1)
                            break
                        except concurrent.futures.TimeoutError:
                            continue
            except BaseException:
                self._abandon(fut, control)
                raise
            if "error" in reply:
                raise pickle.loads(reply["error"])
            return reply, data if make is None else make(reply)
        finally:
            if held:
                interrupts.release()

    # ------------------------------------------------------------------ core worker surface

    def _template_fields(self, template: Any) -> dict[str, Any]:
        known = self._templates.get(id(template))
        if known is not None and known[0] is template:
            return {"tpl": known[1]}
        tid = next(self._template_ids)
        self._templates[id(template)] = (template, tid)
        return {"tpl": tid, "tpl_blob": pickle.dumps(template)}

    def _refs_of(self, reply: dict[str, Any]) -> list[ObjectRef]:
        return [ObjectRef(oid, self.address, True) for oid in reply["ids"]]

    def submit_task(self, template: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                    actor_fields: Any = None) -> list[Any]:
        if template.num_returns == -1:
            raise NotImplementedError("streaming generators (num_returns='streaming', or an actor method that "
                                      "yields) are not supported in client mode (lumos://); return a list, or "
                                      "run the driver on a node of the cluster")
        payload = wire.Payload()
        payload.add(ser.serialize((args, kwargs)))
        control = {"op": "submit", **self._template_fields(template)}
        if actor_fields is not None:
            control["actor"] = [actor_fields[0], actor_fields[1], actor_fields[3]]
        return self._call(control, payload, self._refs_of)[1]  # type: ignore[no-any-return]

    #: No registration runs in the background here: the server's create_actor waits for it.
    _registering: dict[bytes, Any] = {}

    def wait_registered(self, actor_id: bytes) -> None:
        """Nothing to wait for: ``create_actor`` returned after the registration."""

    def create_actor(self, template: Any, args: tuple[Any, ...], kwargs: dict[str, Any], actor_id: bytes,
                     options: dict[str, Any], wait: bool = True) -> Any:
        payload = wire.Payload()
        payload.add(ser.serialize((args, kwargs)))
        control = {"op": "create_actor", "actor_id": actor_id, "options": pickle.dumps(options),
                   **self._template_fields(template)}
        reply, _ = self._call(control, payload)
        return pickle.loads(reply["info"])

    def put(self, value: Any, *, _owner: Any = None) -> ObjectRef:
        if isinstance(value, ObjectRef):
            raise TypeError("put() of an ObjectRef is not allowed; pass the ref itself")
        payload = wire.Payload()
        payload.add(ser.serialize(value))
        return self._call({"op": "put"}, payload, self._refs_of)[1][0]  # type: ignore[no-any-return]

    def get(self, refs: list[ObjectRef], timeout: float | None) -> list[Any]:
        reply, data = self._call({"op": "get", "ids": [r._id for r in refs], "timeout": timeout})
        return [ser.deserialize(b)[1] for b in wire.blobs_of(reply, data)]

    def wait(self, refs: list[ObjectRef], num_returns: int, timeout: float | None,
             fetch_local: bool = True) -> tuple[list[ObjectRef], list[ObjectRef]]:
        reply, _ = self._call({"op": "wait", "ids": [r._id for r in refs], "num_returns": num_returns,
                               "timeout": timeout, "fetch_local": fetch_local})
        by_id = {r._id: r for r in refs}
        ready = [by_id[oid] for oid in reply["ready"]]
        done = set(reply["ready"])
        return ready, [r for r in refs if r._id not in done]

    def cancel(self, ref: ObjectRef, force: bool, recursive: bool) -> None:
        self._call({"op": "cancel", "ids": [ref._id], "force": force, "recursive": recursive})

    def call_gcs(self, msg: Any, timeout_s: float | None = None) -> Any:
        reply, _ = self._call({"op": "call_gcs", "msg": pickle.dumps(msg), "timeout": timeout_s})
        return pickle.loads(reply["value"])

    def call_raylet(self, msg: Any, timeout_s: float | None = None) -> Any:
        reply, _ = self._call({"op": "call_raylet", "msg": pickle.dumps(msg), "timeout": timeout_s})
        return pickle.loads(reply["value"])

    def future_of(self, ref: ObjectRef) -> concurrent.futures.Future[Any]:
        out: concurrent.futures.Future[Any] = concurrent.futures.Future()
        inner = self._call_async({"op": "get", "ids": [ref._id], "timeout": None})

        def done(f: concurrent.futures.Future[Any]) -> None:
            if out.cancelled():
                return
            try:
                reply, data = f.result()
                if "error" in reply:
                    out.set_exception(pickle.loads(reply["error"]))
                else:
                    out.set_result(ser.deserialize(wire.blobs_of(reply, data)[0])[1])
            except BaseException as e:
                out.set_exception(e)
        inner.add_done_callback(done)
        return out

    def describe_object(self, oid: bytes) -> dict[str, Any]:
        try:
            reply, _ = self._call({"op": "describe", "ids": [oid]})
        except ConnectionError:
            return {"state": "?"}
        return pickle.loads(reply["value"])  # type: ignore[no-any-return]

    def on_ref_deserialized(self, object_id: bytes, owner: Any) -> ObjectRef:
        return ObjectRef(object_id, owner, True)

    def _post(self, fn: Callable[..., Any], *args: Any) -> None:
        fn(*args)

    def _flush_events(self) -> None:
        # A request, not a one-way message: the session runs it after the submits sent
        # before it, and the GCS query that follows (``state.list_tasks``) runs on another
        # of its threads, which could otherwise overtake both.
        self._call({"op": "flush_events"})

    def report_metrics(self) -> None:
        """Send the application metrics recorded here (``lumos.util.metrics``) through the
        session, and wait until it passed them on (``lumos.state.metrics()`` asks next)."""
        rows = metrics.BUFFER.take()
        if rows:
            try:
                self._call({"op": "metrics", "rows": rows})
            except ConnectionError:
                metrics.BUFFER.put_back(rows)

    def drain_refs(self) -> None:
        sock = self._sock
        if sock is not None:
            try:
                self._flush_refs(sock)
            except OSError as e:
                self._lost(sock, f"send failed: {e}")

    def drop_stream(self, stream: Any) -> None:
        return None

    def _set_blocked(self, blocked: bool) -> None:
        return None

    def drain_at_exit(self, timeout_s: float, settle_s: float = 0.3) -> int:
        return 0

    def stats(self) -> dict[str, Any]:
        return {"client_mode": True, "head": self.head, "pending_requests": len(self._pending)}

    def run_sync(self, coro: Any, timeout_s: float | None = None) -> Any:
        coro.close()
        raise NotImplementedError("this call talks to cluster processes directly, which a client-mode "
                                  "(lumos://) driver cannot reach; run it on a node of the cluster")

    def shutdown(self) -> None:
        """Say goodbye (the session then ends at once, freeing what this client owned) and close."""
        from lumos import object_ref as object_ref_mod
        if self._closed:
            return
        try:
            self.report_metrics()  # what was recorded since the last heartbeat's report
        except Exception as e:  # the session may be gone already
            logger.debug("client metrics at shutdown: %s", e)
        with self._state_lock:
            self._closed = True  # before the bye: the head closing the link after it is no loss to reconnect
            self._stop.set()
            sock = self._sock
        if sock is not None:
            try:
                self._flush_refs(sock)
                with self._send_lock:
                    wire.send(sock, {"op": "bye"})
            except OSError:
                pass
        with self._state_lock:
            self._sock = None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
        for rid in list(self._pending):
            fut = self._pending.pop(rid, None)
            if fut is not None and not fut.done():
                fut.set_exception(ConnectionError("lumos was shut down in this process"))
        if object_ref_mod._core_worker is self:
            object_ref_mod._core_worker = None
        interrupts.unset_later(self._later)


def connect(config: Config, address: str, namespace: str, token_arg: str | None,
            runtime_env: dict[str, Any] | None, job_metadata: dict[str, str] | None = None) -> ClientWorker:
    """Connect to the head at ``lumos://HOST:PORT``; returns the started ``ClientWorker``.

    Raises:
        ValueError: a malformed address, or a runtime_env client mode cannot ship.
        ConnectionError: the head cannot be reached or refuses the token.
    """
    parse_client_address(address)
    if runtime_env and set(runtime_env) - {"env_vars"}:
        raise ValueError(f"client mode (lumos://) ships runtime_env env_vars only, got "
                         f"{sorted(set(runtime_env) - {'env_vars'})}; put the code the tasks need on the "
                         "cluster's nodes")
    cw = ClientWorker(config, address, client_token(token_arg), namespace, runtime_env, job_metadata)
    cw.start()
    return cw
