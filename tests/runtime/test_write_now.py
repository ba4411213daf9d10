"""``Connection.write_now``: a message written to the socket from another thread (a
worker's reply leaving from its executor thread) never interleaves with the loop's own
writes, keeps its order, and a frame the socket takes only in part is finished by the loop."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading

import pytest

from lumos._private.config import Config
from lumos._private.protocol import messages as m
from lumos._private.transport import connection, eventloop
from lumos._private.transport.connection import RpcServer, connect

TOKEN = b"write-now-test-token-0123456789ab"


@pytest.mark.timeout(60)
def test_write_now_from_another_thread_keeps_frames_whole_and_in_order(tmp_path):
    received: list[tuple[str, int, int]] = []
    total = 2 * 300 + 3

    async def go() -> None:
        async with _served(tmp_path, received, total) as (conn, done):
            assert not conn.write_now(m.Publish("thread", b"\0", b"")), "written before allow_write_now"
            conn.allow_write_now()
            big = b"x" * (16 * 1024 * 1024)  # more than the socket takes at once: the loop finishes it
            written: list[bool] = []

            def writer() -> None:
                for i in range(300):
                    body = m.Publish("thread", bytes([i % 256]), b"y" * (i * 37 % 5000))
                    if not conn.write_now(body):  # busy: the loop sends it, after what it holds
                        asyncio.run_coroutine_threadsafe(_notify(conn, body), loop).result(10)
                written.append(conn.write_now(m.Publish("big", b"\1", big)))

            loop = asyncio.get_running_loop()
            t = threading.Thread(target=writer)
            t.start()
            for i in range(300):  # the loop's own sends, at the same time
                conn.notify(m.Publish("loop", bytes([i % 256]), b"z" * (i * 53 % 7000)))
                await asyncio.sleep(0)
            await asyncio.to_thread(t.join, 30)
            conn.notify(m.Publish("after", b"\2", b""))
            conn.notify(m.Publish("after", b"\3", b""))
            await asyncio.wait_for(done, 30)
            assert written == [True]

    eventloop.run(go())
    by_channel: dict[str, list[tuple[int, int]]] = {}
    for channel, key, size in received:
        by_channel.setdefault(channel, []).append((key, size))
    assert by_channel["thread"] == [(i % 256, i * 37 % 5000) for i in range(300)]
    assert by_channel["loop"] == [(i % 256, i * 53 % 7000) for i in range(300)]
    assert by_channel["big"] == [(1, 16 * 1024 * 1024)]
    assert received[-2:] == [("after", 2, 0), ("after", 3, 0)]  # sent after the big frame, arrive after it


async def _notify(conn, body) -> None:
    conn.notify(body)


@contextlib.asynccontextmanager
async def _pair(tmp_path, on_publish):
    """A server and a client over a Unix socket, ``on_publish(conn, msg)`` the client's
    handler of ``Publish``: (the server's side of the connection, the client's)."""
    config = Config()
    server = RpcServer(token=TOKEN, config=config, handlers={}, name="test-server")
    await server.start(unix_path=str(tmp_path / "s.sock"))
    client = await connect(str(tmp_path / "s.sock"), token=TOKEN, config=config,
                           handlers={m.Publish: on_publish}, name="test-client", timeout_s=10)
    try:
        for _ in range(100):
            if server.connections:
                break
            await asyncio.sleep(0.01)
        (conn,) = server.connections
        yield conn, client
    finally:
        client.close()
        await server.stop()


@contextlib.asynccontextmanager
async def _served(tmp_path, received: list[tuple[str, int, int]], total: int):
    """``_pair``: the server's side of the connection, and a future done once the client
    received ``total`` ``Publish`` messages (appended to ``received`` as channel, first
    key byte, data length)."""
    done = asyncio.get_running_loop().create_future()

    def on_publish(conn, msg) -> None:
        received.append((msg.channel, msg.key[0] if msg.key else 0, len(msg.data)))
        if len(received) == total and not done.done():
            done.set_result(None)

    async with _pair(tmp_path, on_publish) as (conn, _client):
        yield conn, done


@pytest.mark.timeout(60)
def test_the_loops_own_big_frame_on_a_direct_connection_arrives_whole_before_later_ones(tmp_path):
    """With ``allow_write_now`` the loop writes its own sends through the same duplicated
    fd (``os.write`` lets the other threads run meanwhile); a frame the socket takes only
    in part is finished through the transport, and neither the loop's next sends nor
    another thread's ``write_now`` pass it."""
    received: list[tuple[str, int, int]] = []
    total = 2 + 50 + 1

    async def go() -> None:
        async with _served(tmp_path, received, total) as (conn, done):
            conn.allow_write_now()
            big = 32 * 1024 * 1024
            conn.notify(m.Publish("big", b"\1", b"x" * big))
            await asyncio.sleep(0)  # flushed: the socket took a part, the transport holds the rest
            assert not conn.write_now(m.Publish("thread", b"\0", b"")), "written past the big frame's rest"
            conn.notify(m.Publish("big", b"\2", b""))
            for i in range(50):
                conn.notify(m.Publish("loop", bytes([i]), b"z" * (i * 997 % 9000)))
                await asyncio.sleep(0)
            conn.notify(m.Publish("after", b"\3", b""))
            await asyncio.wait_for(done, 30)

    eventloop.run(go())
    assert received[:2] == [("big", 1, 32 * 1024 * 1024), ("big", 2, 0)]
    assert received[2:-1] == [("loop", i, i * 997 % 9000) for i in range(50)]
    assert received[-1] == ("after", 3, 0)


