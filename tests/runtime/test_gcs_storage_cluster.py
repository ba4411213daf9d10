"""A real cluster whose GCS keeps its tables in real Redis servers: write-through and recovery."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from typing import Any, Callable, Iterator

import psutil
import pytest

import lumos
from lumos._private.config import Config
from lumos._private.gcs.storage import unpack_value
from lumos._private.protocol import messages as m
from lumos._private.transport.connection import connect, parse_address
from lumos.testing import Cluster

from tests.conftest import TEST_CONFIG, RedisServer, check_no_leaks, wait_for


def gcs_call(cluster: Cluster, msg: Any) -> Any:
    """One RPC to the cluster's GCS from a connection of its own."""
    config = Config.resolve(TEST_CONFIG)

    async def go() -> Any:
        async with asyncio.timeout(20):
            conn = await connect(parse_address(cluster.address), token=cluster.token.encode(), config=config,
                                 name="test->gcs")
            try:
                return await conn.call(msg, 10.0)
            finally:
                conn.close()
    return asyncio.run(go())


@pytest.fixture
def redis_cluster(redis_server_factory: Callable[..., RedisServer]) -> Iterator[tuple[Cluster, list[RedisServer]]]:
    servers = [redis_server_factory(), redis_server_factory()]
    url = "redis://" + ",".join(s.address for s in servers)
    cluster = Cluster(initialize_head=True,
                      head_node_args={"num_cpus": 1, "_system_config": {**TEST_CONFIG, "gcs_storage": url}})
    try:
        yield cluster, servers
    finally:
        cluster.shutdown()
        check_no_leaks(cluster.session_dir)


def rows(servers: list[RedisServer], table: str) -> dict[bytes, bytes]:
    out: dict[bytes, bytes] = {}
    for s in servers:
        with s.client() as c:
            out.update(c.hgetall(f"lumos:{table}"))
    return out


@lumos.remote
class Counter:
    def __init__(self) -> None:
        self.n = 0

    def incr(self) -> int:
        self.n += 1
        return self.n


@lumos.remote
def square(x: int) -> int:
    return x * x


@pytest.mark.slow
def test_every_table_is_written_through_to_redis(redis_cluster: tuple[Cluster, list[RedisServer]]) -> None:
    cluster, servers = redis_cluster
    cluster.connect(namespace="ns1")
    c = Counter.options(name="counter", lifetime="detached", num_cpus=0).remote()
    assert lumos.get(c.incr.remote(), timeout=30) == 1
    assert lumos.get(square.remote(7), timeout=30) == 49
    pg = lumos.util.placement_group([{"CPU": 0.5}])
    assert pg.wait(timeout_seconds=30)
    assert gcs_call(cluster, m.KvPut("user", b"answer", b"42", True)) is True
    # Acknowledged, so already in Redis: no waiting here.
    assert rows(servers, "kv")[b"user\0answer"] == b"42"
    actors = {k: unpack_value(v) for k, v in rows(servers, "actors").items()}
    info, spec = next(iter(actors.values()))[:2]
    assert (info.name, info.namespace, info.state, info.detached) == ("counter", "ns1", "ALIVE", True)
    assert spec.actor_id == info.actor_id
    assert any(k.startswith(b"fn\0") for k in rows(servers, "kv")), "exported functions are not kept"
    nodes = [unpack_value(v) for v in rows(servers, "nodes").values()]
    assert [n.state for n in nodes] == ["ALIVE"] and nodes[0].resources_total["CPU"] == 1
    jobs = [unpack_value(v) for v in rows(servers, "jobs").values()]
    assert [j.state for j in jobs] == ["RUNNING"]
    groups = [unpack_value(v) for v in rows(servers, "placement_groups").values()]
    assert [g.state for g in groups] == ["CREATED"]
    # The task-event log is a bounded stream on one of the servers.
    wait_for(lambda: any(s.client().xlen("lumos:stream:task_events") for s in servers), 10)
    # A table is spread over both servers (with 32 more keys, each server gets some).
    for i in range(32):
        gcs_call(cluster, m.KvPut("user", b"k%d" % i, b"v", True))
    assert all(s.client().hlen("lumos:kv") for s in servers)
    lumos.kill(c)
    wait_for(lambda: unpack_value(rows(servers, "actors")[info.actor_id])[0].state == "DEAD", 10)


