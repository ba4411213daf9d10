"""What every page shares: the page base class, the navigation bar, number formatting.

Every value that reaches HTML goes through ``esc`` (task names, error text and actor
names are user-controlled). Bokeh's DataTable cells and hover tooltips escape on their
own; ``Div`` text does not, so Divs are built only here and in the pages, always
escaped.
"""

from __future__ import annotations

import html
from typing import Any, Callable

from lumos.dashboard.source import ClusterSource

#: Page path -> title, in navigation order.
PAGE_TITLES = {
    "status": "Status",
    "tasks": "Task stream",
    "graph": "Task graph",
    "lineage": "Lineage",
    "actors": "Actors",
    "gpus": "GPUs",
}

Links = Callable[[str, dict[str, str]], str]


def set_table_data(table: Any, data: dict[str, list[Any]]) -> None:
    """Replace a DataTable's rows with ``data`` and make the browser draw them.

    BokehJS redraws a DataTable's cells when its source's row indices change; new values
    in the same number of rows leave the old cells on screen (Bokeh 3.9). A changed
    ``tags`` value re-renders the table, so that is set whenever the values changed.
    """
    source = table.source
    if dict(source.data) == data:
        return
    same_rows = len(next(iter(source.data.values()), [])) == len(next(iter(data.values()), []))
    source.data = data
    if same_rows:
        table.tags = [int(table.tags[0]) + 1 if table.tags else 1]


def esc(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def short(hex_id: str | None, n: int = 8) -> str:
    return hex_id[:n] if hex_id else ""


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def fmt_amount(x: float) -> str:
    return f"{x:g}"


class Page:
    """A page: builds its Bokeh models once, then ``update()`` on every source change."""

    name = ""

    def __init__(self, source: ClusterSource, args: dict[str, str], links: Links) -> None:
        self.source = source
        self.args = args
        self.links = links
        #: The source tick this page last rendered.
        self.seen = -1

    def layout(self) -> Any:
        raise NotImplementedError

    def update(self) -> None:
        raise NotImplementedError


def nav_html(current: str, links: Links, args: dict[str, str] | None = None) -> str:
    items = []
    for page, title in PAGE_TITLES.items():
        style = "font-weight:bold;text-decoration:none;color:#000" if page == current else "text-decoration:none"
        items.append(f"<a class='lumos-nav' data-page='{esc(page)}' href='{esc(links(page, {}))}' "
                     f"style='margin-right:16px;{style}'>{esc(title)}</a>")
    return ("<div style='font-family:sans-serif;font-size:15px;padding:4px 0'>"
            "<span style='font-weight:bold;margin-right:24px'>lumos</span>" + "".join(items) + "</div>")


def header_html(source: ClusterSource) -> str:
    if source.connected:
        n_alive = sum(1 for n in source.nodes.values() if n.state == "ALIVE")
        text = (f"connected to {esc(source.label)} · {n_alive} node(s) · {len(source.tasks)} task(s) · "
                f"updated {esc(_ago(source.last_poll))}")
        color = "#555"
    else:
        text = f"not connected to the GCS of {esc(source.label)}: {esc(source.error or 'connecting…')}"
        color = "#d7191c"
    return f"<div class='lumos-header' style='font-family:sans-serif;font-size:12px;color:{color}'>{text}</div>"


def _ago(t: float) -> str:
    import time
    if not t:
        return "never"
    return time.strftime("%H:%M:%S", time.localtime(t))


def details_table(title: str, rows: list[tuple[str, Any]]) -> str:
    body = "".join(f"<tr><td style='padding-right:12px;color:#555;vertical-align:top'>{esc(k)}</td>"
                   f"<td style='font-family:monospace;white-space:pre-wrap;word-break:break-all'>{esc(v)}</td></tr>"
                   for k, v in rows)
    return (f"<div class='lumos-details' style='font-family:sans-serif;font-size:12px'><b>{esc(title)}</b>"
            f"<table>{body}</table></div>")
