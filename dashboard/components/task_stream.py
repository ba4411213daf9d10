"""Task stream: one row per worker, one bar per task or actor-call execution.

Finished executions are streamed into a rolling source (only new ones travel to the
browser); running ones sit in a small source replaced on every update, their bars
growing to "now". Bars are coloured by state with the task graph's colours (and its
"ran again" outline), under the same legend; hover shows name, function, id, state, timing.
"""

from __future__ import annotations

import time
from typing import Any

from lumos.dashboard.components.common import Page, esc
from lumos.dashboard.graph_layout import RERUN_COLOR, STATE_COLORS, state_class
from lumos.state import TaskState

#: States that end a bar of the stream.
_ENDED = (TaskState.FINISHED, TaskState.FAILED)

ROLLOVER = 20_000
FIELDS = ("worker", "start", "end", "color", "line_color", "name", "function", "task_id", "state", "duration",
          "node", "type")


class TaskStreamPage(Page):
    name = "tasks"

    def layout(self) -> Any:
        from bokeh.layouts import column
        from bokeh.models import ColumnDataSource, DataRange1d, Div, FactorRange, HoverTool
        from bokeh.plotting import figure

        from lumos.dashboard.components.task_graph import legend_html
        self.done_source = ColumnDataSource({f: [] for f in FIELDS})
        self.running_source = ColumnDataSource({f: [] for f in FIELDS})
        self.plotted: set[str] = set()
        self.y_range = FactorRange(factors=[])
        self.plot = figure(x_axis_type="datetime", y_range=self.y_range, height=420, sizing_mode="stretch_width",
                           title="Task stream (one row per worker)", name="task_stream",
                           x_range=DataRange1d(follow="end", follow_interval=120_000, range_padding=0.02),
                           tools="xpan,xwheel_zoom,reset,save")
        for src, alpha, name in ((self.done_source, 0.9, "done"), (self.running_source, 0.5, "running")):
            self.plot.hbar(y="worker", left="start", right="end", height=0.8, fill_color="color", source=src,
                           fill_alpha=alpha, line_color="line_color", line_width=1.5, name=name)
        self.plot.add_tools(HoverTool(tooltips=[("task", "@name"), ("function", "@function"), ("id", "@task_id"),
                                                ("state", "@state"),
                                                ("duration", "@duration"), ("worker", "@worker"),
                                                ("type", "@type")]))
        self.counts = Div(text="", name="counts")
        self.legend = Div(text=legend_html(False, None, 0), name="legend")
        return column(self.counts, self.legend, self.plot, sizing_mode="stretch_width")

    def _row(self, t: Any, end: float) -> tuple[Any, ...]:
        start = t.start_time or end
        dur = end - start
        color = STATE_COLORS[state_class(t.state)]
        return (self.source.worker_label(t.worker_id), start * 1000, end * 1000, color,
                RERUN_COLOR if t.reran else color, t.name, t.function_name or t.name, t.task_id, t.state,
                f"{dur * 1000:.1f} ms" if dur < 10 else f"{dur:.1f} s", (t.node_id or "")[:8], t.type)

    def update(self) -> None:
        src = self.source
        changed = src.changes_since(self.seen)
        if changed is None or self.seen < 0:
            candidates = list(src.tasks)
        else:
            candidates = [tid for tid in changed if tid in src.tasks]
        new: dict[str, list[Any]] = {f: [] for f in FIELDS}
        for tid in candidates:
            t = src.tasks[tid]
            if tid in self.plotted or not t.start_time or not t.end_time or t.state not in _ENDED:
                continue
            self.plotted.add(tid)
            for f, v in zip(FIELDS, self._row(t, t.end_time)):
                new[f].append(v)
        now = time.time()
        running: dict[str, list[Any]] = {f: [] for f in FIELDS}
        for t in src.tasks.values() if len(src.tasks) < 50_000 else ():
            if t.state == TaskState.RUNNING and t.start_time:
                for f, v in zip(FIELDS, self._row(t, now)):
                    running[f].append(v)
        workers = set(self.y_range.factors)
        fresh = {w for w in new["worker"] + running["worker"] if w not in workers}
        if fresh:
            self.y_range.factors = sorted(workers | fresh)
        if new["worker"]:
            self.done_source.stream(new, rollover=ROLLOVER)
        if running["worker"] or self.running_source.data["worker"]:
            self.running_source.data = running
        if len(self.plotted) > 4 * ROLLOVER:
            self.plotted = set(self.done_source.data["task_id"])
        counts = src.counts_by_state()
        cells = "".join(
            f"<span class='lumos-count' data-state='{esc(s)}' style='margin-right:14px'>"
            f"<span style='display:inline-block;width:10px;height:10px;background:{STATE_COLORS[state_class(s)]}'></span>"
            f" {esc(s)}: <b>{n}</b></span>" for s, n in sorted(counts.items()))
        self.counts.text = f"<div style='font-family:sans-serif'>Tasks by state: {cells or 'none yet'}</div>"
