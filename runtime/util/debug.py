"""Ray's small ``ray.util`` helpers for logging once and checking what pickles."""

from __future__ import annotations

import sys
import threading
from typing import Any

_seen: set[str] = set()
_lock = threading.Lock()
_disabled = False


def log_once(key: str) -> bool:
    """True the first time it is called with ``key`` in this process, then False (to log
    a message once)."""
    with _lock:
        if _disabled:
            return False
        if key in _seen:
            return False
        _seen.add(key)
        return True


def disable_log_once_globally() -> None:
    """Make every later ``log_once`` return False."""
    global _disabled
    _disabled = True


def enable_periodic_logging() -> None:
    """Make ``log_once`` return True again for keys already seen (once more each)."""
    with _lock:
        _seen.clear()


class FailTuple:
    """A member of the object ``inspect_serializability`` was given that does not pickle
    while none of its own members is found failing (Ray's ``FailTuple``): its ``name``
    (attribute, global, closure cell or container index), the object ``obj`` itself and
    the ``parent`` it was found in."""

    __slots__ = ("name", "obj", "parent")

    def __init__(self, obj: Any, name: str, parent: Any) -> None:
        self.obj = obj
        self.name = name
        self.parent = parent

    def __repr__(self) -> str:
        return f"FailTuple({self.name} [obj={self.obj!r}, parent={self.parent!r}])"


def inspect_serializability(base_obj: Any, name: str | None = None, depth: int = 3,
                            print_file: Any = None) -> tuple[bool, set[FailTuple]]:
    """Whether ``base_obj`` pickles as lumos sends it (cloudpickle, with the serializers
    ``register_serializer`` added), and the members that do not: ``(ok, {FailTuple,
    ...})``, looking ``depth`` levels into attributes, closures and containers. Prints a
    report, as Ray's does, to ``print_file`` (a file; stdout when None)."""
    from lumos._private.serialization import _pickles
    failures: set[FailTuple] = set()
    lines: list[str] = []

    def why(obj: Any) -> str | None:
        e = _pickles(obj)
        return None if e is None else f"{type(e).__name__}: {e}"

    def children(obj: Any) -> list[tuple[str, Any]]:
        out: list[tuple[str, Any]] = []
        closure = getattr(obj, "__closure__", None)
        code = getattr(obj, "__code__", None)
        if closure and code is not None:
            out += [(n, c.cell_contents) for n, c in zip(code.co_freevars, closure) if _filled(c)]
        if code is not None:
            glb = getattr(obj, "__globals__", {})
            out += [(n, glb[n]) for n in code.co_names if n in glb]
        if isinstance(obj, dict):
            out += [(repr(k), v) for k, v in obj.items()]
        elif isinstance(obj, (list, tuple, set)):
            out += [(f"[{i}]", v) for i, v in enumerate(obj)]
        elif hasattr(obj, "__dict__") and not isinstance(obj, type):
            out += list(vars(obj).items())
        return out

    def walk(obj: Any, path: list[str], parent: Any, level: int) -> None:
        error = why(obj)
        if error is None:
            return
        lines.append(f"{'  ' * level}{' -> '.join(path)} ({type(obj).__name__}) does not pickle: {error}")
        bad_children = [(n, c) for n, c in children(obj) if why(c) is not None] if level < depth else []
        if not bad_children:
            failures.add(FailTuple(obj, path[-1], parent))
        for n, c in bad_children:
            walk(c, path + [n], obj, level + 1)

    label = name or getattr(base_obj, "__name__", type(base_obj).__name__)
    walk(base_obj, [label], None, 0)
    out = sys.stdout if print_file is None else print_file
    print(f"Checking serializability of {label}: {'serializable' if not failures else 'not serializable'}"
          + "".join(f"\n  {line}" for line in lines), file=out)
    return not failures, failures


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


__all__ = ["log_once", "disable_log_once_globally", "enable_periodic_logging", "inspect_serializability", "FailTuple"]
