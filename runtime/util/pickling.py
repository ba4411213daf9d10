"""Pickling as lumos does it, for front ends and user code that ship values themselves.

``dumps`` is ``cloudpickle.dumps`` (protocol 5 by default, out-of-band buffers through
``buffer_callback``), except that code pickled by value keeps its file name, so tracebacks
from a function defined in a notebook cell or a script still point at it.
``register_serializer`` and ``deregister_serializer`` are Ray's.
"""

from __future__ import annotations

from typing import Any, Callable

from lumos._private import serialization as _ser
from lumos._private.serialization import cloudpickle_dumps as dumps


def register_serializer(cls: type, *, serializer: Callable[[Any], Any],
                        deserializer: Callable[[Any], Any]) -> None:
    """Ray's ``ray.util.register_serializer``: values of exactly ``cls`` that this process
    sends (``put``, arguments, returns) go as ``serializer(value)``, rebuilt by
    ``deserializer``, which travels with them (pickled, by value when it is not
    importable), so the receiving process needs no registration of its own. As in Ray,
    the registration is this process's: a task that returns such values registers it
    itself (at its module's import, say). It wins over the class's ``__reduce__`` and
    over lumos's own handling (torch tensors), which ``deregister_serializer`` brings
    back.

    Raises:
        TypeError: ``cls`` is not a class, or a function is not callable.
    """
    if not callable(serializer) or not callable(deserializer):
        raise TypeError("register_serializer needs callable serializer= and deserializer=")

    def reduce(value: Any) -> tuple:
        return deserializer, (serializer(value),)

    _ser.register_reduction(cls, reduce)


def deregister_serializer(cls: type) -> None:
    """Ray's ``ray.util.deregister_serializer``: ``cls`` pickles as before; nothing if it
    has no serializer."""
    _ser.unregister_reduction(cls)


__all__ = ["dumps", "register_serializer", "deregister_serializer"]
