"""Rich displays of the notebook front end: live cell displays and HTML renderers.

``LiveDisplay`` is a display handle created in the cell that submitted work (an
``--async`` cell, or a cell whose output was still arriving when it returned). The
io thread only appends to its buffers; one ``lumos-cell-display`` thread pushes the
changes to the frontend at most 4 times a second, as ``update_display_data``
messages, which land in the original cell whichever cell runs now.
"""

from __future__ import annotations

import html
import logging
import threading
import time
from typing import Any

from lumos.dashboard.components.common import fmt_bytes

logger = logging.getLogger(__name__)

_MAX_TEXT_CHARS = 200_000

_STATE_STYLE = {"running": ("#1f6feb", "⏳"), "finished": ("#1a7f37", "✓"), "failed": ("#cf222e", "✗"),
                "cancelled": ("#9a6700", "■")}


class LiveDisplay:
    """A progress line, the streamed output and the outcome of work started by one cell."""

    def __init__(self, title: str, total: int = 1, show_progress: bool = True) -> None:
        from IPython.display import display
        self.title = title
        self.total = total
        self.show_progress = show_progress
        self.finished = 0
        self.failed = 0
        self.state = "running"
        self.detail = ""
        self.error_text = ""
        self.started = time.monotonic()
        self.ended: float | None = None
        self._text: list[tuple[str, bool]] = []
        self._text_chars = 0
        self._bundles: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._dirty = False
        self._final = False
        self._last_push = 0.0
        self.handle = display(self.bundle(), raw=True, display_id=True)
        _UPDATER.add(self)

    # ------------------------------------------------------------------ any thread

    def append_text(self, text: str, is_stderr: bool) -> None:
        with self._lock:
            if self._text_chars < _MAX_TEXT_CHARS:
                self._text.append((text, is_stderr))
                self._text_chars += len(text)
            self._dirty = True

    def append_bundle(self, bundle: dict[str, Any]) -> None:
        with self._lock:
            self._bundles.append(bundle)
            self._dirty = True

    def task_done(self, ok: bool) -> None:
        with self._lock:
            if ok:
                self.finished += 1
            else:
                self.failed += 1
            self._dirty = True

    def finish(self, state: str, detail: str = "", error_text: str = "") -> None:
        with self._lock:
            self.state = state
            self.detail = detail
            self.error_text = error_text
            self.ended = time.monotonic()
            self._dirty = True
            self._final = True
        _UPDATER.wake()

    # ------------------------------------------------------------------ rendering

    def text(self) -> str:
        with self._lock:
            return "".join(t for t, _ in self._text)

    def bundle(self) -> dict[str, Any]:
        with self._lock:
            elapsed = (self.ended or time.monotonic()) - self.started
            colour, icon = _STATE_STYLE.get(self.state, ("#666", "?"))
            count = f"{self.finished}/{self.total} done" + (f", {self.failed} failed" if self.failed else "")
            head_plain = f"{icon} {self.title}: {self.state} · {count} · {elapsed:.1f} s"
            if self.detail:
                head_plain += f" · {self.detail}"
            pct = 100.0 * (self.finished + self.failed) / max(self.total, 1)
            bar = ""
            if self.show_progress:
                bar = (f"<div style='background:#eee;width:240px;height:6px;border-radius:3px;margin:3px 0'>"
                       f"<div style='background:{colour};width:{pct:.0f}%;height:6px;border-radius:3px'>"
                       f"</div></div>")
            head = (f"<div class='lumos-live' style='font-family:monospace;font-size:12px'>"
                    f"<span style='color:{colour}'>{icon}</span> <b>{html.escape(self.title)}</b>: "
                    f"{html.escape(self.state)} · {count} · {elapsed:.1f} s"
                    + (f" · {html.escape(self.detail)}" if self.detail else "") + f"{bar}</div>")
            parts = [head]
            plain = [head_plain]
            if self._text:
                body = "".join((f"<span style='color:#cf222e'>{html.escape(t)}</span>" if err else html.escape(t))
                               for t, err in self._text)
                parts.append(f"<pre style='margin:2px 0;font-size:12px'>{body}</pre>")
                plain.append("".join(t for t, _ in self._text).rstrip("\n"))
            for b in self._bundles:
                data = b.get("data", {})
                if "text/html" in data:
                    parts.append(f"<div>{data['text/html']}</div>")
                elif "image/png" in data:
                    parts.append(f"<img src='data:image/png;base64,{data['image/png']}'/>")
                else:
                    parts.append(f"<pre>{html.escape(str(data.get('text/plain', '')))}</pre>")
                plain.append(str(data.get("text/plain", "")))
            if self.error_text:
                parts.append(traceback_html(self.error_text))
                plain.append(self.error_text.rstrip())
            self._dirty = False
        return {"text/plain": "\n".join(plain), "text/html": "".join(parts)}

    def push(self) -> None:
        self._last_push = time.monotonic()
        self.handle.update(self.bundle(), raw=True)

    def wants_push(self, now: float) -> bool:
        if self._dirty:
            return self._final or now - self._last_push >= 0.2
        return self.state == "running" and now - self._last_push >= 1.0


