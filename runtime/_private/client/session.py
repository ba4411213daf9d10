"""One client's session on the head: a real driver that acts for a ``lumos://`` client.

Started by the client server (``server.py``) for each new client; it receives that
client's connections (now and after reconnects) as file descriptors over a
``SOCK_SEQPACKET`` control socket, each with the client's hello. It runs
``lumos.init(address=<the head's GCS>)``, so the client's tasks, actors and objects are
owned by this process, and serves the client's requests over the link
(``wire``): submissions, ``put``/``get``/``wait``, GCS calls. Worker output goes back
to the client.

```
control socket ──(fd, hello)──► attach() ──► reader thread (one per link)
                                               ├─ ordered ops ─► one "serial" thread (submission order)
                                               └─ blocking ops ─► a pool (get, wait, GCS calls)
watchdog: no link for client_reconnect_grace_s (or a "bye") ─► lumos.shutdown(), exit
```
The client's refs are counted here: ``held`` keeps one real ``ObjectRef`` per
stand-in the client holds, and the client's releases drop them. A reply that gives the
client refs or an actor and never reaches it (its link broke first) gives them back:
the session sees the link gone before it sends, or the client names the request when it
reconnects (``unanswered`` in its hello).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import pickle
import queue
import signal
import socket
import sys
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgpack

from lumos._private import serialization as ser
from lumos._private.client import wire
from lumos._private.dashboard_process import read_dashboard_url
from lumos._private.protocol.framing import ProtocolError

logger = logging.getLogger(__name__)

_ORDERED = frozenset(("submit", "create_actor", "put", "release", "incref", "actor_release", "actor_track",
                      "cancel", "flush_events", "metrics"))
_BLOCKING = frozenset(("get", "wait", "call_gcs", "call_raylet", "describe", "reserve_call", "pending_calls"))
#: Replies remembered for a reconnecting client to name as never received (request ids
#: grow; a client names only the requests in flight when its link broke).
_ANSWERED_KEPT = 4096


class ClientSessionServer:
    """Serves one client's links and keeps its refs (threads; see the module docstring)."""

    def __init__(self, client_id: str, config: Any, grace_s: float, gcs_address: str = "",
                 head_session_dir: str = "") -> None:
        import lumos
        from lumos._private import worker_context
        self.lumos = lumos
        self.client_id = client_id
        self.config = config
        self.grace_s = grace_s
        #: The GCS's HOST:PORT as the client is told (the session itself uses its unix socket).
        self.gcs_address = gcs_address
        #: The head's session directory (where the dashboard writes ``dashboard.json``).
        self.head_session_dir = head_session_dir
        self.cw: Any = worker_context.require()
        #: Object id -> one real ref per stand-in the client holds.
        self.held: dict[bytes, list[Any]] = {}
        self._held_lock = threading.Lock()
        #: Client template id -> the TaskTemplate it sent once.
        self.templates: dict[int, Any] = {}
        #: Request id -> what its reply gave the client (("refs", ids) or ("actor", id)),
        #: for the latest ``_ANSWERED_KEPT`` (under ``_held_lock``).
        self._answered: OrderedDict[int, tuple[str, Any]] = OrderedDict()
        self._sock: socket.socket | None = None
        self._send_lock = threading.Lock()
        self._link_lock = threading.Lock()
        #: When the last link broke (monotonic); None while one is up.
        self.detached_at: float | None = time.monotonic()
        self.ending = threading.Event()
        self._serial = ThreadPoolExecutor(1, thread_name_prefix="lumos-client.serial")
        self._pool = ThreadPoolExecutor(32, thread_name_prefix="lumos-client.blocking")
        #: Worker output and cluster errors on their way to the client (None ends the thread).
        self._output: queue.SimpleQueue[dict[str, Any] | None] = queue.SimpleQueue()
        threading.Thread(target=self._send_output, name="lumos-client.output", daemon=True).start()
        self.cw.log_handler = self._forward_logs
        self.cw.error_handler = self._forward_error

    # ------------------------------------------------------------------ links

    def welcome(self, resumed: bool) -> dict[str, Any]:
        cw = self.cw
        ctx = self.lumos.api.worker_context.context
        return {"op": "welcome", "job_id": cw.job_id, "worker_id": cw.worker_id, "node_id": cw.node_id,
                "node_ip": cw.node_ip, "namespace": cw.namespace, "owner": pickle.dumps(cw.address),
                "gcs_address": self.gcs_address or (ctx.address_info.get("gcs_address", "") if ctx else ""),
                "dashboard_url": read_dashboard_url(self.head_session_dir) or (ctx.dashboard_url if ctx else ""),
                "session_dir": str(cw.session_dir),
                "grace_s": self.grace_s, "resumed": resumed, "pid": os.getpid()}

    def attach(self, sock: socket.socket, resumed: bool, unanswered: Any = ()) -> None:
        """A (re)connected client: it supersedes any older link. ``unanswered``: request
        ids whose replies the client never read (its link broke first)."""
        with self._link_lock:
            old, self._sock = self._sock, sock
            self.detached_at = None
        if old is not None:
            _close(old)
        if isinstance(unanswered, list):
            for rid in unanswered:
                if type(rid) is int:
                    self._give_back(rid)
        sock.setblocking(True)
        try:
            with self._send_lock:
                sock.settimeout(self.config.client_heartbeat_timeout_s)
                wire.send(sock, self.welcome(resumed))
        except OSError as e:
            self._detach(sock, f"welcome failed: {e}")
            return
        logger.info("client %s %s", self.client_id[:8], "reconnected" if resumed else "connected")
        threading.Thread(target=self._read, args=(sock,), name="lumos-client.reader", daemon=True).start()

    def _detach(self, sock: socket.socket, why: str) -> None:
        with self._link_lock:
            if self._sock is not sock:
                return
            self._sock = None
            self.detached_at = time.monotonic()
        _close(sock)
        if not self.ending.is_set():
            logger.warning("client %s lost its link (%s); its session waits %.0fs for it to reconnect",
                           self.client_id[:8], why, self.grace_s)

    def _send(self, sock: socket.socket, control: dict[str, Any], payload: wire.Payload | None = None) -> bool:
        try:
            with self._send_lock:
                wire.send(sock, control, payload)
        except OSError as e:
            self._detach(sock, f"send failed: {e}")
            return False
        return True

    def _give_back(self, rid: int) -> None:
        """Release what request ``rid``'s reply gave the client, which never got it."""
        with self._held_lock:
            gift = self._answered.pop(rid, None)
        if gift is None:
            return
        kind, what = gift
        if kind == "refs":
            self._op_release({"ids": what}, None, None)
        else:
            self._op_actor_release({"actor_id": what}, None, None)
        logger.info("client %s: request %d's reply was lost with its link; released what it gave",
                    self.client_id[:8], rid)

    def _read(self, sock: socket.socket) -> None:
        why = "closed by the client"
        try:
            while True:
                control, payload = wire.recv(sock)
                op = control["op"]
                if op == "ping":
                    self._send(sock, {"op": "pong"})
                elif op == "bye":
                    why = "the client shut down"
                    self.ending.set()
                    return
                elif op in _ORDERED:
                    self._serial.submit(self._run, sock, control, payload)
                elif op in _BLOCKING:
                    refs = self._refs_of(control.get("ids", ()))
                    self._pool.submit(self._run, sock, control, payload, refs)
                else:
                    raise ProtocolError(f"unknown op {op!r}")
        except ProtocolError as e:
            logger.warning("client %s sent a bad message (%s); closing its link", self.client_id[:8], e)
            why = str(e)
        except (OSError, ConnectionError, TimeoutError) as e:
            why = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        finally:
            self._detach(sock, why)

    # ------------------------------------------------------------------ requests

    def _refs_of(self, ids: Any) -> list[Any]:
        refs = []
        with self._held_lock:
            for oid in ids:
                held = self.held.get(oid)
                if not held:
                    raise ProtocolError(f"the client asked about object {bytes(oid).hex()[:16]} it does not hold")
                refs.append(held[0])
        return refs

    def _hold(self, refs: list[Any]) -> list[bytes]:
        with self._held_lock:
            for r in refs:
                self.held.setdefault(r._id, []).append(r)
        return [r._id for r in refs]

    def _run(self, sock: socket.socket, control: dict[str, Any], payload: memoryview | None,
             refs: list[Any] | None = None) -> None:
        op, rid = control["op"], control.get("id")
        try:
            reply, out = getattr(self, "_op_" + op)(control, payload, refs)
        except BaseException as e:  # the client's request failed: the client raises it
            if rid is None:
                logger.exception("client %s: %s failed", self.client_id[:8], op)
                return
            try:
                blob = pickle.dumps(e)
            except Exception:
                blob = pickle.dumps(RuntimeError(f"{type(e).__name__}: {e}"))
            self._send(sock, {"op": "reply", "id": rid, "error": blob})
            return
        if rid is None:
            return
        reply["op"], reply["id"] = "reply", rid
        gift = ("refs", reply["ids"]) if "ids" in reply else ("actor", control["actor_id"]) \
            if op == "create_actor" else None
        if gift is None:
            self._send(sock, reply, out)
            return
        with self._held_lock:
            self._answered[rid] = gift
            if len(self._answered) > _ANSWERED_KEPT:
                self._answered.popitem(last=False)
        # The link this came on may be gone: its reply would go nowhere.
        if self._sock is not sock or not self._send(sock, reply, out):
            self._give_back(rid)

    def _template(self, control: dict[str, Any]) -> Any:
        tid = control["tpl"]
        if control.get("tpl_blob") is not None:
            self.templates[tid] = pickle.loads(control["tpl_blob"])
        try:
            return self.templates[tid]
        except KeyError:
            raise ProtocolError(f"unknown task template {tid}") from None

    def _args(self, control: dict[str, Any], payload: memoryview | None) -> tuple[Any, Any]:
        blobs = wire.blobs_of(control, payload)
        if len(blobs) != 1:
            raise ProtocolError("a submission carries exactly one argument blob")
        return ser.deserialize(blobs[0])[1]  # type: ignore[no-any-return]

    def _op_submit(self, control: dict[str, Any], payload: Any, _: Any) -> tuple[dict[str, Any], None]:
        template = self._template(control)
        args, kwargs = self._args(control, payload)
        actor = control.get("actor")
        if actor is not None:
            refs = self.cw.submit_task(template, args, kwargs, (actor[0], actor[1], self.cw.worker_id, actor[2]))
        else:
            refs = self.cw.submit_task(template, args, kwargs)
        return {"ids": self._hold(refs)}, None

    def _op_create_actor(self, control: dict[str, Any], payload: Any, _: Any) -> tuple[dict[str, Any], None]:
        template = self._template(control)
        args, kwargs = self._args(control, payload)
        info = self.cw.create_actor(template, args, kwargs, control["actor_id"], pickle.loads(control["options"]))
        return {"info": pickle.dumps(info)}, None

    def _op_put(self, control: dict[str, Any], payload: Any, _: Any) -> tuple[dict[str, Any], None]:
        (blob,) = wire.blobs_of(control, payload)
        value = ser.deserialize(blob)[1]
        return {"ids": self._hold([self.lumos.put(value)])}, None

    def _op_release(self, control: dict[str, Any], payload: Any, _: Any) -> tuple[dict[str, Any], None]:
        dropped = []
        with self._held_lock:
            for oid in control["ids"]:
                held = self.held.get(oid)
                if held:
                    dropped.append(held.pop())
                    if not held:
                        del self.held[oid]
        del dropped  # the real refs' counts fall here, outside the lock
        return {}, None

    def _op_incref(self, control: dict[str, Any], payload: Any, _: Any) -> tuple[dict[str, Any], None]:
        with self._held_lock:
            for oid in control["ids"]:
                held = self.held.get(oid)
                if held:
                    held.append(held[0].__copy__())
        return {}, None

    def _op_actor_release(self, control: dict[str, Any], payload: Any, _: Any) -> tuple[dict[str, Any], None]:
        self.cw._post(self.cw.actor_submitter.release_handle, control["actor_id"])
        return {}, None

    def _op_actor_track(self, control: dict[str, Any], payload: Any, _: Any) -> tuple[dict[str, Any], None]:
        self.cw._post(self.cw.actor_submitter.track, control["actor_id"], pickle.loads(control["info"]))
        return {}, None

    def _op_flush_events(self, control: dict[str, Any], payload: Any, _: Any) -> tuple[dict[str, Any], None]:
        self.cw._post(self.cw._flush_events)
        return {}, None

    def _op_metrics(self, control: dict[str, Any], payload: Any, _: Any) -> tuple[dict[str, Any], None]:
        """The client's application metrics, passed on to the GCS (which checks each row)."""
        rows = control.get("rows")
        if not isinstance(rows, list):
            raise ProtocolError("metrics rows must be a list")
        self.cw._post(self.cw.forward_metrics, rows)
        return {}, None

    def _op_cancel(self, control: dict[str, Any], payload: Any, _: Any) -> tuple[dict[str, Any], None]:
        (ref,) = self._refs_of([control["ids"][0]])
        self.lumos.cancel(ref, force=control["force"], recursive=control["recursive"])
        return {}, None

    def _op_get(self, control: dict[str, Any], payload: Any, refs: Any) -> tuple[dict[str, Any], wire.Payload]:
        values = self.lumos.get(refs, timeout=control.get("timeout"))
        out = wire.Payload()
        for v in values:
            sv = ser.serialize(v)
            self._hold(sv.nested_refs)  # the client deserializes one stand-in per nested ref
            out.add(sv)
        return {}, out

    def _op_wait(self, control: dict[str, Any], payload: Any, refs: Any) -> tuple[dict[str, Any], None]:
        ready, _ = self.lumos.wait(refs, num_returns=control["num_returns"], timeout=control.get("timeout"),
                                   fetch_local=control.get("fetch_local", True))
        return {"ready": [r._id for r in ready]}, None

    def _op_call_gcs(self, control: dict[str, Any], payload: Any, _: Any) -> tuple[dict[str, Any], None]:
        return {"value": pickle.dumps(self.cw.call_gcs(pickle.loads(control["msg"]), control.get("timeout")))}, None

    def _op_call_raylet(self, control: dict[str, Any], payload: Any, _: Any) -> tuple[dict[str, Any], None]:
        return {"value": pickle.dumps(self.cw.call_raylet(pickle.loads(control["msg"]), control.get("timeout")))}, None

    def _op_describe(self, control: dict[str, Any], payload: Any, refs: Any) -> tuple[dict[str, Any], None]:
        return {"value": pickle.dumps(self.cw.describe_object(refs[0]._id))}, None

    def _op_reserve_call(self, control: dict[str, Any], payload: Any, _: Any) -> tuple[dict[str, Any], None]:
        return {"value": bool(self.cw.actor_submitter.reserve_call(control["actor_id"], control["limit"]))}, None

    def _op_pending_calls(self, control: dict[str, Any], payload: Any, _: Any) -> tuple[dict[str, Any], None]:
        return {"value": int(self.cw.actor_submitter.pending_calls(control["actor_id"]))}, None

    # ------------------------------------------------------------------ output

    def _push(self, control: dict[str, Any]) -> None:
        sock = self._sock
        if sock is not None:
            self._send(sock, control)

    def _forward_logs(self, records: list[Any]) -> None:
        # Called on the driver's lumos-io thread: never wait there for a link busy with a
        # large reply; the output thread sends.
        self._output.put({"op": "logs", "data": pickle.dumps(records)})

    def _forward_error(self, kind: str, text: str) -> None:
        self._output.put({"op": "error_event", "kind": kind, "text": text})

    def _send_output(self) -> None:
        while True:
            control = self._output.get()
            if control is None:
                return
            self._push(control)

    # ------------------------------------------------------------------ lifetime

    def watch(self) -> str:
        """Block until the session should end; returns why."""
        while not self.ending.wait(0.25):
            since = self.detached_at
            if since is not None and time.monotonic() - since > self.grace_s:
                return f"its client did not reconnect within {self.grace_s:g}s"
        return "its client shut down"

    def close(self) -> None:
        self.ending.set()
        self._output.put(None)
        with self._link_lock:
            sock, self._sock = self._sock, None
        if sock is not None:
            _close(sock)
        self._serial.shutdown(wait=False, cancel_futures=True)
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._held_lock:
            self.held.clear()


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


