"""Shared fixtures: clusters that are always shut down, and leak checks.

Every cluster fixture tears down in ``finally`` and then checks that no lumos process,
Unix socket or /dev/shm store directory it started is left; a leak fails the test.
"""

from __future__ import annotations

import glob
import os
import time
from typing import Any, Callable, Iterator

import psutil
import pytest

import lumos

# Every worker of a test cluster runs functions defined in test modules, so it imports
# pytest (~0.15 s each: 200 actors, 30 s): the fork server imports it once for all. (Set
# here, it reaches every cluster the tests start: with init, the CLI, a kernel.)
os.environ.setdefault("LUMOS_WORKER_PRELOAD_MODULES", "pytest")
# The torch tests import torch into this process, where "auto" would have every later
# test cluster's fork server import it too (~1 s of CPU each).
os.environ.setdefault("LUMOS_WORKER_WARM_MODULES", "")

#: Short timeouts and invariant checks for every test cluster.
TEST_CONFIG: dict[str, Any] = {
    "validate": True,
    "heartbeat_interval_ms": 200,
    "node_death_timeout_ms": 3000,
    "worker_idle_timeout_s": 5.0,
    "object_store_full_timeout_s": 2.0,
}


def process_gone(pid: int, created: float | None = None) -> bool:
    """The process has exited (a zombie counts: it runs no more); safe against it
    exiting while we look. With ``created`` (its ``create_time()``), a new process that
    reuses the pid does not count as it (pids wrap at 32768 where many processes come
    and go)."""
    try:
        p = psutil.Process(pid)
        if created is not None and abs(p.create_time() - created) > 0.01:
            return True
        return p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def lumos_children() -> list[psutil.Process]:
    """lumos processes started (directly or not) by this test process."""
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(p.cmdline())
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if "lumos._private" in cmd or "-m lumos.dashboard" in cmd:
            out.append(p)
    return out


def wait_for(predicate: Callable[[], Any], timeout_s: float = 10.0, interval_s: float = 0.02) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s}s: {predicate}")
        time.sleep(interval_s)


def raylet_log(ctx: Any) -> str:
    """What the raylets of ``ctx``'s session (a ``LumosContext``) have logged so far."""
    logs = os.path.join(ctx.address_info["session_dir"], "logs")
    text = ""
    for name in sorted(os.listdir(logs)):
        if name.startswith("raylet"):
            with open(os.path.join(logs, name), errors="replace") as f:
                text += f.read()
    return text


def check_no_leaks(session_dir: str | None, timeout_s: float = 10.0) -> None:
    def clean() -> bool:
        return not lumos_children()
    try:
        wait_for(clean, timeout_s)
    except AssertionError:
        left = [(p.pid, " ".join(p.cmdline())[:120]) for p in lumos_children()]
        for p in lumos_children():
            p.kill()
        raise AssertionError(f"lumos processes left behind: {left}") from None
    if session_dir:
        base = os.path.basename(session_dir)
        stores = glob.glob(f"/dev/shm/lumos-{base}-*")
        assert not stores, f"object store directories left behind: {stores}"
        socks = glob.glob(os.path.join(session_dir, "sockets", "*"))
        assert not socks, f"socket files left behind: {socks}"


def start(**kwargs: Any) -> lumos.LumosContext:
    config = dict(TEST_CONFIG)
    config.update(kwargs.pop("_system_config", {}))
    kwargs.setdefault("num_cpus", 2)
    kwargs.setdefault("object_store_memory", 1024 * 1024 * 1024)
    return lumos.init(_system_config=config, **kwargs)


def running_head(**head_args: Any) -> Iterator[Any]:
    """Body of a one-node fixture: a ``lumos.testing.Cluster`` head of ``head_args`` (with
    ``TEST_CONFIG``), this process connected; yields the cluster (its ``address`` lets other
    drivers join), then shuts it down and checks for leaks."""
    from lumos.testing import Cluster
    cluster = Cluster(initialize_head=True, head_node_args={**head_args, "_system_config": dict(TEST_CONFIG)})
    try:
        cluster.connect()
        yield cluster
    finally:
        cluster.shutdown()
        check_no_leaks(cluster.session_dir)


def running_two_nodes(head_cpus: float, **node_args: Any) -> Iterator[tuple[Any, Any]]:
    """Body of a two-node fixture: a ``lumos.testing.Cluster`` whose head has ``head_cpus``
    and a second node of ``node_args``, this process connected; yields (cluster, the second
    node), then shuts it down and checks for leaks."""
    from lumos.testing import Cluster
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": head_cpus, "_system_config": dict(TEST_CONFIG)})
    try:
        node = cluster.add_node(**node_args)
        cluster.connect()
        yield cluster, node
    finally:
        cluster.shutdown()
        check_no_leaks(cluster.session_dir)