class _Updater:
    """One thread pushes every live display's changes; it exits when none is left."""

    def __init__(self) -> None:
        self._displays: list[LiveDisplay] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()

    def wake(self) -> None:
        self._wake.set()

    def add(self, d: LiveDisplay) -> None:
        with self._lock:
            self._displays.append(d)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="lumos-cell-display", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        idle_since = time.monotonic()
        while True:
            self._wake.wait(0.1)
            self._wake.clear()
            now = time.monotonic()
            with self._lock:
                displays = list(self._displays)
            for d in displays:
                try:
                    if d.wants_push(now):
                        d.push()
                except Exception:
                    logger.exception("updating a live display failed")
            with self._lock:
                # Finished displays stay a little while: late output may still arrive.
                self._displays = [d for d in self._displays
                                  if d.state == "running" or d._dirty or now - (d.ended or now) < 60]
                if self._displays:
                    idle_since = now
                elif now - idle_since > 2.0:
                    self._thread = None
                    return

    def flush(self, settle_s: float = 0.0) -> None:
        """Push every pending change now; first wait up to ``settle_s`` for running ones to end."""
        deadline = time.monotonic() + settle_s
        while time.monotonic() < deadline:
            with self._lock:
                if all(d.state != "running" for d in self._displays):
                    break
            time.sleep(0.02)
        with self._lock:
            displays = list(self._displays)
        for d in displays:
            # Finished ones too: an update pushed between two cells' executions has no cell
            # listening for it (a notebook client files updates under the running request).
            if d._dirty or d._final:
                try:
                    d.push()
                except Exception:
                    logger.exception("updating a live display failed")


_UPDATER = _Updater()


def flush_live_displays(settle_s: float = 0.0) -> None:
    """Push pending display updates from this thread (the frontend files them under the
    cell that made each display); ``settle_s`` first waits for running work to end."""
    _UPDATER.flush(settle_s)


# ---------------------------------------------------------------------------- renderers


def traceback_html(text: str) -> str:
    return (f"<pre style='background:#fff5f5;border-left:3px solid #cf222e;padding:4px 6px;"
            f"font-size:12px;white-space:pre-wrap'>{html.escape(text.rstrip())}</pre>")


def _fmt_amount(name: str, v: float) -> str:
    if name in ("memory", "object_store_memory"):
        return fmt_bytes(v)
    return f"{v:g}"


def _dashboard_link(fallback: str) -> str:
    """The status page through the notebook server (``{base_url}lumos/...``) when the kernel
    runs under one that serves it, else the head node's own URL ("" without a dashboard)."""
    try:
        from lumos.dashboard.notebook import dashboard_url
        return dashboard_url("status")
    except (RuntimeError, ValueError, ImportError, OSError) as e:
        logger.debug("no dashboard link: %s", e)
        return fallback


