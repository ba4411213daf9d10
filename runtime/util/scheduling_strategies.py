"""Scheduling strategies, with Ray's names and fields."""

from __future__ import annotations

import re
from typing import Any


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
        if self.placement_group is None or getattr(self.placement_group, "is_empty", False):
            # (PlacementGroup.empty() too, as in Ray.) Not None: that would let a capturing
            # parent's group apply.
            return ["DEFAULT"]
        return ["PG", self.placement_group.id.binary(), self.placement_group_bundle_index,
                bool(self.placement_group_capture_child_tasks)]


def _operator_values(values: tuple[Any, ...], operator: str) -> list[str]:
    if not values:
        raise ValueError(f"{operator}() needs at least one value: e.g. {operator}(\"value1\", \"value2\")")
    for i, v in enumerate(values):
        if not isinstance(v, str):
            raise ValueError(f"value {i} of {operator}() must be a str (e.g. {operator}(\"value1\")), "
                             f"got {v!r} of type {type(v).__name__}")
    return list(values)


class In:
    """A node label condition: the label is one of ``values``."""

    def __init__(self, *values: str) -> None:
        self.values = _operator_values(values, "In")

    def __repr__(self) -> str:
        return f"In({', '.join(map(repr, self.values))})"


class NotIn:
    """A node label condition: the label is none of ``values`` (or the node has no such label)."""

    def __init__(self, *values: str) -> None:
        self.values = _operator_values(values, "NotIn")

    def __repr__(self) -> str:
        return f"NotIn({', '.join(map(repr, self.values))})"


class Exists:
    """A node label condition: the node has the label, whatever its value."""

    def __repr__(self) -> str:
        return "Exists()"


class DoesNotExist:
    """A node label condition: the node does not have the label."""

    def __repr__(self) -> str:
        return "DoesNotExist()"


def _expressions_to_wire(expressions: Any, param: str) -> list[list[Any]]:
    """``{label: In(...) | NotIn(...) | Exists() | DoesNotExist()}`` as wire conditions
    ``[key, negated, values]`` (``values`` None: the label exists)."""
    if expressions is None:
        return []
    if not isinstance(expressions, dict):
        raise ValueError(f"the {param} parameter must be a dict (e.g. {{\"key1\": In(\"value1\")}}), "
                         f"got {type(expressions).__name__}")
    out: list[list[Any]] = []
    for key, op in expressions.items():
        if not isinstance(key, str):
            raise ValueError(f"the keys of the {param} parameter must be str (label names), got {key!r}")
        if isinstance(op, (In, NotIn)):
            out.append([key, isinstance(op, NotIn), list(op.values)])
        elif isinstance(op, (Exists, DoesNotExist)):
            out.append([key, isinstance(op, DoesNotExist), None])
        else:
            raise ValueError(f"the value for label {key!r} of the {param} parameter must be In, NotIn, Exists "
                             f"or DoesNotExist (e.g. {{\"key1\": In(\"value1\")}}), got {op!r}")
    return out


class NodeLabelSchedulingStrategy:
    """Run on a node whose labels meet every ``hard`` condition, preferring one that also
    meets the ``soft`` ones (any node meeting ``hard`` when none of those can run it now).

        NodeLabelSchedulingStrategy({"region": In("us-east", "us-west"), "gpu": Exists()},
                                    soft={"zone": NotIn("busy")})
    """

    def __init__(self, hard: dict[str, Any], *, soft: dict[str, Any] | None = None) -> None:
        self.hard = hard
        self.soft = soft
        self._hard = _expressions_to_wire(hard, "hard")
        self._soft = _expressions_to_wire(soft, "soft")
        if not (self._hard or self._soft):
            raise ValueError("the hard and soft parameters of NodeLabelSchedulingStrategy cannot both be empty")

    def __repr__(self) -> str:
        # Also a cache key of ``.options()`` templates: every condition is in it.
        return f"NodeLabelSchedulingStrategy(hard={self.hard!r}, soft={self.soft!r})"

    def to_wire(self) -> list[Any]:
        return ["LABELS", self._hard, self._soft, []]


