"""The GCS's table of application metrics: every process's ``ReportMetrics`` folded into
one series per metric and tag set (counters and histograms summed, gauges the last
value set), read back by ``GetMetrics``.

Held in memory only: a GCS restarted on Redis starts the totals again from zero (a
counter reset, which Prometheus's ``rate()`` takes in its stride). Rows are checked one
by one: a malformed one, a metric reported with another kind, tag keys or boundaries
than the GCS first saw for its name, or a metric or series past ``max_series`` (or past
``MAX_TABLE_BYTES`` of names and tag values) is dropped with one warning per metric
name, never the whole report.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from lumos._private.metrics import COUNTER, GAUGE, HISTOGRAM, KINDS, MAX_TAG_VALUE, check_definition

logger = logging.getLogger(__name__)


class _Family:
    __slots__ = ("kind", "description", "tag_keys", "boundaries", "series")

    def __init__(self, kind: str, description: str, tag_keys: list[str], boundaries: list[float] | None) -> None:
        self.kind = kind
        self.description = description
        self.tag_keys = tag_keys
        self.boundaries = boundaries
        #: tag values -> a counter's total, a gauge's value, a histogram's [counts, sum].
        self.series: dict[tuple[str, ...], Any] = {}


#: Bytes of metric names, descriptions and tag values the table holds at most (an
#: estimate: what a series adds is dropped past it, like a series past ``max_series``).
MAX_TABLE_BYTES = 64 * 1024 * 1024
#: Metric names whose dropped records are remembered (with the first reason and a count).
MAX_DROPPED_NAMES = 1000
#: What a series or a metric costs beyond its strings (the estimate's constant).
_SERIES_OVERHEAD = 200


class MetricsTable:
    def __init__(self, max_series: int, max_bytes: int = MAX_TABLE_BYTES) -> None:
        self.max_series = max_series
        self.max_bytes = max_bytes
        self.families: dict[str, _Family] = {}
        self.num_series = 0
        #: The estimate of the table's size that ``max_bytes`` bounds.
        self.num_bytes = 0
        #: Rows or series dropped, for the log's one warning per name.
        self.dropped = 0
        #: Metric name -> [the first reason a record of it was dropped, how many were],
        #: for the first ``MAX_DROPPED_NAMES`` names (``GetMetrics`` passes them on).
        self.dropped_by_name: dict[str, list[Any]] = {}

    def report(self, rows: Any) -> None:
        if not isinstance(rows, list):
            self._drop("?", f"a report of {type(rows).__name__}, not a list of rows")
            return
        for row in rows:
            if not isinstance(row, list) or len(row) != 6:
                self._drop("?", "a row that is not [name, kind, description, tag_keys, boundaries, series]")
                continue
            name, kind, description, tag_keys, boundaries, items = row
            if kind not in KINDS:
                self._drop(str(name)[:200], f"unknown kind {str(kind)[:20]!r}")
                continue
            problem = check_definition(name, description, tag_keys, boundaries, kind)
            if problem is not None or not isinstance(items, list):
                self._drop(str(name)[:200], problem or "its series are not a list")
                continue
            family = self.families.get(name)
            if family is None:
                cost = _SERIES_OVERHEAD + len(name) + len(description) + sum(map(len, tag_keys))
                if len(self.families) >= self.max_series or self.num_bytes + cost > self.max_bytes:
                    self._drop(name, f"the GCS holds {len(self.families)} metrics ({self.num_bytes} bytes) already")
                    continue
                self.num_bytes += cost
                family = self.families[name] = _Family(
                    kind, description, list(tag_keys), [float(b) for b in boundaries] if boundaries else None)
            elif family.kind != kind or family.tag_keys != list(tag_keys) or (
                    kind == HISTOGRAM and family.boundaries != [float(b) for b in boundaries]):
                self._drop(name, f"reported as a {kind} with tag_keys {list(tag_keys)} (and boundaries "
                                 f"{boundaries}), first seen as a {family.kind} with {family.tag_keys} "
                                 f"({family.boundaries}); one name is one metric")
                continue
            for item in items:
                self._apply(name, family, item)

    def _apply(self, name: str, family: _Family, item: Any) -> None:
        if not isinstance(item, list) or len(item) != 2 or not isinstance(item[0], list) \
                or len(item[0]) != len(family.tag_keys) \
                or not all(isinstance(v, str) and len(v) <= MAX_TAG_VALUE for v in item[0]):
            self._drop(name, "a series whose tag values do not match its tag keys")
            return
        values, value = tuple(item[0]), item[1]
        series = family.series
        have = series.get(values)
        if family.kind == HISTOGRAM:
            if not _histogram_value(value, len(family.boundaries) + 1):  # type: ignore[arg-type]
                self._drop(name, "a histogram series that is not [bucket counts, sum]")
                return
        elif isinstance(value, bool) or not isinstance(value, (int, float)) \
                or (family.kind == COUNTER and not (value > 0 and value != math.inf)):
            self._drop(name, f"a {family.kind} value of {str(value)[:40]}")
            return
        if have is None:
            cost = _SERIES_OVERHEAD + sum(map(len, values))
            if self.num_series >= self.max_series or self.num_bytes + cost > self.max_bytes:
                self._drop(name, f"the GCS holds {self.num_series} series ({self.num_bytes} bytes) already "
                                 f"(metrics_max_series={self.max_series})")
                return
            self.num_series += 1
            self.num_bytes += cost
            series[values] = [list(value[0]), float(value[1])] if family.kind == HISTOGRAM else float(value)
        elif family.kind == COUNTER:
            series[values] = have + value
        elif family.kind == GAUGE:
            series[values] = float(value)
        else:
            counts = have[0]
            for i, n in enumerate(value[0]):
                counts[i] += n
            have[1] += value[1]

    def _drop(self, name: str, why: str) -> None:
        self.dropped += 1
        seen = self.dropped_by_name.get(name)
        if seen is not None:
            seen[1] += 1
        elif len(self.dropped_by_name) < MAX_DROPPED_NAMES:
            self.dropped_by_name[name] = [why, 1]
            logger.warning("metric %r: dropped %s (further drops for it are not logged)", name, why)

    def rows(self) -> list[list[Any]]:
        """Every metric and its series, totals for counters and histograms."""
        return [[name, f.kind, f.description, f.tag_keys, f.boundaries,
                 [[list(values), value] for values, value in f.series.items()]]
                for name, f in self.families.items()]

    def answer(self) -> list[Any]:
        """``GetMetrics``'s answer: ``[rows, dropped]``, ``dropped`` ``[[name, first reason, count], ...]``."""
        return [self.rows(), [[name, why, n] for name, (why, n) in self.dropped_by_name.items()]]


def _histogram_value(value: Any, buckets: int) -> bool:
    if not isinstance(value, list) or len(value) != 2 or not isinstance(value[0], list) or len(value[0]) != buckets:
        return False
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in value[0]):
        return False
    return not isinstance(value[1], bool) and isinstance(value[1], (int, float))
