"""``label_selector`` (Ray's option) places tasks and actors on the nodes whose labels
meet it: ``"value"``, ``"!value"``, ``"in(a, b)"``, ``"!in(a, b)"``. A request no node
meets waits, as an infeasible one does. Three real nodes: a head without labels, and two
labelled ones."""

from __future__ import annotations

from typing import Any, Iterator

import pytest

import lumos
from lumos.testing import Cluster
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


def _nodes_of(selector: dict[str, str], n: int = 6) -> set[str]:
    return set(lumos.get([where.options(label_selector=selector).remote() for _ in range(n)], timeout=60))


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
        where.options(label_selector={"zone": "a"}, scheduling_strategy="SPREAD").remote()


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
