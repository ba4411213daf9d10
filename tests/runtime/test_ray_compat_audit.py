"""The Ray compatibility table (docs/ray-compatibility.md) is complete and true.

Every row's status is checked against lumos: "yes" rows exist with Ray's parameters,
"partial"/"ignored" rows exist, and "no" rows fail with an error that names the Ray
feature and the lumos alternative. Where ``ray`` is installed, the rows must be exactly
Ray's public surface (walked by ``ray_surface.ray_rows``), so the table cannot drift.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Callable

import pytest

import lumos
from lumos import options as opts_mod

from tests.runtime import ray_surface

TABLE = ray_surface.read_table()

#: A value other than the default for each option lumos refuses.
_REFUSED_OPTION_VALUES: dict[str, Any] = {
    "label_selector": {"region": "us-west"},
    "object_store_memory": 1024, "allow_out_of_order_execution": True, "enable_tensor_transport": True,
}
#: How to reach each refused function parameter without a cluster.
_REFUSED_PARAM_CALLS: dict[str, Callable[[], Any]] = {
    "ray.util.placement_group(topology_strategy)":
        lambda: lumos.util.placement_group([{"CPU": 1}], topology_strategy="RING"),
    "ray.util.placement_group.placement_group(topology_strategy)":
        lambda: lumos.util.placement_group([{"CPU": 1}], topology_strategy="RING"),
    "ray.method(tensor_transport)": lambda: lumos.method(tensor_transport="nccl"),
    "ray.util.state.get_log(attempt_number)": lambda: lumos.util.state.get_log(node_id="a" * 32, attempt_number=1),
    "ray.util.state.get_log(filename)": lambda: lumos.util.state.get_log(node_id="a" * 32, filename="raylet.out"),
    "ray.util.state.get_log(filter_ansi_code)":
        lambda: lumos.util.state.get_log(node_id="a" * 32, filter_ansi_code=True),
    "ray.util.state.get_log(follow)": lambda: lumos.util.state.get_log(node_id="a" * 32, follow=True),
    "ray.util.state.get_log(node_ip)": lambda: lumos.util.state.get_log(node_ip="127.0.0.1"),
    "ray.util.state.get_log(submission_id)": lambda: lumos.util.state.get_log(submission_id="raysubmit_1"),
}


def test_table_rows_are_well_formed() -> None:
    assert len(TABLE) > 400
    for row, (status, note) in TABLE.items():
        assert row.startswith("ray."), row
        assert status in ray_surface.STATUSES, f"{row}: status {status!r}"
        if status != "yes":
            assert note, f"{row}: a {status!r} row says why in its note"


def test_table_lists_exactly_rays_public_surface() -> None:
    ray = pytest.importorskip("ray", reason="ray is not installed: the rows are checked against lumos only")
    walked = set(ray_surface.ray_rows(ray))
    assert sorted(walked - set(TABLE)) == [], "Ray names missing from docs/ray-compatibility.md"
    assert sorted(set(TABLE) - walked) == [], "rows of docs/ray-compatibility.md that Ray no longer has"


@pytest.mark.parametrize("row", [r for r, (s, _) in TABLE.items() if s == "yes"])
def test_supported_row_exists_in_lumos(row: str) -> None:
    ok, why = ray_surface.lumos_has(row)
    assert ok, f"{row} is 'yes' in the table but {why}"


@pytest.mark.parametrize("row", [r for r, (s, _) in TABLE.items() if s in ("partial", "ignored")])
def test_partial_or_ignored_row_exists_in_lumos(row: str) -> None:
    path, param, kind = ray_surface.split_row(row)
    if kind is not None or (param is None):
        ok, why = ray_surface.lumos_has(row)
        assert ok, f"{row}: {why}"
    else:
        ray_surface._callable_at(lumos, ray_surface.lumos_path(path))  # the function exists


def _refusal(row: str) -> BaseException:
    """The error lumos raises where a Ray program uses what ``row`` names."""
    path, param, kind = ray_surface.split_row(row)
    if row in _REFUSED_PARAM_CALLS:
        try:
            _REFUSED_PARAM_CALLS[row]()
        except Exception as e:
            return e
        raise AssertionError(f"{row}: no error")
    if kind in ("task", "actor"):
        with pytest.raises(NotImplementedError) as info:
            opts_mod.validate({param: _REFUSED_OPTION_VALUES[param]}, opts_mod.TASK if kind == "task"
                              else opts_mod.ACTOR)
        return info.value
    if path == "ray.init":
        if lumos.is_initialized():
            pytest.skip("a cluster is up in this process")
        assert param is not None
        with pytest.raises(NotImplementedError) as info:
            lumos.init(**{param: True})
        return info.value
    parent, _, name = ray_surface.lumos_path(path).rpartition(".")
    try:
        holder = ray_surface._resolve(lumos, parent)
        obj = getattr(holder, name)
    except AttributeError as e:
        return e
    with pytest.raises(NotImplementedError) as info:
        if inspect.isclass(holder) and inspect.isfunction(obj):
            obj(None)  # a method: a stand-in self is enough, it refuses before using it
        else:
            obj()
    return info.value


@pytest.mark.parametrize("row", [r for r, (s, _) in TABLE.items() if s == "no"])
def test_unsupported_row_fails_naming_the_ray_feature_and_the_alternative(row: str) -> None:
    err = _refusal(row)
    status, note = TABLE[row]
    text = str(err)
    kind = note.split(" ", 1)[0].rstrip(":")
    assert type(err).__name__ == kind or isinstance(err, getattr(__builtins__, kind, ())), \
        f"{row}: the table says {kind}, lumos raised {type(err).__name__}: {text}"
    if isinstance(err, TypeError):
        _, param, _ = ray_surface.split_row(row)
        assert param and param in text, f"{row}: {text}"
        return
    assert "not implemented in lumos" in text, f"{row}: {type(err).__name__}: {text}"
    assert "; " in text.split("not implemented in lumos", 1)[1], f"{row}: no alternative named: {text}"


def test_unsupported_names_fail_on_use_not_on_import() -> None:
    # Ray programs import these at the top; they must fail where they are used.
    from lumos.util import connect  # noqa: F401
    from lumos.util.state import StateApiClient, get_log, list_logs  # noqa: F401
    with pytest.raises(NotImplementedError, match="StateApiClient is not implemented in lumos"):
        StateApiClient()
    importlib.import_module("lumos.util.state")