def _receive_links(ctrl: socket.socket, session: list[ClientSessionServer | None],
                   first: list[tuple[socket.socket, dict[str, Any]]], got_first: threading.Event) -> None:
    """Control-socket reader: each message is one client connection (fd) and its hello."""
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(ctrl, 1 << 16, 1)
        except OSError:
            data, fds = b"", []
        if not data:  # the client server is gone: the session goes with it
            for fd in fds:
                os.close(fd)
            if session[0] is not None:
                session[0].ending.set()
            got_first.set()
            return
        try:
            hello = msgpack.unpackb(data, raw=False)
        except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError):
            logger.warning("bad hello on the control socket")
            for fd in fds:
                os.close(fd)
            continue
        if not fds:
            continue
        sock = socket.socket(fileno=fds[0])
        s = session[0]
        if s is None:
            first.append((sock, hello))
            got_first.set()
        else:
            s.attach(sock, resumed=True, unanswered=hello.get("unanswered"))


def main() -> None:
    from lumos._private.config import Config
    from lumos._private.process import die_with_parent, read_token, setup_logging
    p = argparse.ArgumentParser(prog="lumos-client-session")
    p.add_argument("--ctrl-fd", type=int, required=True)
    p.add_argument("--client-id", required=True)
    p.add_argument("--gcs-address", required=True)
    p.add_argument("--gcs-public-address", default="")
    p.add_argument("--token-file", required=True)
    p.add_argument("--session-dir", required=True)
    p.add_argument("--config", default="{}")
    p.add_argument("--die-with-parent", type=int, default=0)
    args = p.parse_args()
    if args.die_with_parent:
        die_with_parent(args.die_with_parent, signal.SIGTERM)
    setup_logging(os.path.join(args.session_dir, "logs"), f"client-{args.client_id[:8]}")
    overrides = json.loads(args.config)
    config = Config.resolve(overrides)
    ctrl = socket.socket(fileno=args.ctrl_fd)
    holder: list[ClientSessionServer | None] = [None]
    first: list[tuple[socket.socket, dict[str, Any]]] = []
    got_first = threading.Event()
    threading.Thread(target=_receive_links, args=(ctrl, holder, first, got_first), name="lumos-client.control",
                     daemon=True).start()
    got_first.wait()
    if not first:
        return
    sock, hello = first[0]
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    import lumos
    try:
        runtime_env = pickle.loads(hello["runtime_env"]) if hello.get("runtime_env") else None
        job_config = lumos.job_config.JobConfig(metadata=hello["job_metadata"]) if hello.get("job_metadata") else None
        lumos.init(address=args.gcs_address, _token=read_token(args.token_file).decode(),
                   namespace=hello.get("namespace") or None, runtime_env=runtime_env,
                   job_config=job_config, _system_config=overrides, include_dashboard=False)
    except BaseException as e:
        logger.exception("client %s: the session's driver did not start", args.client_id[:8])
        try:
            sock.settimeout(5)
            wire.send(sock, {"op": "error", "message": f"the head could not start a session for this client: "
                                                       f"{type(e).__name__}: {e}"})
        except OSError:
            pass
        sock.close()
        sys.exit(1)
    session = ClientSessionServer(args.client_id, config, config.client_reconnect_grace_s,
                                  args.gcs_public_address, args.session_dir)
    holder[0] = session
    session.attach(sock, resumed=False)
    threading.Thread(target=lambda: (stop.wait(), session.ending.set()), daemon=True,
                     name="lumos-client.sigterm").start()
    why = session.watch()
    logger.info("client %s: session ends: %s", args.client_id[:8], why)
    session.close()
    lumos.shutdown()
    logging.shutdown()
    os._exit(0)


if __name__ == "__main__":
    main()
