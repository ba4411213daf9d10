"""GCS storage: one conformance suite over every backend (memory, Redis), sharding, URLs."""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable, Iterator, TypeVar

import pytest

from lumos._private.gcs.storage import (Append, Delete, GcsStorage, Op, Put, StorageUnavailable, StorageWriter,
                                        check_storage_url, create_storage, redact_url)
from lumos._private.gcs.storage.redis_storage import RedisStorage, parse_redis_url

from tests.conftest import RedisServer

_T = TypeVar("_T")


def run(coro: Awaitable[_T]) -> _T:
    async def with_deadline() -> _T:
        async with asyncio.timeout(30):
            return await coro
    return asyncio.run(with_deadline())


@pytest.fixture(params=["memory", "redis"])
def storage_url(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "memory":
        yield "memory"
    else:
        server: RedisServer = request.getfixturevalue("redis_server")
        yield server.url


def with_storage(url: str, body: Callable[[GcsStorage], Awaitable[_T]]) -> _T:
    """Run ``body`` against a fresh, started storage and close it afterwards."""
    async def go() -> _T:
        st = create_storage(url)
        try:
            await st.start()
            return await body(st)
        finally:
            await st.aclose()
    return run(go())


# ----------------------------------------------------------------------------- conformance


def test_put_get_delete_and_get_all(storage_url: str) -> None:
    async def body(st: GcsStorage) -> None:
        assert await st.get("kv", b"a") is None
        assert await st.get_all("kv") == {}
        await st.put("kv", b"a", b"1")
        await st.put("kv", b"b\0x", b"\xff" * 3)
        await st.put("jobs", b"a", b"other table")
        assert await st.get("kv", b"a") == b"1"
        assert await st.get_all("kv") == {b"a": b"1", b"b\0x": b"\xff" * 3}
        await st.put("kv", b"a", b"2")  # overwrite
        await st.delete("kv", b"b\0x")
        await st.delete("kv", b"never there")
        assert await st.get_all("kv") == {b"a": b"2"}
        assert await st.get_all("jobs") == {b"a": b"other table"}
    with_storage(storage_url, body)


def test_batch_applies_ops_on_one_key_in_order(storage_url: str) -> None:
    async def body(st: GcsStorage) -> None:
        await st.write_batch([Put("t", b"k", b"1"), Delete("t", b"k"), Put("t", b"k", b"3"),
                              Put("t", b"j", b"x"), Delete("t", b"j")])
        assert await st.get_all("t") == {b"k": b"3"}
    with_storage(storage_url, body)


def test_stream_keeps_order_and_is_trimmed(storage_url: str) -> None:
    async def body(st: GcsStorage) -> list[bytes]:
        await st.write_batch([Append("events", str(i).encode(), 50) for i in range(400)])
        return await st.read_stream("events")
    got = with_storage(storage_url, body)
    values = [int(v) for v in got]
    assert values == sorted(values) and values[-1] == 399
    # Redis trims with MAXLEN ~ (whole macro nodes): bounded, if not exactly 50.
    assert 50 <= len(values) < 400


def test_data_outlives_the_client_only_when_durable(storage_url: str) -> None:
    async def write(st: GcsStorage) -> None:
        await st.put("nodes", b"n1", b"row")
        await st.append("task_events", b"batch", 10)

    async def read(st: GcsStorage) -> tuple[dict[bytes, bytes], list[bytes], bool]:
        return await st.get_all("nodes"), await st.read_stream("task_events"), st.durable

    with_storage(storage_url, write)
    rows, stream, durable = with_storage(storage_url, read)
    if durable:
        assert rows == {b"n1": b"row"} and stream == [b"batch"]
    else:
        assert rows == {} and stream == []


def test_writer_orders_batches_and_acknowledges_once_written(storage_url: str) -> None:
    async def body(st: GcsStorage) -> None:
        w = StorageWriter(st)
        w.start()
        try:
            for i in range(200):
                w.put_nowait("actors", b"a%d" % (i % 7), b"v%d" % i)
            w.delete_nowait("actors", b"a0")
            seq = w.put_nowait("kv", b"ns\0key", b"value")
            w.append_nowait("task_events", b"e", 100)
            await w.wait_written(seq)
            assert w.written >= seq
            rows = await st.get_all("actors")
            assert rows == {b"a%d" % k: b"v%d" % max(i for i in range(200) if i % 7 == k) for k in range(1, 7)}
            assert await st.get("kv", b"ns\0key") == b"value"
        finally:
            await w.aclose()
        assert await st.read_stream("task_events") == [b"e"]
    with_storage(storage_url, body)


# ----------------------------------------------------------------------------- Redis specifics


def test_keys_are_sharded_over_both_servers(redis_server_factory: Callable[..., RedisServer]) -> None:
    a, b = redis_server_factory(), redis_server_factory()
    url = f"redis://{a.address},{b.address}"

    async def body(st: GcsStorage) -> dict[bytes, bytes]:
        assert isinstance(st, RedisStorage) and len(st.shards) == 2
        await st.write_batch([Put("kv", b"key%d" % i, b"v%d" % i) for i in range(64)])
        return await st.get_all("kv")

    assert with_storage(url, body) == {b"key%d" % i: b"v%d" % i for i in range(64)}
    on_a = a.client().hgetall("lumos:kv")
    on_b = b.client().hgetall("lumos:kv")
    assert on_a and on_b, "every key landed on one server"
    assert not set(on_a) & set(on_b)
    assert len(on_a) + len(on_b) == 64


def test_a_different_shard_list_is_refused(redis_server_factory: Callable[..., RedisServer]) -> None:
    a, b = redis_server_factory(), redis_server_factory()
    with_storage(f"redis://{a.address},{b.address}", lambda st: st.put("kv", b"k", b"v"))
    with pytest.raises(StorageUnavailable, match="sharded over 2 Redis servers"):
        with_storage(f"redis://{a.address}", lambda st: st.get_all("kv"))


def test_password_from_the_url_is_used_and_checked(redis_server_factory: Callable[..., RedisServer]) -> None:
    server = redis_server_factory(password="s3cret")
    with_storage(server.url, lambda st: st.put("kv", b"k", b"v"))
    assert server.client().hget("lumos:kv", b"k") == b"v"
    with pytest.raises(StorageUnavailable, match="check the user and password"):
        with_storage(f"redis://:wrong@{server.address}", lambda st: st.get_all("kv"))
    with pytest.raises(StorageUnavailable, match="check the user and password"):
        with_storage(f"redis://{server.address}", lambda st: st.get_all("kv"))


def test_a_wrong_password_is_reported_as_such_within_the_storages_timeout(
        redis_server_factory: Callable[..., RedisServer]) -> None:
    # redis-py counts a refused password as a connection error and (since 8.0) tries a
    # command ten times, up to a second apart: the storage's own deadline came first and
    # a wrong password read as a timeout (the test above failed so under load).
    server = redis_server_factory(password="s3cret")

    async def go() -> None:
        st = RedisStorage(f"redis://:wrong@{server.address}", timeout_s=1.0)
        try:
            await st.start()
        finally:
            await st.aclose()

    with pytest.raises(StorageUnavailable, match="check the user and password"):
        run(go())


def test_unreachable_redis_is_a_clear_error() -> None:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(StorageUnavailable, match=f"Redis at 127.0.0.1:{port}"):
        with_storage(f"redis://127.0.0.1:{port}", lambda st: st.get_all("kv"))


def test_urls_parse_and_are_redacted() -> None:
    u = parse_redis_url("redis://alice:p%40ss@10.0.0.1:7000,[::1]:7001/2?prefix=c1")
    assert u.hosts == (("10.0.0.1", 7000), ("::1", 7001))
    assert (u.username, u.password, u.db, u.prefix, u.ssl) == ("alice", "p@ss", 2, "c1:", False)
    assert parse_redis_url("redis://pw@h").hosts == (("h", 6379),)
    assert parse_redis_url("redis://pw@h").password == "pw"
    assert redact_url("redis://alice:p%40ss@h:1,h:2") == "redis://alice:***@h:1,h:2"
    assert redact_url("redis://h:1") == "redis://h:1"
    check_storage_url("memory")
    for bad, why in [("redis://h:notaport", "expected HOST:PORT"), ("etcd://h:1", "unknown GCS storage"),
                     ("redis://h:1?shards=2", "unknown parameter"), ("redis://:pw@h:1/x", "must be a number")]:
        with pytest.raises(ValueError, match=why) as e:
            check_storage_url(bad)
        assert "pw" not in str(e.value)


def test_config_keeps_the_password_off_command_lines() -> None:
    from lumos._private.config import Config
    c = Config.resolve({"gcs_storage": "redis://:hunter2@127.0.0.1:6379"})
    assert c.gcs_storage == "redis://:hunter2@127.0.0.1:6379"
    assert "hunter2" not in c.to_json()
    with pytest.raises(ValueError, match="unknown GCS storage"):
        Config.resolve({"gcs_storage": "mysql://x"})


class _FlakyStorage(GcsStorage):
    """Refuses the first ``outages`` batches as an outage, then one batch as a bug."""

    def __init__(self, outages: int) -> None:
        from lumos._private.gcs.storage.memory import InMemoryStorage
        self.inner = InMemoryStorage()
        self.outages = outages
        self.bug_once = True

    async def write_batch(self, ops: list[Op]) -> None:
        if self.outages:
            self.outages -= 1
            raise StorageUnavailable("down")
        if self.bug_once and any(isinstance(op, Put) and op.value == b"bad" for op in ops):
            self.bug_once = False
            raise RuntimeError("refused command")
        await self.inner.write_batch(ops)

    async def get(self, table: str, key: bytes) -> bytes | None:
        return await self.inner.get(table, key)

    async def get_all(self, table: str) -> dict[bytes, bytes]:
        return await self.inner.get_all(table)

    async def read_stream(self, stream: str) -> list[bytes]:
        return await self.inner.read_stream(stream)


def test_writer_retries_an_outage_and_reports_a_refused_batch(caplog: pytest.LogCaptureFixture) -> None:
    async def body() -> None:
        st = _FlakyStorage(outages=3)
        w = StorageWriter(st, retry_max_s=0.05)
        w.start()
        try:
            await w.wait_written(w.put_nowait("kv", b"a", b"1"))  # taken once the outage ends
            assert await st.get("kv", b"a") == b"1" and not w.failing
            with pytest.raises(StorageUnavailable, match="refused command"):
                await w.wait_written(w.put_nowait("kv", b"b", b"bad"))
            await w.wait_written(w.put_nowait("kv", b"c", b"3"))  # the writer goes on
            assert await st.get_all("kv") == {b"a": b"1", b"c": b"3"}
        finally:
            await w.aclose()
    run(body())
    assert "retrying until it is back" in caplog.text and "they are lost" in caplog.text


def test_health_state_exits_only_after_the_documented_bound() -> None:
    from lumos._private.gcs.storage import StorageHealthState
    h = StorageHealthState(exit_after_s=60.0)
    assert h.healthy and h.answered(5.0) is None and h.describe(5.0) == "ok"
    assert h.failed("refused", 10.0) is False
    assert h.failed("refused", 69.0) is False and not h.healthy
    assert "unavailable for 59.0s (refused)" in h.describe(69.0)
    assert "gcs_storage_unavailable_exit_s=60s" in h.describe(69.0)
    assert h.answered(69.5) == 59.5 and h.healthy  # back in time: the clock starts over
    assert h.failed("refused", 100.0) is False
    assert h.failed("refused", 160.0) is True


def test_a_redis_shard_that_lost_its_data_is_reported(redis_server_factory: Callable[..., RedisServer]) -> None:
    a, b = redis_server_factory(), redis_server_factory()

    async def body(st: GcsStorage) -> None:
        assert await st.lost_parts() == []
        b.client().flushall()  # as a Redis restarted without its data
        assert await st.lost_parts() == [f"Redis at {b.address}"]
        await st.mark_parts()
        assert await st.lost_parts() == []
        a.stop()
        with pytest.raises(StorageUnavailable, match=f"Redis at {a.address}"):
            await st.lost_parts()
    with_storage(f"redis://{a.address},{b.address}", body)
