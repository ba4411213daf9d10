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

``plan_bundles`` is the pure part (strategy → node per bundle); the table plugs it
into the GCS node views and heartbeats. A raylet's answer names the node GPUs each
bundle got; they are kept in ``PlacementGroupInfo.bundle_gpu_ids`` (for the dashboard)
and follow the bundle when it is placed again. Changes are published on the
"placement_groups" channel (key: the group id).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from lumos._private.gcs.global_scheduler import Unschedulable
from lumos._private.ids import short
from lumos._private.protocol import messages as m
from lumos._private.raylet.resources import request_units
from lumos._private.transport.connection import (Connection, ConnectionCache, ConnectionLost, RemoteError,
                                                 connect)

if TYPE_CHECKING:
    from lumos._private.gcs.server import GcsServer

logger = logging.getLogger(__name__)

PENDING, CREATED, RESCHEDULING, REMOVED = "PENDING", "CREATED", "RESCHEDULING", "REMOVED"
STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
#: Removed groups kept for ``placement_group_table()``.
_KEEP_REMOVED = 1000


# ----------------------------------------------------------------------------- pure placement


def plan_bundles(strategy: str, bundles: list[dict[str, int]], missing: list[int],
                 placed: dict[int, bytes], nodes: list[tuple[bytes, dict[str, int]]]) -> dict[int, bytes] | None:
    """Pick a node for every bundle index in ``missing``, or None when the strategy cannot be met.

    Args:
        strategy: PACK, SPREAD, STRICT_PACK or STRICT_SPREAD.
        bundles: every bundle's resources (units).
        missing: the bundle indices to place.
        placed: bundles of the group already held (index -> node), which constrain the rest.
        nodes: ``(node id, free units)`` of the alive nodes, in preference order.
    """
    free = {nid: dict(avail) for nid, avail in nodes}
    order = [nid for nid, _ in nodes]
    plan: dict[int, bytes] = {}

    def fits(nid: bytes, units: dict[str, int]) -> bool:
        have = free[nid]
        return all(have.get(k, 0) >= v for k, v in units.items())

    def take(nid: bytes, i: int) -> None:
        for k, v in bundles[i].items():
            free[nid][k] = free[nid].get(k, 0) - v
        plan[i] = nid

    def one_node(candidates: list[bytes]) -> dict[int, bytes] | None:
        want: dict[str, int] = {}
        for i in missing:
            for k, v in bundles[i].items():
                want[k] = want.get(k, 0) + v
        for nid in candidates:
            if nid in free and fits(nid, want):
                return {i: nid for i in missing}
        return None

    used = set(placed.values())
    if strategy == "STRICT_PACK":
        if used:
            return one_node([next(iter(used))]) if len(used) == 1 else None
        return one_node(order)
    if strategy == "PACK":
        whole = one_node([n for n in order if n in used] + [n for n in order if n not in used])
        if whole is not None:
            return whole
        for i in sorted(missing, key=lambda i: -sum(bundles[i].values())):
            holding = [n for n in order if n in used or n in plan.values()]
            nid = next((n for n in holding + order if fits(n, bundles[i])), None)
            if nid is None:
                return None
            take(nid, i)
        return plan
    if strategy == "SPREAD":
        for i in sorted(missing, key=lambda i: -sum(bundles[i].values())):
            def count(n: bytes) -> int:
                return sum(1 for v in placed.values() if v == n) + sum(1 for v in plan.values() if v == n)
            options = sorted((n for n in order if fits(n, bundles[i])), key=count)
            if not options:
                return None
            take(options[0], i)
        return plan
    if strategy == "STRICT_SPREAD":
        todo = sorted(missing, key=lambda i: -sum(bundles[i].values()))

        def assign(k: int, taken: set[bytes]) -> bool:
            if k == len(todo):
                return True
            i = todo[k]
            for nid in order:
                if nid not in taken and fits(nid, bundles[i]):
                    take(nid, i)
                    if assign(k + 1, taken | {nid}):
                        return True
                    for r, v in bundles[i].items():
                        free[nid][r] += v
                    del plan[i]
            return False

        return plan if assign(0, set(used)) else None
    raise ValueError(f"unknown placement strategy {strategy!r}; valid: {', '.join(STRATEGIES)}")


# ----------------------------------------------------------------------------- table


class _Group:
    __slots__ = ("info", "units", "task", "ready", "picks", "warned")

    def __init__(self, info: m.PlacementGroupInfo) -> None:
        self.info = info
        #: Each bundle's resources in units.
        self.units = [request_units(b) for b in info.bundles]
        #: The placement task (while PENDING or RESCHEDULING).
        self.task: asyncio.Task[Any] | None = None
        #: Set while CREATED.
        self.ready = asyncio.Event()
        #: Round robin over bundles for requests that take any bundle (index -1).
        self.picks = 0
        self.warned = False


