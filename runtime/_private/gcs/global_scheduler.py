"""The global scheduler: where a lease request goes when its local raylet spills it.

Bottom-up scheduling (paper, section 4.2.2): a raylet grants leases itself while the
request fits and its queue is short; otherwise it forwards the request here
(``ScheduleLease``). This module picks a node by **estimated wait** among the alive
nodes whose totals fit, and answers with a ``SpillbackReply`` that the raylet passes to
the owner, who then asks the chosen raylet directly (``RequestSpilledLease``).

```
owner ──RequestWorkerLease──► local raylet ──ScheduleLease──► GCS (GlobalScheduler)
  ▲                                │ ◄──────SpillbackReply────────┘
  └────────SpillbackReply──────────┘
owner ──RequestSpilledLease──► chosen raylet ──LeaseGrant──► owner
```

estimated wait(node) = (0 if it fits now else queued requests + 1) × mean task time
                       + bytes of arguments missing there / bandwidth
(availability from the node's heartbeat, minus placements made after it was sent)

Ties prefer the node that holds the most argument bytes, then the asking node (no
extra hop), then the freest. An infeasible request (no alive node has the totals) is
held until a node that fits joins. ``GlobalSchedulerState`` is pure; ``GlobalScheduler``
plugs it into the ``GcsServer`` (its node table and heartbeats).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Any

from lumos._private.ids import NodeID, short
from lumos._private.protocol import messages as m
from lumos._private.protocol.vocab import TaskUnschedulable
from lumos._private.raylet.resources import to_units
from lumos._private.transport.connection import Refusal

logger = logging.getLogger(__name__)

#: Used in the wait estimate until task times are reported per node.
MEAN_TASK_S = 0.05
#: Assumed transfer bandwidth for arguments missing on a node (bytes/s).
TRANSFER_BYTES_PER_S = 1.0e9
#: A placement reaches the node's resources within this long (owner's round trip to that raylet).
_HEARTBEAT_LAG_S = 0.05


class NodeNotAlive(Refusal):
    """A node the GCS declared dead (fenced) asked where to move a request it holds: it
    is on its way out once it hears of its death (a frozen node, thawed, asks before),
    and the refusal is an answer it handles, not a fault to log with a traceback."""


class Unschedulable(Exception):
    """A hard constraint (node affinity) can never be met; the owner's tasks fail with this text."""


class NoSuchGroup(Unschedulable):
    """The placement group asked for was removed, or never existed."""


@dataclasses.dataclass(slots=True)
class NodeView:
    """What the global scheduler knows of one alive node."""

    node_id: NodeID
    address: m.Address
    total: dict[str, int]
    available: dict[str, int]
    queue_length: int
    #: When its latest heartbeat arrived (monotonic seconds); placements after it are not in it yet.
    heartbeat_at: float = 0.0
    #: Its labels (``init(labels=)``, ``lumos start --labels``).
    labels: dict[str, str] = dataclasses.field(default_factory=dict)


