"""``label_selector`` (Ray's option) places tasks and actors on the nodes whose labels
meet it: ``"value"``, ``"!value"``, ``"in(a, b)"``, ``"!in(a, b)"``; ``fallback_strategy``
names the selectors to try next, and ``NodeLabelSchedulingStrategy`` says the same with
``In``/``NotIn``/``Exists``/``DoesNotExist``, hard and soft. A request no node meets
waits, as an infeasible one does. Three real nodes: a head without labels, and two
labelled ones."""

from __future__ import annotations

import time
from typing import Any, Iterator

import pytest

import lumos
from lumos.testing import Cluster
from lumos.util.scheduling_strategies import (DoesNotExist, Exists, In, NodeAffinitySchedulingStrategy,
                                              NodeLabelSchedulingStrategy, NotIn)
from tests.conftest import TEST_CONFIG, check_no_leaks, wait_for

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]


@pytest.fixture(scope="module")
def three_nodes() -> Iterator[dict[str, str]]:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "_system_config": dict(TEST_CONFIG)})
    try:
        a = cluster.add_node(num_cpus=1, labels={"zone": "a", "accelerator": "h100"})
        b = cluster.add_node(num_cpus=1, labels={"zone": "b"})
        cluster.connect()
        yield {"head": cluster.head_node.node_id, "a": a.node_id, "b": b.node_id}
    finally:
        cluster.shutdown()
        check_no_leaks(cluster.session_dir)


@lumos.remote(num_cpus=0.1)
def where() -> str:
    return lumos.get_runtime_context().get_node_id()


@lumos.remote(num_cpus=0.1)
class Resident:
    def where(self) -> str:
        return lumos.get_runtime_context().get_node_id()

    def labels(self) -> dict[str, str]:
        return lumos.get_runtime_context().get_node_labels()


def _nodes_of(selector: dict[str, str], n: int = 6, **options: Any) -> set[str]:
    return set(lumos.get([where.options(label_selector=selector, **options).remote() for _ in range(n)],
                         timeout=60))


def _nodes_by_strategy(hard: dict[str, Any], soft: dict[str, Any] | None = None, n: int = 6,
                       num_cpus: float = 0.1) -> set[str]:
    f = where.options(scheduling_strategy=NodeLabelSchedulingStrategy(hard, soft=soft), num_cpus=num_cpus)
    return set(lumos.get([f.remote() for _ in range(n)], timeout=60))


def test_tasks_run_only_where_the_labels_meet_the_selector(three_nodes: dict[str, str]) -> None:
    assert _nodes_of({"zone": "a"}) == {three_nodes["a"]}
    assert _nodes_of({"zone": "in(b, c)"}) == {three_nodes["b"]}
    assert _nodes_of({"zone": "a", "accelerator": "h100"}) == {three_nodes["a"]}
    # A negated condition is met by a node with another value, and by one without the label.
    assert _nodes_of({"zone": "!a"}, 12) <= {three_nodes["head"], three_nodes["b"]}
    assert _nodes_of({"zone": "!in(a, b)"}) == {three_nodes["head"]}
    # Ray's option name through .options() and the decorator alike.
    on_b = lumos.remote(num_cpus=0.1, label_selector={"zone": "b"})(lambda: lumos.get_runtime_context().get_node_id())
    assert lumos.get(on_b.remote(), timeout=60) == three_nodes["b"]


def test_an_actor_is_placed_where_its_selector_is_met(three_nodes: dict[str, str]) -> None:
    actor = Resident.options(label_selector={"zone": "b"}).remote()
    assert lumos.get(actor.where.remote(), timeout=60) == three_nodes["b"]
    assert lumos.get(actor.labels.remote(), timeout=60) == {"zone": "b", "ray.io/node-id": three_nodes["b"]}
    lumos.kill(actor)
    # Ray's default label of every node: its id.
    assert _nodes_of({"ray.io/node-id": three_nodes["head"]}, 2) == {three_nodes["head"]}


def test_a_selector_no_node_meets_waits_and_others_go_on(three_nodes: dict[str, str], capfd: Any) -> None:
    stuck = where.options(label_selector={"zone": "nowhere"}).remote()
    ready, _ = lumos.wait([stuck], timeout=1.0)
    assert ready == []
    assert _nodes_of({"zone": "a"}, 2) == {three_nodes["a"]}
    # The warning says what the request waits for: a node with such labels, not resources.
    seen = ""

    def warned() -> bool:
        nonlocal seen
        seen += capfd.readouterr().err
        return "label_selector={'zone': 'nowhere'}, but no node does" in seen
    wait_for(warned, 30, 0.1)
    lumos.cancel(stuck)
    with pytest.raises(lumos.exceptions.TaskCancelledError):
        lumos.get(stuck, timeout=30)


