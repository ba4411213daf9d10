"""Application metrics (``lumos.util.metrics``): the API's checks, a process's buffer, the
GCS's table against malformed reports, and real drivers, tasks and actors whose records
add up cluster-wide and read back as valid Prometheus text."""

from __future__ import annotations

import math
import pickle
import time
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

import lumos
from lumos._private import metrics as pm
from lumos._private.gcs.metrics import MetricsTable
from lumos.util.metrics import Counter, Gauge, Histogram
from tests.conftest import wait_for


def families(text: str) -> dict[str, Any]:
    """Prometheus's own parser over the exposition: a malformed line raises."""
    return {f.name: f for f in text_string_to_metric_families(text)}


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


def series_of(name: str) -> list[dict[str, Any]]:
    for row in lumos.state.metrics():
        if row["name"] == name:
            return row["series"]
    return []


# --------------------------------------------------------------------------- the API


class TestApi:
    def test_bad_definitions_are_refused_with_the_reason(self) -> None:
        with pytest.raises(ValueError, match="needs a name"):
            Counter("")
        with pytest.raises(ValueError, match="invalid metric name"):
            Counter("1bad")
        with pytest.raises(ValueError, match="invalid metric name"):
            Gauge("has space")
        with pytest.raises(ValueError, match="cluster's own"):
            Gauge("lumos_nodes")
        with pytest.raises(TypeError, match="tag_keys must be a tuple"):
            Counter("api_c1", tag_keys=["a"])  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="tag keys must be str"):
            Counter("api_c2", tag_keys=(1,))  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="invalid tag key"):
            Counter("api_c3", tag_keys=("le",))
        with pytest.raises(ValueError, match="repeat"):
            Counter("api_c4", tag_keys=("a", "a"))
        with pytest.raises(ValueError, match="needs boundaries"):
            Histogram("api_h1")
        with pytest.raises(ValueError, match="needs boundaries"):
            Histogram("api_h2", boundaries=[])
        with pytest.raises(ValueError, match="> 0"):
            Histogram("api_h3", boundaries=[0.0, 1.0])
        with pytest.raises(ValueError, match="increase"):
            Histogram("api_h4", boundaries=[2.0, 1.0])

    def test_one_name_is_one_metric_in_a_process(self) -> None:
        Counter("api_same", tag_keys=("a",))
        Counter("api_same", description="again", tag_keys=("a",))  # the same definition: fine
        with pytest.raises(ValueError, match="already defined"):
            Gauge("api_same", tag_keys=("a",))
        with pytest.raises(ValueError, match="already defined"):
            Counter("api_same", tag_keys=("b",))
        Histogram("api_same_h", boundaries=[1.0])
        with pytest.raises(ValueError, match="already defined"):
            Histogram("api_same_h", boundaries=[2.0])

    def test_bad_records_are_refused_and_record_nothing(self) -> None:
        c = Counter("api_rec", tag_keys=("route",))
        before = pm.BUFFER.take()
        with pytest.raises(ValueError, match="missing value for tag key"):
            c.inc()
        with pytest.raises(TypeError, match="tag values must be str"):
            c.inc(tags={"route": 3})  # type: ignore[dict-item]
        with pytest.raises(ValueError, match="> 0"):
            c.inc(0, tags={"route": "/a"})
        with pytest.raises(ValueError, match="> 0"):
            c.inc(-1, tags={"route": "/a"})
        with pytest.raises(TypeError, match="int or float"):
            c.inc("1", tags={"route": "/a"})  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="int or float"):
            Gauge("api_rec_g").set(True)
        with pytest.raises(ValueError, match="NaN"):
            Histogram("api_rec_h", boundaries=[1.0]).observe(math.nan)
        with pytest.raises(ValueError, match="unrecognized tag key"):
            c.set_default_tags({"nope": "x"})
        Gauge("api_rec_g").set(None)  # sets nothing, as in Ray
        assert pm.BUFFER.take() == []
        # A record's undeclared keys are left out, as Ray leaves them (they failed here).
        c.inc(tags={"route": "/a", "worker": "3"})
        assert [r[5] for r in pm.BUFFER.take() if r[0] == "api_rec"] == [[[["/a"], 1]]]
        pm.BUFFER.put_back(before)

    def test_default_tags_info_and_pickling(self) -> None:
        g = Gauge("api_g", description="d", tag_keys=("a", "b"))
        assert g.set_default_tags({"a": "1"}) is g
        assert g.info == {"name": "api_g", "description": "d", "tag_keys": ("a", "b"), "default_tags": {"a": "1"}}
        h = Histogram("api_hh", boundaries=[1, 2], tag_keys=("a",)).set_default_tags({"a": "x"})
        assert h.info["boundaries"] == [1.0, 2.0]
        for metric in (g, h, Counter("api_cc", tag_keys=("a",)).set_default_tags({"a": "y"})):
            copy = pickle.loads(pickle.dumps(metric))
            assert type(copy) is type(metric) and copy.info == metric.info


