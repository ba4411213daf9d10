"""Ray's public API surface, as rows of ``docs/ray-compatibility.md``, and their lumos
counterparts.

Row names:
- ``ray.util.placement_group`` — a public name of an audited module;
- ``ray.util.ActorPool.map`` — a public member of an audited class;
- ``ray.get(timeout)`` — a parameter of a function or method;
- ``ray.remote(num_cpus)[task]``, ``ray.remote(max_restarts)[actor]``, ``ray.method(num_returns)``
  — task, actor and actor-method options.

``ray_rows(ray)`` walks a real ``ray`` module (when installed) with the same rules the
table was written with, so the compatibility test notices when Ray's surface changes.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
from typing import Any

#: Ray 2.60's modules whose public names are audited.
MODULES = ["ray", "ray.actor", "ray.runtime_context", "ray.exceptions", "ray.util",
           "ray.util.scheduling_strategies", "ray.util.placement_group", "ray.util.queue",
           "ray.util.actor_pool", "ray.util.state", "ray.util.metrics"]
#: Classes whose public members (and their parameters) are audited, by Ray path.
CLASSES = ["ray.ObjectRef", "ray.ObjectRefGenerator", "ray.actor.ActorClass", "ray.actor.ActorHandle",
           "ray.actor.ActorMethod", "ray.remote_function.RemoteFunction", "ray.runtime_context.RuntimeContext",
           "ray.util.placement_group.PlacementGroup", "ray.util.queue.Queue", "ray.util.ActorPool",
           "ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy",
           "ray.util.scheduling_strategies.PlacementGroupSchedulingStrategy",
           "ray.util.metrics.Metric", "ray.util.metrics.Counter", "ray.util.metrics.Gauge",
           "ray.util.metrics.Histogram"]
#: Submodules listed in ``ray.__all__`` (separate Ray libraries): one row each, no walk.
_LIBRARIES = {"actor", "autoscaler", "client", "data", "internal", "util", "widgets", "workflow", "_config"}
STATUSES = ("yes", "partial", "ignored", "no")

TABLE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                     "docs", "ray-compatibility.md")
_ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|\s*(\w+)\s*\|(.*)\|\s*$")


def read_table(path: str = TABLE) -> dict[str, tuple[str, str]]:
    """Row name -> (status, note) from the markdown table."""
    rows: dict[str, tuple[str, str]] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            match = _ROW.match(line)
            if match:
                name, status, note = match.group(1), match.group(2), match.group(3).strip()
                if name in rows:
                    raise ValueError(f"row {name!r} appears twice in {path}")
                rows[name] = (status, note)
    return rows


def _public_names(mod: Any, modname: str) -> list[str]:
    names = getattr(mod, "__all__", None)
    if names is not None:
        return sorted({n for n in names if not n.startswith("__")})
    out = []
    for n in dir(mod):
        obj = getattr(mod, n)
        if n.startswith("_") or getattr(obj, "__module__", None) != modname:
            continue
        if getattr(getattr(obj, "_annotated_type", None), "value", None) in ("PublicAPI", "DeveloperAPI"):
            out.append(n)
    return sorted(out)


def _params(fn: Any) -> list[str]:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return []
    return [p.name for p in sig.parameters.values()
            if p.name not in ("self", "cls") and not p.name.startswith("_")
            and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def _resolve(root: Any, path: str) -> Any:
    """``ray.util.ActorPool.map`` -> the object: the longest importable module prefix,
    then attributes."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for p in parts[i:]:
                obj = getattr(obj, p)
        except AttributeError:
            continue
        return obj
    raise AttributeError(f"{path} does not exist")


def _callable_at(root: Any, path: str) -> Any:
    """The function a parameter row names: ``ray.util.placement_group(bundles)`` is the
    function ``ray.util`` exports under that name, not the module of the same name."""
    obj = _resolve(root, path)
    if inspect.ismodule(obj):
        parent, _, name = path.rpartition(".")
        obj = getattr(_resolve(root, parent), name)
    return obj