def test_selectors_lumos_cannot_read_are_refused_at_once() -> None:
    with pytest.raises(ValueError, match="a condition is"):
        where.options(label_selector={"zone": "in()"})
    with pytest.raises(ValueError, match="a condition is"):
        where.options(label_selector={"zone": "a b"})
    with pytest.raises(TypeError, match="str -> str"):
        where.options(label_selector={"zone": 1})
    with pytest.raises(ValueError, match="default strategy"):
        where.options(label_selector={"zone": "a"},
                      scheduling_strategy=NodeAffinitySchedulingStrategy("ab" * 16, soft=True)).remote()


def test_a_selector_with_spread_spreads_over_the_nodes_it_allows(three_nodes: dict[str, str]) -> None:
    @lumos.remote(num_cpus=0.1)
    def slow_where() -> str:
        time.sleep(0.2)  # (all in flight at once: spread, not reused leases)
        return lumos.get_runtime_context().get_node_id()
    spread = slow_where.options(label_selector={"zone": "in(a, b)"}, scheduling_strategy="SPREAD")
    got = lumos.get([spread.remote() for _ in range(6)], timeout=60)
    assert set(got) == {three_nodes["a"], three_nodes["b"]}, got
    # (SPREAD balances all its placements: which of the allowed nodes an actor gets
    # depends on the spread so far)
    actors = [Resident.options(label_selector={"zone": "!b"}, scheduling_strategy="SPREAD").remote()
              for _ in range(3)]
    assert set(lumos.get([a.where.remote() for a in actors], timeout=60)) <= {three_nodes["head"], three_nodes["a"]}
    for a in actors:
        lumos.kill(a)


def test_fallback_selectors_are_tried_in_order(three_nodes: dict[str, str]) -> None:
    # No node is in zone c: the first fallback some node meets is taken.
    fallbacks = [{"label_selector": {"zone": "c"}}, {"label_selector": {"zone": "b"}},
                 {"label_selector": {"zone": "a"}}]
    assert _nodes_of({"zone": "c"}, fallback_strategy=fallbacks) == {three_nodes["b"]}
    # The selector itself wins when a node meets it.
    assert _nodes_of({"zone": "a"}, fallback_strategy=fallbacks) == {three_nodes["a"]}
    # A fallback whose nodes are too small for the request does not count as met.
    assert _nodes_of({"zone": "c"}, 2, num_cpus=1,
                     fallback_strategy=[{"label_selector": {"zone": "b", "nothing": "here"}},
                                        {"label_selector": {"accelerator": "h100"}}]) == {three_nodes["a"]}
    actor = Resident.options(label_selector={"zone": "nowhere"},
                             fallback_strategy=[{"label_selector": {"accelerator": "h100"}}]).remote()
    assert lumos.get(actor.where.remote(), timeout=60) == three_nodes["a"]
    lumos.kill(actor)


def test_node_label_strategy_hard_conditions(three_nodes: dict[str, str]) -> None:
    assert _nodes_by_strategy({"zone": In("a", "b")}, n=12) <= {three_nodes["a"], three_nodes["b"]}
    assert _nodes_by_strategy({"accelerator": Exists()}) == {three_nodes["a"]}
    assert _nodes_by_strategy({"zone": DoesNotExist()}) == {three_nodes["head"]}
    assert _nodes_by_strategy({"zone": NotIn("a")}, n=12) <= {three_nodes["head"], three_nodes["b"]}
    assert _nodes_by_strategy({"zone": Exists(), "accelerator": DoesNotExist()}) == {three_nodes["b"]}
    actor = Resident.options(scheduling_strategy=NodeLabelSchedulingStrategy({"zone": In("b")})).remote()
    assert lumos.get(actor.where.remote(), timeout=60) == three_nodes["b"]
    lumos.kill(actor)


def _settle(three_nodes: dict[str, str], b_cpu: float = 1) -> None:
    """Wait until the labelled nodes report what the next placement is to see: a's CPU
    free, b's ``b_cpu``, no lease request waiting (the GCS places by those reports)."""
    def settled() -> bool:
        rows = {r["node_id"]: r for r in lumos.state.list_nodes()}
        a, b = rows[three_nodes["a"]], rows[three_nodes["b"]]
        return (a["resources_available"].get("CPU") == 1 and b["resources_available"].get("CPU") == b_cpu
                and a["pending_leases"] == 0 and b["pending_leases"] == 0)
    wait_for(settled, 30, 0.05)
    # The GCS counts its placements of the last 50 ms before a node's report as not yet
    # in it; the next reports (every 200 ms here) take them in.
    time.sleep(3 * TEST_CONFIG["heartbeat_interval_ms"] / 1000)