class PlacementGroupTable:
    """Placement groups of the cluster, served from the GCS process."""

    def __init__(self, gcs: "GcsServer") -> None:
        self.gcs = gcs
        #: Group id -> group (removed ones kept, bounded).
        self.groups: OrderedDict[bytes, _Group] = OrderedDict()
        #: (namespace, name) -> group id, for groups not removed.
        self.named: dict[tuple[str, str], bytes] = {}
        self._raylets = ConnectionCache()
        #: Set when a node joins or resources may have freed: pending groups try again.
        self._changed = asyncio.Event()

    def handlers(self) -> dict[type, Any]:
        return {
            m.CreatePlacementGroup: self.create,
            m.RemovePlacementGroup: self.remove,
            m.GetPlacementGroup: self.get,
            m.ListPlacementGroups: lambda c, msg: [g.info for g in self.groups.values()
                                                   if msg.job_id is None or g.info.job_id == msg.job_id],
            m.WaitPlacementGroupReady: self.wait_ready,
            # Leases in a bundle go to the bundle's node; all others to the global scheduler.
            m.ScheduleLease: self.schedule_lease,
        }

    # ------------------------------------------------------------------ requests

    def create(self, conn: Connection | None, msg: m.CreatePlacementGroup) -> m.PlacementGroupInfo:
        if msg.strategy not in STRATEGIES:
            raise ValueError(f"unknown placement strategy {msg.strategy!r}; valid: {', '.join(STRATEGIES)}")
        if not msg.bundles or not all(isinstance(b, dict) and b for b in msg.bundles):
            raise ValueError("a placement group needs a non-empty list of non-empty bundles")
        existing = self.groups.get(msg.pg_id)
        if existing is not None:
            return existing.info  # a retried request
        if msg.name and (msg.namespace, msg.name) in self.named:
            raise ValueError(f"a placement group named {msg.name!r} already exists in namespace "
                             f"{msg.namespace!r}; remove it first or pick another name")
        info = m.PlacementGroupInfo(msg.pg_id, msg.name, msg.namespace, msg.strategy,
                                    [dict(b) for b in msg.bundles], PENDING, [None] * len(msg.bundles),
                                    msg.job_id, msg.detached, time.time(), "waiting for resources",
                                    bundle_gpu_ids=[[] for _ in msg.bundles])
        group = _Group(info)
        self.groups[msg.pg_id] = group
        if msg.name:
            self.named[(msg.namespace, msg.name)] = msg.pg_id
        self._trim()
        self._publish(group)
        self._start_placing(group)
        logger.info("placement group %s (%s, %d bundles) registered", short(msg.pg_id), msg.strategy,
                    len(msg.bundles))
        return info

    def get(self, conn: Connection | None, msg: m.GetPlacementGroup) -> m.PlacementGroupInfo | None:
        if msg.pg_id:
            g = self.groups.get(msg.pg_id)
            return g.info if g is not None else None
        pg_id = self.named.get((msg.namespace, msg.name))
        return self.groups[pg_id].info if pg_id is not None else None

    async def remove(self, conn: Connection | None, msg: m.RemovePlacementGroup) -> bool:
        g = self.groups.get(msg.pg_id)
        if g is None:
            raise ValueError(f"no placement group {msg.pg_id.hex()}")
        if g.info.state == REMOVED:
            return False
        await self._remove(g, "removed by remove_placement_group()")
        return True

    async def wait_ready(self, conn: Connection | None, msg: m.WaitPlacementGroupReady) -> bool:
        g = self._require(msg.pg_id)
        if g.info.state == CREATED:
            return True
        try:
            async with asyncio.timeout(max(0.0, min(msg.timeout_s, 300.0))):
                while g.info.state != CREATED:
                    if g.info.state == REMOVED:
                        raise ValueError(f"placement group {msg.pg_id.hex()} was removed")
                    g.ready.clear()
                    await g.ready.wait()
        except TimeoutError:
            return False
        return True

    def _require(self, pg_id: bytes) -> _Group:
        g = self.groups.get(pg_id)
        if g is None:
            raise ValueError(f"no placement group {pg_id.hex()}")
        return g

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
            except Unschedulable as e:
                raise ValueError(str(e)) from None
            if node_id is not None:
                return m.SpillbackReply(self.gcs.nodes[node_id].address, node_id)
            g = self.groups[pg_id]
            g.ready.clear()
            try:
                async with asyncio.timeout(1.0):
                    await g.ready.wait()
            except TimeoutError:
                pass

    def node_for_bundle(self, pg_id: bytes, index: int, resources: dict[str, float]) -> bytes | None:
        """The node holding bundle ``index`` (-1: any bundle) of a group; None while it is not placed.

        Raises:
            Unschedulable: the group is unknown or removed, the index is out of range, or the
                request is larger than the bundle.
        """
        g = self.groups.get(pg_id)
        if g is None or g.info.state == REMOVED:
            raise Unschedulable(f"placement group {pg_id.hex()} "
                                f"{'does not exist' if g is None else 'was removed'}; tasks and actors "
                                "cannot be scheduled into it")
        n = len(g.units)
        if index >= n or index < -1:
            raise Unschedulable(f"placement_group_bundle_index={index} is out of range: placement group "
                                f"{pg_id.hex()} has {n} bundle{'s' if n != 1 else ''} (use 0..{n - 1}, or -1 for any)")
        want = request_units(resources)
        candidates = [index] if index >= 0 else list(range(n))
        fitting = [i for i in candidates if all(g.units[i].get(k, 0) >= v for k, v in want.items())]
        if not fitting:
            which = f"bundle {index}" if index >= 0 else "any bundle"
            raise Unschedulable(f"the request {resources} does not fit in {which} of placement group "
                                f"{pg_id.hex()} (bundles: {g.info.bundles})")
        if g.info.state != CREATED:
            return None
        g.picks += 1
        i = fitting[g.picks % len(fitting)]
        node_id = g.info.bundle_nodes[i]
        if node_id is None or self.gcs.nodes.get(node_id) is None or self.gcs.nodes[node_id].state != "ALIVE":
            return None
        return node_id

    # ------------------------------------------------------------------ placement

    def _start_placing(self, g: _Group) -> None:
        if g.task is None or g.task.done():
            g.task = self.gcs._spawn_task(self._place(g), f"pg.place.{short(g.info.pg_id)}")

    async def _place(self, g: _Group) -> None:
        """Reserve the group's unplaced bundles; retried until all are held or it is removed."""
        info = g.info
        interval = self.gcs.config.heartbeat_interval_ms / 1000
        started = time.monotonic()
        while info.state in (PENDING, RESCHEDULING):
            missing = [i for i, n in enumerate(info.bundle_nodes) if n is None]
            if not missing:
                self._created(g)
                return
            placed = {i: n for i, n in enumerate(info.bundle_nodes) if n is not None}
            views = self.gcs.global_scheduler.node_views()
            plan = plan_bundles(info.strategy, g.units, missing, placed,
                                [(v.node_id, v.available) for v in
                                 sorted(views, key=lambda v: -v.available.get("CPU", 0))])
            if plan is None:
                ever = plan_bundles(info.strategy, g.units, missing, placed,
                                    [(v.node_id, v.total) for v in views])
                detail = ("infeasible: no alive nodes can hold these bundles with strategy "
                          f"{info.strategy}; it stays pending until nodes that fit join" if ever is None
                          else "waiting for resources held by other work")
                if detail != info.detail:
                    info.detail = detail
                    self._publish(g)
                if ever is None and not g.warned and \
                        time.monotonic() - started >= self.gcs.config.infeasible_warning_s:
                    g.warned = True
                    text = (f"placement group {info.pg_id.hex()} ({info.strategy}, bundles {info.bundles}) "
                            f"cannot be placed on the alive nodes; it stays pending until nodes that fit join")
                    logger.warning("%s", text)
                    self.gcs.publish("errors", info.job_id, ["infeasible", text])
                await self._wait_changed(interval)
                continue
            by_node: dict[bytes, list[int]] = {}
            for i, nid in plan.items():
                by_node.setdefault(nid, []).append(i)
            results = await asyncio.gather(*(self._reserve(nid, info.pg_id, [[i, info.bundles[i]] for i in idx])
                                             for nid, idx in by_node.items()))
            ok = [nid for nid, res in zip(by_node, results) if res is not None]
            if info.state == REMOVED or len(ok) != len(by_node):
                for nid in ok:
                    self._release(nid, info.pg_id, by_node[nid])
                if info.state == REMOVED:
                    return
                await asyncio.sleep(interval)  # someone took the resources first: look again after a heartbeat
                continue
            for (nid, idx), gpus in zip(by_node.items(), results):
                for i in idx:
                    if self.gcs.nodes[nid].state == "ALIVE":
                        info.bundle_nodes[i] = nid
                        info.bundle_gpu_ids[i] = (gpus or {}).get(i, [])
        # (REMOVED: nothing held any more)

    async def _wait_changed(self, timeout_s: float) -> None:
        self._changed.clear()
        try:
            async with asyncio.timeout(timeout_s):
                await self._changed.wait()
        except TimeoutError:
            pass

    def _created(self, g: _Group) -> None:
        info = g.info
        info.state = CREATED
        info.detail = ""
        g.ready.set()
        self._publish(g)
        logger.info("placement group %s created: bundles on %s", short(info.pg_id),
                    [short(n) if n else None for n in info.bundle_nodes])

    async def _reserve(self, node_id: bytes, pg_id: bytes, bundles: list[Any]) -> dict[int, list[int]] | None:
        """Reserve ``bundles`` on a node: bundle index -> the node GPUs it holds, or None when refused."""
        try:
            raylet = await self._raylet(node_id)
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
            self._release(node_id, pg_id, [int(b[0]) for b in bundles])
            return None

    def _release(self, node_id: bytes, pg_id: bytes, indices: list[int] | None) -> None:
        conn = self._raylets.conns.get(node_id)
        if conn is not None and not conn.is_closed:
            conn.notify(m.ReleaseBundles(pg_id, indices))

    async def _raylet(self, node_id: bytes) -> Connection:
        async def open_conn() -> Connection:
            address = self.gcs.nodes[node_id].address
            return await connect(address, token=self.gcs.token, config=self.gcs.config,
                                 name=f"gcs.pg->raylet-{short(node_id)}",
                                 use_unix=bool(address.unix_path) and os.path.exists(address.unix_path))

        return await self._raylets.get(node_id, open_conn)

    async def _remove(self, g: _Group, why: str) -> None:
        info = g.info
        info.state = REMOVED
        info.detail = why
        if info.name and self.named.get((info.namespace, info.name)) == info.pg_id:
            del self.named[(info.namespace, info.name)]
        for nid in {n for n in info.bundle_nodes if n is not None}:
            self._release(nid, info.pg_id, None)
        info.bundle_nodes = [None] * len(info.bundle_nodes)
        info.bundle_gpu_ids = [[] for _ in info.bundle_nodes]
        g.ready.set()  # wake waiters: they see REMOVED
        self._publish(g)
        logger.info("placement group %s removed: %s", short(info.pg_id), why)

    def _publish(self, g: _Group) -> None:
        g.info.version += 1
        self.gcs.persist("placement_groups", g.info.pg_id, g.info)
        self.gcs.publish("placement_groups", g.info.pg_id, g.info)

    def persist_all(self) -> None:
        """Write every group row again (a storage that came back empty)."""
        for g in self.groups.values():
            self.gcs.persist("placement_groups", g.info.pg_id, g.info)

    def restore(self, info: m.PlacementGroupInfo) -> None:
        """Take back a group row from storage (a restarted GCS); unplaced bundles are placed again."""
        g = _Group(info)
        self.groups[info.pg_id] = g
        if info.state == REMOVED:
            return
        if info.name:
            self.named[(info.namespace, info.name)] = info.pg_id
        if info.state == CREATED:
            g.ready.set()
        else:
            self._start_placing(g)

    def _trim(self) -> None:
        removed = [k for k, g in self.groups.items() if g.info.state == REMOVED]
        for k in removed[:max(0, len(removed) - _KEEP_REMOVED)]:
            del self.groups[k]
            self.gcs.unpersist("placement_groups", k)

    # ------------------------------------------------------------------ cluster events

    def nodes_changed(self) -> None:
        self._changed.set()

    def on_node_dead(self, node_id: bytes) -> None:
        self._raylets.discard(node_id)
        for g in self.groups.values():
            info = g.info
            if info.state == REMOVED or node_id not in info.bundle_nodes:
                continue
            lost = [i for i, n in enumerate(info.bundle_nodes) if n == node_id]
            for i in lost:
                info.bundle_nodes[i] = None
                info.bundle_gpu_ids[i] = []
            info.state = RESCHEDULING
            info.detail = f"bundles {lost} lost with node {short(node_id)}; placing them again"
            g.ready.clear()
            self._publish(g)
            logger.warning("placement group %s: bundles %s were on node %s, which died; rescheduling",
                           short(info.pg_id), lost, short(node_id))
            self._start_placing(g)

    def on_job_finished(self, job_id: bytes) -> None:
        for g in list(self.groups.values()):
            if g.info.job_id == job_id and not g.info.detached and g.info.state != REMOVED:
                self.gcs._spawn(self._remove(g, "its job finished"), "pg.remove")

    def close(self) -> None:
        self._raylets.close_all()
