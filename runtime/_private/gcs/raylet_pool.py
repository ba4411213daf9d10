"""The GCS's connections to raylets: one per node, shared by every GCS table that dials one.

Raylets connect to the GCS for their own traffic (registration, heartbeats); the GCS
dials each raylet back for what it asks of the node: worker leases for actor creation,
``KillWorker`` and ``ReturnWorker`` (actor manager), ``ReserveBundles`` and
``ReleaseBundles`` (placement groups). One ``RayletPool`` owned by ``GcsServer`` serves
them all, so a node has one GCS->raylet connection and a dead node's is dropped once.

```
ActorManager ─────────┐                    ┌──► raylet A
PlacementGroupTable ──┴─► RayletPool.get ──┼──► raylet B   (opened once, on first use)
                          notify_nowait    └──► ...
GcsServer.mark_node_dead ─► discard(node)
```
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable

from lumos._private.config import Config
from lumos._private.ids import NodeID, short
from lumos._private.protocol import messages as m
from lumos._private.transport.connection import Connection, ConnectionCache, connect

logger = logging.getLogger(__name__)


class RayletPool:
    """One authenticated connection per raylet, opened on first use."""

    def __init__(self, address_of: Callable[[bytes], m.Address], token: bytes, config: Config) -> None:
        #: Node id -> the raylet's address (``KeyError`` for an unknown node).
        self._address_of = address_of
        self._token = token
        self._config = config
        self._conns = ConnectionCache()

    async def get(self, node_id: NodeID) -> Connection:
        """The node's raylet connection, dialled if none is open.

        Raises:
            KeyError: the node is unknown. OSError, ConnectionLost, TimeoutError: the raylet
                could not be reached (the caller retries or gives up per its own policy).
        """
        async def open_conn() -> Connection:
            address = self._address_of(node_id)
            return await connect(address, token=self._token, config=self._config,
                                 name=f"gcs->raylet-{short(node_id)}",
                                 # (for a task's owner; the GCS hears of workers from ReportWorker,
                                 # and its leases, actors', are never recalled)
                                 handlers={m.LeasedWorkerExited: lambda conn, msg: None,
                                           m.LeaseRecalled: lambda conn, msg: None},
                                 use_unix=bool(address.unix_path) and os.path.exists(address.unix_path))

        return await self._conns.get(node_id, open_conn)

    def get_nowait(self, node_id: NodeID | None) -> Connection | None:
        """The node's open connection, or None (never dials)."""
        if node_id is None:
            return None
        conn = self._conns.conns.get(node_id)
        return conn if conn is not None and not conn.is_closed else None

    def notify_nowait(self, node_id: NodeID | None, msg: Any) -> bool:
        """Send ``msg`` to the node's raylet if a connection is open; False when there is none.

        What the GCS tells a raylet this way releases something it was granted over an
        open connection; with none open, the raylet is gone or going, and its node's death
        frees everything it held.
        """
        conn = self.get_nowait(node_id)
        if conn is None:
            return False
        conn.notify(msg)
        return True

    def discard(self, node_id: NodeID) -> None:
        """Forget and close the node's connection (its node died)."""
        conn = self._conns.conns.pop(node_id, None)
        if conn is not None:
            conn.close()

    def close(self) -> None:
        self._conns.close_all()
