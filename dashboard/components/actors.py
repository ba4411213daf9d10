"""Actors page: state, class, node, pid, restarts and pending calls of every actor."""

from __future__ import annotations

from typing import Any

from lumos.dashboard.components.common import Page, set_table_data, short
from lumos.dashboard.source import TERMINAL_STATES
from lumos.state import TaskKind, TaskState

COLUMNS = [("actor_id", "Actor"), ("class_name", "Class"), ("name", "Name"), ("state", "State"),
           ("node", "Node"), ("pid", "PID"), ("restarts", "Restarts"), ("pending", "Pending calls"),
           ("death_cause", "Death cause")]


class ActorsPage(Page):
    name = "actors"

    def layout(self) -> Any:
        from bokeh.layouts import column
        from bokeh.models import ColumnDataSource, DataTable, Div, TableColumn
        self.table_source = ColumnDataSource({k: [] for k, _ in COLUMNS})
        self.table = DataTable(source=self.table_source, columns=[TableColumn(field=k, title=t) for k, t in COLUMNS],
                               index_position=None, height=400, sizing_mode="stretch_width", name="actors_table")
        self.summary = Div(text="", name="summary")
        return column(self.summary, self.table, sizing_mode="stretch_width")

    def rows(self) -> dict[str, list[Any]]:
        src = self.source
        pending: dict[str, int] = {}
        created: dict[str, Any] = {}
        for t in src.tasks.values():
            if not t.actor_id:
                continue
            if t.type == TaskKind.ACTOR_CREATION_TASK.name:
                created[t.actor_id] = t
            elif t.state not in TERMINAL_STATES:
                pending[t.actor_id] = pending.get(t.actor_id, 0) + 1
        data: dict[str, list[Any]] = {k: [] for k, _ in COLUMNS}
        seen = set()
        for actor_id, a in src.actors.items():
            seen.add(actor_id)
            values = (short(actor_id, 12), a.class_name, a.name or "", a.state, short(a.node_id.hex() if a.node_id else ""),
                      a.pid or "", f"{a.num_restarts} / {a.max_restarts}",
                      max(pending.get(actor_id, 0), getattr(a, "pending_calls", 0)), a.death_cause or "")
            for (k, _), v in zip(COLUMNS, values):
                data[k].append(v)
        # Without a GCS actor table (or before its first row arrives), the task log still knows them.
        for actor_id, t in created.items():
            if actor_id in seen:
                continue
            state = {TaskState.FINISHED: "ALIVE", TaskState.FAILED: "DEAD"}.get(t.state, "PENDING_CREATION")
            w = src.workers.get(t.worker_id or "")
            values = (short(actor_id, 12), t.function_name or t.name, "", state, short(t.node_id),
                      w.pid if w else "", f"{t.retries}", pending.get(actor_id, 0), t.error or "")
            for (k, _), v in zip(COLUMNS, values):
                data[k].append(v)
        return data

    def update(self) -> None:
        data = self.rows()
        set_table_data(self.table, data)
        by_state: dict[str, int] = {}
        for s in data["state"]:
            by_state[s] = by_state.get(s, 0) + 1
        text = " · ".join(f"{n} {s}" for s, n in sorted(by_state.items())) or "no actors yet"
        self.summary.text = f"<div style='font-family:sans-serif'><b>{len(data['state'])}</b> actor(s): {text}</div>"
