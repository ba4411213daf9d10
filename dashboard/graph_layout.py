"""The task graph as columns for Bokeh: pure (tasks in, positions and edges out).

The paper's dynamic task graph has tasks and objects as nodes and three kinds of edges:
data (object -> the task that consumes it; task -> the object it returns), control
(parent task -> the child it submitted) and stateful (an actor's call -> its next call).

Layout is layered and *incremental*: a node gets its position the first time it is
seen (depth = one more than whatever it depends on; row = next free row of that
layer) and keeps it, so a live graph does not jump around as tasks arrive. Beyond
``group_threshold`` tasks, or once one layer holds more than ``max_rows`` tasks (a
wide tree smears into a thin stripe long before 500 tasks), the graph is drawn per
function instead (one node per function, edges aggregated with counts): measured in ``tests/dashboard`` to build in
tens of milliseconds for 10,000 tasks, where 20,000 individual glyphs and edges made
the browser crawl.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Protocol

from lumos.state import TaskState

#: Fill colour per state class.
STATE_COLORS = {
    "pending": "#bdbdbd",
    "running": "#2b83ba",
    "finished": "#1a9641",
    "failed": "#d7191c",
    "cancelled": "#fdae61",
}
#: Outline of tasks that ran again (retried, or rebuilt by lineage reconstruction).
RERUN_COLOR = "#7b3294"
OBJECT_READY = "#9ecae1"
OBJECT_PENDING = "#ffffff"
EDGE_STYLES = {
    # kind: (colour, dash, width, legend)
    "data": ("#636363", "solid", 1.2, "data (object → task)"),
    "control": ("#3182bd", "dashed", 1.2, "control (parent → child)"),
    "stateful": ("#e6550d", "dotted", 3.0, "stateful (actor call → next call)"),
}
NODE_FIELDS = ("id", "kind", "x", "y", "color", "line_color", "line_width", "size", "marker", "label",
               "name", "state", "count", "info")
EDGE_FIELDS = ("x0", "y0", "x1", "y1")


class TaskLike(Protocol):
    task_id: str
    name: str
    function_name: str
    type: str
    state: str
    attempt: int
    retries: int
    parent: str | None
    actor_id: str | None
    prev_call: str | None
    args: list[str]
    returns: list[str]
    node_id: str | None
    worker_id: str | None


#: CSS class of each task state that has its own colour; every other state is "pending".
_STATE_CLASS = {TaskState.RUNNING: "running", TaskState.FINISHED: "finished", TaskState.FAILED: "failed",
                TaskState.CANCELLED: "cancelled"}


def state_class(state: str) -> str:
    return _STATE_CLASS.get(state, "pending")  # type: ignore[call-overload]


def _reran(t: TaskLike) -> bool:
    return bool(t.retries) or t.attempt > 0


class GraphLayout:
    """Stable positions across calls of ``build`` (one instance per page session)."""

    def __init__(self, group_threshold: int = 500, max_rows: int = 60) -> None:
        self.group_threshold = group_threshold
        self.max_rows = max_rows
        #: Task id -> depth (layer).
        self._depth: dict[str, int] = {}
        #: Node id -> (x, y), fixed once assigned.
        self._pos: dict[str, tuple[float, float]] = {}
        #: Column x -> rows used.
        self._rows: dict[float, int] = {}
        self.grouped = False

    def _place(self, node_id: str, x: float) -> tuple[float, float]:
        pos = self._pos.get(node_id)
        if pos is None:
            row = self._rows.get(x, 0)
            self._rows[x] = row + 1
            pos = self._pos[node_id] = (x, -float(row))
        return pos

    def _task_depth(self, t: TaskLike, producer: Mapping[str, str], present: Mapping[str, Any]) -> int:
        d = self._depth.get(t.task_id)
        if d is not None:
            return d
        d = 0
        for oid in t.args:
            p = producer.get(oid)
            if p is not None and p in present:
                d = max(d, self._depth.get(p, 0) + 1)
        for dep in (t.parent, t.prev_call):
            if dep and dep in present:
                d = max(d, self._depth.get(dep, 0) + 1)
        self._depth[t.task_id] = d
        return d

    def build(self, tasks: Iterable[TaskLike], producer: Mapping[str, str],
              grouped: bool | None = None) -> tuple[dict[str, list[Any]], dict[str, dict[str, list[Any]]]]:
        """Columns for the node glyphs and, per edge kind, for the edge segments.

        ``tasks`` must come in the order they were first seen (dependencies first).
        ``grouped=None`` groups by function beyond ``group_threshold`` tasks or
        ``max_rows`` tasks in one layer.
        """
        present = {t.task_id: t for t in tasks}
        widths: dict[int, int] = {}
        for t in present.values():
            d = self._task_depth(t, producer, present)
            widths[d] = widths.get(d, 0) + 1
        if grouped is None:
            grouped = len(present) > self.group_threshold or max(widths.values(), default=0) > self.max_rows
        if grouped != self.grouped:
            self._pos.clear()
            self._rows.clear()
            self.grouped = grouped
        if grouped:
            return self._build_grouped(present, producer)
        return self._build_tasks(present, producer)

    # ------------------------------------------------------------------ one node per task

    def _build_tasks(self, present: dict[str, TaskLike], producer: Mapping[str, str]
                     ) -> tuple[dict[str, list[Any]], dict[str, dict[str, list[Any]]]]:
        nodes: dict[str, list[Any]] = {f: [] for f in NODE_FIELDS}
        edges: dict[str, dict[str, list[Any]]] = {k: {f: [] for f in EDGE_FIELDS} for k in EDGE_STYLES}
        obj_pos: dict[str, tuple[float, float]] = {}

        def add_node(node_id: str, kind: str, pos: tuple[float, float], color: str, line_color: str,
                     line_width: float, size: float, marker: str, label: str, name: str, state: str,
                     info: str) -> None:
            for f, v in zip(NODE_FIELDS, (node_id, kind, pos[0], pos[1], color, line_color, line_width,
                                          size, marker, label, name, state, 1, info)):
                nodes[f].append(v)

        def add_edge(kind: str, a: tuple[float, float], b: tuple[float, float]) -> None:
            e = edges[kind]
            e["x0"].append(a[0])
            e["y0"].append(a[1])
            e["x1"].append(b[0])
            e["y1"].append(b[1])

        for t in present.values():
            x = 2.0 * self._depth[t.task_id]
            pos = self._place(t.task_id, x)
            cls = state_class(t.state)
            rerun = _reran(t)
            label = t.name if len(t.name) <= 24 else t.name[:23] + "…"
            add_node(t.task_id, "task", pos, STATE_COLORS[cls], RERUN_COLOR if rerun else "#333333",
                     3.0 if rerun else 1.0, 16, "circle", label, t.name,
                     t.state + (f" (ran {t.attempt + 1}×)" if rerun else ""),
                     f"{t.type} on node {(t.node_id or '?')[:8]}")
            for i, oid in enumerate(t.returns):
                opos = self._place("obj:" + oid, x + 1.0)
                obj_pos[oid] = opos
                ready = t.state == TaskState.FINISHED
                add_node(oid, "object", opos, OBJECT_READY if ready else OBJECT_PENDING, "#555555", 1.0, 10,
                         "square", "", f"return {i} of {t.name}", "ready" if ready else "pending", "object")
                add_edge("data", pos, opos)
        for t in present.values():
            pos = self._pos[t.task_id]
            for oid in t.args:
                opos = obj_pos.get(oid)
                if opos is None:  # put() objects and refs from outside the view: a column at the left
                    opos = self._place("obj:" + oid, -1.0)
                    obj_pos[oid] = opos
                    owner = "put()" if oid not in producer else "earlier task"
                    add_node(oid, "object", opos, OBJECT_READY, "#555555", 1.0, 10, "square", "",
                             f"object from {owner}", "ready", "object")
                add_edge("data", opos, pos)
            if t.parent and t.parent in present:
                add_edge("control", self._pos[t.parent], pos)
            if t.prev_call and t.prev_call in present:
                add_edge("stateful", self._pos[t.prev_call], pos)
        return nodes, edges

    # ------------------------------------------------------------------ one node per function

    def _build_grouped(self, present: dict[str, TaskLike], producer: Mapping[str, str]
                       ) -> tuple[dict[str, list[Any]], dict[str, dict[str, list[Any]]]]:
        group_of: dict[str, str] = {}
        groups: dict[str, dict[str, Any]] = {}
        for t in present.values():
            key = t.function_name or t.name
            group_of[t.task_id] = key
            g = groups.get(key)
            if g is None:
                g = groups[key] = {"depth": self._depth[t.task_id], "count": 0, "states": {}, "reran": 0,
                                   "name": t.name, "type": t.type, "names": set()}
            g["count"] += 1
            if len(g["names"]) < 2:
                g["names"].add(t.name)
            cls = state_class(t.state)
            g["states"][cls] = g["states"].get(cls, 0) + 1
            if _reran(t):
                g["reran"] += 1
        pairs: dict[str, dict[tuple[str, str], int]] = {k: {} for k in EDGE_STYLES}
        for t in present.values():
            mine = group_of[t.task_id]
            for oid in t.args:
                p = producer.get(oid)
                if p is not None and p in group_of:
                    key = (group_of[p], mine)
                    pairs["data"][key] = pairs["data"].get(key, 0) + 1
            for kind, dep in (("control", t.parent), ("stateful", t.prev_call)):
                if dep and dep in group_of:
                    key = (group_of[dep], mine)
                    pairs[kind][key] = pairs[kind].get(key, 0) + 1
        nodes: dict[str, list[Any]] = {f: [] for f in NODE_FIELDS}
        for key, g in groups.items():
            pos = self._place("group:" + key, 2.0 * g["depth"])
            states = g["states"]
            # The colour says what needs attention first: failures, then work in flight.
            for cls in ("failed", "running", "pending", "cancelled", "finished"):
                if states.get(cls):
                    break
            summary = ", ".join(f"{states[c]} {c}" for c in STATE_COLORS if states.get(c))
            if g["reran"]:
                summary += f", {g['reran']} ran again"
            # The tasks' own name when they share one ("combine", "Counter.add"), not the
            # module path of the function that would fill the label.
            short = next(iter(g["names"])) if len(g["names"]) == 1 else key.rsplit(".", 1)[-1]
            label = short if len(short) <= 24 else short[:23] + "…"
            values = ("group:" + key, "group", pos[0], pos[1], STATE_COLORS[cls],
                      RERUN_COLOR if g["reran"] else "#333333", 3.0 if g["reran"] else 1.0,
                      min(14 + 6 * len(str(g["count"])), 48), "circle", f"{label} ×{g['count']}", key,
                      summary, g["count"], g["type"])
            for f, v in zip(NODE_FIELDS, values):
                nodes[f].append(v)
        edges: dict[str, dict[str, list[Any]]] = {}
        for kind, counts in pairs.items():
            e: dict[str, list[Any]] = {f: [] for f in EDGE_FIELDS}
            for (a, b), _n in counts.items():
                pa, pb = self._pos["group:" + a], self._pos["group:" + b]
                if pa == pb:
                    continue  # a function calling itself: shown in the node's count
                e["x0"].append(pa[0])
                e["y0"].append(pa[1])
                e["x1"].append(pb[0])
                e["y1"].append(pb[1])
            edges[kind] = e
        return nodes, edges
