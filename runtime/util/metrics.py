"""Application metrics (Ray's ``ray.util.metrics``): ``Counter``, ``Gauge`` and
``Histogram``, recorded from the driver, tasks and actors and gathered cluster-wide by
the GCS.

Each process reports what it recorded at most once per ``metrics_report_interval_ms``
(1 s), and at once when it exits or asks for the metrics itself. Across processes a
counter's and a histogram's series add up (a process that exited keeps its part); a
gauge keeps the last value any process set for that tag set. Read them with
``lumos.state.metrics()``, as Prometheus text with ``lumos.state.prometheus_text()``,
or scrape the dashboard's ``/metrics`` (see the README, "Metrics").

Example:
    >>> from lumos.util.metrics import Counter
    >>> served = Counter("requests_served", description="Requests served.", tag_keys=("route",))
    >>> served.inc(tags={"route": "/predict"})
"""

from __future__ import annotations

import math
import numbers
from typing import Any

from lumos._private.metrics import BUFFER, COUNTER, GAUGE, HISTOGRAM, MAX_TAG_VALUE, check_definition

__all__ = ["Metric", "Counter", "Gauge", "Histogram"]


class Metric:
    """What ``Counter``, ``Gauge`` and ``Histogram`` share: a name, a description, the tag
    keys every record must give a value for (or take from ``set_default_tags``).

    Raises (at construction): ``ValueError`` for an invalid or reserved (``lumos_...``)
    name, invalid tag keys, or a name this process already defined as another kind or
    with other tag keys or boundaries; ``TypeError`` when ``tag_keys`` is not a tuple of
    str.
    """

    _kind = ""

    def __init__(self, name: str, description: str = "", tag_keys: tuple[str, ...] | None = None) -> None:
        self._init(name, description, tag_keys, None)

    def _init(self, name: str, description: str, tag_keys: tuple[str, ...] | None,
              boundaries: list[float] | None) -> None:
        tag_keys = tuple() if tag_keys is None else tag_keys
        if not isinstance(tag_keys, tuple):
            raise TypeError(f"tag_keys must be a tuple, got {type(tag_keys).__name__}")
        for key in tag_keys:
            if not isinstance(key, str):
                raise TypeError(f"tag keys must be str, got {type(key).__name__}")
        if isinstance(name, str) and not name:
            raise ValueError("a metric needs a name")
        if not isinstance(description, str):
            raise TypeError(f"description must be a str, got {type(description).__name__}")
        problem = check_definition(name, description, tag_keys, boundaries, self._kind)
        if problem is not None:
            raise ValueError(problem)
        BUFFER.define(self._kind, name, description, tag_keys, boundaries)
        self._name = name
        self._description = description
        self._tag_keys = tag_keys
        self._default_tags: dict[str, str] = {}

    def set_default_tags(self, default_tags: dict[str, str]) -> "Metric":
        """Tag values every record uses unless it gives its own; returns the metric itself.

        Raises:
            ValueError: a key is not one of ``tag_keys``.
            TypeError: a value is not a str.
        """
        self._check_tags(default_tags, "default_tags")
        self._default_tags = dict(default_tags)
        return self

    @property
    def info(self) -> dict[str, Any]:
        """The metric's name, description, tag_keys and default_tags."""
        return {"name": self._name, "description": self._description, "tag_keys": self._tag_keys,
                "default_tags": self._default_tags}

    def _values(self, tags: dict[str, str] | None) -> tuple[str, ...]:
        """The record's tag values in ``tag_keys`` order: ``tags`` over the defaults."""
        if tags:
            # A record's keys beyond tag_keys are left out, as Ray leaves them (only
            # set_default_tags refuses them); a crash here would end an instrumented loop.
            self._check_tags(tags, "tags", known_only=False)
            merged = {**self._default_tags, **tags}
        else:
            merged = self._default_tags
        try:
            return tuple(merged[key] for key in self._tag_keys)
        except KeyError:
            missing = [key for key in self._tag_keys if key not in merged]
            raise ValueError(f"missing value for tag key(s): {', '.join(missing)}") from None

    def _check_tags(self, tags: Any, what: str, known_only: bool = True) -> None:
        if not isinstance(tags, dict):
            raise TypeError(f"{what} must be a dict, got {type(tags).__name__}")
        for key, value in tags.items():
            if key not in self._tag_keys:
                if not known_only:
                    continue
                raise ValueError(f"unrecognized tag key {key!r}; this metric's tag_keys are {self._tag_keys!r}")
            if not isinstance(value, str):
                raise TypeError(f"tag values must be str, got {type(value).__name__} for {key!r}")
            if len(value) > MAX_TAG_VALUE:
                raise ValueError(f"the value of tag {key!r} is {len(value)} characters long; at most {MAX_TAG_VALUE}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._name!r}, tag_keys={self._tag_keys!r})"


def _check_value(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"value must be int or float, got {type(value).__name__}")
    return float(value)


class Counter(Metric):
    """A total that only grows (Prometheus's counter, exported as ``<name>_total``); the
    increments of every process add up."""

    _kind = COUNTER

    def inc(self, value: float = 1.0, tags: dict[str, str] | None = None) -> None:
        """Add ``value`` (> 0, default 1); ``tags`` override the default tags.

        Raises:
            TypeError: ``value`` is not a number or a tag value not a str.
            ValueError: ``value`` is not > 0 and finite, a tag key is unknown or a tag missing.
        """
        v = _check_value(value)
        if not v > 0 or v == math.inf:
            raise ValueError(f"value must be > 0 and finite, got {value!r}")
        BUFFER.record(COUNTER, self._name, self._values(tags), v)

    def __reduce__(self) -> Any:
        return _rebuild, (Counter, (self._name, self._description, self._tag_keys), self._default_tags)


class Gauge(Metric):
    """A value that goes up and down (Prometheus's gauge): the last one set, by any
    process, for each tag set."""

    _kind = GAUGE

    def set(self, value: float | None, tags: dict[str, str] | None = None) -> None:
        """Set the gauge to ``value``; ``tags`` override the default tags. ``None`` sets
        nothing (as in Ray).

        Raises:
            TypeError: ``value`` is not a number or a tag value not a str.
            ValueError: a tag key is unknown or a tag missing.
        """
        if value is None:
            return
        BUFFER.record(GAUGE, self._name, self._values(tags), _check_value(value))

    def __reduce__(self) -> Any:
        return _rebuild, (Gauge, (self._name, self._description, self._tag_keys), self._default_tags)


class Histogram(Metric):
    """Counts of observed values in buckets (Prometheus's histogram: ``_bucket``,
    ``_sum`` and ``_count``), added up over every process.

    Args:
        boundaries: the buckets' upper bounds, increasing, each > 0 (a last bucket
            above them is added).
    """

    _kind = HISTOGRAM

    def __init__(self, name: str, description: str = "", boundaries: list[float] | None = None,
                 tag_keys: tuple[str, ...] | None = None) -> None:
        if boundaries is None or (isinstance(boundaries, (list, tuple)) and len(boundaries) == 0):
            raise ValueError("a Histogram needs boundaries, e.g. Histogram('latency_s', boundaries=[0.01, 0.1, 1.0])")
        if not isinstance(boundaries, (list, tuple)):
            raise TypeError(f"boundaries must be a list of numbers, got {type(boundaries).__name__}")
        self.boundaries = [float(b) if isinstance(b, numbers.Real) and not isinstance(b, bool) else b
                           for b in boundaries]
        self._init(name, description, tag_keys, self.boundaries)

    def observe(self, value: float, tags: dict[str, str] | None = None) -> None:
        """Count ``value`` in its bucket; ``tags`` override the default tags.

        Raises:
            TypeError: ``value`` is not a number or a tag value not a str.
            ValueError: ``value`` is NaN, a tag key is unknown or a tag missing.
        """
        v = _check_value(value)
        if v != v:
            raise ValueError("value must not be NaN")
        BUFFER.record(HISTOGRAM, self._name, self._values(tags), v, self.boundaries)

    @property
    def info(self) -> dict[str, Any]:
        """As ``Metric.info``, with the boundaries."""
        return {**super().info, "boundaries": self.boundaries}

    def __reduce__(self) -> Any:
        return _rebuild, (Histogram, (self._name, self._description, self.boundaries, self._tag_keys),
                          self._default_tags)


def _rebuild(cls: type, args: tuple[Any, ...], default_tags: dict[str, str]) -> Metric:
    """A metric sent to another process (a task's argument, an actor's attribute): the same
    definition there, with its default tags."""
    return cls(*args).set_default_tags(default_tags)