def running_cluster(**kwargs: Any) -> Iterator[lumos.LumosContext]:
    """Body of a cluster fixture: ``start(**kwargs)``, then shut down and check for leaks."""
    ctx = start(**kwargs)
    session = ctx.address_info["session_dir"]
    try:
        yield ctx
    finally:
        lumos.shutdown()
        check_no_leaks(session)


@pytest.fixture(scope="module")
def cluster() -> Iterator[lumos.LumosContext]:
    """A shared 2-CPU cluster for tests that do not break things."""
    yield from running_cluster()


@pytest.fixture
def fresh_cluster() -> Iterator[Callable[..., lumos.LumosContext]]:
    """Start a cluster with the given init() arguments; shut down after the test."""
    sessions: list[str] = []

    def make(**kwargs: Any) -> lumos.LumosContext:
        ctx = start(**kwargs)
        sessions.append(ctx.address_info["session_dir"])
        return ctx

    try:
        yield make
    finally:
        lumos.shutdown()
        for s in sessions:
            check_no_leaks(s)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A failed test or fixture shows the tails of its cluster's GCS and raylet logs, so a
    failure seen only in CI can be read from CI's output."""
    report = yield
    if report.failed:
        from lumos._private import worker_context
        ctx = worker_context.context
        session = getattr(ctx, "address_info", {}).get("session_dir") if ctx is not None else None
        if session:
            for path in sorted(glob.glob(os.path.join(session, "logs", "gcs*.log")) +
                               glob.glob(os.path.join(session, "logs", "raylet*.log")))[:4]:
                try:
                    with open(path, errors="replace") as f:
                        tail = f.readlines()[-25:]
                except OSError:
                    continue
                report.sections.append((f"lumos log {os.path.basename(path)} (last lines)", "".join(tail)))
    return report


class RedisServer:
    """A ``redis-server`` on a loopback port of its own, with its data in a private dir.

    ``stop()`` ends it by pid (SIGTERM, then SIGKILL); ``start()`` again reuses the port
    and the append-only file, as an operator restarting Redis would.
    """

    def __init__(self, data_dir: str, password: str | None = None) -> None:
        import socket
        self.data_dir = data_dir
        self.password = password
        with socket.socket() as s:  # a free port, picked by the kernel
            s.bind(("127.0.0.1", 0))
            self.port: int = s.getsockname()[1]
        self.proc: Any = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}{self.address}"

    def start(self) -> None:
        import shutil
        import subprocess
        exe = shutil.which("redis-server")
        if exe is None:
            pytest.skip("redis-server is not installed (.ci/run installs it)")
        cmd = [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.data_dir,
               "--save", "", "--appendonly", "yes", "--appendfsync", "everysec", "--daemonize", "no",
               "--logfile", os.path.join(self.data_dir, "redis.log")]
        if self.password:
            cmd += ["--requirepass", self.password]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        wait_for(self._answers, 10.0, 0.05)

    def _answers(self) -> bool:
        import redis
        if self.proc.poll() is not None:
            raise AssertionError(f"redis-server exited with {self.proc.returncode}; see {self.data_dir}/redis.log")
        try:
            with redis.Redis(port=self.port, password=self.password, socket_timeout=1) as r:
                return bool(r.ping())
        except redis.exceptions.ConnectionError:
            return False

    def client(self) -> Any:
        import redis
        return redis.Redis(port=self.port, password=self.password, socket_timeout=5)

    def stop(self) -> None:
        import subprocess
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def redis_server_factory(tmp_path: Any) -> Iterator[Callable[..., RedisServer]]:
    """Start ``redis-server``s (``make(password=None)``); every one is stopped after the test."""
    servers: list[RedisServer] = []

    def make(password: str | None = None) -> RedisServer:
        d = tmp_path / f"redis{len(servers)}"
        d.mkdir()
        server = RedisServer(str(d), password)
        servers.append(server)
        server.start()
        return server

    try:
        yield make
    finally:
        for server in servers:
            server.stop()


@pytest.fixture
def redis_server(redis_server_factory: Callable[..., RedisServer]) -> RedisServer:
    """One ``redis-server`` on a loopback port picked for this test."""
    return redis_server_factory()