@pytest.mark.slow
def test_restarted_gcs_recovers_named_actors_kv_and_jobs(redis_cluster: tuple[Cluster, list[RedisServer]]) -> None:
    cluster, servers = redis_cluster
    cluster.connect(namespace="ns1")
    job_before = lumos.get_runtime_context().get_job_id()
    c = Counter.options(name="counter", lifetime="detached", num_cpus=0, max_restarts=-1).remote()
    assert lumos.get(c.incr.remote(), timeout=30) == 1
    assert gcs_call(cluster, m.KvPut("user", b"answer", b"42", True)) is True
    lumos.shutdown()

    cluster.kill_gcs()
    cluster.restart_gcs()

    assert gcs_call(cluster, m.KvGet("user", b"answer", 0.0)) == b"42"
    jobs = {j.job_id.hex(): j for j in gcs_call(cluster, m.GetAllJobs())}
    assert job_before in jobs
    named = gcs_call(cluster, m.GetNamedActor("counter", "ns1"))
    assert named is not None and named.detached
    # The restarted GCS serves new nodes and drivers, and the named actor answers again
    # (restarted on the new node if its own went with the old GCS).
    cluster.add_node(num_cpus=1)
    cluster.connect(namespace="ns1")
    again = lumos.get_actor("counter")
    assert lumos.get(again.incr.remote(), timeout=60) >= 1
    assert lumos.get(square.remote(5), timeout=60) == 25


@pytest.mark.slow
def test_lumos_start_keeps_the_gcs_in_password_protected_redis(
        redis_server_factory: Callable[..., RedisServer]) -> None:
    from tests.runtime.test_cli import CliEnv, assert_all_gone, start_head
    server = redis_server_factory(password="hunter2")
    cli = CliEnv()
    try:
        address, token = start_head(cli, "--gcs-storage", server.url)
        out = cli.driver(f"""
            import lumos
            lumos.init(address={address!r}, _token={token!r})
            @lumos.remote
            def f():
                return 3
            print("RESULT", lumos.get(f.remote(), timeout=30))
        """)
        assert "RESULT 3" in out.stdout, out.stderr
        nodes = [unpack_value(v) for v in rows([server], "nodes").values()]
        assert [n.state for n in nodes] == ["ALIVE"]
        procs, records = cli.processes(), cli.records()
        read = 0
        for p in procs:  # the password is on no command line
            try:
                assert "hunter2" not in " ".join(p.cmdline())
                read += 1
            except psutil.NoSuchProcess:  # (ZombieProcess too: a worker of the driver's, ending with its job)
                pass
        assert read >= len(records[0]["processes"]), (read, records)  # the node's own ones were read
        cli.lumos("stop")
        assert_all_gone(procs, records)
    finally:
        cli.cleanup()


@lumos.remote(num_cpus=0.5)
def node_of() -> str:
    return lumos.get_runtime_context().get_node_id()


@pytest.mark.slow
def test_a_label_selector_this_node_misses_waits_for_the_restarted_gcs(
        redis_cluster: tuple[Cluster, list[RedisServer]]) -> None:
    """With its GCS away, a raylet serves the requests it gets itself; one whose
    label_selector its node does not meet waits for the GCS instead (it ran on the wrong
    node before), and runs where the selector holds once the GCS is back."""
    cluster, _ = redis_cluster
    a = cluster.add_node(num_cpus=1, labels={"zone": "a"})
    cluster.connect()
    on_a = node_of.options(label_selector={"zone": "a"})
    assert lumos.get(on_a.remote(), timeout=30) == a.node_id
    cluster.kill_gcs()
    # (another shape than the call above: no lease of that one to reuse)
    ref = node_of.options(label_selector={"zone": "a"}, num_cpus=0.25).remote()
    ready, _ = lumos.wait([ref], timeout=2.0)
    assert ready == []  # the head's raylet would have run it on the head
    cluster.restart_gcs()
    assert lumos.get(ref, timeout=60) == a.node_id