class TestBuffer:
    def test_counters_sum_gauges_keep_the_last_histograms_bucket(self) -> None:
        b = pm.Buffer()
        woken: list[int] = []
        b.wake = lambda: woken.append(1)
        b.define(pm.COUNTER, "c", "", ("k",), None)
        b.define(pm.GAUGE, "g", "", (), None)
        b.define(pm.HISTOGRAM, "h", "", (), [1.0, 10.0])
        b.record(pm.COUNTER, "c", ("a",), 1.0)
        b.record(pm.COUNTER, "c", ("a",), 2.5)
        b.record(pm.COUNTER, "c", ("b",), 1.0)
        b.record(pm.GAUGE, "g", (), 5.0)
        b.record(pm.GAUGE, "g", (), -2.0)
        for v in (0.5, 1.0, 3.0, 11.0, math.inf):
            b.record(pm.HISTOGRAM, "h", (), v, [1.0, 10.0])
        assert woken == [1], "only the first record after a report wakes the reporter"
        rows = {r[0]: r for r in b.take()}
        assert sorted(map(tuple, (s for s in rows["c"][5]))) == [(["a"], 3.5), (["b"], 1.0)]
        assert rows["g"][5] == [[[], -2.0]]
        assert rows["h"][4] == [1.0, 10.0] and rows["h"][5] == [[[], [[2, 1, 2], math.inf]]]
        assert b.take() == [] and not b.pending()
        b.record(pm.GAUGE, "g", (), 1.0)
        assert woken == [1, 1]

    def test_put_back_merges_with_what_came_since(self) -> None:
        b = pm.Buffer()
        b.define(pm.COUNTER, "c", "", (), None)
        b.define(pm.GAUGE, "g", "", (), None)
        b.define(pm.HISTOGRAM, "h", "", (), [1.0])
        b.record(pm.COUNTER, "c", (), 2.0)
        b.record(pm.GAUGE, "g", (), 1.0)
        b.record(pm.HISTOGRAM, "h", (), 0.5, [1.0])
        taken = b.take()
        b.record(pm.COUNTER, "c", (), 3.0)
        b.record(pm.GAUGE, "g", (), 9.0)
        b.record(pm.HISTOGRAM, "h", (), 5.0, [1.0])
        b.put_back(taken)
        rows = {r[0]: r[5] for r in b.take()}
        assert rows == {"c": [[[], 5.0]], "g": [[[], 9.0]], "h": [[[], [[1, 1], 5.5]]]}

    def test_a_process_holds_a_bounded_number_of_series(self) -> None:
        b = pm.Buffer()
        b.define(pm.COUNTER, "c", "", ("k",), None)
        with pytest.warns(RuntimeWarning, match="records of new ones are dropped"):
            for i in range(pm.MAX_PROCESS_SERIES + 5):
                b.record(pm.COUNTER, "c", (str(i),), 1.0)
        assert b.dropped == 5
        assert len(b.take()[0][5]) == pm.MAX_PROCESS_SERIES

    def test_bucket_is_the_first_bound_not_exceeded(self) -> None:
        bounds = [1.0, 2.0, 5.0]
        assert [pm._bucket(bounds, v) for v in (-1, 0.5, 1.0, 1.5, 2.0, 5.0, 5.1)] == [0, 0, 0, 1, 1, 2, 3]


