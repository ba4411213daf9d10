"""Application metrics in a process: what ``lumos.util.metrics`` records, held until the
core worker reports it to the GCS, and the Prometheus text the cluster's metrics read as.

```
Counter.inc / Gauge.set / Histogram.observe (any thread)
    └─► BUFFER (one per process, a lock) ──take(), every metrics_report_interval_ms──► core worker
                                                          ──ReportMetrics──► GCS (gcs/metrics.py)
lumos.state.prometheus_text() / the dashboard's /metrics ◄──GetMetrics── GCS  (render_prometheus)
```

A record costs a dict update under a lock; the first one after a report wakes the core
worker once (``wake``), which reports what gathered one interval later. Counters and
histograms are sent as increases since the last report, so the GCS's totals survive a
process's exit (its last report goes with its final flush); a gauge as its last value.
"""

from __future__ import annotations

import math
import re
import threading
import warnings
from typing import Any, Callable, Iterable

COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
KINDS = (COUNTER, GAUGE, HISTOGRAM)

#: Prometheus's metric and label name rules.
NAME_RE = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
LABEL_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")

#: Bounds on what one metric may carry, checked where it is defined and again by the GCS.
MAX_NAME = 200
MAX_DESCRIPTION = 2_000
MAX_TAG_KEYS = 32
MAX_TAG_VALUE = 1_000
MAX_BOUNDARIES = 200
#: Distinct tag sets a process holds between two reports; more are dropped (one warning).
MAX_PROCESS_SERIES = 10_000

#: Names the cluster's own metrics use (``render_prometheus``): an application metric may not.
SYSTEM_PREFIX = "lumos_"


def check_definition(name: Any, description: Any, tag_keys: Any, boundaries: Any, kind: str) -> str | None:
    """Why a metric's definition is unusable, or None. Shared by the API and the GCS."""
    if not isinstance(name, str) or not name:
        return "a metric's name must be a non-empty str"
    if len(name) > MAX_NAME or not NAME_RE.match(name):
        return (f"invalid metric name {name[:MAX_NAME]!r}: letters, digits, _ and :, not starting with a "
                f"digit, at most {MAX_NAME} characters")
    if name.startswith(SYSTEM_PREFIX):
        return f"metric names starting with {SYSTEM_PREFIX!r} are the cluster's own: {name!r}"
    if not isinstance(description, str) or len(description) > MAX_DESCRIPTION:
        return f"description must be a str of at most {MAX_DESCRIPTION} characters"
    if not isinstance(tag_keys, (tuple, list)) or len(tag_keys) > MAX_TAG_KEYS:
        return f"tag_keys must be a tuple of at most {MAX_TAG_KEYS} str"
    for key in tag_keys:
        if not isinstance(key, str):
            return f"tag keys must be str, got {type(key).__name__}"
        if not LABEL_RE.match(key) or key.startswith("__") or key == "le":
            return f"invalid tag key {key[:100]!r}: letters, digits and _, not starting with a digit or __, not 'le'"
    if len(set(tag_keys)) != len(tag_keys):
        return f"tag keys repeat: {tuple(tag_keys)!r}"
    if kind == HISTOGRAM:
        if not isinstance(boundaries, (list, tuple)) or not boundaries or len(boundaries) > MAX_BOUNDARIES:
            return (f"boundaries must be a non-empty list of at most {MAX_BOUNDARIES} numbers, e.g. "
                    "Histogram('name', boundaries=[1.0, 2.0])")
        last = 0.0
        for i, b in enumerate(boundaries):
            if isinstance(b, bool) or not isinstance(b, (int, float)) or not math.isfinite(b) or b <= 0:
                return f"boundaries[{i}] is {b!r}: bucket bounds must be finite numbers > 0"
            if b <= last:
                return f"boundaries must increase: {list(boundaries)[:20]!r}"
            last = b
    elif boundaries is not None:
        return "only a histogram has boundaries"
    return None


