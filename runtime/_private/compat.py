"""Stand-ins for Ray API that lumos does not implement (docs/ray-compatibility.md).

Each raises ``NotImplementedError`` naming the Ray feature and what to use in lumos, so
a Ray program fails at the line that needs the feature, with a way forward.
"""

from __future__ import annotations

from typing import Any, Callable


def not_implemented_error(ray_name: str, instead: str) -> NotImplementedError:
    return NotImplementedError(f"{ray_name} is not implemented in lumos; {instead}")


def missing_function(ray_name: str, instead: str) -> Callable[..., Any]:
    """A function that raises ``NotImplementedError`` for ``ray_name`` when called."""
    def missing(*args: Any, **kwargs: Any) -> Any:
        raise not_implemented_error(ray_name, instead)
    missing.__name__ = ray_name.rsplit(".", 1)[-1]
    missing.__qualname__ = missing.__name__
    missing.__doc__ = f"Not implemented in lumos ({ray_name}): {instead}."
    return missing


def missing_class(ray_name: str, instead: str) -> type:
    """A class whose construction raises ``NotImplementedError`` for ``ray_name``."""
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        raise not_implemented_error(ray_name, instead)
    name = ray_name.rsplit(".", 1)[-1]
    return type(name, (), {"__init__": __init__, "__doc__": f"Not implemented in lumos ({ray_name}): {instead}.",
                           "__module__": "lumos"})
