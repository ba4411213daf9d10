"""Copies of owned objects in other nodes' stores, and the one use of knowing them: when
the node that holds an object dies, a copy pulled into another node's store becomes the
object's home, so its value is neither rebuilt from lineage nor, without lineage (a
``put``, an actor's return), lost. Ray's owner does the same (it pins an existing copy
before it reconstructs).

```
a reader pulls X (home: node A) into node B ─► ObjectCopied([X], B) ─► owner: X.copies += B
GCS: node A dead ─► owner: X.node_id = B at once ─► KeepObjectCopies(B, [X]) ─► B's store keeps it
                    B had let it go (a cache) ─► the next copy, or X.node_id = A again: lost, rebuilt
```

A reader that pulls a copy says so (one message per pull, which moves at least a large
value); the owner keeps at most ``MAX_COPIES`` nodes per object. ``ObjectEntry.copies``
and ``copied`` belong to the io thread. A copy the owner learns of may since have been
evicted from its node's store: the node then answers ``KeepObjectCopies`` without it,
and a reader that tried it in between asks the owner again (``lost_node``).
"""

from __future__ import annotations

import logging
from typing import Any

from lumos._private.core_worker.references import READY
from lumos._private.ids import NodeID, ObjectID, short
from lumos._private.protocol import messages as m
from lumos._private.transport.connection import Connection, ConnectionLost, RemoteError

logger = logging.getLogger(__name__)

#: Nodes with copies an owner remembers per object.
MAX_COPIES = 8


class CopiesMixin:
    """``CoreWorker``'s record of its objects' copies on other nodes."""

    objects: Any
    node_id: NodeID
    worker_id: bytes
    dead_nodes: set[bytes]
    raylet: Any
    config: Any
    #: Owned objects that have copies (io thread; pruned as it grows, ``_prune_copied``).
    copied: set[ObjectID]
    _copied_pruned_at: int

    def note_pulled(self, pulled: list[tuple[ObjectID, m.Address | None]]) -> None:
        """These objects were pulled into this node's store (any thread; ``None``: owned here)."""
        if pulled:
            self._post(self._copied_here, pulled)  # type: ignore[attr-defined]

    def _copied_here(self, pulled: list[tuple[ObjectID, m.Address | None]]) -> None:
        to_owners: dict[bytes, tuple[m.Address, list[ObjectID]]] = {}
        for oid, owner in pulled:
            if owner is None or owner.worker_id == self.worker_id:
                self._add_copy(oid, self.node_id)
            else:
                to_owners.setdefault(owner.worker_id, (owner, []))[1].append(oid)
        for owner, ids in to_owners.values():
            self._spawn(self._notify_peer(owner, m.ObjectCopied(ids, self.node_id)),  # type: ignore[attr-defined]
                        "object-copied")

    def _handle_object_copied(self, conn: Connection, msg: m.ObjectCopied) -> None:
        if not isinstance(msg.node_id, bytes):
            raise ValueError("malformed ObjectCopied")
        for oid in msg.object_ids:
            if isinstance(oid, bytes):
                self._add_copy(oid, msg.node_id)

    def _add_copy(self, oid: ObjectID, node: NodeID) -> None:
        e = self.objects.entries.get(oid)
        if e is None or not e.owned or e.state != READY or e.data is not None or e.node_id in (None, node) \
                or node in self.dead_nodes:
            return
        copies = e.copies
        if copies is None:
            e.copies = [node]
        elif node not in copies and len(copies) < MAX_COPIES:
            copies.append(node)
        else:
            return
        self.copied.add(oid)
        if len(self.copied) > 2 * self._copied_pruned_at + 1024:
            self._prune_copied()

    def _prune_copied(self) -> None:
        entries = self.objects.entries
        self.copied = {oid for oid in self.copied if (e := entries.get(oid)) is not None and e.copies}
        self._copied_pruned_at = len(self.copied)

    def move_to_copies(self, dead: NodeID) -> None:
        """Node ``dead`` died: each owned object it held that has a copy on a live node
        lives there from now on (io thread)."""
        if not self.copied:
            return
        moves: dict[bytes, list[ObjectID]] = {}
        entries = self.objects.entries
        with self.objects.lock:  # (user threads read node_id under it)
            for oid in self.copied:
                e = entries.get(oid)
                if e is None or not e.copies:
                    continue
                if e.node_id == dead and e.state == READY:
                    home = self._to_live_copy(e)
                    if home is not None:
                        moves.setdefault(home, []).append(oid)
                else:
                    self._drop_dead_copies(e)
        self._prune_copied()
        for node, ids in moves.items():
            self._spawn(self._keep_copies(node, ids, dead), "keep-copies")  # type: ignore[attr-defined]

    def _drop_dead_copies(self, e: Any) -> None:
        e.copies = [n for n in e.copies or () if n not in self.dead_nodes] or None

    def _to_live_copy(self, e: Any) -> NodeID | None:
        """Make the first copy of ``e``'s value on a live node its home (under the table's
        lock); None, its home unchanged, when it has none."""
        self._drop_dead_copies(e)
        if not e.copies:
            return None
        home: NodeID = e.copies.pop(0)
        e.copies = e.copies or None
        e.node_id = home
        return home

    async def _keep_copies(self, node: NodeID, ids: list[ObjectID], dead: NodeID) -> None:
        """Have ``node``'s store keep its copies of ``ids`` (their home died with ``dead``);
        one it no longer has moves on to the next copy, or back to ``dead`` (lost)."""
        kept: Any = []
        if self.raylet is not None and node not in self.dead_nodes:
            try:
                kept = await self.raylet.call(m.KeepObjectCopies(node, ids), self.config.rpc_timeout_s)
            except (OSError, ConnectionLost, TimeoutError, RemoteError) as e:
                logger.info("cannot keep copies on node %s: %s", short(node), e)
        kept_ids = set(kept) if isinstance(kept, list) else set()
        retry: dict[bytes, list[ObjectID]] = {}
        entries = self.objects.entries
        with self.objects.lock:
            for oid in ids:
                e = entries.get(oid)
                if oid in kept_ids or e is None or e.node_id != node or e.state != READY:
                    continue
                home = self._to_live_copy(e)
                if home is not None:
                    retry.setdefault(home, []).append(oid)
                else:
                    e.node_id = dead  # no copy left: lost with its node, rebuilt if it can be
        kept_here = len(kept_ids.intersection(ids))
        if kept_here:
            logger.info("%d object(s) lost with node %s live on in copies on node %s", kept_here, short(dead),
                        short(node))
        for other, again in retry.items():
            self._spawn(self._keep_copies(other, again, dead), "keep-copies")  # type: ignore[attr-defined]
