"""Arguments checked at the call site, as Ray does: ``f.remote(1, 2, 3)`` for a function
of two parameters raises ``TypeError`` from ``.remote()``, not later from ``get()`` (the
task would have been sent, run and failed on a worker).

A function's signature is kept as a ``Spec``, a tuple of ``(name, kind, has_default)``
per parameter (plain data: actor handles carry their methods' specs to any process,
without the defaults themselves). The usual call, positional arguments within range, is
checked with two comparisons; anything else goes through ``inspect.Signature.bind``.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

#: ``(name, inspect.Parameter kind as an int, has a default)`` per parameter.
Spec = tuple[tuple[str, int, bool], ...]

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def spec_of(fn: Any, drop_first: bool = False) -> Spec | None:
    """``fn``'s parameters (without the first with ``drop_first``: a method's ``self``);
    None when Python cannot tell (some builtins and C functions): such calls are not checked."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    params = list(sig.parameters.values())
    if drop_first:
        if not params or params[0].kind not in _POSITIONAL:
            return None  # (``def m(*args)`` as a method: nothing to drop)
        params = params[1:]
    return tuple((p.name, int(p.kind), p.default is not inspect.Parameter.empty) for p in params)


def _unchecked(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    return None


class _Checker:
    __slots__ = ("name", "least", "most", "positional_ok", "sig")

    def __init__(self, name: str, spec: Spec) -> None:
        self.name = name
        positional = [s for s in spec if s[1] in (0, 1)]
        self.least = sum(1 for s in positional if not s[2])
        self.most = None if any(s[1] == inspect.Parameter.VAR_POSITIONAL for s in spec) else len(positional)
        # Positional arguments alone satisfy it unless a keyword-only parameter has no default.
        self.positional_ok = not any(s[1] == inspect.Parameter.KEYWORD_ONLY and not s[2] for s in spec)
        self.sig = inspect.Signature([inspect.Parameter(n, inspect._ParameterKind(k),
                                                        default=None if d else inspect.Parameter.empty)
                                      for n, k, d in spec])

    def __call__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if not kwargs and self.positional_ok and self.least <= len(args) and \
                (self.most is None or len(args) <= self.most):
            return
        try:
            self.sig.bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"{self.name}() {e}") from None


def checker(name: str, spec: Spec | None) -> Callable[[tuple[Any, ...], dict[str, Any]], None]:
    """A callable that raises ``TypeError`` (naming ``name``) when ``(args, kwargs)`` do not
    fit ``spec``; one that checks nothing when the spec is unknown."""
    if spec is None:
        return _unchecked
    try:
        return _Checker(name, spec)
    except (TypeError, ValueError):  # a spec Python itself would not build: leave it unchecked
        return _unchecked


__all__ = ["Spec", "spec_of", "checker"]