@pytest.mark.slow
def test_actors_and_tasks_keep_working_while_the_gcs_restarts(
        redis_cluster: tuple[Cluster, list[RedisServer]]) -> None:
    cluster, _ = redis_cluster
    cluster.connect(namespace="ns1")
    c = Counter.options(name="counter", lifetime="detached", num_cpus=0).remote()
    assert lumos.get(c.incr.remote(), timeout=30) == 1
    assert lumos.get(square.remote(2), timeout=30) == 4
    job = lumos.get_runtime_context().get_job_id()

    cluster.kill_gcs()
    # The GCS is down: calls on a live actor go straight to its worker, tasks get local leases.
    assert lumos.get(c.incr.remote(), timeout=30) == 2
    assert lumos.get(square.remote(3), timeout=30) == 9
    cluster.restart_gcs()

    # Operations that need the GCS work again, on the same actor (its state kept: not restarted).
    again = lumos.get_actor("counter")
    assert lumos.get(again.incr.remote(), timeout=30) == 3
    d = Counter.remote()
    assert lumos.get(d.incr.remote(), timeout=30) == 1
    jobs = {j.job_id.hex(): j.state for j in gcs_call(cluster, m.GetAllJobs())}
    assert jobs[job] == "RUNNING"
    nodes = gcs_call(cluster, m.GetAllNodes())
    assert [n.state for n in nodes] == ["ALIVE"], "the head's raylet did not come back as the same node"


def test_a_client_drivers_metrics_recorded_while_the_gcs_restarts_reach_it(
        redis_cluster: tuple[Cluster, list[RedisServer]]) -> None:
    """A client-mode driver reports its metrics through its session, which passed them on
    only while the GCS was there: what it recorded during a restart was dropped. The
    session holds them with the rest of its backlog now. (The GCS keeps metrics in
    memory: the restarted one counts from what it is sent, as a Prometheus counter reset.)"""
    from lumos._private import metrics as pm
    from lumos._private.client.launch import start_client_server
    from lumos.util.metrics import Counter as MetricCounter
    cluster, servers = redis_cluster
    url = "redis://" + ",".join(s.address for s in servers)
    address = start_client_server(cluster._head_processes(), "127.0.0.1", 0, cluster.address,
                                  {**TEST_CONFIG, "gcs_storage": url}, tie_to_parent=True)

    def value() -> list[float]:
        return [s["value"] for r in lumos.state.metrics() if r["name"] == "client_restart_records"
                for s in r["series"]]

    lumos.init(address, _token=cluster.token)
    try:
        records = MetricCounter("client_restart_records")
        records.inc()
        assert value() == [1.0]
        cluster.kill_gcs()
        records.inc(2)
        wait_for(lambda: not pm.BUFFER.pending(), 15)  # the heartbeat's turn: with the session now
        time.sleep(0.5)
        cluster.restart_gcs()
        wait_for(lambda: value() == [2.0], 30)
    finally:
        lumos.shutdown()


@pytest.mark.slow
def test_without_redis_a_gcs_death_fails_the_driver_at_once() -> None:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "_system_config": TEST_CONFIG})
    try:
        cluster.connect()
        assert lumos.get(square.remote(2), timeout=30) == 4
        cluster.kill_gcs()

        def fails() -> bool:
            try:
                lumos.get(square.remote(3), timeout=5)
            except lumos.exceptions.ClusterUnavailableError:
                return True
            return False
        wait_for(fails, 20, 0.2)
    finally:
        cluster.shutdown()
        check_no_leaks(cluster.session_dir)


@pytest.mark.slow
def test_a_gcs_that_never_returns_stops_raylets_and_fails_drivers(redis_server: RedisServer) -> None:
    import glob
    import os
    from tests.conftest import process_gone
    config = {**TEST_CONFIG, "gcs_storage": redis_server.url, "gcs_reconnect_timeout_s": 2.0}
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "_system_config": config})
    try:
        cluster.connect()
        assert lumos.get(square.remote(2), timeout=30) == 4
        raylet_pid = cluster.head_node.raylet_pid  # type: ignore[union-attr]
        cluster.kill_gcs()
        wait_for(lambda: process_gone(raylet_pid), 30, 0.1)
        [log] = glob.glob(os.path.join(cluster.session_dir, "logs", "raylet-*.log"))
        with open(log) as f:
            assert "within gcs_reconnect_timeout_s=2s" in f.read()
        with pytest.raises(lumos.exceptions.ClusterUnavailableError):
            lumos.get(square.remote(3), timeout=30)
    finally:
        cluster.shutdown()
        check_no_leaks(cluster.session_dir)


def kill_redis(server: RedisServer) -> None:
    """SIGKILL ``server`` (no shutdown save): it comes back from what its AOF holds, if anything."""
    server.proc.kill()
    server.proc.wait(10)


