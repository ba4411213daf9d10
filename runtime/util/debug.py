"""Ray's small ``ray.util`` helpers for logging once and checking what pickles."""

from __future__ import annotations

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


def inspect_serializability(base_obj: Any, name: str | None = None, depth: int = 3,
                            print_file: Any = None) -> tuple[bool, set[Any]]:
    """Whether ``base_obj`` pickles as lumos sends it (cloudpickle), and the members that
    do not: ``(ok, {(name, type_name), ...})``, looking ``depth`` levels into attributes,
    closures and containers. Prints a short report to ``print_file`` when given."""
    import cloudpickle
    failures: set[tuple[str, str]] = set()

    def fails(obj: Any) -> bool:
        try:
            cloudpickle.dumps(obj)
        except Exception:
            return True
        return False

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

    def walk(obj: Any, label: str, level: int) -> None:
        if not fails(obj):
            return
        bad_children = [(n, c) for n, c in children(obj) if fails(c)] if level < depth else []
        if not bad_children:
            failures.add((label, type(obj).__name__))
        for n, c in bad_children:
            walk(c, n, level + 1)

    label = name or getattr(base_obj, "__name__", type(base_obj).__name__)
    walk(base_obj, label, 0)
    if print_file is not None:
        print(f"{label}: {'serializable' if not failures else 'not serializable'}"
              + "".join(f"\n  cannot pickle {n} ({t})" for n, t in sorted(failures)), file=print_file)
    return not failures, failures


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


__all__ = ["log_once", "disable_log_once_globally", "enable_periodic_logging", "inspect_serializability"]