class TestGcsTable:
    def test_reports_add_up(self) -> None:
        t = MetricsTable(100)
        t.report([["c", "counter", "d", ["k"], None, [[["a"], 1.0]]]])
        t.report([["c", "counter", "d", ["k"], None, [[["a"], 2.0], [["b"], 1.0]]]])
        t.report([["g", "gauge", "", [], None, [[[], 1.0]]]])
        t.report([["g", "gauge", "", [], None, [[[], -3.0]]]])
        t.report([["h", "histogram", "", [], [1.0], [[[], [[1, 0], 0.5]]]]])
        t.report([["h", "histogram", "", [], [1.0], [[[], [[0, 2], 7.0]]]]])
        rows = {r[0]: r[5] for r in t.rows()}
        assert sorted(rows["c"]) == [[["a"], 3.0], [["b"], 1.0]]
        assert rows["g"] == [[[], -3.0]]
        assert rows["h"] == [[[], [[1, 2], 7.5]]]

    @pytest.mark.parametrize("report", [
        None, 3, "x", [None], [[]], [["c"]], [[1, "counter", "", [], None, []]],
        [["c", "bogus", "", [], None, []]], [["c", "counter", 5, [], None, []]],
        [["c", "counter", "", "k", None, []]], [["c", "counter", "", [1], None, []]],
        [["c", "counter", "", [], [1.0], []]], [["c", "counter", "", [], None, "x"]],
        [["c", "counter", "", [], None, [None, [[], "x"], [[], -1.0], [[], math.inf], [["extra"], 1.0],
                                          [[], True], [[1], 1.0], [[]]]]],
        [["h", "histogram", "", [], None, []]], [["h", "histogram", "", [], [-1.0], []]],
        [["h", "histogram", "", [], [1.0], [[[], [[1], 1.0]], [[], [[1, -1], 1.0]], [[], [[1, 1], "s"]],
                                             [[], [[1.5, 1], 1.0]], [[], 3.0]]]],
        [["lumos_nodes", "gauge", "", [], None, [[[], 1.0]]]],
        [["x" * 10_000, "gauge", "", [], None, [[[], 1.0]]]],
        [["g", "gauge", "", ["k"], None, [[["v" * 5_000], 1.0]]]],
    ])
    def test_malformed_reports_are_dropped_never_raise(self, report: Any) -> None:
        t = MetricsTable(100)
        t.report(report)
        assert t.rows() == [] or all(r[5] == [] for r in t.rows())
        assert t.dropped >= 1
        rows, dropped = t.answer()
        assert dropped and all(isinstance(why, str) and n >= 1 for _, why, n in dropped)

    def test_a_conflicting_definition_is_dropped_the_first_kept(self) -> None:
        t = MetricsTable(100)
        t.report([["m", "counter", "", ["k"], None, [[["a"], 1.0]]]])
        t.report([["m", "gauge", "", ["k"], None, [[["a"], 5.0]]],
                  ["m", "counter", "", ["j"], None, [[["a"], 5.0]]],
                  ["m", "counter", "", ["k"], None, [[["a"], 1.0]]]])
        assert t.rows() == [["m", "counter", "", ["k"], None, [[["a"], 2.0]]]]
        assert t.dropped == 2

    def test_series_past_the_bound_are_dropped(self) -> None:
        t = MetricsTable(3)
        t.report([["m", "gauge", "", ["k"], None, [[[str(i)], 1.0] for i in range(5)]]])
        assert len(t.rows()[0][5]) == 3 and t.dropped == 2
        t.report([["m", "gauge", "", ["k"], None, [[["0"], 7.0]]]])  # a known series still updates
        assert [["0"], 7.0] in t.rows()[0][5]


    def test_metrics_and_their_strings_are_bounded_too(self) -> None:
        t = MetricsTable(5)
        t.report([[f"m{i}", "gauge", "", [], None, []] for i in range(8)])  # metrics with no series yet
        assert len(t.families) == 5 and t.dropped == 3
        t = MetricsTable(1000, max_bytes=10_000)
        t.report([["m", "gauge", "", ["k"], None, [[[str(i) * 300], 1.0] for i in range(100)]]])
        assert t.num_bytes <= 10_000 and 0 < t.num_series < 100


def test_prometheus_text_escapes_and_parses() -> None:
    rows = [["odd", "gauge", 'a "quoted"\nhelp \\ here', ["k"], None, [[['v"1\n\\'], 1.5], [["x"], math.nan]]],
            ["req", "counter", "", [], None, [[[], 3.0]]],
            ["req2_total", "counter", "", [], None, [[[], 1.0]]],
            ["lat", "histogram", "", ["k"], [0.1, 1.0], [[["a"], [[1, 2, 3], 9.5]]]]]
    text = pm.render_prometheus(rows, [], [], [], [])
    fams = families(text)
    assert fams["odd"].documentation == 'a "quoted"\nhelp \\ here'
    assert samples(text, "odd")[(("k", 'v"1\n\\'),)] == 1.5
    assert math.isnan(samples(text, "odd")[(("k", "x"),)])
    assert samples(text, "req_total") == {(): 3.0}
    assert samples(text, "req2_total") == {(): 1.0}
    buckets = samples(text, "lat_bucket")
    assert [buckets[(("k", "a"), ("le", le))] for le in ("0.1", "1.0", "+Inf")] == [1, 3, 6]
    assert samples(text, "lat_count") == {(("k", "a"),): 6} and samples(text, "lat_sum") == {(("k", "a"),): 9.5}


# --------------------------------------------------------------------------- a real cluster


@lumos.remote
def served(n: int) -> int:
    c = Counter("t_served", description="Requests served.", tag_keys=("route",)).set_default_tags({"route": "/task"})
    for _ in range(n):
        c.inc()
    Histogram("t_latency_s", boundaries=[0.01, 0.1]).observe(n / 100)
    return n


@lumos.remote(max_calls=1)
def once_then_exit() -> None:
    Counter("t_exits").inc(5)


