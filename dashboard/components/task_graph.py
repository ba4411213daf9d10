"""Task graph: tasks and objects as nodes; data, control and stateful edges.

Drawn from ``graph_layout`` columns: one glyph renderer for nodes (circles for tasks,
squares for objects, big circles for per-function groups), one segment renderer per
edge kind (each its own colour and dash, with a legend). Clicking a node shows its
details below the plot (escaped), with a link to the lineage of its value. Updates
send only what changed: new nodes are streamed, changed colours patched; a re-layout
(grouping switched on) replaces all.

The plot fits what is drawn: its height follows the number of rows (``ROW_PX`` each,
between ``MIN_HEIGHT`` and ``MAX_HEIGHT``), its ranges are set to the nodes plus room
for the labels (and are what "reset" returns to), and labels are hidden when rows
are too close to read them. "by function" / "each task" / "auto" switch grouping.
"""

from __future__ import annotations

from typing import Any, Iterable

from lumos.state import TaskState

from lumos.dashboard.components.common import Page, details_table, esc
from lumos.dashboard.graph_layout import (EDGE_FIELDS, EDGE_STYLES, NODE_FIELDS, RERUN_COLOR, STATE_COLORS,
                                          GraphLayout)

#: Everything but the id and the position (fixed once placed) may change between polls:
#: a task first seen through its worker's events gets its name when the submitter's
#: events arrive, so the name columns are patched too.
_PATCHABLE = tuple(f for f in NODE_FIELDS if f not in ("id", "x", "y"))
ROW_PX = 24
MIN_HEIGHT = 260
MAX_HEIGHT = 1000
#: Room (in layout units: a layer is 2 wide) right of the last column for its labels.
LABEL_ROOM = 1.6
GROUP_MODES = ["auto", "each task", "by function"]


def legend_html(grouped: bool, n_tasks: int | None, threshold: int) -> str:
    """State colours; above them, unless ``n_tasks`` is None, how many tasks are drawn and how."""
    swatches = "".join(
        f"<span style='margin-right:12px'><span style='display:inline-block;width:10px;height:10px;"
        f"border-radius:5px;background:{c}'></span> {esc(s)}</span>" for s, c in STATE_COLORS.items())
    swatches += (f"<span style='margin-right:12px'><span style='display:inline-block;width:8px;height:8px;"
                 f"border:2px solid {RERUN_COLOR};border-radius:5px'></span> ran again (retry or reconstruction)</span>")
    if n_tasks is None:
        mode = ""
    elif grouped:
        mode = (f"{n_tasks} tasks, grouped by function (more than {threshold}, or too many side by side); "
                "choose \"each task\" to see them all, or open Lineage for one object's tasks")
    else:
        mode = f"{n_tasks} tasks"
    head = f"{esc(mode)}<br>" if mode else ""
    return f"<div class='lumos-graph-legend' style='font-family:sans-serif;font-size:12px'>{head}{swatches}</div>"


class GraphView:
    """The plot, its sources and incremental updates; shared by the graph and lineage pages."""

    def __init__(self, title: str, name: str, group_threshold: int) -> None:
        from bokeh.models import ColumnDataSource, HoverTool, TapTool
        from bokeh.plotting import figure
        self.layout_engine = GraphLayout(group_threshold)
        self.node_source = ColumnDataSource({f: [] for f in NODE_FIELDS})
        self.edge_sources = {k: ColumnDataSource({f: [] for f in EDGE_FIELDS}) for k in EDGE_STYLES}
        self.plot = figure(height=520, sizing_mode="stretch_width", title=title, name=name,
                           tools="pan,wheel_zoom,box_zoom,reset,save", match_aspect=False)
        self.plot.xaxis.visible = False
        self.plot.yaxis.visible = False
        self.plot.xgrid.visible = False
        self.plot.ygrid.visible = False
        for kind, (color, dash, width, legend) in EDGE_STYLES.items():
            self.plot.segment(x0="x0", y0="y0", x1="x1", y1="y1", source=self.edge_sources[kind], line_color=color,
                              line_dash=dash, line_width=width, line_alpha=0.7, legend_label=legend,
                              name=f"edges_{kind}")
        nodes = self.plot.scatter(x="x", y="y", size="size", marker="marker", fill_color="color",
                                  line_color="line_color", line_width="line_width", source=self.node_source,
                                  name="nodes")
        self.labels = self.plot.text(x="x", y="y", text="label", source=self.node_source, text_font_size="9px",
                                     x_offset=9, y_offset=-4, text_color="#333333", name="labels")
        self.plot.add_tools(HoverTool(renderers=[nodes], tooltips=[
            ("", "@kind"), ("name", "@name"), ("id", "@id"), ("state", "@state"), ("", "@info")]))
        self.plot.add_tools(TapTool(renderers=[nodes]))
        legend = self.plot.legend[0]
        legend.label_text_font_size = "10px"
        legend.orientation = "horizontal"
        self.plot.center.remove(legend)
        self.plot.add_layout(legend, "below")
        from bokeh.models import Range1d
        self.plot.x_range = Range1d(-1.0, 1.0, name="graph_x")
        self.plot.y_range = Range1d(-1.0, 1.0, name="graph_y")
        self._bounds: tuple[float, float, float, float] | None = None
        self._ids: list[str] = []

    def show(self, tasks: Iterable[Any], producer: dict[str, str], grouped: bool | None = None) -> None:
        nodes, edges = self.layout_engine.build(tasks, producer, grouped)
        ids = nodes["id"]
        old = self._ids
        if len(ids) >= len(old) and ids[:len(old)] == old and old:
            patches: dict[str, list[tuple[int, Any]]] = {}
            current = self.node_source.data
            for f in _PATCHABLE:
                col = current[f]
                new = nodes[f]
                changes = [(i, new[i]) for i in range(len(old)) if col[i] != new[i]]
                if changes:
                    patches[f] = changes
            if patches:
                self.node_source.patch(patches)
            if len(ids) > len(old):
                self.node_source.stream({f: nodes[f][len(old):] for f in NODE_FIELDS})
        else:
            self.node_source.data = nodes
        self._ids = list(ids)
        self._fit(nodes)
        for kind, cols in edges.items():
            src = self.edge_sources[kind]
            have = len(src.data["x0"])
            if len(cols["x0"]) >= have and all(cols[f][:have] == list(src.data[f]) for f in EDGE_FIELDS) and have:
                if len(cols["x0"]) > have:
                    src.stream({f: cols[f][have:] for f in EDGE_FIELDS})
            elif cols["x0"] or have:
                src.data = cols

    def _fit(self, nodes: dict[str, list[Any]]) -> None:
        """Height from the rows, ranges around the nodes and their labels (only when they change)."""
        xs, ys = nodes["x"], nodes["y"]
        bounds = (min(xs), max(xs), min(ys), max(ys)) if xs else (0.0, 0.0, 0.0, 0.0)
        if bounds == self._bounds:
            return
        self._bounds = bounds
        x0, x1, y0, y1 = bounds
        rows = int(y1 - y0) + 1
        height = max(MIN_HEIGHT, min(MAX_HEIGHT, 110 + ROW_PX * rows))
        if self.plot.height != height:
            self.plot.height = height
        for rng, start, end in ((self.plot.x_range, x0 - 0.6, x1 + LABEL_ROOM),
                                (self.plot.y_range, y0 - 0.7, y1 + 0.7)):
            rng.update(start=start, end=end, reset_start=start, reset_end=end)
        # Labels overlap below ~11 px a row: hide them (hover and click still tell).
        self.labels.visible = (height - 110) / rows >= 11

    def selected_id(self) -> str | None:
        idx = self.node_source.selected.indices
        if not idx or idx[0] >= len(self._ids):
            return None
        return self._ids[idx[0]]