def wipe_redis_data(server: RedisServer) -> None:
    """Remove the killed ``server``'s data files: its next start is an empty Redis."""
    import os
    import shutil
    for name in os.listdir(server.data_dir):
        path = os.path.join(server.data_dir, name)
        if name != "redis.log":
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)


def gcs_log(cluster: Cluster) -> str:
    import glob
    import os
    out = ""
    for path in glob.glob(os.path.join(cluster.session_dir, "logs", "gcs*.log")):
        with open(path) as f:
            out += f.read()
    return out


@pytest.mark.slow
def test_the_same_gcs_writes_again_once_redis_restarts(redis_server: RedisServer) -> None:
    config = {**TEST_CONFIG, "gcs_storage": redis_server.url, "gcs_storage_check_interval_ms": 200}
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "_system_config": config})
    try:
        gcs_pid = cluster.head_node._processes.gcs_proc.pid  # type: ignore[union-attr]
        redis_server.client().config_set("appendfsync", "always")  # what was acknowledged is in the AOF
        assert gcs_call(cluster, m.KvPut("user", b"before", b"1", True)) is True
        kill_redis(redis_server)  # SIGKILL: no shutdown save, only the append-only file
        redis_server.start()  # same port, same file
        assert gcs_call(cluster, m.KvPut("user", b"after", b"2", True)) is True
        assert redis_server.client().hget("lumos:kv", b"user\0before") == b"1"
        assert redis_server.client().hget("lumos:kv", b"user\0after") == b"2"
        assert cluster.head_node._processes.gcs_proc.pid == gcs_pid  # type: ignore[union-attr]
        assert cluster.head_node._processes.gcs_proc.poll() is None  # type: ignore[union-attr]
    finally:
        cluster.shutdown()
        check_no_leaks(cluster.session_dir)


@pytest.mark.slow
def test_a_redis_that_never_returns_makes_the_gcs_unhealthy_then_exit(
        redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    import contextlib
    import io
    import json
    from lumos import cli
    from tests.conftest import process_gone
    config = {**TEST_CONFIG, "gcs_storage": redis_server.url, "gcs_storage_check_interval_ms": 100,
              "gcs_storage_unavailable_exit_s": 5.0, "gcs_reconnect_timeout_s": 2.0, "gcs_storage_timeout_s": 1.0}
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "_system_config": config})
    try:
        monkeypatch.setenv("LUMOS_CLUSTER_TOKEN", cluster.token)  # for `lumos status`
        cluster.connect()
        assert lumos.get(square.remote(2), timeout=30) == 4
        gcs_proc = cluster.head_node._processes.gcs_proc  # type: ignore[union-attr]
        raylet_pid = cluster.head_node.raylet_pid  # type: ignore[union-attr]
        assert gcs_call(cluster, m.KvGet("cluster", b"gcs_storage_health", 0.0)) == b"ok"
        kill_redis(redis_server)  # and never started again

        def reported() -> bool:
            health = gcs_call(cluster, m.KvGet("cluster", b"gcs_storage_health", 0.0))
            return health.startswith(b"unavailable for")
        wait_for(reported, 10, 0.05)
        assert "GCS unhealthy: its storage" in gcs_log(cluster)
        status = io.StringIO()
        with contextlib.redirect_stdout(status):
            assert cli.main(["status", "--address", cluster.address, "--json"]) == 0
        assert json.loads(status.getvalue())["gcs_storage_health"].startswith("unavailable for")
        gcs_proc.wait(30)
        assert gcs_proc.returncode == 1
        assert "the GCS exits: its storage" in gcs_log(cluster)
        # Then the raylet and the driver take their GCS-gone paths.
        wait_for(lambda: process_gone(raylet_pid), 30, 0.1)
        with pytest.raises(lumos.exceptions.ClusterUnavailableError):
            lumos.get(square.remote(3), timeout=30)
    finally:
        cluster.shutdown()
        check_no_leaks(cluster.session_dir)


