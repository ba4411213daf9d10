"""Native thread-pool limits from a task's environment variables (``OMP_NUM_THREADS``…).

BLAS and OpenMP libraries read ``OMP_NUM_THREADS``/``OPENBLAS_NUM_THREADS``/… once, when
they are loaded. A worker forked from the fork server has numpy (and its OpenBLAS)
loaded before any task runs, so a ``runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}}``
set per task would come too late. ``apply`` sets the loaded pools to the limits those
variables ask for (through threadpoolctl) and returns a ``Limits`` whose ``restore``
puts every pool back: one loaded before the task to its size then, one loaded during
the task to the size it would have without the task's variables (the variables left
after the task, else the CPUs this process may run on).

The executor calls ``apply`` only when the task's environment names one of ``NAMES``,
so tasks without them never import threadpoolctl. ``VECLIB_MAXIMUM_THREADS`` (macOS
Accelerate) has no runtime control: only the variable itself is set.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from typing import Any

logger = logging.getLogger(__name__)

#: The variables that size native thread pools.
NAMES = frozenset({"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "MKL_NUM_THREADS",
                   "BLIS_NUM_THREADS", "FLEXIBLAS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
                   "NUMEXPR_NUM_THREADS"})

#: threadpoolctl's internal_api -> the variables it reads at load time, first wins.
_PRECEDENCE: dict[str, tuple[str, ...]] = {
    "openblas": ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS"),
    "mkl": ("MKL_NUM_THREADS", "OMP_NUM_THREADS"),
    "blis": ("BLIS_NUM_THREADS", "OMP_NUM_THREADS"),
    "flexiblas": ("FLEXIBLAS_NUM_THREADS", "OMP_NUM_THREADS"),
    "openmp": ("OMP_NUM_THREADS",),
    "numexpr": ("NUMEXPR_NUM_THREADS",),
}


#: This worker process set ``OMP_NUM_THREADS`` itself (``default_for_worker``): the user
#: left it unset, and a task that asks for more CPUs gets as many threads (``for_task``).
defaulted = False


def default_for_worker() -> None:
    """In a worker process (or the fork server, whose children inherit it), before numpy or
    torch loads: ``OMP_NUM_THREADS=1`` unless the user set it, as Ray does. Without it
    each of a node's N workers ran a BLAS pool of N threads on its N CPUs: two workers'
    numpy on 2 cores ran 1.4-2.6x slower than one thread each (the pools' threads also
    spin between calls, taking the other worker's CPU)."""
    global defaulted
    if "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = "1"
        defaulted = True


def for_task(resources: Mapping[str, float]) -> dict[str, str] | None:
    """The thread variables a task or actor asking for ``resources`` runs under when the
    user set none (``defaulted``): as many threads as whole CPUs, as in Ray; None where
    the worker's default of one stands."""
    if not defaulted:
        return None
    cpus = resources.get("CPU", 0)
    return {"OMP_NUM_THREADS": str(int(cpus))} if cpus >= 2 else None


def wanted(api: str, environ: Mapping[str, str]) -> int | None:
    """The pool size ``environ`` asks of a library of ``api``; None when it asks nothing.
    ``OMP_NUM_THREADS=4,2`` (nested levels) counts its first level; a value that is not
    a positive integer is ignored, as the libraries ignore it."""
    for name in _PRECEDENCE.get(api, ()):
        raw = environ.get(name)
        if raw is None:
            continue
        try:
            n = int(raw.split(",", 1)[0].strip())
        except ValueError:
            continue
        if n > 0:
            return n
    return None


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class Limits:
    """The pools' sizes before ``apply`` (by library path) and numexpr's, to restore."""

    def __init__(self, before: dict[str, int], numexpr_loaded: bool, numexpr_before: int | None) -> None:
        self.before = before
        self.numexpr_loaded = numexpr_loaded
        self.numexpr_before = numexpr_before

    def restore(self) -> None:
        """Call after the task's variables are restored in ``os.environ``."""
        environ = os.environ
        for lib in _controllers():
            target = self.before.get(lib.filepath)
            if target is None:  # loaded during the task: the size it has without the task's variables
                target = wanted(lib.internal_api, environ) or _cpus()
            _set(lib, target)
        numexpr = sys.modules.get("numexpr")
        if numexpr is None:
            return
        if self.numexpr_before is not None:
            _set_numexpr(numexpr, self.numexpr_before)
        elif not self.numexpr_loaded:
            _set_numexpr(numexpr, wanted("numexpr", environ) or _cpus())


def apply() -> Limits:
    """Size the loaded pools as ``os.environ`` (already holding the task's variables) asks."""
    environ = os.environ
    before: dict[str, int] = {}
    for lib in _controllers():
        before[lib.filepath] = lib.num_threads
        n = wanted(lib.internal_api, environ)
        if n is not None:
            _set(lib, n)
    numexpr = sys.modules.get("numexpr")
    numexpr_before = None
    if numexpr is not None:
        n = wanted("numexpr", environ)
        if n is not None:
            numexpr_before = _set_numexpr(numexpr, n)
    return Limits(before, numexpr is not None, numexpr_before)


_scanned: tuple[int, list[Any]] | None = None


def _controllers() -> list[Any]:
    """The loaded pools' controllers. Scanning the process's libraries costs ~0.5 ms, so
    the scan is kept until ``sys.modules`` grows (native pools arrive with an import)."""
    global _scanned
    loaded = len(sys.modules)
    if _scanned is not None and _scanned[0] == loaded:
        return _scanned[1]
    from threadpoolctl import ThreadpoolController  # only tasks that size pools pay for the import
    libs = list(ThreadpoolController().lib_controllers)
    _scanned = (len(sys.modules), libs)
    return libs


def _set(lib: Any, n: int) -> None:
    if lib.num_threads == n:
        return
    try:
        lib.set_num_threads(n)
    except (OSError, AttributeError, TypeError) as e:  # a library without the usual entry point
        logger.warning("could not set %s (%s) to %d threads: %s", lib.internal_api, lib.filepath, n, e)


def _set_numexpr(numexpr: Any, n: int) -> int | None:
    """Set numexpr's pool size; returns the previous size (numexpr's ``set_num_threads`` does)."""
    setter = getattr(numexpr, "set_num_threads", None)
    if setter is None:
        return None
    previous = setter(n)
    return int(previous) if isinstance(previous, int) else None
