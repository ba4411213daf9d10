"""``bench/microbench.py --compare`` (and ``bench/workloads.py --compare``, which shares
it) starts each system's column on a quiet machine (``settle``)."""

from __future__ import annotations

import importlib.util
import os
import time
from types import ModuleType
from typing import Any, Callable

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _microbench() -> ModuleType:
    """The script as a module (``bench/`` is not a package)."""
    spec = importlib.util.spec_from_file_location("bench_microbench", os.path.join(ROOT, "bench", "microbench.py"))
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _reader(busy: list[float]) -> Callable[[Any], tuple[float | None, tuple[int, int]]]:
    """A stand-in for the /proc/stat reading: the busy shares of successive windows."""
    def read(prev: Any) -> tuple[float | None, tuple[int, int]]:
        return (None if prev is None else busy.pop(0)), (0, 0)
    return read


def test_each_column_starts_on_a_quiet_machine() -> None:
    settle = _microbench().settle
    slept: list[float] = []
    # Busy (the last system still exiting), then quiet for two windows in a row.
    assert settle(read=_reader([0.9, 0.5, 0.05, 0.4, 0.1, 0.02]), sleep=slept.append) == 3.0
    assert slept == [0.5] * 6
    # Never quiet: it gives up at the bound.
    assert settle(max_s=2.0, read=_reader([0.9] * 10), sleep=slept.append) == 2.0
    # No /proc (another system): no wait.
    assert settle(read=lambda prev: (None, None), sleep=slept.append) == 0.0


def test_the_machine_busy_share_reads_proc_stat() -> None:
    read = _microbench()._busy_fraction_since
    _, mark = read(None)
    if mark is None:
        return  # no /proc here: settle() does not wait (checked above)
    busy = None
    deadline = time.monotonic() + 5
    while busy is None and time.monotonic() < deadline:  # (a clock tick must pass)
        sum(range(200_000))
        busy, _ = read(mark)
    assert busy is not None and 0.0 <= busy <= 1.0