def label_selector_to_wire(selector: Any, fallback_strategy: Any = None, spread: bool = False) -> list[Any] | None:
    """``label_selector`` (Ray's: node label -> ``"value"``, ``"!value"``, ``"in(a, b)"`` or
    ``"!in(a, b)"``) as the strategy sent in task specs: ``["LABELS", [[key, negated,
    [values]], ...]]``; None for an empty one. With ``fallback_strategy`` (Ray's: a list
    of ``{"label_selector": {...}}``, tried in order when no node meets the ones before):
    ``["LABELS", conditions, [], [fallback conditions, ...]]``. ``spread`` (with
    ``scheduling_strategy="SPREAD"``): ``["LABELS", conditions, [], fallbacks, True]``.

    Raises:
        TypeError: not a dict of str -> str.
        ValueError: a condition lumos cannot read; a fallback that is not ``{"label_selector": ...}``.
    """
    fallbacks = _fallbacks_to_wire(fallback_strategy)
    if not selector and not fallbacks:
        return None
    conditions = _selector_conditions(selector, "label_selector")
    if spread:
        return ["LABELS", conditions, [], fallbacks, True]
    return ["LABELS", conditions, [], fallbacks] if fallbacks else ["LABELS", conditions]


def _selector_conditions(selector: Any, what: str) -> list[list[Any]]:
    if not selector:
        return []
    if not isinstance(selector, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                 for k, v in selector.items()):
        raise TypeError(f"{what} must be a dict of label -> condition (str -> str), got {selector!r}")
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
            raise ValueError(f"{what} {{{key!r}: {text!r}}}: a condition is 'value', '!value', "
                             "'in(a, b)' or '!in(a, b)', each value letters, digits, '-', '_' and '.'")
        conditions.append([key, negated, values])
    return conditions


def _fallbacks_to_wire(fallback_strategy: Any) -> list[list[list[Any]]]:
    if fallback_strategy is None:
        return []
    if not isinstance(fallback_strategy, list):
        raise TypeError(f"fallback_strategy must be a list of dicts such as {{'label_selector': {{...}}}}, "
                        f"got {fallback_strategy!r}")
    out = []
    for i, entry in enumerate(fallback_strategy):
        if not isinstance(entry, dict) or not entry:
            raise ValueError(f"fallback_strategy[{i}] must be a non-empty dict such as "
                             f"{{'label_selector': {{...}}}}, got {entry!r}")
        for option in entry:
            if option != "label_selector":
                raise ValueError(f"fallback_strategy[{i}] has option {option!r}: only 'label_selector' is "
                                 "supported there (as in Ray)")
        out.append(_selector_conditions(entry["label_selector"], f"fallback_strategy[{i}]['label_selector']"))
    return out


_LABEL_VALUE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?")


def strategy_to_wire(strategy: Any) -> Any:
    """The strategy as sent in task specs: None, ["SPREAD"], ["NODE", ...], ["PG", ...],
    ["LABELS", ...] or ["DEFAULT"] (default placement, never captured into a parent's
    placement group)."""
    if strategy is None:
        return None
    if strategy == "DEFAULT":  # as in Ray: said outright, a capturing parent's group does not apply
        return ["DEFAULT"]
    if strategy == "SPREAD":
        return ["SPREAD"]
    if isinstance(strategy, (NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy)):
        return strategy.to_wire()
    if isinstance(strategy, NodeLabelSchedulingStrategy):
        return strategy.to_wire()
    raise ValueError(f"unknown scheduling_strategy {strategy!r}; use 'DEFAULT', 'SPREAD', "
                     "NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy or "
                     "NodeLabelSchedulingStrategy")


__all__ = ["NodeAffinitySchedulingStrategy", "PlacementGroupSchedulingStrategy", "NodeLabelSchedulingStrategy",
           "In", "NotIn", "Exists", "DoesNotExist"]