@pytest.mark.slow
def test_a_redis_that_comes_back_empty_gets_the_live_tables_written_back(redis_server: RedisServer) -> None:
    config = {**TEST_CONFIG, "gcs_storage": redis_server.url, "gcs_storage_check_interval_ms": 200}
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "_system_config": config})
    try:
        cluster.connect(namespace="ns1")
        c = Counter.options(name="counter", lifetime="detached", num_cpus=0).remote()
        assert lumos.get(c.incr.remote(), timeout=30) == 1
        pg = lumos.util.placement_group([{"CPU": 0.5}])
        assert pg.wait(timeout_seconds=30)
        assert gcs_call(cluster, m.KvPut("user", b"answer", b"42", True)) is True
        tables = ["nodes", "jobs", "kv", "actors", "placement_groups"]
        before = {t: set(rows([redis_server], t)) for t in tables}
        assert all(before.values())

        kill_redis(redis_server)
        wipe_redis_data(redis_server)
        redis_server.start()  # same port, empty (the GCS may write back before we could look:
        # its log line below is what shows it found Redis empty)

        def back() -> bool:
            return all(before[t] <= set(rows([redis_server], t)) for t in tables)
        wait_for(back, 20, 0.1)
        assert "came back without the GCS's data; writing the live tables back" in gcs_log(cluster)
        assert rows([redis_server], "kv")[b"user\0answer"] == b"42"

        # What was written back is what a restarted GCS recovers from.
        cluster.kill_gcs()
        cluster.restart_gcs()
        again = lumos.get_actor("counter")
        assert lumos.get(again.incr.remote(), timeout=30) == 2
    finally:
        cluster.shutdown()
        check_no_leaks(cluster.session_dir)


@pytest.mark.slow
def test_a_stopped_cluster_leaves_its_nodes_and_jobs_ended_in_redis(redis_server: RedisServer) -> None:
    config = {**TEST_CONFIG, "gcs_storage": redis_server.url}
    first = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "_system_config": config})
    try:
        first.connect(namespace="ns1")
        c = Counter.options(name="once", lifetime="detached", num_cpus=0).remote()
        assert lumos.get(c.incr.remote(), timeout=30) == 1
        assert gcs_call(first, m.KvPut("user", b"kept", b"yes", True)) is True
    finally:
        first.shutdown()
        check_no_leaks(first.session_dir)
    assert {unpack_value(v).state for v in rows([redis_server], "nodes").values()} == {"DEAD"}
    assert {unpack_value(v).state for v in rows([redis_server], "jobs").values()} == {"FINISHED"}

    second = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "_system_config": config})
    try:
        assert gcs_call(second, m.KvGet("user", b"kept", 0.0)) == b"yes"
        # Its node was gone and max_restarts=0: the old detached actor is dead, its name free.
        assert gcs_call(second, m.GetNamedActor("once", "ns1")) is None
        alive = [n for n in gcs_call(second, m.GetAllNodes()) if n.state == "ALIVE"]
        assert len(alive) == 1
    finally:
        second.shutdown()
        check_no_leaks(second.session_dir)


@pytest.mark.slow
def test_calls_that_need_the_gcs_wait_for_its_restart(redis_cluster: tuple[Cluster, list[RedisServer]]) -> None:
    import threading
    cluster, _ = redis_cluster
    cluster.connect(namespace="ns1")
    c = Counter.options(name="counter", lifetime="detached", num_cpus=0).remote()
    assert lumos.get(c.incr.remote(), timeout=30) == 1
    cluster.kill_gcs()
    got: list[Any] = []

    def need_the_gcs() -> None:  # both need the GCS: they wait for the restarted one
        try:
            d = Counter.options(num_cpus=0).remote()
            found = lumos.get_actor("counter")
            got.append(lumos.get([d.incr.remote(), found.incr.remote()], timeout=30))
        except BaseException as e:
            got.append(e)

    # (The GCS is started from this thread: it dies with the thread that started it.)
    caller = threading.Thread(target=need_the_gcs)
    caller.start()
    try:
        from lumos import object_ref
        cw: Any = object_ref._core_worker
        wait_for(lambda: cw._gcs_reconnecting, 10)  # the driver saw the GCS go; the calls wait
        cluster.restart_gcs()
    finally:
        caller.join(60)
    assert got == [[1, 2]]


