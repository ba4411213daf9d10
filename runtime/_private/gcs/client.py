"""A GCS client for processes that are not part of a job: the dashboard, CLI tools.

It connects with the cluster token alone (no ``lumos.init()``, no core worker, no
raylet), asks for tables and subscribes to pub/sub channels. It runs on whatever
asyncio loop calls ``connect``: the dashboard's tornado loop, or the Jupyter
server's, which is why nothing here blocks.

```
dashboard / jupyter-server ──GetAllNodes, GetClusterStatus, GetTaskUpdates, ListActors, ListPlacementGroups──► GCS
                           ◄──Publish(nodes | jobs | workers | actors | errors)─────────────┘
```
The GCS treats this connection as a plain subscriber: it registers no job, so it
neither keeps a private cluster alive nor ends it when it goes.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable

from lumos._private.config import Config
from lumos._private.protocol import messages as m
from lumos._private.transport.connection import Connection, connect_with_retry, parse_address

logger = logging.getLogger(__name__)

PublishCallback = Callable[[m.Publish], None]


class GcsClient:
    """One authenticated connection to the GCS, with channel callbacks.

    Args:
        address: ``"unix:/path/gcs.sock"``, ``"HOST:PORT"``, a ``(host, port)`` pair
            or a Unix socket path.
        token: the cluster token.

    Example:
        >>> client = GcsClient(os.path.join(session_dir, "sockets", "gcs.sock"), token)
        >>> await client.connect()
        >>> nodes = await client.call(m.GetAllNodes())
    """

    def __init__(self, address: str | tuple[str, int], token: bytes, config: Config | None = None,
                 name: str = "client->gcs") -> None:
        if isinstance(address, str) and not address.startswith("/"):
            address = parse_address(address)
        self.address = address
        self._token = token
        self.config = config or Config.resolve()
        self.name = name
        self._conn: Connection | None = None
        #: channel -> callbacks for its Publish messages.
        self._callbacks: dict[str, list[PublishCallback]] = {}
        #: Called once when the connection drops (after ``connect`` succeeded).
        self.on_close: Callable[[], None] | None = None

    @property
    def connected(self) -> bool:
        return self._conn is not None and not self._conn.is_closed

    async def connect(self, timeout_s: float | None = None) -> None:
        """Connect and authenticate; re-subscribes channels registered before. Raises
        ``ConnectionLost``/``OSError``/``TimeoutError`` when the GCS cannot be reached."""
        self.close()
        self._conn = await connect_with_retry(
            self.address, token=self._token, config=self.config, name=self.name,
            handlers={m.Publish: self._on_publish}, on_close=self._closed, timeout_s=timeout_s)
        for channel in self._callbacks:
            self._conn.notify(m.Subscribe(channel, None))

    def _closed(self, conn: Connection) -> None:
        if conn is self._conn and self.on_close is not None:
            try:
                self.on_close()
            except Exception:
                logger.exception("on_close callback of %s failed", self.name)

    async def call(self, msg: Any, timeout_s: float | None = None) -> Any:
        """One request; raises ``ConnectionLost`` when not connected, ``GetTimeoutError`` (a
        ``TimeoutError``) after the deadline: a GCS stopped, overloaded or cut off."""
        from lumos._private.transport.connection import ConnectionLost
        from lumos.exceptions import GetTimeoutError
        conn = self._conn
        if conn is None or conn.is_closed:
            raise ConnectionLost(f"{self.name} is not connected")
        timeout_s = self.config.rpc_timeout_s if timeout_s is None else timeout_s
        try:
            return await conn.call(msg, timeout_s)
        except TimeoutError:
            raise GetTimeoutError(f"{type(msg).__name__} to the GCS at {self.address} timed out after "
                                  f"{timeout_s:g}s: the GCS did not answer (stopped, overloaded or cut off)") from None

    def subscribe(self, channel: str, callback: PublishCallback) -> None:
        """Call ``callback(Publish)`` for every message on ``channel`` (kept across reconnects)."""
        first = channel not in self._callbacks
        self._callbacks.setdefault(channel, []).append(callback)
        if first and self.connected:
            assert self._conn is not None
            self._conn.notify(m.Subscribe(channel, None))

    def _on_publish(self, conn: Connection, msg: m.Publish) -> None:
        for cb in self._callbacks.get(msg.channel, ()):
            try:
                cb(msg)
            except Exception:
                logger.exception("subscriber of channel %r failed", msg.channel)

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


async def wait_closed(client: GcsClient) -> None:
    """Until the client's current connection closes."""
    conn = client._conn
    if conn is not None:
        await asyncio.shield(conn.closed)
