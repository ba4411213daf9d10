"""GPUs page: per node, each GPU and the task, actor or placement-group bundle holding it.

Holders come from the GCS only: running tasks and alive actors whose resources include
GPUs, and placed placement-group bundles that reserve GPUs (one row per GPU; tasks and
actors running in a bundle have rows of their own too). GPU indices are shown when the
lease's ids reached the task log (``resource_ids``) or the raylet named the bundle's
(``PlacementGroupInfo.bundle_gpu_ids``); otherwise the holder is listed with its amount
and "?" as index.
"""

from __future__ import annotations

from typing import Any

from lumos.dashboard.components.common import Page, fmt_amount, set_table_data, short
from lumos.state import TaskKind, TaskState

COLUMNS = [("node", "Node"), ("gpu", "GPU"), ("holder_kind", "Held by"), ("holder", "Name"),
           ("holder_id", "Id"), ("amount", "Amount"), ("worker", "Worker")]


class GpusPage(Page):
    name = "gpus"

    def layout(self) -> Any:
        from bokeh.layouts import column
        from bokeh.models import ColumnDataSource, DataTable, Div, TableColumn
        self.table_source = ColumnDataSource({k: [] for k, _ in COLUMNS})
        self.table = DataTable(source=self.table_source, columns=[TableColumn(field=k, title=t) for k, t in COLUMNS],
                               index_position=None, height=360, sizing_mode="stretch_width", name="gpus_table")
        self.summary = Div(text="", name="summary")
        return column(self.summary, self.table, sizing_mode="stretch_width")

    def rows(self) -> dict[str, list[Any]]:
        src = self.source
        data: dict[str, list[Any]] = {k: [] for k, _ in COLUMNS}

        def add(*values: Any) -> None:
            for (k, _), v in zip(COLUMNS, values):
                data[k].append(v)

        holders: dict[str, list[tuple[str, str, str, float, Any, str]]] = {}
        for pg_id, g in src.placement_groups.items():
            for i, (bundle, node) in enumerate(zip(g.bundles, g.bundle_nodes)):
                amount = bundle.get("GPU", 0)
                if not amount or node is None:
                    continue
                name = f"pg {pg_id[:8]}{f' ({g.name})' if g.name else ''} bundle {i}"
                ids = g.bundle_gpu_ids[i] if i < len(g.bundle_gpu_ids) else []
                # One row per GPU it reserves; ids unknown (an older GCS): one row with index "?".
                for gid in ids or [None]:
                    each = amount / len(ids) if ids else amount
                    holders.setdefault(node.hex(), []).append(
                        ("bundle", name, pg_id, each, {"GPU": [[gid, each]]} if gid is not None else None, ""))
        actor_tasks = {}
        for t in src.tasks.values():
            gpus = (t.resources or {}).get("GPU", 0)
            if not gpus or not t.node_id:
                continue
            if t.type == TaskKind.ACTOR_CREATION_TASK.name:
                actor_tasks[t.actor_id] = t
                continue
            if t.state == TaskState.RUNNING:
                holders.setdefault(t.node_id, []).append(
                    ("task", t.name, t.task_id, gpus, t.resource_ids, src.worker_label(t.worker_id)))
        for actor_id, t in actor_tasks.items():
            a = src.actors.get(actor_id or "")
            alive = (a.state == "ALIVE") if a is not None else t.state == TaskState.FINISHED
            if alive:
                holders.setdefault(t.node_id or "", []).append(
                    ("actor", (a.class_name if a is not None else t.function_name) or t.name, actor_id or "",
                     t.resources.get("GPU", 0), t.resource_ids, src.worker_label(t.worker_id)))
        for node_id, info in src.nodes.items():
            total = info.resources_total.get("GPU", 0)
            if not total and node_id not in holders:
                continue
            used_ids: set[int] = set()
            for kind, name, hid, amount, ids, worker in holders.get(node_id, []):
                gpu_ids = [int(i) for i, _frac in (ids or {}).get("GPU", [])]
                used_ids.update(gpu_ids)
                add(short(node_id), ", ".join(map(str, gpu_ids)) if gpu_ids else "?", kind, name,
                    short(hid, 12), fmt_amount(amount), worker)
            for i in range(int(total)):
                if i not in used_ids and not (holders.get(node_id) and not used_ids):
                    add(short(node_id), str(i), "free", "", "", "", "")
        return data

    def update(self) -> None:
        data = self.rows()
        set_table_data(self.table, data)
        src = self.source
        total = sum(n.resources_total.get("GPU", 0) for n in src.nodes.values() if n.state == "ALIVE")
        avail = sum(s.available.get("GPU", 0) for s in src.status.values())
        if not total:
            text = "no GPUs in this cluster (nodes declare them with num_gpus, or they are detected with nvidia-smi)"
        else:
            text = f"<b>{fmt_amount(total - avail)}</b> of <b>{fmt_amount(total)}</b> GPU(s) in use"
        self.summary.text = f"<div style='font-family:sans-serif'>{text}</div>"
