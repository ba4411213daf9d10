"""Pickling as lumos does it, for front ends and user code that ship values themselves.

``dumps`` is ``cloudpickle.dumps`` (protocol 5 by default, out-of-band buffers through
``buffer_callback``), except that code pickled by value keeps its file name, so tracebacks
from a function defined in a notebook cell or a script still point at it.
"""

from __future__ import annotations

from lumos._private.serialization import cloudpickle_dumps as dumps

__all__ = ["dumps"]