def lineage_link(links: Any, object_id: str | None, text: str) -> str:
    """A link to the lineage page of ``object_id`` ("" without one or without links)."""
    if not object_id or links is None:
        return ""
    href = links("lineage", {"object": object_id})
    if not href:
        return ""
    return (f"<div style='font-family:sans-serif;font-size:12px;margin-top:4px'><a class='lumos-lineage-link' "
            f"href='{esc(href)}'>{esc(text)}</a></div>")


def describe(source: Any, node_id: str, links: Any = None) -> str:
    """Escaped HTML details of a graph node: a task, an object or a function group;
    with ``links``, a link to the lineage of the task's (or the object's) value."""
    if node_id.startswith("group:"):
        key = node_id[6:]
        members = [t for t in source.tasks.values() if (t.function_name or t.name) == key]
        states: dict[str, int] = {}
        for t in members:
            states[t.state] = states.get(t.state, 0) + 1
        failed = next((t for t in members if t.state == TaskState.FAILED), None)
        rows: list[tuple[str, Any]] = [("function", key), ("tasks", len(members)),
                                       ("states", ", ".join(f"{n} {s}" for s, n in sorted(states.items())))]
        if failed is not None:
            rows.append(("a failure", failed.error))
        last = next((t for t in reversed(members) if t.returns), None)
        return details_table(f"group {key}", rows) + lineage_link(
            links, last.returns[0] if last else None, f"lineage of the latest {key} result")
    task = source.tasks.get(node_id)
    if task is not None:
        rows = [(k, v) for k, v in task.as_dict().items() if v not in (None, [], {}, "")]
        return details_table(f"task {task.name}", rows) + lineage_link(
            links, task.returns[0] if task.returns else None, f"lineage of {task.name}'s result")
    producer = source.producer.get(node_id)
    rows = [("object id", node_id), ("produced by", producer or "put() or an earlier job")]
    if producer and producer in source.tasks:
        t = source.tasks[producer]
        rows += [("producer name", t.name), ("producer state", t.state)]
    consumers = [t.name for t in source.tasks.values() if node_id in t.args][:20]
    if consumers:
        rows.append(("consumed by", ", ".join(consumers)))
    return details_table("object", rows) + lineage_link(links, node_id if producer else None,
                                                        "lineage of this object")


class TaskGraphPage(Page):
    name = "graph"

    def layout(self) -> Any:
        from bokeh.layouts import column
        from bokeh.models import Div
        try:
            threshold = max(1, int(self.args.get("group_threshold", "500")))
        except ValueError:
            threshold = 500
        self.threshold = threshold
        from bokeh.models import RadioButtonGroup
        self.view = GraphView("Task graph", "task_graph", threshold)
        self.mode = RadioButtonGroup(labels=GROUP_MODES, active=0, name="group_mode")
        self.mode.on_change("active", lambda attr, old, new: self.update())
        self.legend = Div(text="", name="legend")
        self.details = Div(text="<i style='font-family:sans-serif;font-size:12px'>click a node for details</i>",
                           name="details")
        self.view.node_source.selected.on_change("indices", lambda attr, old, new: self._select())
        return column(self.mode, self.legend, self.view.plot, self.details, sizing_mode="stretch_width")

    def _select(self) -> None:
        node_id = self.view.selected_id()
        if node_id is not None:
            self.details.text = describe(self.source, node_id, self.links)

    def update(self) -> None:
        src = self.source
        grouped = (None, False, True)[self.mode.active or 0]
        self.view.show(src.tasks.values(), src.producer, grouped)
        self.legend.text = legend_html(self.view.layout_engine.grouped, len(src.tasks), self.threshold)
        self._select()
