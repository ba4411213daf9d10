"""Status page, the one people leave open: totals, one row and one bar per node, history
of the last minutes, recent failures and log tails.

- Summary and node table: each node's labels, CPU/GPU reserved by tasks, memory
  reserved *and* really in use (the machine's memory and the RSS of the node's lumos
  processes, as each raylet reports them in its heartbeats: ``host.reported_usage``; read
  locally only for a node that does not report), object store, workers (one count
  everywhere: the GCS worker table, drivers left out), queued leases.
- Per-node bars (Dask's style): CPU reserved, memory in use, object store, in percent.
- History (sampled once a second while the page is open, ``HISTORY_S`` kept): CPU
  reserved, host CPU load, memory in use, object store (percent), and tasks finished
  per second.
- Recent failed tasks with the last line of their error (``MAX_FAILED``, newest first).
- Object spilling per node (``lumos.state`` spill stats, read every couple of seconds
  while the page is open): objects and bytes spilled and restored, copy throughput, what
  is on disk now, and an out-of-disk episode.
- Application metrics (``lumos.util.metrics``, read every couple of seconds while the
  page is open): one row per metric and tag set, a counter's total, a gauge's value, a
  histogram's count, mean and the buckets its median and 99th percentile fall in.
- The log tail of a node's raylet or one of its workers, chosen in a drop-down (escaped),
  for any node: the GCS asks that node's raylet (``ClusterSource.request_log``).
"""

from __future__ import annotations

import time
from typing import Any

from lumos.dashboard import host
from lumos.dashboard.components.common import Page, esc, fmt_amount, fmt_bytes, set_table_data, short
from lumos.state import TaskState, labels_text

COLUMNS = [("node", "Node"), ("host", "Host"), ("labels", "Labels"), ("state", "State"),
           ("cpu", "CPU reserved / total"), ("gpu", "GPU reserved / total"), ("memory", "Memory reserved / total"),
           ("memory_real", "Memory in use (host)"), ("store", "Object store used / total"), ("workers", "Workers"),
           ("queue", "Queued leases")]
SPILL_COLUMNS = [("node", "Node"), ("spilled", "Spilled"), ("restored", "Restored"), ("spill_rate", "Spill MiB/s"),
                 ("restore_rate", "Restore MiB/s"), ("on_disk", "On disk now"), ("disk", "Spill disk")]
METRIC_COLUMNS = [("metric", "Metric"), ("kind", "Kind"), ("tags", "Tags"), ("value", "Value")]
#: Metric rows shown (the series of the first metrics by name); the rest are counted.
MAX_METRIC_ROWS = 200
FAILED_COLUMNS = [("time", "Ended"), ("name", "Task"), ("task", "Task id"), ("node", "Node"), ("error", "Error")]
BAR_KINDS = (("cpu", "CPU reserved (%)"), ("memory", "Memory in use (%)"), ("store", "Object store (%)"))
HISTORY_FIELDS = ("t", "cpu", "load", "memory", "store", "rate")
#: Seconds of history kept (one sample a second).
HISTORY_S = 600
SAMPLE_S = 1.0
MAX_FAILED = 20
TAIL_LINES = 40