@pytest.mark.slow
def test_a_detached_actor_whose_node_died_during_the_outage_is_restarted(
        redis_cluster: tuple[Cluster, list[RedisServer]]) -> None:
    cluster, _ = redis_cluster
    doomed = cluster.add_node(num_cpus=1, resources={"spot": 1})
    cluster.connect(namespace="ns1")
    c = Counter.options(name="survivor", lifetime="detached", num_cpus=0, resources={"spot": 0.5},
                        max_restarts=1).remote()
    assert lumos.get([c.incr.remote(), c.incr.remote()], timeout=30) == [1, 2]
    cluster.kill_gcs()
    cluster.remove_node(doomed)  # SIGKILL while the GCS is down: nobody sees it go
    cluster.restart_gcs()
    cluster.add_node(num_cpus=1, resources={"spot": 1})
    # The restarted GCS declares the silent node dead and restarts the actor elsewhere.
    assert lumos.get(c.incr.remote(), timeout=60) == 1
    info = gcs_call(cluster, m.GetNamedActor("survivor", "ns1"))
    assert info.num_restarts == 1 and info.node_id != bytes.fromhex(doomed.node_id)


@lumos.remote
class Holder:
    def __init__(self, blob: bytes) -> None:
        self.n = len(blob)

    def size(self) -> int:
        return self.n


@lumos.remote
def sizes_through(handles: list[Any]) -> list[Any]:
    out: list[Any] = []
    for h in handles:
        try:
            out.append(lumos.get(h.size.remote(), timeout=30))
        except lumos.exceptions.ActorDiedError as e:
            out.append(str(e))
    return out


@pytest.mark.slow
def test_the_gcs_keeps_the_last_dead_actors_without_their_arguments(redis_server: RedisServer) -> None:
    """A long-lived cluster's actor table held every actor it ever ran, each with its
    constructor's arguments (50 KB each here), in memory and in Redis. Now a dead actor's
    row loses the arguments and only the most recently dead few are kept: a handle to an
    older one fails with an error saying so."""
    config = {**TEST_CONFIG, "gcs_storage": redis_server.url, "maximum_gcs_destroyed_actor_cached_count": 3}
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "_system_config": config})
    try:
        cluster.connect()
        blob = b"x" * 50_000
        holders = [Holder.options(num_cpus=0).remote(blob) for _ in range(6)]
        assert lumos.get([h.size.remote() for h in holders], timeout=60) == [len(blob)] * 6
        for h in holders[:5]:
            lumos.kill(h)
        ids = [h._actor_id for h in holders]
        wait_for(lambda: set(rows([redis_server], "actors")) == set(ids[2:]), 30)
        table = {r["actor_id"]: r["state"] for r in lumos.state.list_actors()}
        assert table == {**{i.hex(): "DEAD" for i in ids[2:5]}, ids[5].hex(): "ALIVE"}
        stored = {k: unpack_value(v) for k, v in rows([redis_server], "actors").items()}
        assert all(stored[i][1].args == b"" for i in ids[2:5])
        assert blob in stored[ids[5]][1].args  # (alive: a restart would need it)

        got = lumos.get(sizes_through.remote(holders), timeout=60)
        assert all("forgotten" in g for g in got[:2]), got[:2]
        assert all("killed" in g for g in got[2:5]), got[2:5]
        assert got[5] == len(blob)
    finally:
        cluster.shutdown()
        check_no_leaks(cluster.session_dir)


_EXPORTING_DRIVER = """
import os, sys
import numpy as np
import lumos
lumos.init(address=sys.argv[1], _token=sys.argv[2], namespace="exports")
big = np.ones(100_000)

@lumos.remote
def total() -> float:
    return float(big.sum())  # (the closure sends the array with the function)

@lumos.remote(max_restarts=1)
class Keeper:
    def pid(self) -> int:
        return os.getpid()

assert lumos.get(total.remote(), timeout=60) == 100_000.0
if sys.argv[3] == "detached":
    k = Keeper.options(name="keeper", lifetime="detached").remote()
    lumos.get(k.pid.remote(), timeout=60)
print(lumos.get_runtime_context().get_job_id())
"""