class Buffer:
    """What this process recorded since its last report (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: name -> [kind, description, tag_keys, boundaries]: every metric defined here.
        self._defs: dict[str, list[Any]] = {}
        #: (name, tag values) -> a counter's increase, a gauge's value or [counts, sum].
        self._series: dict[tuple[str, tuple[str, ...]], Any] = {}
        #: Called (any thread) when the first record after a report arrives; None: nothing reports.
        self.wake: Callable[[], None] | None = None
        self.dropped = 0

    def define(self, kind: str, name: str, description: str, tag_keys: tuple[str, ...],
               boundaries: list[float] | None) -> None:
        """Raises ValueError when ``name`` is already defined here differently."""
        new = [kind, description, list(tag_keys), list(boundaries) if boundaries is not None else None]
        with self._lock:
            old = self._defs.get(name)
            if old is None:
                self._defs[name] = new
                return
        if old[0] != kind or old[2] != new[2] or old[3] != new[3]:
            raise ValueError(f"metric {name!r} is already defined in this process as a {old[0]} with tag_keys "
                             f"{tuple(old[2])!r}" + (f" and boundaries {old[3]!r}" if old[3] else "")
                             + "; one name is one metric")

    def record(self, kind: str, name: str, values: tuple[str, ...], value: float,
               boundaries: list[float] | None = None) -> None:
        key = (name, values)
        with self._lock:
            series = self._series
            first = not series
            have = series.get(key)
            if have is None and len(series) >= MAX_PROCESS_SERIES:
                self._full(name)
                return
            if kind == COUNTER:
                series[key] = value if have is None else have + value
            elif kind == GAUGE:
                series[key] = value
            else:
                if have is None:
                    have = series[key] = [[0] * (len(boundaries) + 1), 0.0]  # type: ignore[arg-type]
                have[0][_bucket(boundaries, value)] += 1  # type: ignore[arg-type]
                have[1] += value
        if first:
            wake = self.wake
            if wake is not None:
                wake()

    def _full(self, name: str) -> None:
        """(under the lock) A new tag set past ``MAX_PROCESS_SERIES``: dropped, said once."""
        self.dropped += 1
        if self.dropped == 1:
            warnings.warn(f"metric {name!r}: this process holds {MAX_PROCESS_SERIES} tag sets since its last "
                          "report; records of new ones are dropped until the next (tag values should "
                          "come from a small set)", RuntimeWarning, stacklevel=4)

    def pending(self) -> bool:
        return bool(self._series)

    def take(self) -> list[list[Any]]:
        """The report's rows (``m.ReportMetrics.rows``), emptying the buffer."""
        with self._lock:
            if not self._series:
                return []
            series, self._series = self._series, {}
            defs = self._defs
            by_name: dict[str, list[Any]] = {}
            for (name, values), value in series.items():
                row = by_name.get(name)
                if row is None:
                    kind, description, tag_keys, boundaries = defs[name]
                    row = by_name[name] = [name, kind, description, tag_keys, boundaries, []]
                row[5].append([list(values), value])
        return list(by_name.values())

    def put_back(self, rows: list[list[Any]]) -> None:
        """Rows taken but not sent (the GCS connection was down): merged back for the next report."""
        with self._lock:
            series = self._series
            for name, kind, _d, _k, _b, items in rows:
                for values, value in items:
                    key = (name, tuple(values))
                    have = series.get(key)
                    if have is None:
                        series[key] = value
                    elif kind == COUNTER:
                        series[key] = have + value
                    elif kind == HISTOGRAM:
                        series[key] = [[a + b for a, b in zip(value[0], have[0])], value[1] + have[1]]
                    # a gauge set since keeps its newer value


def _bucket(boundaries: list[float], value: float) -> int:
    """The index of the bucket ``value`` falls in: the first bound it does not exceed."""
    lo, hi = 0, len(boundaries)
    while lo < hi:
        mid = (lo + hi) // 2
        if value <= boundaries[mid]:
            hi = mid
        else:
            lo = mid + 1
    return lo


#: This process's buffer.
BUFFER = Buffer()


# --------------------------------------------------------------------------- Prometheus text


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n")