class GlobalSchedulerState:
    """Pure node choice. Feed it the current node views with every decision."""

    def __init__(self, heartbeat_interval_s: float) -> None:
        #: Node -> [(time, units)] placed here recently; counted until a heartbeat shows them.
        self.recent: dict[bytes, list[tuple[float, dict[str, int]]]] = {}
        #: Node -> SPREAD placements so far (round robin among the nodes that fit).
        self.spread_count: dict[bytes, int] = {}
        self._forget_after_s = max(4 * heartbeat_interval_s, 2.0)

    def pick(self, nodes: list[NodeView], req: m.ScheduleLease, now: float) -> bytes | None:
        """The node for ``req``, or None while no alive node could ever run it.

        Raises:
            Unschedulable: hard node affinity to a node that is gone or too small.
        """
        units = {k: to_units(v) for k, v in req.resources.items() if v}
        self._prune(now)
        strategy = req.strategy
        by_id = {n.node_id: n for n in nodes}
        if strategy and strategy[0] == "NODE":
            target = by_id.get(bytes(strategy[1]))
            soft = bool(strategy[2]) if len(strategy) > 2 else False
            if target is not None and _fits(target.total, units):
                if not soft or _fits(self._available(target), units):
                    return self._placed(target.node_id, units, now)
            if not soft:
                if target is None:
                    raise Unschedulable(f"node {bytes(strategy[1]).hex()[:8]} named by NodeAffinitySchedulingStrategy"
                                        "(soft=False) is not alive; use soft=True to run elsewhere")
                raise Unschedulable(f"node {target.node_id.hex()[:8]} named by NodeAffinitySchedulingStrategy"
                                    f"(soft=False) has {_floats(target.total)}, less than {req.resources}")

        def now_available(n: NodeView) -> tuple[dict[str, int], int]:
            """What ``n`` has free and how many requests queue there, as known now."""
            if n.node_id == req.from_node and req.local_available is not None:
                # The asking raylet's own numbers are fresher than its last heartbeat.
                return {k: to_units(v) for k, v in req.local_available.items()}, req.local_queue
            return self._available(n), n.queue_length + self._unseen(n)

        choices = m.label_choices_of(strategy)
        if choices is None:
            feasible = [n for n in nodes if _fits(n.total, units)]
        else:
            # Node labels (``label_selector``, ``NodeLabelSchedulingStrategy``): the nodes
            # meeting the hard conditions, else those meeting the first fallback that any
            # node able to run the request meets.
            for conditions in choices:
                feasible = [n for n in nodes if m.labels_match(n.labels, conditions) and _fits(n.total, units)]
                if feasible:
                    break
            soft = m.label_soft_of(strategy)
            if soft and feasible:
                # Preferred (as Ray's policy): a node also meeting the soft conditions
                # with room now; else any with room now; else (none has room) one
                # meeting the soft conditions, to wait there.
                roomy = [n for n in feasible if _fits(now_available(n)[0], units)]
                among = roomy or feasible
                preferred = [n for n in among if m.labels_match(n.labels, soft)]
                feasible = preferred or among
        if req.only_if_room:
            # A request waiting where it was placed moves only to a node with room now (a
            # move to another busy node would only lose its place in the queue).
            feasible = [n for n in feasible if n.node_id != req.from_node and _fits(now_available(n)[0], units)]
            if not feasible:
                return req.from_node if req.from_node in by_id else None
        if not feasible:
            return None
        if strategy and (strategy[0] == "SPREAD" or m.label_spread_of(strategy)):
            best = min(feasible, key=lambda n: (self.spread_count.get(n.node_id, 0),
                                                not _fits(self._available(n), units), n.queue_length))
            self.spread_count[best.node_id] = self.spread_count.get(best.node_id, 0) + 1
            return self._placed(best.node_id, units, now)
        args = req.arg_bytes_by_node or {}
        total_args = sum(args.values())

        def score(n: NodeView) -> tuple[float, int, bool, float]:
            avail, queue = now_available(n)
            # The local scheduler grants whatever fits, past queued requests that do not: a node
            # where it fits now has no wait; elsewhere it queues behind the others.
            waiting = 0 if _fits(avail, units) else queue + 1
            missing = total_args - args.get(n.node_id, 0)
            wait_s = waiting * MEAN_TASK_S + missing / TRANSFER_BYTES_PER_S
            free_cpu = avail.get("CPU", 0) / max(n.total.get("CPU", 1), 1)
            return (wait_s, -args.get(n.node_id, 0), n.node_id != req.from_node, -free_cpu)

        best = min(feasible, key=score)
        return self._placed(best.node_id, units, now)

    def _available(self, n: NodeView) -> dict[str, int]:
        recent = self.recent.get(n.node_id)
        if not recent:
            return n.available
        avail = dict(n.available)
        for t, units in recent:
            if t > n.heartbeat_at - _HEARTBEAT_LAG_S:
                for k, v in units.items():
                    avail[k] = avail.get(k, 0) - v
        return avail

    def _unseen(self, n: NodeView) -> int:
        """Placements on ``n`` its latest heartbeat cannot show yet (they would queue if it is full)."""
        return sum(1 for t, _ in self.recent.get(n.node_id, ()) if t > n.heartbeat_at - _HEARTBEAT_LAG_S)

    def _placed(self, node_id: NodeID, units: dict[str, int], now: float) -> NodeID:
        self.recent.setdefault(node_id, []).append((now, units))
        return node_id

    def _prune(self, now: float) -> None:
        for node_id, recent in list(self.recent.items()):
            keep = [(t, u) for t, u in recent if now - t < self._forget_after_s]
            if keep:
                self.recent[node_id] = keep
            else:
                del self.recent[node_id]

    def node_removed(self, node_id: NodeID) -> None:
        self.recent.pop(node_id, None)
        self.spread_count.pop(node_id, None)