def _job_entries(cluster: Cluster, servers: list[RedisServer], job: bytes) -> tuple[int, int]:
    """(in the GCS, in Redis) how many of the job's exported functions and config entries are kept."""
    gcs = len(gcs_call(cluster, m.KvKeys("fn", job))) + (gcs_call(cluster, m.KvGet("job", job)) is not None)
    stored = sum(1 for k in rows(servers, "kv") if k.startswith(b"fn\0" + job) or k == b"job\0" + job)
    return gcs, stored


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_finished_job_s_exported_functions_go_once_no_detached_actor_of_it_lives(
        redis_cluster: tuple[Cluster, list[RedisServer]]) -> None:
    """Each driver's functions and classes (closures and all: 800 KB here) and its config
    stayed in the GCS and Redis for the cluster's life. Now a finished job's go, unless a
    detached actor of it lives: it may restart (its class and config are read again then),
    and then they go with it."""
    cluster, servers = redis_cluster
    cluster.connect(namespace="exports")

    def run(kind: str) -> bytes:
        done = subprocess.run([sys.executable, "-c", _EXPORTING_DRIVER, cluster.address, cluster.token, kind],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return bytes.fromhex(done.stdout.split()[-1])

    def finished(job: bytes) -> bool:
        return any(j.job_id == job and j.state == "FINISHED" for j in gcs_call(cluster, m.GetAllJobs()))

    plain = run("plain")
    wait_for(lambda: finished(plain) and _job_entries(cluster, servers, plain) == (0, 0), 30)

    kept = run("detached")
    wait_for(lambda: finished(kept), 30)
    time.sleep(0.5)
    assert _job_entries(cluster, servers, kept) == (3, 3)  # the function, the class, the config
    keeper = lumos.get_actor("keeper")
    pid = lumos.get(keeper.pid.remote(), timeout=30)
    psutil.Process(pid).kill()  # it restarts: its class comes back from the GCS
    wait_for(lambda: _alive_pid(keeper) not in (None, pid), 60, 0.2)
    lumos.kill(keeper)
    wait_for(lambda: _job_entries(cluster, servers, kept) == (0, 0), 30)


def _alive_pid(actor: Any) -> int | None:
    try:
        return lumos.get(actor.pid.remote(), timeout=5)  # type: ignore[no-any-return]
    except (lumos.exceptions.ActorDiedError, lumos.exceptions.ActorUnavailableError, lumos.exceptions.GetTimeoutError):
        return None


_WORKING_DIR_DRIVER = """
import sys
import lumos
lumos.init(address=sys.argv[1], _token=sys.argv[2], runtime_env={"working_dir": sys.argv[3]})

@lumos.remote
def value() -> str:
    import wdmod
    return wdmod.VALUE

print(lumos.get_runtime_context().get_job_id(), flush=True)
sys.stdin.readline()  # (runs its task once told to)
print(lumos.get(value.remote(), timeout=60), flush=True)
"""


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_working_dir_package_goes_with_the_last_job_that_uses_it(
        redis_cluster: tuple[Cluster, list[RedisServer]], tmp_path: Any) -> None:
    """Two drivers with the same working_dir share its package (one upload, by content
    hash): it stays while either runs, the second's first task runs from it after the first
    driver ended, and it goes with the second, from the GCS, Redis and the node's disk
    (each package and unpacked copy stayed for the cluster's life)."""
    cluster, servers = redis_cluster
    wd = tmp_path / "wd"
    wd.mkdir()
    (wd / "wdmod.py").write_text("VALUE = 'from the working dir'\n")

    def start() -> tuple[subprocess.Popen[str], bytes]:
        p = subprocess.Popen([sys.executable, "-c", _WORKING_DIR_DRIVER, cluster.address, cluster.token,
                              str(wd)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert p.stdout is not None
        return p, bytes.fromhex(p.stdout.readline().split()[-1])

    def packages() -> tuple[int, int]:
        return (len(gcs_call(cluster, m.KvKeys("pkg", b""))),
                sum(1 for k in rows(servers, "kv") if k.startswith(b"pkg\0")))

    first, _ = start()
    second, _ = start()
    try:
        assert packages() == (1, 1)
        out, _ = first.communicate("go\n", timeout=90)
        assert out.strip() == "from the working dir" and first.returncode == 0
        time.sleep(0.5)
        assert packages() == (1, 1)  # the second job uses it still
        unpacked = os.path.join(cluster.session_dir, "runtime_resources")
        assert [d for d in os.listdir(unpacked) if d.startswith("working_dir_")]
        out, _ = second.communicate("go\n", timeout=90)
        assert out.strip() == "from the working dir" and second.returncode == 0
        wait_for(lambda: packages() == (0, 0), 30)
        wait_for(lambda: os.listdir(unpacked) == [], 30)  # (nor the node's unpacked copy)
    finally:
        for p in (first, second):
            if p.poll() is None:
                p.kill()
                p.wait()