def ray_rows(ray: Any) -> list[str]:
    """Every row name of Ray's audited surface, walked from the installed ``ray``."""
    rows: list[str] = []
    for modname in MODULES:
        mod = importlib.import_module(modname)
        for n in _public_names(mod, modname):
            rows.append(f"{modname}.{n}")
            if modname == "ray" and n in _LIBRARIES:
                continue  # a separate library, imported lazily: one row, not walked
            obj = getattr(mod, n, None)
            if inspect.isfunction(obj):
                rows += [f"{modname}.{n}({p})" for p in _params(obj)]
    for path in CLASSES:
        cls = _resolve(ray, path)
        for n, member in sorted(vars(cls).items()) if isinstance(vars(cls), dict) else []:
            if n.startswith("_"):
                continue
            rows.append(f"{path}.{n}")
            fn = member.fget if isinstance(member, property) else member
            if inspect.isfunction(fn) and not isinstance(member, property):
                rows += [f"{path}.{n}({p})" for p in _params(fn)]
        if not isinstance(vars(cls), dict) or not any(r.startswith(path + ".") for r in rows):
            for n in dir(cls):  # a Cython class (ObjectRef): its public attributes
                if not n.startswith("_"):
                    rows.append(f"{path}.{n}")
        init = vars(cls).get("__init__") if isinstance(vars(cls), dict) else None
        if inspect.isfunction(init) and path.startswith("ray.util.scheduling_strategies"):
            rows += [f"{path}({p})" for p in _params(init)]
    options = importlib.import_module("ray.actor").ray_option_utils
    rows += [f"ray.remote({o})[task]" for o in sorted(options.task_options) if not o.startswith("_")]
    rows += [f"ray.remote({o})[actor]" for o in sorted(options.actor_options) if not o.startswith("_")]
    src = inspect.getsource(importlib.import_module("ray.actor").method)
    listed = re.search(r"valid_kwargs = \[(.*?)\]", src, re.S)
    assert listed is not None, "ray.method's valid_kwargs moved: update ray_rows()"
    rows += [f"ray.method({o})" for o in re.findall(r'"(\w+)"', listed.group(1)) if not o.startswith("_")]
    return sorted(dict.fromkeys(rows))


# ----------------------------------------------------------------------------- lumos side


def lumos_path(row: str) -> str:
    return "lumos" + row[len("ray"):]


def split_row(row: str) -> tuple[str, str | None, str | None]:
    """``(path, parameter or None, option kind or None)`` of a row name."""
    m = re.match(r"^(.*?)\((\w+)\)(?:\[(task|actor)\])?$", row)
    if m is None:
        return row, None, None
    kind = m.group(3) or ("method" if m.group(1) == "ray.method" else None)
    return m.group(1), m.group(2), kind


def lumos_has(row: str) -> tuple[bool, str]:
    """Whether lumos accepts what the row names (True), or why not."""
    import lumos
    from lumos import actor as actor_mod
    from lumos import options as opts
    path, param, kind = split_row(row)
    if kind in ("task", "actor"):
        opt = opts.OPTIONS.get(param or "")
        ok = opt is not None and (opts.TASK if kind == "task" else opts.ACTOR) in opt.applies
        return ok, "" if ok else f"no {kind} option {param}"
    if kind == "method":
        ok = param in actor_mod._METHOD_OPTIONS
        return ok, "" if ok else f"no method option {param}"
    try:
        obj = (_callable_at if param is not None else _resolve)(lumos, lumos_path(path))
    except (AttributeError, ImportError) as e:
        return False, f"{type(e).__name__}: {e}"
    if param is None:
        return True, ""
    target = obj.__init__ if inspect.isclass(obj) else obj
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError) as e:
        return False, f"no signature: {e}"
    if param in sig.parameters:
        return True, ""
    if obj is lumos.init:  # its **kwargs takes Ray's operational arguments it ignores, by name
        from lumos import api
        ok = param in api._IGNORED_INIT_ARGS
        return ok, "" if ok else f"lumos.init() does not take {param}"
    if any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values()):
        return True, ""
    return False, f"{lumos_path(path)}{sig} has no parameter {param}"
