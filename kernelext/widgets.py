"""``%lumos gpus``: the GPU placement panel (ipywidgets).

One row per node: its GPUs (model and memory from ``nvidia-smi`` for nodes on this
machine, declared ids otherwise) and which tasks or actors hold GPUs there. Below,
controls that set the defaults of the next ``%%remote`` cells (``RemoteCells.defaults``):
number of GPUs (fractions below 1 share a GPU), node, strategy, and a button that
reserves N GPUs as a placement group for this notebook.

A ``lumos-gpu-panel`` thread refreshes the node rows every ``refresh_s`` seconds until
the panel is closed (``%lumos gpus`` again or ``panel.close()``). ``%lumos shutdown``
freezes it instead (``close(keep_view=True)``): a notebook run top to bottom keeps the
panel's last view rather than an empty output. "Reserve GPUs" is disabled while the
cluster has no GPUs.
"""

from __future__ import annotations

import html
import logging
import os
import shutil
import socket
import subprocess
import threading
from typing import Any

import lumos

logger = logging.getLogger(__name__)

_CELL = "text-align:left;vertical-align:top;padding:2px 14px 2px 0"


def local_gpu_models() -> list[dict[str, Any]]:
    """GPUs of this machine from ``nvidia-smi`` (empty when there is none)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        out = subprocess.run([exe, "--query-gpu=index,name,memory.total,memory.used",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return []
    gpus = []
    for line in out.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 4 and parts[0].isdigit():
            gpus.append({"index": int(parts[0]), "model": parts[1],
                         "memory_total_mib": _num(parts[2]), "memory_used_mib": _num(parts[3])})
    return gpus


def _num(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return 0.0


def gpu_holders() -> dict[str, list[dict[str, Any]]]:
    """node id hex -> running tasks and live actors that hold GPUs there."""
    out: dict[str, list[dict[str, Any]]] = {}
    try:
        tasks = lumos.state.list_tasks(filters=[("state", "=", "RUNNING")], limit=2000, all_jobs=True)
    except lumos.exceptions.LumosError as e:
        logger.debug("listing tasks for the GPU panel failed: %s", e)
        tasks = []
    for t in tasks:
        gpus = (t.get("required_resources") or {}).get("GPU", 0)
        if gpus and t.get("node_id") and not t.get("actor_id"):
            out.setdefault(t["node_id"], []).append({"kind": "task", "name": t["name"], "GPU": gpus,
                                                     "ids": t.get("resource_ids")})
    try:
        actors = lumos.state.list_actors()
    except lumos.exceptions.LumosError as e:
        logger.debug("listing actors for the GPU panel failed: %s", e)
        actors = []
    for a in actors:
        row = a if isinstance(a, dict) else {k: getattr(a, k, None) for k in ("state", "required_resources",
                                                                              "node_id", "name", "class_name")}
        gpus = (row.get("required_resources") or {}).get("GPU", 0)
        node = row.get("node_id")
        if isinstance(node, bytes):
            node = node.hex()
        if gpus and node and row.get("state") == "ALIVE":
            out.setdefault(node, []).append({"kind": "actor", "name": row.get("name") or row.get("class_name"),
                                             "GPU": gpus, "ids": None})
    return out


class GpuPanel:
    """The widget shown by ``%lumos gpus``; its controls set the next cells' defaults.

    Attributes (ipywidgets, also settable from Python): ``num_gpus``, ``node``,
    ``strategy``, ``reserve_count``, ``reserve_button``, ``release_button``.
    """

    def __init__(self, cells: Any, refresh_s: float = 2.0) -> None:
        import ipywidgets as w
        self._cells = cells
        self.refresh_s = refresh_s
        d = cells.defaults
        self._here = {socket.gethostname(), "127.0.0.1", "localhost"}
        self._models = local_gpu_models()
        self.nodes_html = w.HTML(layout=w.Layout(width="100%"))
        self.num_gpus = w.BoundedFloatText(value=d.num_gpus or 0.0, min=0.0, max=1024.0, step=0.25,
                                           description="GPUs / cell", style={"description_width": "initial"})
        self.node = w.Dropdown(options=[("any node", "")], value="", description="node")
        self.strategy = w.ToggleButtons(options=["DEFAULT", "SPREAD"], value=d.strategy or "DEFAULT",
                                        description="strategy")
        self.reserve_count = w.BoundedIntText(value=1, min=1, max=1024, description="reserve",
                                              layout=w.Layout(width="160px"))
        self.reserve_button = w.Button(description="Reserve GPUs", icon="lock",
                                       tooltip="reserve N GPUs as a placement group for this notebook")
        self.release_button = w.Button(description="Release", icon="unlock", disabled=True)
        self.summary = w.HTML()
        self.widget = w.VBox([
            w.HTML("<b>lumos GPUs</b>"), self.nodes_html,
            w.HBox([self.num_gpus, self.node]), self.strategy,
            w.HBox([self.reserve_count, self.reserve_button, self.release_button]), self.summary])
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self.refresh()
        if d.node and d.node in [v for _, v in self.node.options]:
            self.node.value = d.node
        for control in (self.num_gpus, self.node, self.strategy):
            control.observe(self._on_change, names="value")
        self.reserve_button.on_click(lambda _b: self.reserve(self.reserve_count.value))
        self.release_button.on_click(lambda _b: self.release())
        self._render_summary()
        self._thread = threading.Thread(target=self._refresh_loop, name="lumos-gpu-panel", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ display

    def _ipython_display_(self) -> None:
        from IPython.display import display
        display(self.widget)

    def __repr__(self) -> str:
        return f"GpuPanel({self.spec})"

    @property
    def spec(self) -> dict[str, Any]:
        """What the next ``%%remote`` cell asks for by default."""
        d = self._cells.defaults
        return {"num_gpus": d.num_gpus or 0, "node": d.node or None, "strategy": d.strategy or "DEFAULT",
                "placement_group": getattr(getattr(d.placement_group, "id", None), "hex", lambda: None)()}

    def close(self, keep_view: bool = False) -> None:
        """Stop refreshing; remove the panel, or with ``keep_view`` leave its last state
        on show with the controls disabled (the cluster is gone)."""
        self._closed.set()
        if not keep_view:
            self.widget.close()
            return
        for control in (self.num_gpus, self.node, self.strategy, self.reserve_count, self.reserve_button,
                        self.release_button):
            control.disabled = True
        self._render_summary("the cluster was shut down: this panel no longer updates")

    # ------------------------------------------------------------------ controls

    def _on_change(self, change: Any) -> None:
        d = self._cells.defaults
        value = float(self.num_gpus.value)
        if value > 1 and value != int(value):
            self.summary.value = ("<span style='color:#cf222e'>fractions are allowed only below 1 GPU; "
                                  f"{value:g} was not applied</span>")
            return
        d.num_gpus = value or None
        d.node = self.node.value or None
        d.strategy = None if self.strategy.value == "DEFAULT" else self.strategy.value
        self._render_summary()

    def _render_summary(self, note: str = "") -> None:
        s = self.spec
        parts = [f"next <code>%%remote</code>: {s['num_gpus']:g} GPU"]
        if s["node"]:
            parts.append(f"on node {html.escape(s['node'][:12])}")
        if s["placement_group"]:
            parts.append(f"in placement group {html.escape(s['placement_group'][:12])}")
        elif s["strategy"] != "DEFAULT":
            parts.append(f"strategy {s['strategy']}")
        self.summary.value = " ".join(parts) + (f"<br>{note}" if note else "")

    def reserve(self, count: int) -> Any:
        """Reserve ``count`` GPUs as a placement group used by the next cells: one bundle per
        GPU, each with a CPU too, since a cell's task needs one to run."""
        if self._cells.defaults.placement_group is not None:
            self.release()
        try:
            pg = lumos.util.placement_group([{"CPU": 1, "GPU": 1}] * int(count), strategy="PACK",
                                            name=f"lumos-notebook-{os.getpid()}")
        except (ValueError, TypeError, lumos.exceptions.LumosError) as e:
            self._render_summary(f"<span style='color:#cf222e'>{html.escape(str(e))}</span>")
            return None
        self._cells.defaults.placement_group = pg
        self.release_button.disabled = False
        self._render_summary(f"reserved {count} GPU(s)")
        return pg

    def release(self) -> None:
        d = self._cells.defaults
        pg, d.placement_group = d.placement_group, None
        if pg is not None:
            try:
                lumos.util.remove_placement_group(pg)
            except lumos.exceptions.LumosError as e:
                logger.warning("releasing the notebook's placement group failed: %s", e)
        self.release_button.disabled = True
        self._render_summary("released")

    # ------------------------------------------------------------------ refresh

    def _refresh_loop(self) -> None:
        while not self._closed.wait(self.refresh_s):
            if not lumos.is_initialized():
                continue
            try:
                self.refresh()
            except Exception:  # the cluster went away between the check and the call
                logger.debug("GPU panel refresh failed", exc_info=True)

    def refresh(self) -> None:
        """Re-read nodes, GPUs and holders from the cluster."""
        with self._lock:
            nodes = [n for n in lumos.state.list_nodes() if n["state"] == "ALIVE"]
            holders = gpu_holders()
            options = [("any node", "")] + [(f"{n['node_id'][:12]} ({n['node_ip']})", n["node_id"]) for n in nodes]
            if list(self.node.options) != options:
                current = self.node.value
                self.node.options = options
                self.node.value = current if current in [v for _, v in options] else ""
            self.nodes_html.value = self._nodes_table(nodes, holders)
            total = sum(n["resources_total"].get("GPU", 0) for n in nodes)
            if not self._closed.is_set():
                self.reserve_button.disabled = total < 1
                self.reserve_button.tooltip = ("reserve N GPUs as a placement group for this notebook" if total >= 1
                                               else "this cluster has no GPUs to reserve")
                self.reserve_count.max = max(1, int(total))

    def _nodes_table(self, nodes: list[dict[str, Any]], holders: dict[str, list[dict[str, Any]]]) -> str:
        rows = []
        for n in nodes:
            total = n["resources_total"].get("GPU", 0)
            free = n["resources_available"].get("GPU", total)
            local = n["node_ip"] in self._here or n["hostname"] in self._here
            gpus = []
            for i in range(int(total)):
                model = next((g for g in self._models if g["index"] == i), None) if local else None
                label = (f"GPU {i}: {html.escape(model['model'])} "
                         f"({model['memory_used_mib']:.0f}/{model['memory_total_mib']:.0f} MiB)"
                         if model else f"GPU {i} (declared)")
                gpus.append(label)
            if total != int(total):
                gpus.append(f"+{total - int(total):g} GPU (declared)")
            held = holders.get(n["node_id"], [])
            who = ", ".join(f"{html.escape(str(h['name']))} ({h['kind']}, {h['GPU']:g} GPU)" for h in held)
            cells = (f"<code>{n['node_id'][:12]}</code> {html.escape(n['node_ip'])}", "<br>".join(gpus) or "no GPUs",
                     f"{total - free:g}/{total:g} in use", who or "—")
            rows.append("<tr>" + "".join(f"<td style='{_CELL}'>{c}</td>" for c in cells) + "</tr>")
        # Header and rows share one alignment (a th is centred by default, a td is not).
        head = "".join(f"<th style='{_CELL};font-weight:bold'>{h}</th>" for h in ("node", "GPUs", "use", "held by"))
        return (f"<table class='lumos-gpus' style='border-collapse:collapse'><thead><tr>{head}</tr></thead>"
                f"<tbody>{''.join(rows)}</tbody></table>")