def last_line(text: str | None) -> str:
    lines = [ln.strip() for ln in (text or "").strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def metric_value(kind: str, series: dict[str, Any]) -> str:
    """One series of ``lumos.state.metrics()`` as the metrics table shows it."""
    if kind != "histogram":
        return f"{series['value']:.6g}"
    count = series["count"]
    if not count:
        return "0 observed"

    def bucket_of(q: float) -> str:
        for bound, below in series["buckets"]:
            if below >= q * count:
                return f"<= {bound:.4g}" if bound != float("inf") else f"> {series['buckets'][-2][0]:.4g}"
        return "?"
    return (f"{count} observed, mean {series['sum'] / count:.4g}, median {bucket_of(0.5)}, "
            f"p99 {bucket_of(0.99)}")


class StatusPage(Page):
    name = "status"

    def layout(self) -> Any:
        from bokeh.layouts import column, row
        from bokeh.models import (ColumnDataSource, DataTable, Div, FactorRange, HoverTool, Range1d, Select,
                                  TableColumn)
        from bokeh.plotting import figure
        self.table_source = ColumnDataSource({k: [] for k, _ in COLUMNS})
        self.table = DataTable(source=self.table_source, columns=[TableColumn(field=k, title=t) for k, t in COLUMNS],
                               index_position=None, height=90, sizing_mode="stretch_width", name="nodes_table")
        self.summary = Div(text="", name="summary")
        # Per-node bars.
        self.bar_source = ColumnDataSource({"node": [], **{k: [] for k, _ in BAR_KINDS},
                                            **{f"{k}_text": [] for k, _ in BAR_KINDS}})
        self.bar_range = FactorRange(factors=[])
        self.bars = []
        for kind, title in BAR_KINDS:
            fig = figure(y_range=self.bar_range, x_range=Range1d(0, 100), height=120, title=title,
                         toolbar_location=None, sizing_mode="stretch_width", name=f"{kind}_bars")
            fig.hbar(y="node", right=kind, height=0.7, source=self.bar_source, color="#2b83ba", name=f"{kind}_bar")
            fig.add_tools(HoverTool(tooltips=[("node", "@node"), (title, f"@{kind}_text")]))
            self.bars.append(fig)
        # History.
        self.history_source = ColumnDataSource({f: [] for f in HISTORY_FIELDS})
        self.use_plot = figure(x_axis_type="datetime", y_range=Range1d(0, 105), height=200, name="history_use",
                               title="Use over the last minutes (%)", tools="xpan,xwheel_zoom,reset",
                               sizing_mode="stretch_width")
        for field, color, label in (("cpu", "#2b83ba", "CPU reserved"), ("load", "#abdda4", "CPU load (host)"),
                                    ("memory", "#d7191c", "memory in use"), ("store", "#fdae61", "object store")):
            self.use_plot.line(x="t", y=field, source=self.history_source, color=color, line_width=2,
                               legend_label=label, name=f"history_{field}")
        self.use_plot.legend.location = "top_left"
        self.use_plot.legend.label_text_font_size = "10px"
        self.rate_plot = figure(x_axis_type="datetime", height=200, name="history_rate", title="Tasks finished / s",
                                tools="xpan,xwheel_zoom,reset", sizing_mode="stretch_width",
                                x_range=self.use_plot.x_range)
        self.rate_plot.line(x="t", y="rate", source=self.history_source, color="#1a9641", line_width=2,
                            name="history_tasks")
        # Failures and logs.
        self.failed_source = ColumnDataSource({k: [] for k, _ in FAILED_COLUMNS})
        self.failed = DataTable(source=self.failed_source, name="failed_table", index_position=None, height=90,
                                columns=[TableColumn(field=k, title=t, width=w) for (k, t), w in
                                         zip(FAILED_COLUMNS, (70, 140, 110, 80, 600))],
                                sizing_mode="stretch_width")
        self.failed_title = Div(text="", name="failed_title")
        self.spill_title = Div(text="", name="spill_title")
        self.spill_source = ColumnDataSource({k: [] for k, _ in SPILL_COLUMNS})
        self.spill_table = DataTable(source=self.spill_source, name="spill_table", index_position=None, height=56,
                                     columns=[TableColumn(field=k, title=t) for k, t in SPILL_COLUMNS],
                                     sizing_mode="stretch_width")
        self.metrics_title = Div(text="", name="metrics_title")
        self.metrics_source = ColumnDataSource({k: [] for k, _ in METRIC_COLUMNS})
        self.metrics_table = DataTable(source=self.metrics_source, name="metrics_table", index_position=None,
                                       height=56, sizing_mode="stretch_width",
                                       columns=[TableColumn(field=k, title=t, width=w) for (k, t), w in
                                                zip(METRIC_COLUMNS, (220, 80, 260, 440))])
        self.log_select = Select(title="Log", options=[], value="", name="log_select", width=360)
        self.log_select.on_change("value", lambda attr, old, new: self._show_log())
        self.log_tail = Div(text="", name="log_tail", sizing_mode="stretch_width")
        self._last_sample = 0.0
        self._sample_tick = -1
        self._last_log = 0.0
        #: The log tail on show: its key in ``source.logs`` and when it was fetched.
        self._log_key: tuple[str, str, str, int] | None = None
        self._log_shown_at = -1.0
        self._usage: dict[str, host.NodeUsage | None] = {}
        return column(self.summary, self.table, row(*self.bars, sizing_mode="stretch_width"),
                      row(self.use_plot, self.rate_plot, sizing_mode="stretch_width"),
                      self.spill_title, self.spill_table, self.metrics_title, self.metrics_table, self.failed_title,
                      self.failed, self.log_select, self.log_tail, sizing_mode="stretch_width")

    # ------------------------------------------------------------------ one refresh

    def update(self) -> None:
        now = time.time()
        sample = now - self._last_sample >= SAMPLE_S
        if sample or not self._usage:
            self._read_usage()
        totals = self._nodes()
        if sample:
            self._sample(now, totals)
        self._failures()
        self.source.request_spill()
        self._spill()
        self.source.request_metrics()
        self._metrics()
        if now - self._last_log >= SAMPLE_S:
            self._log_options()
            self._show_log()
        self._render_log()

    def _workers_by_node(self) -> dict[str, list[Any]]:
        """Alive workers per node, drivers left out (the one count used on this page)."""
        out: dict[str, list[Any]] = {}
        for w in self.source.workers.values():
            if w.state == "ALIVE" and not w.is_driver:
                out.setdefault(w.node_id.hex(), []).append(w)
        return out

    def _read_usage(self) -> None:
        workers = self._workers_by_node()
        usage: dict[str, host.NodeUsage | None] = {}
        for node_id, info in self.source.nodes.items():
            if info.state != "ALIVE":
                usage[node_id] = None
                continue
            # The raylet's report (any machine); a local read only for a node that sent none.
            usage[node_id] = (host.reported_usage(self.source.status.get(node_id))
                              or host.node_usage(info, [w.pid for w in workers.get(node_id, [])]))
        self._usage = usage

    def _nodes(self) -> dict[str, list[float]]:
        src = self.source
        data: dict[str, list[Any]] = {k: [] for k, _ in COLUMNS}
        bars: dict[str, list[Any]] = {k: [] for k in self.bar_source.data}
        totals: dict[str, list[float]] = {}
        workers = self._workers_by_node()
        for node_id, info in src.nodes.items():
            st = src.status.get(node_id)
            total = dict(info.resources_total)
            avail = dict(st.available) if st and info.state == "ALIVE" else dict(total)

            def used(name: str) -> tuple[float, float]:
                return total.get(name, 0.0) - avail.get(name, total.get(name, 0.0)), total.get(name, 0.0)
            cpu, gpu, mem = used("CPU"), used("GPU"), used("memory")
            store_used = st.store_used_bytes if st else 0
            store_cap = info.object_store_bytes
            usage = self._usage.get(node_id)
            label = short(node_id) + (" (head)" if info.is_head else "")
            data["node"].append(label)
            data["host"].append(info.hostname)
            data["labels"].append(labels_text(info.labels))  # (what label selectors match)
            data["state"].append(info.state + (f": {info.death_reason}" if info.death_reason else ""))
            data["cpu"].append(f"{fmt_amount(cpu[0])} / {fmt_amount(cpu[1])}")
            data["gpu"].append(f"{fmt_amount(gpu[0])} / {fmt_amount(gpu[1])}")
            data["memory"].append(f"{fmt_bytes(mem[0])} / {fmt_bytes(mem[1])}")
            data["memory_real"].append(
                f"{fmt_bytes(usage.memory_used_bytes)} / {fmt_bytes(usage.memory_total_bytes)} "
                f"(lumos {fmt_bytes(usage.lumos_rss_bytes)})" if usage else
                ("not reported yet" if info.state == "ALIVE" else ""))
            data["store"].append(f"{fmt_bytes(store_used)} / {fmt_bytes(store_cap)}")
            data["workers"].append(len(workers.get(node_id, [])) if info.state == "ALIVE" else 0)
            data["queue"].append(st.queue_length if st else 0)
            if info.state != "ALIVE":
                continue
            mem_pct = 100.0 * usage.memory_used_bytes / usage.memory_total_bytes if usage else None
            pct = {"cpu": 100.0 * cpu[0] / cpu[1] if cpu[1] else 0.0,
                   "memory": mem_pct if mem_pct is not None else (100.0 * mem[0] / mem[1] if mem[1] else 0.0),
                   "store": 100.0 * store_used / store_cap if store_cap else 0.0}
            text = {"cpu": f"{fmt_amount(cpu[0])} of {fmt_amount(cpu[1])} CPUs reserved",
                    "memory": data["memory_real"][-1] if usage else f"{fmt_bytes(mem[0])} reserved",
                    "store": data["store"][-1]}
            bars["node"].append(label)
            for k, _ in BAR_KINDS:
                bars[k].append(pct[k])
                bars[f"{k}_text"].append(f"{pct[k]:.0f}% · {text[k]}")
            for key, (u, t) in (("CPU", cpu), ("GPU", gpu), ("object store", (store_used, store_cap))):
                acc = totals.setdefault(key, [0.0, 0.0])
                acc[0] += u
                acc[1] += t
            if usage:
                acc = totals.setdefault("memory in use", [0.0, 0.0])
                acc[0] += usage.memory_used_bytes
                acc[1] += usage.memory_total_bytes
        set_table_data(self.table, data)
        self.table.height = 30 + 26 * max(1, len(data["node"]))
        if list(self.bar_range.factors) != bars["node"]:
            self.bar_range.factors = bars["node"]
            for fig in self.bars:
                fig.height = 60 + 26 * max(1, len(bars["node"]))
        self.bar_source.data = bars
        alive = len(bars["node"])
        jobs = sum(1 for j in src.jobs.values() if j.state == "RUNNING")
        n_workers = sum(data["workers"])
        counts = src.counts_by_state()
        states = " · ".join(f"{esc(s)} {n}" for s, n in sorted(counts.items()))
        use = " · ".join(f"{esc(k)} {100.0 * u / t:.0f}%" for k, (u, t) in totals.items() if t > 0)
        self.summary.text = (f"<div class='lumos-summary' style='font-family:sans-serif'><b>{alive}</b> node(s) "
                             f"alive · <b>{jobs}</b> running job(s) · <b class='lumos-workers'>{n_workers}</b> "
                             f"worker(s) · tasks: {states or 'none'}<br><span style='color:#555'>{use}</span></div>")
        return totals

    def _sample(self, now: float, totals: dict[str, list[float]]) -> None:
        src = self.source
        dt = now - self._last_sample if self._last_sample else SAMPLE_S
        changed = src.changes_since(self._sample_tick)
        ids = src.tasks.keys() if changed is None else changed
        since = self._last_sample or now - SAMPLE_S
        done = 0
        for tid in ids:
            t = src.tasks.get(tid)
            if t is not None and t.end_time and since < t.end_time <= now \
                    and t.state in (TaskState.FINISHED, TaskState.FAILED):
                done += 1
        loads = [u.cpu_percent for u in self._usage.values() if u is not None]

        def pct(key: str) -> float:
            u, t = totals.get(key, (0.0, 0.0))
            return 100.0 * u / t if t else 0.0
        self.history_source.stream({"t": [now * 1000.0], "cpu": [pct("CPU")], "load": [loads[0] if loads else 0.0],
                                    "memory": [pct("memory in use")], "store": [pct("object store")],
                                    "rate": [done / dt if dt > 0 else 0.0]}, rollover=int(HISTORY_S / SAMPLE_S))
        self._last_sample = now
        self._sample_tick = src.tick

    def _failures(self) -> None:
        failed = sorted((t for t in self.source.tasks.values() if t.state == TaskState.FAILED),
                        key=lambda t: t.end_time or 0.0, reverse=True)
        data: dict[str, list[Any]] = {k: [] for k, _ in FAILED_COLUMNS}
        for t in failed[:MAX_FAILED]:
            data["time"].append(time.strftime("%H:%M:%S", time.localtime(t.end_time)) if t.end_time else "")
            data["name"].append(t.name)
            data["task"].append(short(t.task_id, 12))
            data["node"].append(short(t.node_id))
            data["error"].append(last_line(t.error))
        if data["task"] != list(self.failed_source.data["task"]):
            set_table_data(self.failed, data)
            self.failed.height = 30 + 26 * max(1, len(data["task"]))
        self.failed_title.text = (f"<div style='font-family:sans-serif;font-weight:bold'>Recent failed tasks "
                                  f"({len(failed)})</div>")

    def _spill(self) -> None:
        src = self.source
        data: dict[str, list[Any]] = {k: [] for k, _ in SPILL_COLUMNS}
        for node_id, info in src.nodes.items():
            row = src.spill.get(node_id)
            if info.state != "ALIVE" or row is None:
                continue
            data["node"].append(short(node_id) + (" (head)" if info.is_head else ""))
            data["spilled"].append(f"{row.get('spilled_objects', 0)} objects, {fmt_bytes(row.get('spilled_bytes', 0))}")
            data["restored"].append(f"{row.get('restored_objects', 0)} objects, "
                                    f"{fmt_bytes(row.get('restored_bytes', 0))}")
            data["spill_rate"].append(f"{row.get('spill_mib_s', 0.0):.0f}")
            data["restore_rate"].append(f"{row.get('restore_mib_s', 0.0):.0f}")
            data["on_disk"].append(fmt_bytes(row.get("disk_bytes", 0)))
            data["disk"].append(f"FULL ({row.get('out_of_disk_rejects', 0)} refused)" if row.get("out_of_disk")
                                else "ok")
        if data != {k: list(v) for k, v in self.spill_source.data.items()}:
            set_table_data(self.spill_table, data)
            self.spill_table.height = 30 + 26 * max(1, len(data["node"]))
        total = sum(r.get("spilled_bytes", 0) for r in src.spill.values())
        self.spill_title.text = (f"<div style='font-family:sans-serif;font-weight:bold'>Object spilling "
                                 f"<span class='lumos-spilled' style='font-weight:normal;color:#555'>"
                                 f"{fmt_bytes(total)} spilled in all</span></div>")

    def _metrics(self) -> None:
        data: dict[str, list[Any]] = {k: [] for k, _ in METRIC_COLUMNS}
        series = 0
        for row in sorted(self.source.metrics, key=lambda r: r["name"]):
            for s in sorted(row["series"], key=lambda s: sorted(s["tags"].items())):
                series += 1
                if len(data["metric"]) >= MAX_METRIC_ROWS:
                    continue
                data["metric"].append(row["name"])
                data["kind"].append(row["kind"])
                data["tags"].append(", ".join(f"{k}={v}" for k, v in s["tags"].items()))
                data["value"].append(metric_value(row["kind"], s))
        if data != {k: list(v) for k, v in self.metrics_source.data.items()}:
            set_table_data(self.metrics_table, data)
            self.metrics_table.height = 30 + 26 * max(1, len(data["metric"]))
        shown = len(data["metric"])
        note = ("none recorded yet: lumos.util.metrics Counter, Gauge, Histogram" if not series else
                f"{series} series" + (f", the first {shown} shown" if shown < series else "")
                + "; as Prometheus text: the head's dashboard at /metrics")
        dropped = self.source.metrics_dropped
        if dropped:
            first = dropped[0]
            note += (f"; records of {len(dropped)} metric(s) refused, e.g. {first['name']} "
                     f"({first['count']}: {first['reason']})")
        self.metrics_title.text = (f"<div style='font-family:sans-serif;font-weight:bold'>Application metrics "
                                   f"<span class='lumos-metrics' style='font-weight:normal;color:#555'>"
                                   f"{esc(note)}</span></div>")

    # ------------------------------------------------------------------ logs

    def _log_options(self) -> None:
        src = self.source
        options: list[tuple[str, str]] = []
        workers = self._workers_by_node()
        for node_id, info in src.nodes.items():
            if info.state != "ALIVE":
                continue
            options.append((f"raylet:{node_id}:{node_id}:log", f"raylet of node {short(node_id)} ({info.hostname})"))
            for w in sorted(workers.get(node_id, []), key=lambda w: w.pid):
                for suffix, what in (("out", "output"), ("log", "log")):
                    options.append((f"worker:{node_id}:{w.worker_id.hex()}:{suffix}",
                                    f"worker pid {w.pid} on node {short(node_id)} ({what})"))
        if options != [tuple(o) for o in self.log_select.options]:
            self.log_select.options = options
            if self.log_select.value not in [v for v, _ in options]:
                self.log_select.value = options[0][0] if options else ""

    def _show_log(self) -> None:
        """Ask for the chosen log's tail (fetched by the source through the GCS)."""
        self._last_log = time.time()
        value = self.log_select.value
        if not value:
            self._log_key = None
            self.log_tail.text = ("<div style='font-family:sans-serif;color:#555'>no alive node: "
                                  "nothing to show</div>")
            return
        kind, node_id, ident, suffix = (value.split(":") + ["", "", "", ""])[:4]
        key = (node_id, ident if kind == "worker" else "", suffix or "log", TAIL_LINES)
        if key != self._log_key:
            self._log_key = key
            self._log_shown_at = -1.0
            self._log_html("", "(loading…)")
        self.source.request_log(key[0], key[1] or None, key[2], key[3])

    def _render_log(self) -> None:
        if self._log_key is None:
            return
        got = self.source.logs.get(self._log_key)
        if got is None or got.fetched_at == self._log_shown_at:
            return
        self._log_shown_at = got.fetched_at
        if got.error:
            self._log_html(got.name, f"(cannot read the log: {got.error})")
        else:
            self._log_html(got.name, got.text or "(empty: nothing logged yet)")

    def _log_html(self, name: str, text: str) -> None:
        self.log_tail.text = (f"<div class='lumos-log-name' style='font-family:sans-serif;font-size:12px;color:#555'>"
                              f"{esc(name)} (last {TAIL_LINES} lines)</div><pre class='lumos-log' style='font-size:11px;max-height:320px;overflow:auto;"
                              f"background:#f7f7f7;padding:6px;white-space:pre-wrap'>{esc(text)}</pre>")
