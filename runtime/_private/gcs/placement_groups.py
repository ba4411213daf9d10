"""The GCS placement-group table: bundle placement, reservation on raylets, removal.

A placement group is a list of resource *bundles* reserved together on the cluster's
nodes (Ray's placement groups). The driver registers it; this table picks a node for
every bundle by the group's strategy, asks those raylets to reserve them (each raylet
takes a bundle's resources out of its own pool, all of a node's bundles or none), and
marks the group CREATED once every bundle is held. Tasks and actors scheduled into a
bundle run on its node from the bundle's resources (raylet/scheduler.py).

```
driver ──CreatePlacementGroup──► PlacementGroupTable ──ReserveBundles──► raylets (one per node used)
                                   │ all answered ok: CREATED, wake WaitPlacementGroupReady
                                   │ one refused: ReleaseBundles to the others, retry later
owner ──RequestWorkerLease(PG)──► raylet without the bundle ──ScheduleLease──► here: the bundle's node
node died ──► its bundles unplaced, group RESCHEDULING, placed again (strategy kept)
RemovePlacementGroup / job finished ──► ReleaseBundles (workers in bundles stopped) ──► REMOVED
```

What happens to a group (placement, the two-phase reservation, rollback, node
failures, removal) is decided by the pure ``PlacementGroupState``
(placement_group_state.py, with ``plan_bundles``); this module owns the I/O: RPC
handlers, one placement loop per group, the reservation RPCs (through the GCS's
``RayletPool``), storage writes, publishes and the waiters of ``ready()``. Changes are
published on the "placement_groups" channel (key: the group id).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from lumos._private.gcs import placement_group_state as pgs
from lumos._private.gcs.global_scheduler import NoSuchGroup, Unschedulable
from lumos._private.gcs.turns import Turns
from lumos._private.gcs.placement_group_state import (CREATED, PENDING, REMOVED, RESCHEDULING,  # noqa: F401
                                                      STRATEGIES, plan_bundles)
from lumos._private.ids import JobID, NodeID, PlacementGroupID, short
from lumos._private.protocol import messages as m
from lumos._private.protocol.vocab import PlacementGroupRemoved
from lumos._private.transport.connection import Connection, ConnectionLost, RemoteError

if TYPE_CHECKING:
    from lumos._private.gcs.server import GcsServer

logger = logging.getLogger(__name__)

__all__ = ["PlacementGroupTable", "plan_bundles", "STRATEGIES"]


class PlacementGroupTable:
    """Serves placement groups in the GCS process from a ``PlacementGroupState``."""

    def __init__(self, gcs: "GcsServer") -> None:
        self.gcs = gcs
        self.state = pgs.PlacementGroupState(gcs.config.heartbeat_interval_ms / 1000,
                                             gcs.config.infeasible_warning_s, validate=gcs.config.validate)
        #: Group id -> its placement loop (while PENDING or RESCHEDULING).
        self._placing: dict[bytes, asyncio.Task[Any]] = {}
        #: Group id -> set on every change of the group (waiters look again).
        self._changed_of: dict[bytes, asyncio.Event] = {}
        #: Pending groups' loops, woken in creation order when a node joins and at every
        #: heartbeat interval (room frees without one joining).
        self._turns = Turns(gcs._spawn_task, lambda: self.state.groups, self.state.retry_s,
                            "placement_group.turns")

    @property
    def groups(self) -> dict[bytes, Any]:
        return self.state.groups

    def handlers(self) -> dict[type, Any]:
        return {
            m.CreatePlacementGroup: self.create,
            m.RemovePlacementGroup: self.remove,
            m.GetPlacementGroup: self.get,
            m.ListPlacementGroups: lambda c, msg: [g.info for g in self.state.groups.values()
                                                   if msg.job_id is None or g.info.job_id == msg.job_id],
            m.WaitPlacementGroupReady: self.wait_ready,
            # Leases in a bundle go to the bundle's node; all others to the global scheduler.
            m.ScheduleLease: self.schedule_lease,
        }

    # ------------------------------------------------------------------ events in, actions out

    def _dispatch(self, event: pgs.Event) -> list[pgs.Action]:
        actions = self.state.handle(event, time.monotonic())
        for action in actions:
            self._execute(action)
        return actions

    def _execute(self, action: pgs.Action) -> None:
        if isinstance(action, pgs.PublishGroup):
            info = self.state.info_of(action.pg_id)
            self.gcs.persist("placement_groups", action.pg_id, info)
            self.gcs.publish("placement_groups", action.pg_id, info)
            changed = self._changed_of.get(action.pg_id)
            if changed is not None:
                changed.set()
        elif isinstance(action, pgs.DeleteGroupRow):
            self._changed_of.pop(action.pg_id, None)
            self.gcs.unpersist("placement_groups", action.pg_id)
        elif isinstance(action, pgs.PlaceGroup):
            task = self._placing.get(action.pg_id)
            if task is None or task.done():
                self._placing[action.pg_id] = self.gcs._spawn_task(self._place(action.pg_id),
                                                                   f"pg.place.{short(action.pg_id)}")
        elif isinstance(action, pgs.ReleaseBundles):
            self.gcs.raylets.notify_nowait(action.node_id, m.ReleaseBundles(action.pg_id, action.indices))
        elif isinstance(action, pgs.ReportInfeasible):
            logger.warning("%s", action.text)
            self.gcs.publish("errors", action.job_id, ["infeasible", action.text])
        # ReserveBundles and RetryPlacement: run by the placement loop that got them.

    # ------------------------------------------------------------------ requests

    def create(self, conn: Connection | None, msg: m.CreatePlacementGroup) -> m.PlacementGroupInfo:
        self._dispatch(pgs.GroupCreated(msg, time.time()))
        info = self.state.info_of(msg.pg_id)
        assert info is not None
        return info

    def get(self, conn: Connection | None, msg: m.GetPlacementGroup) -> m.PlacementGroupInfo | None:
        if msg.pg_id:
            return self.state.info_of(msg.pg_id)
        return self.state.named_info(msg.namespace, msg.name)

    async def remove(self, conn: Connection | None, msg: m.RemovePlacementGroup) -> bool:
        info = self.state.info_of(msg.pg_id)
        was_there = info is not None and info.state != REMOVED
        self._dispatch(pgs.GroupRemoved(msg.pg_id, "removed by remove_placement_group()"))
        return was_there

    async def wait_ready(self, conn: Connection | None, msg: m.WaitPlacementGroupReady) -> bool:
        info = self._require(msg.pg_id)
        if info.state == CREATED:
            return True
        try:
            async with asyncio.timeout(max(0.0, min(msg.timeout_s, 300.0))):
                while info.state != CREATED:
                    if info.state == REMOVED:
                        raise ValueError(f"placement group {msg.pg_id.hex()} was removed")
                    await self._wait_group_changed(msg.pg_id, None)
        except TimeoutError:
            return False
        return True

    def _require(self, pg_id: PlacementGroupID) -> m.PlacementGroupInfo:
        info = self.state.info_of(pg_id)
        if info is None:
            raise ValueError(f"no placement group {pg_id.hex()}")
        return info

    async def _wait_group_changed(self, pg_id: PlacementGroupID, timeout_s: float | None) -> None:
        changed = self._changed_of.get(pg_id)
        if changed is None:
            changed = self._changed_of[pg_id] = asyncio.Event()
        changed.clear()
        try:
            async with asyncio.timeout(timeout_s):
                await changed.wait()
        except TimeoutError:
            pass

    # ------------------------------------------------------------------ leases into bundles

    async def schedule_lease(self, conn: Connection, msg: m.ScheduleLease) -> m.SpillbackReply:
        ref = msg.bundle
        if ref is None and msg.strategy and msg.strategy[0] == "PG":
            ref = msg.strategy[1:3]
        if ref is None:
            reply: m.SpillbackReply = await self.gcs.global_scheduler._schedule_lease(conn, msg)
            return reply
        pg_id, index = bytes(ref[0]), int(ref[1])
        while True:
            try:
                node_id = self.node_for_bundle(pg_id, index, msg.resources)
            except NoSuchGroup as e:
                raise PlacementGroupRemoved(str(e)) from None
            except Unschedulable as e:
                raise ValueError(str(e)) from None
            if node_id is not None:
                return m.SpillbackReply(self.gcs.nodes[node_id].address, node_id)
            await self._wait_group_changed(pg_id, 1.0)

    def node_for_bundle(self, pg_id: PlacementGroupID, index: int, resources: dict[str, float]) -> bytes | None:
        """The node holding bundle ``index`` (-1: any bundle) of a group; None while it is not placed.

        Raises:
            Unschedulable: the group is unknown or removed, the index is out of range, or the
                request is larger than the bundle.
        """
        return self.state.node_for_bundle(pg_id, index, resources)

    # ------------------------------------------------------------------ placement

    async def _place(self, pg_id: PlacementGroupID) -> None:
        """Reserve the group's unplaced bundles; retried until all are held or it is removed."""
        while self.state.wants_placement(pg_id):
            views = self.gcs.global_scheduler.node_views()
            actions = self._dispatch(pgs.PlacementTried(
                pg_id, [(v.node_id, v.available) for v in sorted(views, key=lambda v: -v.available.get("CPU", 0))],
                [(v.node_id, v.total) for v in views], {v.node_id: v.labels for v in views}))
            reserves = [a for a in actions if isinstance(a, pgs.ReserveBundles)]
            if reserves:
                answers = await asyncio.gather(*(self._reserve(a) for a in reserves))
                actions = self._dispatch(pgs.BundlesReserved(
                    pg_id, {a.node_id: answer for a, answer in zip(reserves, answers)}))
            retry = next((a for a in actions if isinstance(a, pgs.RetryPlacement)), None)
            if retry is not None or (not reserves and self.state.wants_placement(pg_id)):
                # No room yet, or another took it first (or nothing to do yet, which the
                # state never answers; never spin): look again in this group's turn.
                await self._turns.wait(pg_id)

    async def _reserve(self, action: pgs.ReserveBundles) -> dict[int, list[int]] | None:
        """Reserve bundles on a node: bundle index -> the node GPUs it holds, or None when refused."""
        node_id, pg_id, bundles = action.node_id, action.pg_id, action.bundles
        try:
            raylet = await self.gcs.raylets.get(node_id)
            reply = await raylet.call(m.ReserveBundles(pg_id, bundles), self.gcs.config.rpc_timeout_s)
        except (OSError, ConnectionLost, TimeoutError, RemoteError, KeyError) as e:
            logger.info("could not reserve bundles of %s on node %s: %s", short(pg_id), short(node_id), e)
            return None
        try:
            ok, reason = reply[0], reply[1]
            if not ok:
                logger.debug("node %s refused bundles of %s: %s", short(node_id), short(pg_id), reason)
                return None
            # An older raylet answers [ok, reason] only: GPU indices unknown.
            return {int(i): [int(g) for g in gpus] for i, gpus in (reply[2] if len(reply) > 2 else [])}
        except (TypeError, ValueError, IndexError, KeyError) as e:
            logger.warning("node %s sent a malformed bundle answer for %s: %s", short(node_id), short(pg_id), e)
            self.gcs.raylets.notify_nowait(node_id, m.ReleaseBundles(pg_id, [int(b[0]) for b in bundles]))
            return None

    # ------------------------------------------------------------------ storage and cluster events

    def persist_all(self) -> None:
        """Write every group row again (a storage that came back empty)."""
        for pg_id, g in self.state.groups.items():
            self.gcs.persist("placement_groups", pg_id, g.info)

    def restore(self, info: m.PlacementGroupInfo) -> None:
        """Take back a group row from storage (a restarted GCS); unplaced bundles are placed again."""
        self._dispatch(pgs.GroupRestored(info))

    def nodes_changed(self) -> None:
        self._turns.wake()

    def on_node_dead(self, node_id: NodeID) -> None:
        self._dispatch(pgs.NodeDied(node_id))

    def on_job_finished(self, job_id: JobID) -> None:
        self._dispatch(pgs.JobFinished(job_id))