@pytest.mark.timeout(60)
def test_large_queued_frames_go_out_in_one_gather_write_and_arrive_whole_and_in_order(tmp_path, monkeypatch):
    """Sends queued in one loop turn that add up to ``GATHER_BYTES`` or more are written
    with ``os.writev`` of the pieces (no join: a fresh buffer over malloc's mmap threshold
    per flush); when the socket takes only part, the rest, cut inside a piece, is finished
    by the transport, before the loop's later sends and another thread's ``write_now``."""
    received: list[tuple[str, int, int]] = []
    sizes = [connection.GATHER_BYTES // 2 + i * 4099 for i in range(40)]  # ~3 MB: more than the socket takes
    total = len(sizes) + 2
    gathers: list[int] = []
    writev = os.writev

    def counting_writev(fd, buffers):
        buffers = list(buffers)
        gathers.append(len(buffers))
        return writev(fd, buffers)

    monkeypatch.setattr(os, "writev", counting_writev)

    async def go() -> None:
        async with _served(tmp_path, received, total) as (conn, done):
            conn.allow_write_now()
            with connection.batch():  # one loop turn: flushed together when it ends
                for i, size in enumerate(sizes):
                    conn.notify(m.Publish("large", bytes([i]), b"v" * size))
            assert gathers == [2 * len(sizes)], "the queued frames were not written in one gather write"
            assert not conn.write_now(m.Publish("thread", b"\0", b"")), "written past the gather's rest"
            conn.notify(m.Publish("after", b"\1", b""))
            conn.notify(m.Publish("after", b"\2", b""))
            await asyncio.wait_for(done, 30)

    eventloop.run(go())
    assert received[:-2] == [("large", i, size) for i, size in enumerate(sizes)]
    assert received[-2:] == [("after", 1, 0), ("after", 2, 0)]


@pytest.mark.timeout(60)
def test_what_a_peer_sent_before_it_went_is_read_when_a_write_finds_it_gone(tmp_path):
    """A worker that exits after its task (max_calls) writes its reply and goes. When this
    end writes to it before reading that reply (under load: the next task's push), the
    write fails (EPIPE) and the loop drops the connection without reading: the reply was
    lost, the task counted as in flight on a dead worker and ran again. What the peer sent
    is read through the duplicate fd first."""
    got: list[str] = []

    async def go() -> None:
        async with _pair(tmp_path, lambda conn, msg: got.append(msg.channel)) as (peer, client):
            client.allow_write_now()
            client._transport.pause_reading()  # busy elsewhere: the reply waits in the socket
            peer.notify(m.Publish("last words", b"\0", b""))
            await asyncio.sleep(0.1)
            peer.close()  # the peer exits
            await asyncio.sleep(0.1)
            client.notify(m.Publish("next task", b"\0", b"x" * 1000))  # finds it gone
            await asyncio.wait_for(asyncio.shield(client.closed), 10)

    eventloop.run(go())
    assert got == ["last words"]
