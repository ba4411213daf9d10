"""The GCS placement-group table as a pure state machine: placement, 2-phase reservation, removal.

``PlacementGroupState`` takes events (a group registered or removed, a placement try with
the current node views, the raylets' answers to a reservation, a node or job that died)
and returns actions (reserve bundles on a node, release them, publish a row, wait and try
again). It opens no sockets and awaits nothing; ``PlacementGroupTable``
(placement_groups.py) feeds it and runs the actions. Time is passed in (monotonic
seconds, for the infeasibility warning).

A placement is a two-phase commit over the raylets that get bundles::

    PlacementTried(views) ─► plan_bundles ─► ReserveBundles to each node used   (prepare:
                                             │                                    each raylet
    BundlesReserved(answers) ─► all ok ──────┴► bundles recorded on their nodes   takes them
                                │               (commit; a node that died since   or refuses)
                                │                is left out and placed again)
                                └ one refused ─► ReleaseBundles to the others (rollback),
                                                 RetryPlacement after a heartbeat
    every bundle recorded ─► CREATED
    NodeDied ─► its bundles unplaced, group RESCHEDULING, PlaceGroup
    GroupRemoved / JobFinished ─► ReleaseBundles everywhere ─► REMOVED

``plan_bundles`` is the strategy part (strategy → node per bundle). A raylet's answer
names the node GPUs each bundle got; they are kept in ``PlacementGroupInfo.bundle_gpu_ids``
(for the dashboard). Every change bumps ``version`` and is one ``PublishGroup``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import OrderedDict
from typing import Any, Union

from lumos._private.gcs.global_scheduler import NoSuchGroup, Unschedulable
from lumos._private.ids import JobID, NodeID, PlacementGroupID, short
from lumos._private.protocol import messages as m
from lumos._private.protocol.cluster_messages import PG_INFEASIBLE_DETAIL, PG_WAITING_DETAIL
from lumos._private.raylet.resources import request_units

logger = logging.getLogger(__name__)

PENDING, CREATED, RESCHEDULING, REMOVED = "PENDING", "CREATED", "RESCHEDULING", "REMOVED"
STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
#: Removed groups kept for ``placement_group_table()``.
KEEP_REMOVED = 1000


# ----------------------------------------------------------------------------- pure placement


def plan_bundles(strategy: str, bundles: list[dict[str, int]], missing: list[int],
                 placed: dict[int, bytes], nodes: list[tuple[bytes, dict[str, int]]],
                 bundle_labels: list[list[Any]] | None = None,
                 node_labels: dict[bytes, dict[str, str]] | None = None) -> dict[int, bytes] | None:
    """Pick a node for every bundle index in ``missing``, or None when the strategy cannot be met.

    Args:
        strategy: PACK, SPREAD, STRICT_PACK or STRICT_SPREAD.
        bundles: every bundle's resources (units).
        missing: the bundle indices to place.
        placed: bundles of the group already held (index -> node), which constrain the rest.
        nodes: ``(node id, free units)`` of the alive nodes, in preference order.
        bundle_labels: each bundle's node-label conditions (``bundle_label_selector``).
        node_labels: each node's labels.
    """
    free = {nid: dict(avail) for nid, avail in nodes}
    order = [nid for nid, _ in nodes]
    plan: dict[int, bytes] = {}

    def allowed(nid: bytes, i: int) -> bool:
        """Bundle ``i``'s label conditions hold on node ``nid`` (or it has none)."""
        if not bundle_labels or not bundle_labels[i]:
            return True
        return m.labels_match((node_labels or {}).get(nid, {}), bundle_labels[i])

    def fits(nid: bytes, units: dict[str, int], i: int | None = None) -> bool:
        if i is not None and not allowed(nid, i):
            return False
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
            if nid in free and fits(nid, want) and all(allowed(nid, i) for i in missing):
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
            nid = next((n for n in holding + order if fits(n, bundles[i], i)), None)
            if nid is None:
                return None
            take(nid, i)
        return plan
    if strategy == "SPREAD":
        for i in sorted(missing, key=lambda i: -sum(bundles[i].values())):
            def count(n: bytes) -> int:
                return sum(1 for v in placed.values() if v == n) + sum(1 for v in plan.values() if v == n)
            options = sorted((n for n in order if fits(n, bundles[i], i)), key=count)
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
                if nid not in taken and fits(nid, bundles[i], i):
                    take(nid, i)
                    if assign(k + 1, taken | {nid}):
                        return True
                    for r, v in bundles[i].items():
                        free[nid][r] += v
                    del plan[i]
            return False

        return plan if assign(0, set(used)) else None
    raise ValueError(f"unknown placement strategy {strategy!r}; valid: {', '.join(STRATEGIES)}")