@lumos.remote
class Meter:
    def __init__(self, name: str) -> None:
        self.depth = Gauge("t_depth", tag_keys=("meter",)).set_default_tags({"meter": name})

    def set(self, value: float) -> None:
        self.depth.set(value)

    def leave(self) -> None:
        Counter("t_leaving").inc()
        lumos.actor.exit_actor()


def test_records_of_every_process_add_up(cluster: Any) -> None:
    Counter("t_served", description="Requests served.", tag_keys=("route",)).inc(3, tags={"route": "/driver"})
    assert sum(lumos.get([served.remote(n) for n in range(1, 11)])) == 55
    meters = [Meter.remote("a"), Meter.remote("b")]
    lumos.get([meters[0].set.remote(1.0), meters[1].set.remote(2.0)])
    lumos.get(meters[0].set.remote(4.0))
    # The driver's own records are in at once; the workers' within their report interval.
    want = {"/driver": 3.0, "/task": 55.0}
    wait_for(lambda: {s["tags"]["route"]: s["value"] for s in series_of("t_served")} == want, 10)
    wait_for(lambda: {s["tags"]["meter"]: s["value"] for s in series_of("t_depth")} == {"a": 4.0, "b": 2.0}, 10)
    wait_for(lambda: len(series_of("t_latency_s")) == 1 and series_of("t_latency_s")[0]["count"] == 10, 10)
    (hist,) = series_of("t_latency_s")
    assert hist["buckets"] == [(0.01, 1), (0.1, 10), (math.inf, 10)] and hist["sum"] == pytest.approx(0.55)
    text = lumos.state.prometheus_text()
    assert samples(text, "t_served_total") == {(("route", "/driver"),): 3.0, (("route", "/task"),): 55.0}
    assert samples(text, "t_depth") == {(("meter", "a"),): 4.0, (("meter", "b"),): 2.0}
    fams = families(text)
    assert fams["t_served"].type == "counter" and fams["t_served"].documentation == "Requests served."
    assert fams["t_latency_s"].type == "histogram"
    assert samples(text, "lumos_nodes")[(("state", "ALIVE"),)] == 1
    (cpu,) = [v for k, v in samples(text, "lumos_node_resources_total").items() if ("resource", "CPU") in k]
    assert cpu == 2
    assert samples(text, "lumos_actors")[(("state", "ALIVE"),)] >= 2
    assert samples(text, "lumos_jobs")[(("state", "RUNNING"),)] >= 1
    assert list(samples(text, "lumos_object_store_capacity_bytes").values())[0] > 0
    for m in meters:
        lumos.kill(m)


def test_a_process_that_exits_reports_first(cluster: Any) -> None:
    """A worker that exits right after its task (max_calls) and an actor that calls
    exit_actor still deliver what they recorded: the exit's flush reports it."""
    lumos.get([once_then_exit.remote() for _ in range(3)])
    meter = Meter.remote("leaving")
    with pytest.raises(lumos.exceptions.RayActorError):
        lumos.get(meter.leave.remote())
    wait_for(lambda: [s["value"] for s in series_of("t_exits")] == [15.0], 10)
    wait_for(lambda: [s["value"] for s in series_of("t_leaving")] == [1.0], 10)


def test_records_are_batched_one_report_per_interval(cluster: Any) -> None:
    from lumos._private import worker_context
    cw = worker_context.require()
    c = Counter("t_batched", tag_keys=("k",))
    lumos.state.metrics()
    before = cw.metrics_reports
    t0 = time.monotonic()
    n = 0
    while time.monotonic() - t0 < 1.5:
        for i in range(1000):
            c.inc(tags={"k": str(i % 3)})
        n += 1000
    # 1.5 s of records: reports one interval (1 s) apart, not one per record.
    wait_for(lambda: sum(s["value"] for s in series_of("t_batched")) == n, 10)
    assert cw.metrics_reports - before <= 4, (cw.metrics_reports - before, n)


def test_conflicting_definitions_across_processes_keep_the_first(cluster: Any) -> None:
    Counter("t_conflict", tag_keys=("k",)).inc(tags={"k": "a"})
    lumos.state.metrics()

    @lumos.remote
    def other() -> None:
        Gauge("t_conflict").set(3.0)  # another kind under the same name, in another process
    lumos.get(other.remote())
    time.sleep(1.5)  # past the worker's report
    with pytest.warns(UserWarning, match=r"dropped 1 record\(s\) of metric 't_conflict': reported as a gauge"):
        rows = [r for r in lumos.state.metrics() if r["name"] == "t_conflict"]
    assert len(rows) == 1 and rows[0]["kind"] == "counter" and rows[0]["series"] == [{"tags": {"k": "a"},
                                                                                    "value": 1.0}]
    text = lumos.state.prometheus_text()  # still one valid exposition; warned once per process
    assert samples(text, "lumos_metrics_dropped_total")[(("metric", "t_conflict"),)] == 1
