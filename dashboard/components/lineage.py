"""Lineage: for one object id, the tasks that produced it, transitively.

Tasks that ran again (a retry, or lineage reconstruction after their object was lost)
are outlined and their attempt count shown. The object id comes from the page's
``object`` query argument or the text box.
"""

from __future__ import annotations

import re
from typing import Any

from lumos.dashboard.components.common import Page, esc
from lumos.dashboard.components.task_graph import GraphView, describe, legend_html

_HEX = re.compile(r"^[0-9a-f]{8,128}$")


class LineagePage(Page):
    name = "lineage"

    def layout(self) -> Any:
        from bokeh.layouts import column
        from bokeh.models import Div, TextInput
        self.object_id = self.args.get("object", "").strip().lower()
        self.input = TextInput(title="Object id (hex)", value=self.object_id, name="object_input",
                               sizing_mode="stretch_width")
        self.input.on_change("value", lambda attr, old, new: self._set_object(new))
        self.view = GraphView("Lineage", "lineage_graph", 10_000)
        self.info = Div(text="", name="lineage_info")
        self.details = Div(text="", name="details")
        self.legend = Div(text=legend_html(False, 0, 0), name="legend")
        self.view.node_source.selected.on_change("indices", lambda attr, old, new: self._select())
        return column(self.input, self.info, self.legend, self.view.plot, self.details, sizing_mode="stretch_width")

    def _set_object(self, value: str) -> None:
        from lumos.dashboard.graph_layout import GraphLayout
        self.object_id = value.strip().lower()
        self.view.layout_engine = GraphLayout(10_000)  # a new object: a fresh layout
        self.update()

    def _select(self) -> None:
        node_id = self.view.selected_id()
        if node_id is not None:
            self.details.text = describe(self.source, node_id)

    def update(self) -> None:
        oid = self.object_id
        if not oid:
            self.info.text = ("<div style='font-family:sans-serif'>Enter an object id (hex, as in "
                              "<code>ref.hex()</code>) to see the tasks that produced it.</div>")
            self.view.show([], {}, grouped=False)
            return
        if not _HEX.match(oid):
            self.info.text = f"<div style='font-family:sans-serif;color:#d7191c'>not an object id: {esc(oid)}</div>"
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
