"""Status page: every node with CPU, GPU, memory and object-store use and totals."""

from __future__ import annotations

from typing import Any

from lumos.dashboard.components.common import Page, esc, fmt_amount, fmt_bytes, short

COLUMNS = [("node", "Node"), ("host", "Host"), ("state", "State"), ("cpu", "CPU used / total"),
           ("gpu", "GPU used / total"), ("memory", "Memory used / total"),
           ("store", "Object store used / total"), ("workers", "Workers"), ("queue", "Queued leases")]


class StatusPage(Page):
    name = "status"

    def layout(self) -> Any:
        from bokeh.layouts import column
        from bokeh.models import ColumnDataSource, DataTable, Div, TableColumn
        from bokeh.plotting import figure
        self.table_source = ColumnDataSource({k: [] for k, _ in COLUMNS})
        self.table = DataTable(source=self.table_source, columns=[TableColumn(field=k, title=t) for k, t in COLUMNS],
                               index_position=None, height=160, sizing_mode="stretch_width", name="nodes_table")
        self.use_source = ColumnDataSource({"resource": [], "used": [], "label": []})
        self.use_plot = figure(y_range=[], x_range=(0, 100), height=220, title="Cluster use (%)",
                               toolbar_location=None, sizing_mode="stretch_width", name="use_plot")
        self.use_plot.hbar(y="resource", right="used", height=0.6, source=self.use_source, color="#2b83ba")
        self.summary = Div(text="", name="summary")
        return column(self.summary, self.table, self.use_plot, sizing_mode="stretch_width")

    def update(self) -> None:
        src = self.source
        data: dict[str, list[Any]] = {k: [] for k, _ in COLUMNS}
        totals: dict[str, list[float]] = {}
        for node_id, info in src.nodes.items():
            st = src.status.get(node_id)
            total = dict(info.resources_total)
            avail = dict(st.available) if st and info.state == "ALIVE" else dict(total)
            def used(name: str) -> tuple[float, float]:
                return total.get(name, 0.0) - avail.get(name, total.get(name, 0.0)), total.get(name, 0.0)
            cpu, gpu, mem = used("CPU"), used("GPU"), used("memory")
            store_used = st.store_used_bytes if st else 0
            store_cap = info.object_store_bytes
            data["node"].append(short(node_id) + (" (head)" if info.is_head else ""))
            data["host"].append(info.hostname)
            data["state"].append(info.state + (f": {info.death_reason}" if info.death_reason else ""))
            data["cpu"].append(f"{fmt_amount(cpu[0])} / {fmt_amount(cpu[1])}")
            data["gpu"].append(f"{fmt_amount(gpu[0])} / {fmt_amount(gpu[1])}")
            data["memory"].append(f"{fmt_bytes(mem[0])} / {fmt_bytes(mem[1])}")
            data["store"].append(f"{fmt_bytes(store_used)} / {fmt_bytes(store_cap)}")
            data["workers"].append(st.num_workers if st else 0)
            data["queue"].append(st.queue_length if st else 0)
            if info.state == "ALIVE":
                for key, (u, t) in (("CPU", cpu), ("GPU", gpu), ("memory", mem),
                                    ("object store", (store_used, store_cap))):
                    acc = totals.setdefault(key, [0.0, 0.0])
                    acc[0] += u
                    acc[1] += t
        self.table_source.data = data
        names = [k for k, (u, t) in totals.items() if t > 0]
        self.use_plot.y_range.factors = names
        self.use_source.data = {"resource": names, "used": [100.0 * totals[k][0] / totals[k][1] for k in names],
                                "label": names}
        alive = sum(1 for n in src.nodes.values() if n.state == "ALIVE")
        jobs = sum(1 for j in src.jobs.values() if j.state == "RUNNING")
        workers = sum(1 for w in src.workers.values() if w.state == "ALIVE" and not w.is_driver)
        counts = src.counts_by_state()
        states = " · ".join(f"{esc(s)} {n}" for s, n in sorted(counts.items()))
        self.summary.text = (f"<div style='font-family:sans-serif'><b>{alive}</b> node(s) alive · <b>{jobs}</b> "
                             f"running job(s) · <b>{workers}</b> worker(s) · tasks: {states or 'none'}</div>")
