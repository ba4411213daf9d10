"""Scheduling strategies, with Ray's names and fields."""

from __future__ import annotations

import re
from typing import Any

from lumos._private.compat import missing_class as _missing_class


class NodeAffinitySchedulingStrategy:
    """Run on the node ``node_id`` (hex). ``soft=True`` falls back to other nodes."""

    def __init__(self, node_id: str, soft: bool, _spill_on_unavailable: bool = False,
                 _fail_on_unavailable: bool = False) -> None:
        if not isinstance(node_id, str):
            raise TypeError(f"node_id must be a hex string, not {type(node_id).__name__}")
        try:
            bytes.fromhex(node_id)
        except ValueError:
            raise ValueError(f"node_id {node_id!r} is not a hex node id (see lumos.nodes())") from None
        self.node_id = node_id
        self.soft = bool(soft)
        self._spill_on_unavailable = _spill_on_unavailable
        self._fail_on_unavailable = _fail_on_unavailable

    def __repr__(self) -> str:
        return f"NodeAffinitySchedulingStrategy(node_id={self.node_id!r}, soft={self.soft})"

    def to_wire(self) -> list[Any]:
        return ["NODE", bytes.fromhex(self.node_id), self.soft]


class PlacementGroupSchedulingStrategy:
    """Run inside a placement group's bundle (``-1``: any bundle).

    ``placement_group=None`` (as in Ray) means "in no group": a child of a task whose
    group captures its children runs outside that group.
    """

    def __init__(self, placement_group: Any, placement_group_bundle_index: int = -1,
                 placement_group_capture_child_tasks: bool | None = None) -> None:
        if placement_group is not None and not hasattr(placement_group, "id"):
            raise TypeError("placement_group must be a PlacementGroup from lumos.util.placement_group(), "
                            "or None for no group")
        if not isinstance(placement_group_bundle_index, int):
            raise TypeError("placement_group_bundle_index must be an int")
        self.placement_group = placement_group
        self.placement_group_bundle_index = placement_group_bundle_index
        self.placement_group_capture_child_tasks = placement_group_capture_child_tasks

    def __repr__(self) -> str:
        # Also a cache key of ``.options()`` templates: every field that changes scheduling is in it.
        return (f"PlacementGroupSchedulingStrategy({self.placement_group!r}, "
                f"bundle={self.placement_group_bundle_index}, "
                f"capture_child_tasks={bool(self.placement_group_capture_child_tasks)})")

    def to_wire(self) -> list[Any]:
        if self.placement_group is None:
            return ["DEFAULT"]  # not None: that would let a capturing parent's group apply
        return ["PG", self.placement_group.id.binary(), self.placement_group_bundle_index,
                bool(self.placement_group_capture_child_tasks)]


_NO_LABELS = ("lumos schedules by node labels with the label_selector option only (label -> 'value', "
              "'!value', 'in(a, b)' or '!in(a, b)'); or ask for a custom resource (resources={'name': amount})")
NodeLabelSchedulingStrategy = _missing_class("ray.util.scheduling_strategies.NodeLabelSchedulingStrategy", _NO_LABELS)
In = _missing_class("ray.util.scheduling_strategies.In", _NO_LABELS)
NotIn = _missing_class("ray.util.scheduling_strategies.NotIn", _NO_LABELS)
Exists = _missing_class("ray.util.scheduling_strategies.Exists", _NO_LABELS)
DoesNotExist = _missing_class("ray.util.scheduling_strategies.DoesNotExist", _NO_LABELS)


def label_selector_to_wire(selector: Any) -> list[Any] | None:
    """``label_selector`` (Ray's: node label -> ``"value"``, ``"!value"``, ``"in(a, b)"`` or
    ``"!in(a, b)"``) as the strategy sent in task specs: ``["LABELS", [[key, negated,
    [values]], ...]]``; None for an empty one.

    Raises:
        TypeError: not a dict of str -> str.
        ValueError: a condition lumos cannot read.
    """
    if not selector:
        return None
    if not isinstance(selector, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                 for k, v in selector.items()):
        raise TypeError(f"label_selector must be a dict of label -> condition (str -> str), got {selector!r}")
    conditions = []
    for key, text in selector.items():
        cond = text.strip()
        negated = cond.startswith("!")
        cond = cond[1:].strip() if negated else cond
        if cond.startswith("in(") and cond.endswith(")"):
            values = [v.strip() for v in cond[3:-1].split(",")]
        else:
            values = [cond]
        if not key.strip() or not all(_LABEL_VALUE.fullmatch(v) for v in values):
            raise ValueError(f"label_selector {{{key!r}: {text!r}}}: a condition is 'value', '!value', "
                             "'in(a, b)' or '!in(a, b)', each value letters, digits, '-', '_' and '.'")
        conditions.append([key, negated, values])
    return ["LABELS", conditions]


_LABEL_VALUE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?")


def strategy_to_wire(strategy: Any) -> Any:
    """The strategy as sent in task specs: None, ["SPREAD"], ["NODE", ...], ["PG", ...], or
    ["DEFAULT"] (default placement, never captured into a parent's placement group)."""
    if strategy is None:
        return None
    if strategy == "DEFAULT":  # as in Ray: said outright, a capturing parent's group does not apply
        return ["DEFAULT"]
    if strategy == "SPREAD":
        return ["SPREAD"]
    if isinstance(strategy, (NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy)):
        return strategy.to_wire()
    raise ValueError(f"unknown scheduling_strategy {strategy!r}; use 'DEFAULT', 'SPREAD', "
                     "NodeAffinitySchedulingStrategy or PlacementGroupSchedulingStrategy")


__all__ = ["NodeAffinitySchedulingStrategy", "PlacementGroupSchedulingStrategy", "NodeLabelSchedulingStrategy",
           "In", "NotIn", "Exists", "DoesNotExist"]