def test_node_label_strategy_prefers_soft_conditions(three_nodes: dict[str, str]) -> None:
    _settle(three_nodes)
    assert _nodes_by_strategy({"zone": Exists()}, soft={"zone": In("b")}) == {three_nodes["b"]}
    assert _nodes_by_strategy({}, soft={"accelerator": Exists()}) == {three_nodes["a"]}
    # Soft conditions no node meets: any node meeting the hard ones.
    assert _nodes_by_strategy({"zone": In("a")}, soft={"zone": In("b")}) == {three_nodes["a"]}
    # The soft-preferred node has no room now while another meeting the hard conditions
    # has: the task runs there instead of waiting (as in Ray).
    holder = Resident.options(num_cpus=1, label_selector={"zone": "b"}).remote()
    assert lumos.get(holder.where.remote(), timeout=60) == three_nodes["b"]
    try:
        _settle(three_nodes, b_cpu=0)
        assert _nodes_by_strategy({"zone": Exists()}, soft={"zone": In("b")}, n=1, num_cpus=1) == {three_nodes["a"]}
    finally:
        lumos.kill(holder)


def test_node_label_strategy_refusals() -> None:
    with pytest.raises(ValueError, match="cannot both be empty"):
        NodeLabelSchedulingStrategy({})
    with pytest.raises(ValueError, match="must be In, NotIn, Exists or DoesNotExist"):
        NodeLabelSchedulingStrategy({"zone": "a"})
    with pytest.raises(ValueError, match="at least one value"):
        In()
    with pytest.raises(ValueError, match="must be a str"):
        NotIn("a", 1)
    with pytest.raises(ValueError, match="only 'label_selector'"):
        where.options(fallback_strategy=[{"num_cpus": 1}])
    with pytest.raises(TypeError, match="fallback_strategy must be a list"):
        where.options(fallback_strategy={"label_selector": {"zone": "a"}})
    with pytest.raises(ValueError, match="a condition is"):
        where.options(fallback_strategy=[{"label_selector": {"zone": "in()"}}])
    with pytest.raises(ValueError, match="default strategy"):
        where.options(label_selector={"zone": "a"},
                      scheduling_strategy=NodeLabelSchedulingStrategy({"zone": In("a")})).remote()


def test_label_conditions_as_the_schedulers_read_them() -> None:
    from lumos._private.protocol import messages as m
    from lumos.util.scheduling_strategies import label_selector_to_wire
    wire = label_selector_to_wire({"zone": "!in(a, b)", "tier": "gpu"})
    assert wire == ["LABELS", [["zone", True, ["a", "b"]], ["tier", False, ["gpu"]]]]
    conditions: Any = m.label_conditions_of(wire)
    assert m.labels_match({"tier": "gpu"}, conditions)
    assert m.labels_match({"tier": "gpu", "zone": "c"}, conditions)
    assert not m.labels_match({"tier": "gpu", "zone": "a"}, conditions)
    assert not m.labels_match({"zone": "c"}, conditions)
    assert label_selector_to_wire({}) is None and label_selector_to_wire(None) is None
    # Exists / DoesNotExist: values None.
    strategy = NodeLabelSchedulingStrategy({"gpu": Exists(), "old": DoesNotExist()}, soft={"zone": In("a")})
    wire = strategy.to_wire()
    assert wire == ["LABELS", [["gpu", False, None], ["old", True, None]], [["zone", False, ["a"]]], []]
    assert m.labels_match({"gpu": "x"}, wire[1]) and not m.labels_match({"gpu": "x", "old": "1"}, wire[1])
    assert not m.labels_match({}, wire[1])
    assert m.label_soft_of(wire) == [["zone", False, ["a"]]]
    assert m.label_soft_of(label_selector_to_wire({"a": "b"})) == []
    fb = label_selector_to_wire({"zone": "c"}, [{"label_selector": {"zone": "b"}}])
    assert m.label_choices_of(fb) == [[["zone", False, ["c"]]], [["zone", False, ["b"]]]]
    assert m.label_choices_of(["SPREAD"]) is None


