"""``connect``: a connection that does not finish its handshake leaves no socket open."""

from __future__ import annotations

import asyncio
import os

import pytest

from lumos._private.config import Config
from lumos._private.transport import eventloop
from lumos._private.transport.connection import connect

TOKEN = b"connect-test-token-0123456789abcd"


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["cancelled", "timed out"])
def test_a_connect_stopped_in_its_handshake_closes_its_socket(tmp_path, how: str) -> None:
    """A peer that accepts and never answers: the connect is cancelled (its owner shutting
    down) or runs out of time. Its socket was left open, and uvloop reported it as an
    unclosed resource when the loop closed (a core worker's shutdown met one opening to a
    worker it had just been granted)."""
    path = str(tmp_path / "silent.sock")

    async def go() -> None:
        accepted: list[asyncio.StreamWriter] = []

        async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            accepted.append(writer)

        server = await asyncio.start_unix_server(silent, path)
        before = _open_fds()
        timeout_s = 0.3 if how == "timed out" else 30.0
        task = asyncio.ensure_future(connect(path, token=TOKEN, config=Config(), name="test-client",
                                             timeout_s=timeout_s))
        for _ in range(500):
            if accepted:
                break
            await asyncio.sleep(0.01)
        assert accepted, "the server never accepted"
        if how == "cancelled":
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        else:
            with pytest.raises(TimeoutError):
                await task
        # The server's end stays open (closing it would let the client see the end of the
        # stream and close its side by itself): only that one socket may be left.
        server_fd = str(accepted[0].get_extra_info("socket").fileno())
        for _ in range(50):  # a closed transport lets its socket go at the next turns
            await asyncio.sleep(0.01)
            if _open_fds() - before <= {server_fd}:
                break
        left.extend(sorted(_open_fds() - before - {server_fd}))
        for w in accepted:
            w.close()
        server.close()
        await asyncio.sleep(0.05)  # (the client's end, if still open, sees the close now)

    left: list[str] = []
    loop = eventloop.new_event_loop()
    try:
        loop.run_until_complete(asyncio.wait_for(go(), 20))
    finally:
        loop.close()
    assert not left, f"sockets left open by the stopped connect: {left}"
