"""Client mode (``lumos://``) on loopback: the breadth of the API and reference counting.

A head started with ``lumos start --head`` in a session root of the test's own; the
driver (this test process) connects through the client address only. The network
namespace story (cuts, reconnects, cleanup) is ``test_client_mode.py``.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Iterator

import numpy as np
import pytest

import lumos
from tests.conftest import TEST_CONFIG, wait_for

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]


def _cli(root: str, *args: str) -> str:
    env = dict(os.environ, LUMOS_TMPDIR=root)
    env.pop("LUMOS_ADDRESS", None)
    env.pop("LUMOS_CLUSTER_TOKEN", None)
    done = subprocess.run([sys.executable, "-m", "lumos.cli", *args], env=env, capture_output=True, text=True,
                          timeout=90)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def head() -> Iterator[tuple[str, str]]:
    """(client address, token file) of a head with a client server."""
    root = tempfile.mkdtemp(prefix="lumos-capi-")
    try:
        out = _cli(root, "start", "--head", "--port", "0", "--client-server-port", "0", "--num-cpus", "2",
                   "--no-dashboard", "--object-store-memory", str(256 << 20), "--system-config", json.dumps(TEST_CONFIG))
        address = next(line.split("client address:", 1)[1].strip() for line in out.splitlines()
                       if "client address:" in line)
        with open(os.path.join(root, "current_cluster.json")) as f:
            token_file = os.path.join(json.load(f)["session_dir"], "token")
        yield address, token_file
    finally:
        try:
            _cli(root, "stop")
        finally:
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def client(head: tuple[str, str]) -> Iterator[lumos.LumosContext]:
    ctx = lumos.init(head[0], _token=head[1])
    try:
        yield ctx
    finally:
        lumos.shutdown()


def _store_used() -> float:
    return lumos.cluster_resources()["object_store_memory"] - lumos.available_resources()["object_store_memory"]


def test_refs_the_client_drops_free_their_objects_on_the_cluster(client: lumos.LumosContext) -> None:
    base = _store_used()
    ref = lumos.put(np.zeros(16 << 20, dtype=np.uint8))
    twin = copy.copy(ref)
    wait_for(lambda: _store_used() >= base + (16 << 20), 30)
    del ref
    time.sleep(1.0)  # the release of one copy went out; the other keeps the value
    assert _store_used() >= base + (16 << 20)
    assert lumos.get(twin, timeout=30).nbytes == 16 << 20
    del twin
    wait_for(lambda: _store_used() < base + (1 << 20), 30)


def test_list_tasks_in_client_mode_sees_the_tasks_submitted_just_before(client: lumos.LumosContext) -> None:
    # In a driver, list_tasks() sends what this process has not reported yet before it
    # asks the GCS. Through the client, the session ran the submits and the flush in
    # order, but the GCS query on another thread, which could overtake both: tasks
    # submitted just before were missing (seen under a loaded suite run).
    @lumos.remote
    def quick(i: int) -> int:
        return i

    for _ in range(10):
        refs = [quick.remote(i) for i in range(200)]
        listed = {t["task_id"] for t in lumos.state.list_tasks(filters=[("name", "=", "quick")], limit=10_000)}
        assert {r.task_id().hex() for r in refs} <= listed
        assert lumos.get(refs, timeout=60) == list(range(200))


def test_application_metrics_of_a_client_driver_reach_the_cluster(head: tuple[str, str]) -> None:
    """A client-mode driver's records go through its session: at once before
    ``lumos.state.metrics()``, with the heartbeat's turn once per report interval, and at
    ``shutdown()``; its tasks' records as any worker's."""
    from lumos.util.metrics import Counter, Gauge

    @lumos.remote
    def count() -> None:
        Counter("client_task_records").inc(2)

    lumos.init(head[0], _token=head[1])
    try:
        c = Counter("client_records", tag_keys=("k",))
        c.inc(tags={"k": "a"})
        lumos.get([count.remote() for _ in range(3)], timeout=60)

        def values(name: str) -> list[float]:
            return [s["value"] for r in lumos.state.metrics() if r["name"] == name for s in r["series"]]
        assert values("client_records") == [1.0]  # sent before the query
        wait_for(lambda: values("client_task_records") == [6.0], 15)
        c.inc(tags={"k": "a"})
        Gauge("client_gauge").set(5.0)
        # Not asked for: the heartbeat's turn reports it within the interval (1 s).
        from lumos._private import metrics as pm
        wait_for(lambda: not pm.BUFFER.pending(), 10)
        c.inc(3, tags={"k": "a"})
    finally:
        lumos.shutdown()  # reports the last 3
    lumos.init(head[0], _token=head[1])
    try:
        rows = {r["name"]: r["series"] for r in lumos.state.metrics()}
        assert rows["client_records"] == [{"tags": {"k": "a"}, "value": 5.0}]
        assert rows["client_gauge"] == [{"tags": {}, "value": 5.0}]
    finally:
        lumos.shutdown()


def test_named_actors_kill_cancel_timeouts_and_state_work_through_the_client(client: lumos.LumosContext) -> None:
    @lumos.remote
    class Box:
        def __init__(self, v: int) -> None:
            self.v = v

        def get(self) -> int:
            return self.v

    box = Box.options(name="box", lifetime="detached").remote(5)
    assert lumos.get(lumos.get_actor("box").get.remote(), timeout=30) == 5

    @lumos.remote
    def nap(s: float) -> float:
        time.sleep(s)
        return s

    @lumos.remote
    def take(refs: list[Any]) -> int:
        return sum(lumos.get(refs))

    slow = nap.remote(30)
    with pytest.raises(lumos.exceptions.GetTimeoutError):
        lumos.get(slow, timeout=0.2)
    ready, not_ready = lumos.wait([slow, nap.remote(0)], num_returns=1, timeout=30)
    assert len(ready) == 1 and not_ready == [slow]
    lumos.cancel(slow)
    with pytest.raises(lumos.exceptions.TaskCancelledError):
        lumos.get(slow, timeout=30)
    assert lumos.get(take.remote([lumos.put(1), lumos.put(2)]), timeout=30) == 3  # refs nested in args
    lumos.kill(box)
    with pytest.raises(lumos.exceptions.ActorDiedError):
        lumos.get(box.get.remote(), timeout=30)
    assert any(t["name"] == "nap" for t in lumos.state.list_tasks())
    from lumos.util.placement_group import placement_group, remove_placement_group
    from lumos.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    pg = placement_group([{"CPU": 1}])
    assert pg.wait(30)
    assert lumos.get(nap.options(scheduling_strategy=PlacementGroupSchedulingStrategy(pg)).remote(0),
                     timeout=30) == 0
    remove_placement_group(pg)
    assert lumos.get(nap.options(num_cpus=0.5).remote(0), timeout=30) == 0


def test_a_blocking_call_from_a_done_callback_raises_instead_of_hanging(client: lumos.LumosContext) -> None:
    import concurrent.futures
    seen: concurrent.futures.Future[Any] = concurrent.futures.Future()

    def callback(_: Any) -> None:
        try:
            lumos.get(lumos.put(1), timeout=5)
            seen.set_result(None)
        except RuntimeError as e:
            seen.set_result(e)

    @lumos.remote
    def later() -> int:
        time.sleep(0.5)  # the callback is added before the value arrives: the reader runs it
        return 2

    later.remote().future().add_done_callback(callback)
    assert "another thread" in str(seen.result(30))


def test_streaming_generators_are_refused_with_what_to_do_instead(client: lumos.LumosContext) -> None:
    @lumos.remote(num_returns="streaming")
    def gen() -> Iterator[int]:
        yield 1

    with pytest.raises(NotImplementedError, match="client mode"):
        gen.remote()


def test_ray_client_addresses_connect_too(head: tuple[str, str]) -> None:
    lumos.init("ray://" + head[0][len("lumos://"):], _token=head[1])
    try:
        assert lumos.get(lumos.put("via ray://"), timeout=30) == "via ray://"
    finally:
        lumos.shutdown()


def test_a_client_jobs_metadata_is_its_jobs(head: tuple[str, str]) -> None:
    lumos.init(head[0], _token=head[1], job_config=lumos.job_config.JobConfig(metadata={"run": "client-7"}))
    try:
        me = lumos.get_runtime_context().get_job_id()
        (row,) = [j for j in lumos.state.list_jobs() if j["job_id"] == me]
        assert row["metadata"] == {"run": "client-7"}
    finally:
        lumos.shutdown()


def test_client_server_survives_garbage_and_half_handshakes(head: tuple[str, str]) -> None:
    import socket
    host, port = head[0][len("lumos://"):].rsplit(":", 1)
    for blob in (os.urandom(4096), b"", os.urandom(16)):
        with socket.create_connection((host, int(port)), timeout=10) as s:
            if blob:
                s.sendall(blob)
    lumos.init(head[0], _token=head[1])
    try:
        assert lumos.get(lumos.put(7), timeout=30) == 7
    finally:
        lumos.shutdown()


def test_wrong_token_and_bad_address_raise_at_init(head: tuple[str, str], tmp_path: Any) -> None:
    with pytest.raises(ConnectionError, match=head[0][len("lumos://"):]):
        lumos.init(head[0], _token="0" * 64)
    assert not lumos.is_initialized()
    with pytest.raises(ValueError, match="lumos://HOST:PORT"):
        lumos.init("lumos://nohost")
    with pytest.raises(ConnectionError, match="token"):
        env = os.environ.pop("LUMOS_CLUSTER_TOKEN", None)
        try:
            lumos.init(head[0])
        finally:
            if env is not None:
                os.environ["LUMOS_CLUSTER_TOKEN"] = env


class _CutBeforeReply:
    """The client's link breaks just as the reply to its next request arrives: the
    session sent it, the client never reads it (a real socket shut down mid-stream)."""

    def __enter__(self) -> "_CutBeforeReply":
        from lumos._private.client import wire
        self.wire, self.real, self.cut, self.armed = wire, wire.recv, False, False

        def recv(sock: Any) -> Any:
            control, payload = self.real(sock)
            if self.armed and control.get("op") == "reply" and not self.cut:
                self.cut = True
                sock.shutdown(2)
                raise OSError("the link broke")
            return control, payload

        wire.recv = recv
        # The reader waits in a recv that began before the patch: one round trip moves it on.
        assert lumos.get(lumos.put(0), timeout=30) == 0
        self.armed = True
        return self

    def __exit__(self, *exc: Any) -> None:
        self.wire.recv = self.real


def test_refs_and_actors_whose_reply_the_link_lost_are_released(client: lumos.LumosContext) -> None:
    base = _store_used()
    with _CutBeforeReply() as cut:
        with pytest.raises(ConnectionError, match="lost the connection"):
            lumos.put(np.zeros(16 << 20, dtype=np.uint8))
    assert cut.cut
    # The session made and held the object; the client never learnt its id. It names the
    # request when it reconnects, and the session lets the object go.
    wait_for(lambda: _store_used() < base + (1 << 20), 30)
    assert lumos.get(lumos.put(7), timeout=30) == 7  # the client goes on, reconnected

    @lumos.remote(num_cpus=0)
    class Orphan:
        def ping(self) -> int:
            return 1

    with _CutBeforeReply() as cut:
        with pytest.raises(ConnectionError, match="lost the connection"):
            Orphan.remote()
    assert cut.cut
    # Created, and its only handle never reached the client: the session lets it go.
    wait_for(lambda: [a["state"] for a in lumos.state.list_actors() if a["class_name"] == "Orphan"] == ["DEAD"], 30)


def test_a_client_of_another_wire_version_is_refused_with_both_versions(head: tuple[str, str]) -> None:
    from lumos._private.protocol import auth
    code = ("import lumos\nfrom lumos._private.protocol import auth\nauth.WIRE_VERSION = 999\n"
            f"try:\n    lumos.init({head[0]!r}, _token={head[1]!r})\n"
            "except ConnectionError as e:\n    print('REFUSED', e)\nelse:\n    print('CONNECTED')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "REFUSED" in out.stdout and "refused this client" in out.stdout, out.stdout
    assert "this client speaks lumos wire format 999" in out.stdout, out.stdout
    assert f"the lumos head wire format {auth.WIRE_VERSION}" in out.stdout, out.stdout
    ctx = lumos.init(head[0], _token=head[1])  # the head serves clients of its own version on
    try:
        assert lumos.get(lumos.put(3), timeout=30) == 3 and ctx.dashboard_url is not None
    finally:
        lumos.shutdown()


def test_shutdown_leaves_no_link_or_reconnect_behind(head: tuple[str, str]) -> None:
    """The head closes the link after the bye: that is the end, not a loss to reconnect from."""
    import psutil
    port = int(head[0].rsplit(":", 1)[1])

    def links() -> list[Any]:
        return [c for c in psutil.Process().net_connections("tcp") if c.raddr and c.raddr.port == port]

    started: list[str] = []
    real_start = threading.Thread.start

    def start(self: threading.Thread) -> None:
        started.append(self.name)
        real_start(self)

    for _ in range(5):
        lumos.init(head[0], _token=head[1])
        fut = lumos.put(1).future()
        fut.cancel()  # a caller's cancel is no failure of the link
        assert lumos.get(lumos.put(2), timeout=30) == 2
        threading.Thread.start = start  # type: ignore[method-assign]
        try:
            lumos.shutdown()
            wait_for(lambda: not links() and not [t for t in threading.enumerate()
                                                  if t.name.startswith("lumos-client.")], 10)
            time.sleep(0.3)
        finally:
            threading.Thread.start = real_start  # type: ignore[method-assign]
        assert "lumos-client.reconnect" not in started


def test_a_failing_error_handler_does_not_end_the_link(client: lumos.LumosContext) -> None:
    from lumos import object_ref
    cw = object_ref._core_worker
    seen: list[str] = []

    def broken(kind: str, text: str) -> None:
        seen.append(kind)
        raise RuntimeError("a handler of the user's that fails")

    cw.error_handler = broken

    @lumos.remote(num_gpus=64)
    def never() -> None:  # infeasible: the cluster's warning comes back as an error event
        pass

    ref = never.remote()
    wait_for(lambda: seen, 30)
    assert lumos.get(lumos.put("still here"), timeout=30) == "still here"
    lumos.cancel(ref)


def test_the_stop_button_in_client_puts_and_calls_leaves_nothing_on_the_cluster(client: lumos.LumosContext) -> None:
    """Presses at random moments of puts and calls with a 1 MiB argument: each stops its
    call, the link goes on (a press midway through a message left half a frame on it,
    and the session dropped the link), and once the client's refs are gone the cluster's
    store is back where it was (a press while a reply was awaited left the objects it
    gave, with nobody to release them, for the session's life)."""
    from tests.runtime.test_stop_button import _interrupted_often, _store_used as store_objects

    @lumos.remote
    def nbytes(a: Any) -> int:
        return int(a.nbytes)

    value = np.ones((1 << 20) // 8)
    assert lumos.get(nbytes.remote(value), timeout=30) == value.nbytes
    time.sleep(1.0)
    base = store_objects()  # (bytes and count of objects: slots reserved ahead are not counted)
    cw = lumos._private.worker_context.require()
    reconnects = cw._lost_why
    for i, op in enumerate((lambda: lumos.put(value), lambda: nbytes.remote(value))):
        got, interrupted = _interrupted_often(op, 150, 10 + i, 0.004, at_least=5, finished_at_least=3)
        assert interrupted >= 5 and got, (interrupted, len(got))
        assert lumos.get(got[-1], timeout=30) is not None
        del got
    assert cw._lost_why == reconnects  # (the link was never dropped)
    wait_for(lambda: all(now <= then for now, then in zip(store_objects(), base)), 30)
    assert lumos.get(lumos.put(7), timeout=30) == 7


def _client_server_pid(token_file: str) -> int:
    """The pid of the head's client server (``lumos._private.client.server``), by its session dir."""
    import psutil
    session_dir = os.path.dirname(token_file)
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if "lumos._private.client.server" in cmd and session_dir in cmd:
            return p.pid
    raise AssertionError(f"no client server runs for {session_dir}")


def test_the_stop_button_stops_a_call_waiting_for_a_reconnect(head: tuple[str, str],
                                                               client: lumos.LumosContext) -> None:
    """A put made while the link is down waits for the reconnect before it sends anything;
    a press meanwhile raises ``KeyboardInterrupt`` at once, the link still down (the wait
    was held with the send, so the press came only once the link was back, or after the
    grace, the session gone), and the client goes on once it is back. The head's client
    server is frozen, so the reconnect hangs in its handshake until it is thawed."""
    import signal
    import socket
    cw = lumos._private.worker_context.require()
    assert lumos.get(lumos.put(1), timeout=30) == 1
    server = _client_server_pid(head[1])
    value = np.ones((1 << 20) // 8)
    # (Thawed after 5 s whatever happens, so a press held until the reconnect shows as a late one.)
    thaw = threading.Timer(5.0, os.kill, (server, signal.SIGCONT))
    press = threading.Timer(0.5, signal.pthread_kill, (threading.main_thread().ident, signal.SIGINT))
    os.kill(server, signal.SIGSTOP)
    try:
        sock = cw._sock
        assert sock is not None
        sock.shutdown(socket.SHUT_RDWR)  # the link breaks; the reader sees it end and reconnects
        wait_for(lambda: cw._sock is None, 10)
        thaw.start()
        started = time.monotonic()
        press.start()
        with pytest.raises(KeyboardInterrupt):
            lumos.put(value)
        took, link = time.monotonic() - started, "down" if cw._sock is None else "back"
        assert took < 2.5 and link == "down", f"the press (at 0.5s) came {took:.1f}s into the put, the link {link}"
    finally:
        press.cancel()
        thaw.cancel()
        os.kill(server, signal.SIGCONT)
        for timer in (press, thaw):
            if timer.ident is not None:
                timer.join(10)
    wait_for(lambda: cw._sock is not None, 30)
    assert lumos.get(lumos.put(value), timeout=30).nbytes == value.nbytes

    @lumos.remote
    def nbytes(a: Any) -> int:
        return int(a.nbytes)

    assert lumos.get(nbytes.remote(value), timeout=30) == value.nbytes