# ----------------------------------------------------------------------------- events

#: ``(node id, units)`` of each alive node, in preference order.
NodeUnits = list[tuple[bytes, dict[str, int]]]


@dataclasses.dataclass(slots=True)
class GroupCreated:
    """A driver registered a group (``CreatePlacementGroup``), at wall-clock ``created_at``."""

    msg: m.CreatePlacementGroup
    created_at: float


@dataclasses.dataclass(slots=True)
class GroupRemoved:
    pg_id: PlacementGroupID
    why: str


@dataclasses.dataclass(slots=True)
class GroupRestored:
    """A row read back from storage by a restarted GCS."""

    info: m.PlacementGroupInfo


@dataclasses.dataclass(slots=True)
class PlacementTried:
    """The group's placement loop looks at the nodes: free units now, and totals."""

    pg_id: PlacementGroupID
    available: NodeUnits
    totals: NodeUnits
    #: Each alive node's labels (for ``bundle_label_selector``).
    labels: dict[bytes, dict[str, str]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(slots=True)
class BundlesReserved:
    """The raylets answered the reservation: node -> bundle index -> its GPUs (None: refused)."""

    pg_id: PlacementGroupID
    answers: dict[bytes, dict[int, list[int]] | None]


@dataclasses.dataclass(slots=True)
class NodeDied:
    node_id: NodeID


@dataclasses.dataclass(slots=True)
class JobFinished:
    job_id: JobID


Event = Union[GroupCreated, GroupRemoved, GroupRestored, PlacementTried, BundlesReserved, NodeDied, JobFinished]

# ----------------------------------------------------------------------------- actions


@dataclasses.dataclass(slots=True)
class PublishGroup:
    """Persist the group's row and publish it on the "placement_groups" channel."""

    pg_id: PlacementGroupID


@dataclasses.dataclass(slots=True)
class DeleteGroupRow:
    """A removed group dropped from the table (beyond ``KEEP_REMOVED``): delete its row."""

    pg_id: PlacementGroupID


@dataclasses.dataclass(slots=True)
class PlaceGroup:
    """Run the group's placement loop (one per group) until it is placed or removed."""

    pg_id: PlacementGroupID


@dataclasses.dataclass(slots=True)
class ReserveBundles:
    """Prepare: ask the node's raylet to take these bundles, all or none."""

    pg_id: PlacementGroupID
    node_id: NodeID
    #: ``[[bundle index, resources], ...]``.
    bundles: list[list[Any]]


@dataclasses.dataclass(slots=True)
class ReleaseBundles:
    """Give bundles back on a node (rollback, removal); ``indices`` None: all of the group's there."""

    pg_id: PlacementGroupID
    node_id: NodeID
    indices: list[int] | None


@dataclasses.dataclass(slots=True)
class RetryPlacement:
    """Try again after ``after_s``; with ``on_change``, as soon as nodes change. (The
    server's loop waits for the group's turn, ``Turns``: the next node change or tick of
    one timer of that period, pending groups in creation order.)"""

    pg_id: PlacementGroupID
    after_s: float
    on_change: bool


@dataclasses.dataclass(slots=True)
class ReportInfeasible:
    """Warn the group's job: no alive nodes can hold it."""

    job_id: JobID
    text: str


Action = Union[PublishGroup, DeleteGroupRow, PlaceGroup, ReserveBundles, ReleaseBundles, RetryPlacement,
               ReportInfeasible]

# ----------------------------------------------------------------------------- state


class _Group:
    __slots__ = ("info", "units", "picks", "warned", "placing_since", "reserving")

    def __init__(self, info: m.PlacementGroupInfo) -> None:
        self.info = info
        #: Each bundle's resources in units.
        self.units = [request_units(b) for b in info.bundles]
        #: Round robin over bundles for requests that take any bundle (index -1).
        self.picks = 0
        #: The infeasibility warning was sent.
        self.warned = False
        #: When the current placement started (monotonic); None while not placing.
        self.placing_since: float | None = None
        #: The reservation in flight: node -> bundle indices asked of it.
        self.reserving: dict[bytes, list[int]] | None = None


class PlacementGroupState:
    """Placement groups of the cluster (removed ones too, bounded) and their names."""

    def __init__(self, heartbeat_interval_s: float, infeasible_warning_s: float, validate: bool = False) -> None:
        self.retry_s = heartbeat_interval_s
        self.infeasible_warning_s = infeasible_warning_s
        self.validate = validate
        #: Group id -> group (removed ones kept, up to ``KEEP_REMOVED``).
        self.groups: OrderedDict[bytes, _Group] = OrderedDict()
        #: (namespace, name) -> group id, for groups not removed.
        self.named: dict[tuple[str, str], bytes] = {}
        #: Nodes declared dead: nothing is placed or committed there.
        self.dead_nodes: set[bytes] = set()

    # ------------------------------------------------------------------ queries

    def info_of(self, pg_id: PlacementGroupID) -> m.PlacementGroupInfo | None:
        g = self.groups.get(pg_id)
        return g.info if g is not None else None

    def named_info(self, namespace: str, name: str) -> m.PlacementGroupInfo | None:
        pg_id = self.named.get((namespace, name))
        return self.info_of(pg_id) if pg_id is not None else None

    def wants_placement(self, pg_id: PlacementGroupID) -> bool:
        g = self.groups.get(pg_id)
        return g is not None and g.info.state in (PENDING, RESCHEDULING)

    def node_for_bundle(self, pg_id: PlacementGroupID, index: int, resources: dict[str, float]) -> bytes | None:
        """The node holding bundle ``index`` (-1: any bundle, round robin) of a group; None while unplaced.

        Raises:
            Unschedulable: the group is unknown or removed, the index is out of range, or the
                request is larger than the bundle.
        """
        g = self.groups.get(pg_id)
        if g is None or g.info.state == REMOVED:
            raise NoSuchGroup(f"placement group {pg_id.hex()} "
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
        node_id = g.info.bundle_nodes[fitting[g.picks % len(fitting)]]
        if node_id is None or node_id in self.dead_nodes:
            return None
        return node_id

    # ------------------------------------------------------------------ events

    def handle(self, event: Event, now: float) -> list[Action]:
        """Apply ``event`` at monotonic ``now``; the actions to run, in order.

        Raises:
            ValueError: a malformed group, a name taken in its namespace, or a removal of an
                unknown group (the state is unchanged).
        """
        actions: list[Action] = []
        if isinstance(event, GroupCreated):
            self._create(event, actions)
        elif isinstance(event, GroupRemoved):
            g = self.groups.get(event.pg_id)
            if g is None:
                raise ValueError(f"no placement group {event.pg_id.hex()}")
            self._remove(g, event.why, actions)
        elif isinstance(event, GroupRestored):
            self._restore(event.info, actions)
        elif isinstance(event, PlacementTried):
            g = self.groups.get(event.pg_id)
            if g is not None and g.info.state in (PENDING, RESCHEDULING):
                self._try_placement(g, event, now, actions)
        elif isinstance(event, BundlesReserved):
            g = self.groups.get(event.pg_id)
            if g is not None and g.reserving is not None:
                self._reserved(g, event.answers, actions)
        elif isinstance(event, NodeDied):
            self._node_died(event.node_id, actions)
        elif isinstance(event, JobFinished):
            for g in list(self.groups.values()):
                if g.info.job_id == event.job_id and not g.info.detached and g.info.state != REMOVED:
                    self._remove(g, "its job finished", actions)
        if self.validate:
            self.check_invariants()
        return actions

    def _create(self, e: GroupCreated, actions: list[Action]) -> None:
        msg = e.msg
        if msg.strategy not in STRATEGIES:
            raise ValueError(f"unknown placement strategy {msg.strategy!r}; valid: {', '.join(STRATEGIES)}")
        if not msg.bundles or not all(isinstance(b, dict) and b for b in msg.bundles):
            raise ValueError("a placement group needs a non-empty list of non-empty bundles")
        if msg.bundle_labels and len(msg.bundle_labels) != len(msg.bundles):
            raise ValueError(f"bundle_label_selector has {len(msg.bundle_labels)} selectors for "
                             f"{len(msg.bundles)} bundles; give one per bundle")
        if msg.pg_id in self.groups:
            return  # a retried request
        if msg.name and (msg.namespace, msg.name) in self.named:
            raise ValueError(f"a placement group named {msg.name!r} already exists in namespace "
                             f"{msg.namespace!r}; remove it first or pick another name")
        info = m.PlacementGroupInfo(msg.pg_id, msg.name, msg.namespace, msg.strategy,
                                    [dict(b) for b in msg.bundles], PENDING, [None] * len(msg.bundles),
                                    msg.job_id, msg.detached, e.created_at, "waiting for resources",
                                    bundle_gpu_ids=[[] for _ in msg.bundles],
                                    bundle_labels=[list(c) for c in msg.bundle_labels])
        self.groups[msg.pg_id] = _Group(info)
        if msg.name:
            self.named[(msg.namespace, msg.name)] = msg.pg_id
        self._trim(actions)
        self._publish(msg.pg_id, actions)
        actions.append(PlaceGroup(msg.pg_id))
        logger.info("placement group %s (%s, %d bundles) registered", short(msg.pg_id), msg.strategy,
                    len(msg.bundles))

    def _restore(self, info: m.PlacementGroupInfo, actions: list[Action]) -> None:
        if len(info.bundle_gpu_ids) != len(info.bundles):  # a row from a GCS that predates it
            info.bundle_gpu_ids = [[] for _ in info.bundles]
        self.groups[info.pg_id] = _Group(info)
        if info.state == REMOVED:
            return
        if info.name:
            self.named[(info.namespace, info.name)] = info.pg_id
        if info.state != CREATED:
            actions.append(PlaceGroup(info.pg_id))

    # ------------------------------------------------------------------ placement (two phases)

    def _try_placement(self, g: _Group, e: PlacementTried, now: float, actions: list[Action]) -> None:
        info = g.info
        if g.reserving is not None:
            # The loop that asked never heard back (it was cancelled or failed): give back
            # whatever those raylets may hold before planning again.
            for nid, idx in g.reserving.items():
                actions.append(ReleaseBundles(info.pg_id, nid, idx))
            g.reserving = None
        if g.placing_since is None:
            g.placing_since = now
        missing = [i for i, n in enumerate(info.bundle_nodes) if n is None]
        if not missing:
            self._created(g, actions)
            return
        placed = {i: n for i, n in enumerate(info.bundle_nodes) if n is not None}
        available = [(n, units) for n, units in e.available if n not in self.dead_nodes]
        plan = plan_bundles(info.strategy, g.units, missing, placed, available, info.bundle_labels, e.labels)
        if plan is None:
            totals = [(n, units) for n, units in e.totals if n not in self.dead_nodes]
            ever = plan_bundles(info.strategy, g.units, missing, placed, totals, info.bundle_labels, e.labels)
            labelled = (" and their bundle_label_selector ("
                        + "; ".join(m.describe_label_conditions(c) for c in info.bundle_labels) + ")"
                        if info.bundle_labels else "")
            detail = (f"{PG_INFEASIBLE_DETAIL}no alive nodes can hold these bundles with strategy "
                      f"{info.strategy}{labelled}; it stays pending until nodes that fit join" if ever is None
                      else PG_WAITING_DETAIL)
            if detail != info.detail:
                info.detail = detail
                self._publish(info.pg_id, actions)
            if ever is None and not g.warned and now - g.placing_since >= self.infeasible_warning_s:
                g.warned = True
                actions.append(ReportInfeasible(info.job_id, (
                    f"placement group {info.pg_id.hex()} ({info.strategy}, bundles {info.bundles}{labelled}) "
                    f"cannot be placed on the alive nodes; it stays pending until nodes that fit join")))
            actions.append(RetryPlacement(info.pg_id, self.retry_s, on_change=True))
            return
        by_node: dict[bytes, list[int]] = {}
        for i, nid in plan.items():
            by_node.setdefault(nid, []).append(i)
        g.reserving = by_node
        for nid, idx in by_node.items():
            actions.append(ReserveBundles(info.pg_id, nid, [[i, info.bundles[i]] for i in idx]))

    def _reserved(self, g: _Group, answers: dict[bytes, dict[int, list[int]] | None],
                  actions: list[Action]) -> None:
        info = g.info
        by_node, g.reserving = g.reserving or {}, None
        ok = [nid for nid in by_node if answers.get(nid) is not None]
        if info.state == REMOVED or len(ok) != len(by_node):
            for nid in ok:  # rollback: the ones that said yes give their share back
                actions.append(ReleaseBundles(info.pg_id, nid, by_node[nid]))
            if info.state != REMOVED:
                # Someone took the resources first: look again after a heartbeat.
                actions.append(RetryPlacement(info.pg_id, self.retry_s, on_change=False))
            return
        for nid, idx in by_node.items():
            if nid in self.dead_nodes:
                continue  # died since it said yes: those bundles are placed again
            gpus = answers[nid] or {}
            for i in idx:
                info.bundle_nodes[i] = nid
                info.bundle_gpu_ids[i] = gpus.get(i, [])
        if all(n is not None for n in info.bundle_nodes):
            self._created(g, actions)

    def _created(self, g: _Group, actions: list[Action]) -> None:
        info = g.info
        info.state = CREATED
        info.detail = ""
        g.placing_since = None
        self._publish(info.pg_id, actions)
        logger.info("placement group %s created: bundles on %s", short(info.pg_id),
                    [short(n) if n else None for n in info.bundle_nodes])

    # ------------------------------------------------------------------ removal and failures

    def _remove(self, g: _Group, why: str, actions: list[Action]) -> None:
        info = g.info
        if info.state == REMOVED:
            return
        info.state = REMOVED
        info.detail = why
        if info.name and self.named.get((info.namespace, info.name)) == info.pg_id:
            del self.named[(info.namespace, info.name)]
        for nid in dict.fromkeys(n for n in info.bundle_nodes if n is not None):
            actions.append(ReleaseBundles(info.pg_id, nid, None))
        info.bundle_nodes = [None] * len(info.bundle_nodes)
        info.bundle_gpu_ids = [[] for _ in info.bundle_nodes]
        g.placing_since = None
        self._publish(info.pg_id, actions)
        logger.info("placement group %s removed: %s", short(info.pg_id), why)

    def _node_died(self, node_id: NodeID, actions: list[Action]) -> None:
        self.dead_nodes.add(node_id)
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
            g.placing_since = None
            self._publish(info.pg_id, actions)
            logger.warning("placement group %s: bundles %s were on node %s, which died; rescheduling",
                           short(info.pg_id), lost, short(node_id))
            actions.append(PlaceGroup(info.pg_id))

    def _trim(self, actions: list[Action]) -> None:
        removed = [k for k, g in self.groups.items() if g.info.state == REMOVED]
        for k in removed[:max(0, len(removed) - KEEP_REMOVED)]:
            del self.groups[k]
            actions.append(DeleteGroupRow(k))

    def _publish(self, pg_id: PlacementGroupID, actions: list[Action]) -> None:
        self.groups[pg_id].info.version += 1
        actions.append(PublishGroup(pg_id))

    # ------------------------------------------------------------------ invariants

    def check_invariants(self) -> None:
        """Raise AssertionError naming the first group whose bookkeeping disagrees."""
        for (ns, name), pg_id in self.named.items():
            g = self.groups.get(pg_id)
            if g is None or g.info.state == REMOVED or (g.info.namespace, g.info.name) != (ns, name):
                raise AssertionError(f"name {ns}/{name} points at placement group {short(pg_id)}, which is "
                                     f"{'unknown' if g is None else g.info.state}")
        for pg_id, g in self.groups.items():
            info = g.info
            what = f"placement group {short(pg_id)} ({info.state})"
            n = len(info.bundles)
            if not (len(info.bundle_nodes) == len(g.units) == len(info.bundle_gpu_ids) == n):
                raise AssertionError(f"{what}: {n} bundles but {len(info.bundle_nodes)} nodes, "
                                     f"{len(info.bundle_gpu_ids)} GPU lists")
            if info.state != REMOVED and info.name and self.named.get((info.namespace, info.name)) != pg_id:
                raise AssertionError(f"{what} is named {info.name!r} but the name points elsewhere")
            nodes = [nid for nid in info.bundle_nodes if nid is not None]
            if info.state == REMOVED and (nodes or any(info.bundle_gpu_ids)):
                raise AssertionError(f"{what} still holds bundles on {[short(x) for x in nodes]}")
            if info.state == CREATED and len(nodes) != n:
                raise AssertionError(f"{what} has unplaced bundles")
            if any(nid in self.dead_nodes for nid in nodes):
                raise AssertionError(f"{what} holds bundles on a dead node")
            if info.strategy == "STRICT_PACK" and len(set(nodes)) > 1:
                raise AssertionError(f"{what} is STRICT_PACK over {len(set(nodes))} nodes")
            if info.strategy == "STRICT_SPREAD" and len(set(nodes)) != len(nodes):
                raise AssertionError(f"{what} is STRICT_SPREAD with two bundles on one node")
            if g.reserving is not None:
                if info.state not in (PENDING, RESCHEDULING, REMOVED):
                    raise AssertionError(f"{what} has a reservation in flight")
                asked = [i for idx in g.reserving.values() for i in idx]
                if info.state != REMOVED and any(info.bundle_nodes[i] is not None for i in asked):
                    raise AssertionError(f"{what} reserves bundles {asked} it holds already")
