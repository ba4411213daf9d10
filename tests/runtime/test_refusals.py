"""A handler's refusal (``connection.Refusal``: a full store, an object that exists) is an
answer its caller handles: it reaches the caller as a ``RemoteError`` of its type, and
the serving process logs no error for it (a raylet under worker kills logged one, with
a traceback, for every retry that found its object made already)."""

from __future__ import annotations

import logging

import pytest

from lumos._private.config import Config
from lumos._private.protocol import messages as m
from lumos._private.raylet import server as raylet_server
from lumos._private.transport import eventloop
from lumos._private.transport.connection import Refusal, RemoteError, RpcServer, connect

TOKEN = b"refusal-test-token-0123456789abcd"


@pytest.mark.timeout(60)
def test_a_refusal_is_answered_and_logged_as_no_error(tmp_path, caplog: pytest.LogCaptureFixture) -> None:
    answers: list[BaseException] = []
    raised = iter([raylet_server._ObjectExists("object already exists in the store"), RuntimeError("a bug")])

    def handler(conn, msg) -> None:
        raise next(raised)

    async def go() -> None:
        config = Config()
        server = RpcServer(token=TOKEN, config=config, handlers={m.GetClusterStatus: handler}, name="test-server")
        await server.start(unix_path=str(tmp_path / "s.sock"))
        client = await connect(str(tmp_path / "s.sock"), token=TOKEN, config=config, handlers={},
                               name="test-client", timeout_s=10)
        try:
            for _ in range(2):
                with pytest.raises(RemoteError) as e:
                    await client.call(m.GetClusterStatus(), 10)
                answers.append(e.value)
        finally:
            client.close()
            await server.stop()

    with caplog.at_level(logging.DEBUG, logger="lumos._private.transport.connection"):
        eventloop.run(go())
    assert [(a.type_name, a.text) for a in answers] == [  # type: ignore[attr-defined]
        ("_ObjectExists", "object already exists in the store"), ("RuntimeError", "a bug")]
    assert issubclass(raylet_server._StoreFull, Refusal) and issubclass(raylet_server._OutOfDisk, Refusal)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "GetClusterStatus" in errors[0].getMessage() and errors[0].exc_info
    assert any(r.levelno == logging.DEBUG and "refused" in r.getMessage() for r in caplog.records)
