"""Lineage: for one object, the tasks that produced it, transitively.

Tasks that ran again (a retry, or lineage reconstruction after their object was lost)
are outlined and their attempt count shown. The object comes from the page's
``object`` query argument (the task graph's details link here), or from the search
box: an object id (hex), or part of a task name, which lists the matching tasks;
clicking one shows the lineage of its result. Clicking an object in the graph offers
its own lineage.
"""

from __future__ import annotations

import re
from typing import Any

from lumos.dashboard.components.common import Page, esc, short
from lumos.dashboard.components.task_graph import GraphView, describe, legend_html

_HEX = re.compile(r"^[0-9a-f]{8,128}$")
#: Tasks listed for a name search, newest first.
MAX_MATCHES = 50
MATCH_COLUMNS = [("name", "Task"), ("state", "State"), ("task", "Task id"), ("object", "Result object")]


class LineagePage(Page):
    name = "lineage"

    def layout(self) -> Any:
        from bokeh.layouts import column
        from bokeh.models import ColumnDataSource, DataTable, Div, TableColumn, TextInput
        self.object_id = self.args.get("object", "").strip().lower()
        self.query = self.object_id
        self.input = TextInput(title="Object id (hex) or task name", value=self.object_id, name="object_input",
                               placeholder="e.g. train_step, or ref.hex()", sizing_mode="stretch_width")
        self.input.on_change("value", lambda attr, old, new: self._search(new))
        self.match_source = ColumnDataSource({k: [] for k, _ in MATCH_COLUMNS} | {"oid": []})
        self.matches = DataTable(source=self.match_source, name="lineage_matches", index_position=None,
                                 columns=[TableColumn(field=k, title=t) for k, t in MATCH_COLUMNS],
                                 height=150, sizing_mode="stretch_width", visible=False)
        self.match_source.selected.on_change("indices", lambda attr, old, new: self._pick(new))
        self.view = GraphView("Lineage", "lineage_graph", 10_000)
        self.info = Div(text="", name="lineage_info")
        self.details = Div(text="", name="details")
        self.legend = Div(text=legend_html(False, None, 0), name="legend")
        self.view.node_source.selected.on_change("indices", lambda attr, old, new: self._select())
        return column(self.input, self.matches, self.info, self.legend, self.view.plot, self.details,
                      sizing_mode="stretch_width")

    # ------------------------------------------------------------------ choosing the object

    def _search(self, value: str) -> None:
        self.query = value.strip()
        if _HEX.match(self.query.lower()) and self._is_object(self.query.lower()):
            self._set_object(self.query.lower())
        else:
            self._set_object("")
        self.update()

    def _is_object(self, oid: str) -> bool:
        src = self.source
        return oid in src.producer or not any(self.query.lower() in (t.name or "").lower()
                                              for t in src.tasks.values())

    def _pick(self, indices: list[int]) -> None:
        oids = self.match_source.data["oid"]
        if indices and indices[0] < len(oids) and oids[indices[0]]:
            self._set_object(oids[indices[0]])
            self.update()

    def _set_object(self, oid: str) -> None:
        from lumos.dashboard.graph_layout import GraphLayout
        if oid != self.object_id:
            self.object_id = oid
            self.view.layout_engine = GraphLayout(10_000)  # a new object: a fresh layout

    def _match_rows(self) -> dict[str, list[Any]]:
        q = self.query.lower()
        data: dict[str, list[Any]] = {k: [] for k, _ in MATCH_COLUMNS} | {"oid": []}
        if not q or _HEX.match(q) and q in self.source.producer:
            return data
        found = [t for t in reversed(list(self.source.tasks.values()))
                 if t.returns and q in (t.name or "").lower()][:MAX_MATCHES]
        for t in found:
            for k, v in (("name", t.name), ("state", t.state), ("task", short(t.task_id, 12)),
                         ("object", short(t.returns[0], 16)), ("oid", t.returns[0])):
                data[k].append(v)
        return data

    # ------------------------------------------------------------------ drawing

    def _select(self) -> None:
        node_id = self.view.selected_id()
        if node_id is not None:
            self.details.text = describe(self.source, node_id, self.links)

    def update(self) -> None:
        rows = self._match_rows()
        if rows["oid"] != list(self.match_source.data["oid"]):
            self.match_source.selected.indices = []
            self.match_source.data = rows
            self.matches.height = 30 + 26 * min(max(len(rows["oid"]), 1), 5)
        self.matches.visible = bool(rows["oid"]) or (bool(self.query) and not self.object_id)
        oid = self.object_id
        if not oid:
            if self.query and not rows["oid"]:
                self.info.text = (f"<div style='font-family:sans-serif'>No task named like {esc(self.query)} "
                                  "returned an object yet.</div>")
            elif self.query:
                self.info.text = (f"<div style='font-family:sans-serif'>{len(rows['oid'])} task(s) match "
                                  f"{esc(self.query)}: click one to see the lineage of its result.</div>")
            else:
                self.info.text = ("<div style='font-family:sans-serif'>Type a task name (or an object id, as in "
                                  "<code>ref.hex()</code>) to see the tasks that produced its result; or click "
                                  "a task in the Task graph.</div>")
            self.view.show([], {}, grouped=False)
            return
        tasks = self.source.lineage(oid)
        tasks.sort(key=lambda t: t.first_seen)
        if not tasks:
            self.info.text = (f"<div style='font-family:sans-serif'>No task in the log produced {esc(oid)} "
                              f"(a <code>put()</code> object, or not submitted yet).</div>")
        else:
            reran = sum(1 for t in tasks if t.reran)
            self.info.text = (f"<div class='lumos-lineage-info' style='font-family:sans-serif'>Object {esc(oid[:16])}…: "
                              f"{len(tasks)} task(s) in its lineage, {reran} ran again.</div>")
        self.view.show(tasks, self.source.producer, grouped=False)
        self._select()