def _fits(have: dict[str, int], units: dict[str, int]) -> bool:
    return all(have.get(k, 0) >= v for k, v in units.items())


def _floats(units: dict[str, int]) -> dict[str, float]:
    from lumos._private.raylet.resources import from_units
    return {k: from_units(v) for k, v in units.items() if not k.startswith("node:")}


def infeasible_text(what: str, resources: dict[str, float], strategy: Any,
                    nodes: list[tuple[dict[str, float], dict[str, str]]]) -> str:
    """The warning for a request no alive node can run (``nodes``: each one's total
    resources and labels): what it needs, and what the nodes have."""
    choices = m.label_choices_of(strategy)
    if choices is None:
        return (f"{what} needs {resources}, but no node has that much (cluster nodes: "
                f"{[total for total, _ in nodes]}); it stays pending until a node that fits joins the cluster")
    if len(strategy) == 2 and all(values is not None for _, _, values in choices[0]):
        # (a label_selector alone: said as the user wrote it)
        wanted = "label_selector=" + str({key: ("!" if negated else "") + (
            values[0] if len(values) == 1 else f"in({', '.join(values)})") for key, negated, values in choices[0]})
    else:
        wanted = " or ".join(f"[{m.describe_label_conditions(c)}]" for c in choices)
    return (f"{what} needs {resources} on a node whose labels meet {wanted}, but no node "
            f"does (cluster nodes: {[{'resources': total, 'labels': labels} for total, labels in nodes]}); it "
            "stays pending until such a node joins the cluster")


class GlobalScheduler:
    """Serves ``ScheduleLease`` in the GCS process from its node table and heartbeats."""

    def __init__(self, gcs: Any) -> None:
        self.gcs = gcs
        self.state = GlobalSchedulerState(gcs.config.heartbeat_interval_ms / 1000)
        self._poll_s = min(0.2, gcs.config.heartbeat_interval_ms / 1000)

    def handlers(self) -> dict[type, Any]:
        return {m.ScheduleLease: self._schedule_lease}

    def node_views(self) -> list[NodeView]:
        out = []
        for node_id, info in self.gcs.nodes.items():
            if info.state != "ALIVE":
                continue
            hb = self.gcs.node_load.get(node_id)
            total = {k: to_units(v) for k, v in info.resources_total.items()}
            avail = ({k: to_units(v) for k, v in hb.resources_available.items()} if hb is not None
                     else dict(total))
            out.append(NodeView(node_id, info.address, total, avail, hb.queue_length if hb is not None else 0,
                                self.gcs._last_heartbeat.get(node_id, 0.0), dict(info.labels)))
        return out

    async def _schedule_lease(self, conn: Any, msg: m.ScheduleLease) -> m.SpillbackReply:
        started = time.monotonic()
        warned = False
        while True:
            try:
                node_id = self.state.pick(self.node_views(), msg, time.monotonic())
            except Unschedulable as e:
                raise TaskUnschedulable(str(e)) from None
            if node_id is None and msg.only_if_room:  # (the asking node is not alive here)
                raise NodeNotAlive(f"node {short(msg.from_node)} is not alive in the GCS's view")
            if node_id is not None:
                info = self.gcs.nodes[node_id]
                if logger.isEnabledFor(logging.DEBUG):
                    logger.debug("lease for %s %s from node %s (free %s, queue %d) placed on %s; views %s",
                                 msg.function_name, msg.resources, short(msg.from_node), msg.local_available,
                                 msg.local_queue, short(node_id), self.node_views())
                return m.SpillbackReply(info.address, node_id)
            if not warned and time.monotonic() - started >= self.gcs.config.infeasible_warning_s:
                warned = True
                text = infeasible_text(f"task {msg.function_name or '?'}", msg.resources, msg.strategy,
                                       [(_floats(n.total), n.labels) for n in self.node_views()])
                logger.warning("%s", text)
                self.gcs.publish("errors", msg.job_id, ["infeasible", text])
            await asyncio.sleep(self._poll_s)