def test_the_gcs_pick_with_soft_conditions_and_fallbacks() -> None:
    from lumos._private.gcs.global_scheduler import GlobalSchedulerState, NodeView
    from lumos._private.protocol import messages as m
    from lumos._private.raylet.resources import to_units
    from lumos.util.scheduling_strategies import label_selector_to_wire

    def node(name: bytes, labels: dict[str, str], free: float, total: float = 1) -> NodeView:
        return NodeView(name, m.Address(name, b"", "", "127.0.0.1", 1), {"CPU": to_units(total)},
                        {"CPU": to_units(free)}, 0, 0.0, labels)

    def pick(nodes: list[NodeView], strategy: Any, cpu: float = 1) -> bytes | None:
        # (a fresh state each time: no earlier placement weighs on the next)
        return GlobalSchedulerState(heartbeat_interval_s=0.2).pick(
            nodes, m.ScheduleLease(b"job", {"CPU": cpu}, strategy, "f", b"elsewhere"), now=0.0)

    soft_b = NodeLabelSchedulingStrategy({"zone": Exists()}, soft={"zone": In("b")}).to_wire()
    a_free, b_free = node(b"a", {"zone": "a"}, 1), node(b"b", {"zone": "b"}, 1)
    a_busy, b_busy = node(b"a", {"zone": "a"}, 0), node(b"b", {"zone": "b"}, 0)
    assert pick([a_free, b_free], soft_b) == b"b"
    assert pick([a_free, b_busy], soft_b) == b"a"  # the preferred one has no room: one that has
    assert pick([a_busy, b_busy], soft_b) == b"b"  # none has room: wait on the preferred one
    # Fallbacks: the first selector a node able to run the request meets.
    fb = label_selector_to_wire({"zone": "c"}, [{"label_selector": {"zone": "b"}},
                                                 {"label_selector": {"zone": "a"}}])
    assert pick([a_free, b_busy], fb) == b"b"
    assert pick([a_free, node(b"b", {"zone": "b"}, 0.5, total=0.5)], fb) == b"a"  # b too small
    assert pick([node(b"h", {}, 1)], fb) is None


def test_placement_group_bundles_go_where_their_selectors_hold(three_nodes: dict[str, str]) -> None:
    from lumos.util import placement_group, placement_group_table, remove_placement_group
    from lumos.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    pg = placement_group([{"CPU": 0.1}, {"CPU": 0.1}], strategy="SPREAD",
                         bundle_label_selector=[{"zone": "b"}, {"accelerator": "h100"}])
    assert pg.wait(30)
    assert placement_group_table(pg)["bundles_to_node_id"] == {0: three_nodes["b"], 1: three_nodes["a"]}
    in_0 = where.options(num_cpus=0.1, scheduling_strategy=PlacementGroupSchedulingStrategy(pg, 0))
    assert lumos.get(in_0.remote(), timeout=60) == three_nodes["b"]
    remove_placement_group(pg)
    # PACK keeps the bundles together where every selector holds (a node without any
    # labels would do for the second, but not for both).
    pg = placement_group([{"CPU": 0.1}, {"CPU": 0.1}], strategy="PACK",
                         bundle_label_selector=[{"zone": "!a"}, {"zone": "in(a, b)"}])
    assert pg.wait(30)
    assert placement_group_table(pg)["bundles_to_node_id"] == {0: three_nodes["b"], 1: three_nodes["b"]}
    remove_placement_group(pg)
    # No node meets it: pending, and the table says why.
    pg = placement_group([{"CPU": 0.1}], bundle_label_selector=[{"zone": "nowhere"}])
    assert not pg.wait(1)
    state = placement_group_table(pg)["stats"]["scheduling_detail"]
    assert "infeasible" in state and "zone in (nowhere)" in state, state
    remove_placement_group(pg)


def test_bundle_label_selector_refusals() -> None:
    from lumos.util import placement_group
    with pytest.raises(ValueError, match="one label selector per bundle"):
        placement_group([{"CPU": 0.1}, {"CPU": 0.1}], bundle_label_selector=[{"zone": "a"}])
    with pytest.raises(ValueError, match="a condition is"):
        placement_group([{"CPU": 0.1}], bundle_label_selector=[{"zone": "in()"}])
    with pytest.raises(TypeError, match="str -> str"):
        placement_group([{"CPU": 0.1}], bundle_label_selector=[{"zone": 1}])


def test_plan_bundles_with_labels() -> None:
    from lumos._private.gcs.placement_group_state import plan_bundles
    nodes = [(b"h", {"CPU": 4}), (b"a", {"CPU": 4}), (b"b", {"CPU": 4})]
    labels = {b"a": {"zone": "a"}, b"b": {"zone": "b"}}
    cond_a, cond_b = [["zone", False, ["a"]]], [["zone", False, ["b"]]]
    bundles = [{"CPU": 1}, {"CPU": 1}]
    assert plan_bundles("STRICT_SPREAD", bundles, [0, 1], {}, nodes, [cond_b, cond_a], labels) == {0: b"b", 1: b"a"}
    assert plan_bundles("STRICT_PACK", bundles, [0, 1], {}, nodes, [cond_b, []], labels) == {0: b"b", 1: b"b"}
    assert plan_bundles("STRICT_PACK", bundles, [0, 1], {}, nodes, [cond_b, cond_a], labels) is None
    assert plan_bundles("PACK", bundles, [0, 1], {}, nodes, [cond_a, []], labels) == {0: b"a", 1: b"a"}
    assert plan_bundles("SPREAD", bundles, [0, 1], {}, nodes, [[], []], labels) in ({0: b"h", 1: b"a"},
                                                                                  {0: b"a", 1: b"h"})