def _escape_help(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n")


def _labels(pairs: Iterable[tuple[str, str]]) -> str:
    inner = ",".join(f'{k}="{_escape_label(str(v))}"' for k, v in pairs)
    return "{" + inner + "}" if inner else ""


def _num(value: float) -> str:
    if value != value:
        return "NaN"
    if value in (math.inf, -math.inf):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _family(out: list[str], name: str, kind: str, description: str) -> None:
    out.append(f"# HELP {name} {_escape_help(description)}")
    out.append(f"# TYPE {name} {kind}")


def counter_name(name: str) -> str:
    """A counter's exported name: Prometheus's convention ends it in ``_total``."""
    return name if name.endswith("_total") else name + "_total"


def render_prometheus(metrics: list[list[Any]], nodes: list[Any], resources: list[Any], actors: list[Any],
                      jobs: list[Any], dropped: list[dict[str, Any]] | None = None) -> str:
    """The Prometheus text exposition (format 0.0.4) of the cluster's own metrics (``lumos_``:
    nodes, their resources, object stores, queues and memory; actors and jobs by state;
    application records the GCS refused, by metric) and of the application's (``GetMetrics``
    rows, counters named ``<name>_total``)."""
    out: list[str] = []
    names = {n.node_id.hex(): n for n in nodes}

    def node_labels(node_id: Any) -> list[tuple[str, str]]:
        info = names.get(node_id.hex())
        return [("node_id", node_id.hex()), ("hostname", info.hostname if info is not None else "")]

    states: dict[str, int] = {}
    for n in nodes:
        states[n.state] = states.get(n.state, 0) + 1
    _family(out, "lumos_nodes", "gauge", "Nodes the GCS knows, by state.")
    for state in sorted(set(states) | {"ALIVE", "DEAD"}):
        out.append(f"lumos_nodes{_labels([('state', state)])} {states.get(state, 0)}")
    per_node = [
        ("lumos_node_resources_total", "The node's resources, by name.", "total"),
        ("lumos_node_resources_available", "The node's resources not in use, as of its last heartbeat.",
         "available"),
        ("lumos_object_store_used_bytes", "Bytes in the node's object store.", "store_used_bytes"),
        ("lumos_object_store_capacity_bytes", "The node's object store size, bytes.", "store_capacity_bytes"),
        ("lumos_object_store_pooled_bytes", "Store files of freed objects kept for reuse, bytes (not in "
         "lumos_object_store_used_bytes: a create takes them back at once).", "store_pooled_bytes"),
        ("lumos_node_queued_leases", "Lease requests waiting at the node's scheduler.", "queue_length"),
        ("lumos_node_workers", "Worker processes on the node.", "num_workers"),
        ("lumos_node_memory_total_bytes", "The machine's memory, bytes.", "memory_total_bytes"),
        ("lumos_node_memory_available_bytes", "The machine's available memory, bytes.", "memory_available_bytes"),
        ("lumos_node_process_rss_bytes", "Resident memory of the node's raylet and workers, bytes.",
         "lumos_rss_bytes"),
        ("lumos_node_cpu_percent", "The machine's CPU load, percent of all its cores.", "cpu_percent"),
    ]
    ordered = sorted(resources, key=lambda r: r.node_id.hex())
    for name, description, field in per_node:
        _family(out, name, "gauge", description)
        for r in ordered:
            labels = node_labels(r.node_id)
            value = getattr(r, field)
            if isinstance(value, dict):  # by resource
                for resource in sorted(value):
                    out.append(f"{name}{_labels(labels + [('resource', resource)])} {_num(value[resource])}")
            else:
                out.append(f"{name}{_labels(labels)} {_num(value)}")
    for name, description, rows in (("lumos_actors", "Actors, by state.", actors),
                                    ("lumos_jobs", "Jobs (drivers), by state.", jobs)):
        counts: dict[str, int] = {}
        for row in rows:
            counts[row.state] = counts.get(row.state, 0) + 1
        _family(out, name, "gauge", description)
        for state in sorted(counts):
            out.append(f"{name}{_labels([('state', state)])} {counts[state]}")
    _family(out, "lumos_metrics_dropped_total", "counter",
            "Application-metric records the GCS refused (another kind or tag keys under a known name, "
            "malformed, past its bounds), by metric.")
    for d in sorted(dropped or [], key=lambda d: str(d["name"])):
        out.append(f"lumos_metrics_dropped_total{_labels([('metric', str(d['name']))])} {d['count']}")
    for name, kind, description, tag_keys, boundaries, series in sorted(metrics, key=lambda row: row[0]):
        exported = counter_name(name) if kind == COUNTER else name
        _family(out, exported, kind, description)
        for values, value in sorted(series, key=lambda item: item[0]):
            pairs = list(zip(tag_keys, values))
            if kind != HISTOGRAM:
                out.append(f"{exported}{_labels(pairs)} {_num(value)}")
                continue
            counts, total = value
            running = 0
            for bound, count in zip(list(boundaries) + [math.inf], counts):
                running += count
                out.append(f"{name}_bucket{_labels(pairs + [('le', _num(bound))])} {running}")
            out.append(f"{name}_sum{_labels(pairs)} {_num(total)}")
            out.append(f"{name}_count{_labels(pairs)} {running}")
    return "\n".join(out) + "\n"