class ClusterStatus:
    """The cluster card: what ``lumos.init()`` shows and ``%lumos status`` returns.

    Like Dask's ``Client`` card: totals first (nodes, CPUs, GPUs, workers, memory,
    object store, in human units), the per-node list folded below, and a dashboard link
    that works from the browser (through the notebook server when there is one).
    """

    def __init__(self, nodes: list[dict[str, Any]], dashboard_url: str, address: str = "") -> None:
        self.nodes = nodes
        self.dashboard_url = _dashboard_link(dashboard_url)
        self.address = address

    @classmethod
    def current(cls, fallback_url: str = "", address: str = "") -> "ClusterStatus":
        import lumos
        nodes = lumos.state.list_nodes()
        if not fallback_url:
            fallback_url = next((n["dashboard_url"] for n in nodes if n.get("dashboard_url")), "") or ""
        return cls(nodes, fallback_url, address)

    # ------------------------------------------------------------------ numbers

    def _alive(self) -> list[dict[str, Any]]:
        return [n for n in self.nodes if n["state"] == "ALIVE"]

    @staticmethod
    def _used(n: dict[str, Any], key: str) -> float:
        total = n["resources_total"].get(key, 0.0)
        return max(total - n["resources_available"].get(key, total), 0.0)

    def totals(self) -> dict[str, Any]:
        alive = self._alive()
        out: dict[str, Any] = {"nodes": len(alive), "nodes_dead": len(self.nodes) - len(alive)}
        for key in ("CPU", "GPU", "memory"):
            out[key] = sum(n["resources_total"].get(key, 0.0) for n in alive)
            out[key + "_used"] = sum(self._used(n, key) for n in alive)
        out["workers"] = sum(int(n.get("num_workers") or 0) for n in alive)
        out["store_used"] = sum(n["object_store_used_bytes"] for n in alive)
        out["store_capacity"] = sum(n["object_store_capacity_bytes"] for n in alive)
        return out

    def _summary(self) -> list[tuple[str, str]]:
        t = self.totals()
        rows = [("Nodes", f"{t['nodes']} alive" + (f", {t['nodes_dead']} dead" if t["nodes_dead"] else "")),
                ("CPUs", f"{t['CPU']:g} ({t['CPU_used']:g} in use)")]
        if t["GPU"]:
            rows.append(("GPUs", f"{t['GPU']:g} ({t['GPU_used']:g} in use)"))
        rows += [("Workers", f"{t['workers']}"),
                 ("Memory", f"{fmt_bytes(t['memory'])} ({fmt_bytes(t['memory_used'])} reserved)"),
                 ("Object store", f"{fmt_bytes(t['store_used'])} / {fmt_bytes(t['store_capacity'])}"
                                  f" ({_pct(t['store_used'], t['store_capacity'])})")]
        if self.address:
            rows.append(("GCS address", self.address))
        return rows

    def _rows(self) -> list[tuple[str, str, str, str, str, str]]:
        rows = []
        for n in self.nodes:
            total = n["resources_total"]
            res = []
            for k in sorted(total):
                if k.startswith("node:") or k.startswith("accelerator_type:"):
                    continue
                used = self._used(n, k) if n["state"] == "ALIVE" else 0
                res.append(f"{k} {_fmt_amount(k, used)}/{_fmt_amount(k, total[k])}")
            store = (f"{fmt_bytes(n['object_store_used_bytes'])} / "
                     f"{fmt_bytes(n['object_store_capacity_bytes'])}")
            rows.append((n["node_id"][:12] + (" (head)" if n["is_head_node"] else ""), n["node_ip"],
                         n["state"], ", ".join(res), str(int(n.get("num_workers") or 0)), store))
        return rows

    # ------------------------------------------------------------------ renderings

    def __repr__(self) -> str:
        lines = ["lumos cluster: " + " · ".join(f"{k.lower()} {v}" for k, v in self._summary())]
        if self.dashboard_url:
            lines.append(f"dashboard: {self.dashboard_url}")
        for node, ip, state, res, workers, store in self._rows():
            lines.append(f"  {node} {ip} {state}: {res}; {workers} workers; object store {store}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        e = html.escape
        link = (f"<a href='{e(self.dashboard_url)}' target='_blank'>{e(self.dashboard_url)}</a>"
                if self.dashboard_url else "<i>no dashboard</i>")
        summary = "".join(f"<tr><th style='text-align:left;padding-right:1em'>{e(k)}</th>"
                          f"<td style='text-align:left'>{e(v)}</td></tr>" for k, v in self._summary())
        body = "".join(
            "<tr>" + "".join(f"<td style='text-align:left'>{e(c)}</td>" for c in row) + "</tr>"
            for row in self._rows())
        nodes = (f"<details class='lumos-nodes'><summary>Nodes ({len(self.nodes)})</summary>"
                 f"<table><thead><tr><th>node</th><th>address</th><th>state</th>"
                 f"<th>resources (in use / total)</th><th>workers</th><th>object store</th></tr></thead>"
                 f"<tbody>{body}</tbody></table></details>")
        return (f"<div class='lumos-status' style='font-size:13px'>"
                f"<div><b>lumos</b> cluster · dashboard: {link}</div>"
                f"<table style='margin:4px 0'>{summary}</table>{nodes}</div>")


def _pct(used: float, total: float) -> str:
    return f"{100.0 * used / total:.0f}%" if total else "0%"


class SessionList:
    """``%lumos sessions``."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows

    def __repr__(self) -> str:
        if not self.rows:
            return "no lumos sessions"
        return "\n".join(f"{r['name']}: {r['state']} on node {r['node'][:12]} · {r['resources']} · "
                         f"{r['cells']} cell(s)" for r in self.rows)

    def _repr_html_(self) -> str:
        if not self.rows:
            return "<i>no lumos sessions</i>"
        body = "".join(
            f"<tr><td>{html.escape(r['name'])}</td><td>{html.escape(r['state'])}</td>"
            f"<td>{html.escape(r['node'][:12])}</td><td>{html.escape(str(r['resources']))}</td>"
            f"<td>{r['cells']}</td><td>{html.escape(', '.join(r['names'][:20]))}</td></tr>"
            for r in self.rows)
        return ("<table class='lumos-sessions'><thead><tr><th>session</th><th>state</th><th>node</th>"
                f"<th>resources</th><th>cells</th><th>names</th></tr></thead><tbody>{body}</tbody></table>")
