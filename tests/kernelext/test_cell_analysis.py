"""What a cell reads and binds (pure; no kernel)."""

from __future__ import annotations

from typing import Any

import pytest

from lumos.kernelext.cell import analyze


def test_reads_exclude_names_assigned_first_and_nested_locals() -> None:
    a = analyze("y = x + 1\nz = y * w\ndef f(p):\n    return p + q\nfor i in items:\n    total += i\n")
    assert a.reads == ["x", "w", "q", "items", "total"]
    assert set(a.assigns) == {"y", "z", "f", "i", "total"}


def test_binds_cover_imports_classes_globals_del_and_walrus() -> None:
    a = analyze("import numpy as np\nimport os.path\nfrom json import dumps as d\nclass C: pass\n"
                "def g():\n    global hidden\n    hidden = 1\ndel old\n(n := 3)\n")
    assert set(a.assigns) == {"np", "os", "d", "C", "g", "hidden", "old", "n"}
    assert a.reads == ["old"]  # `del old` needs it remotely


def test_values_leave_out_imports_loop_targets_defs_and_nested_names() -> None:
    a = analyze("import json\nfrom os import path as p\ntotal = 0\nfor i in range(3):\n    total += i\n"
                "sq = [j for j in range(3) if (w := j)]\ndef f(x):\n    global g\n    local = x\n    g = 1\n"
                "class C: pass\nwith open('f') as fh:\n    pass\ntry:\n    pass\nexcept Exception as err:\n"
                "    pass\ny: int = 3\na, (b, *c) = 1, (2, 3)\ndel old\n")
    assert a.values[:2] == ["total", "sq"] and set(a.values) == {"total", "sq", "g", "fh", "y", "a", "b", "w", "c"}
    assert {"json", "p", "i", "f", "C", "err", "old"} <= set(a.assigns) - set(a.values)
    assert "j" not in a.assigns and "local" not in a.assigns


def test_augmented_assignment_reads_the_name() -> None:
    assert analyze("count += 1").reads == ["count"]


def test_last_expression_and_semicolon() -> None:
    assert analyze("x = 1\nx + 1").last_expr
    assert not analyze("x = 1").last_expr
    assert analyze("x + 1;").quiet
    assert not analyze("x + 1").quiet


def test_syntax_error_is_raised() -> None:
    with pytest.raises(SyntaxError):
        analyze("def (:")


def test_a_streams_finalizer_inside_a_write_of_the_stream_it_wraps_does_not_deadlock() -> None:
    """A %%remote cell that printed a lot after a cell that raised hung for good: the
    garbage collector, run by an allocation inside the worker stdout's write (which holds
    its lock), finalized the failed cell's counting wrapper, whose IOBase finalizer flushed
    the stream, taking the same lock. Neither may happen now."""
    import gc
    import io
    import threading

    from lumos._private.core_worker.executor import _LineStream
    from lumos.kernelext.cell import _Counting

    emitted: list[str] = []

    class Stream(_LineStream):
        def _emit(self, text: str) -> None:
            emitted.append(text)
            self.flush()  # what the finalizer did, on this thread, mid-write

    stream = Stream(io.StringIO())
    writer = threading.Thread(target=lambda: (stream.write("a\nb"), stream.write("c\n")), daemon=True)
    writer.start()
    writer.join(10)
    assert not writer.is_alive(), "a flush inside the stream's own write deadlocked"
    assert emitted == ["a", "bc"]

    flushes = []

    class Inner(io.StringIO):
        def flush(self) -> None:
            flushes.append(1)

    inner = Inner()
    counting = _Counting(inner)
    counting.write("x")
    del counting
    gc.collect()
    assert flushes == [] and not inner.closed  # the wrapper's finalizer leaves the stream alone


def test_a_cells_task_that_prints_before_its_id_is_registered_reaches_the_cell() -> None:
    """A fast %%remote task's output could arrive before the cell registered its task id:
    it went to the plain printer, end marker and all, and the cell waited out its grace.
    Output of the task name the cell expects is routed to it meanwhile."""
    from lumos.kernelext.output import OutputRouter

    fed: list[tuple[bytes, str]] = []
    printed: list[list[Any]] = []

    class Sink:
        def feed(self, task_id: bytes, is_stderr: bool, text: str, rec: list[Any]) -> None:
            fed.append((task_id, text))

    router = OutputRouter()
    router._previous = printed.extend
    sink: Any = Sink()
    router.expect("cell In[3]", sink)
    router.handle([[b"job", b"t1", "cell In[3]", 1, False, "hello", None],
                   [b"job", b"t2", "other", 1, False, "not the cell's", None]])
    router.register(b"t1", sink)
    router.settled("cell In[3]")
    router.handle([[b"job", b"t1", "cell In[3]", 1, False, "later", None],
                   [b"job", b"t3", "cell In[3]", 1, False, "a later cell's", None]])
    assert fed == [(b"t1", "hello"), (b"t1", "later")]
    assert [r[5] for r in printed] == ["not the cell's", "a later cell's"]


def test_queued_cell_output_is_written_a_stream_run_at_a_time(monkeypatch: Any) -> None:
    """One write and one flush per run of one stream: a flush per line made a message per
    line on the kernel's iopub socket, which drops messages past its high-water mark."""
    import io
    import sys

    from lumos.kernelext.output import ERR, OUT, CellSink

    class Counting(io.StringIO):
        flushes = 0

        def flush(self) -> None:
            type(self).flushes += 1

    out, err = Counting(), Counting()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    sink = CellSink("n0nce")
    for i in range(1000):
        sink.queue.put((OUT, f"line {i}\n"))
    sink.queue.put((ERR, "oops\n"))
    sink.queue.put((OUT, "after\n"))
    sink._write_pending()
    assert out.getvalue() == "".join(f"line {i}\n" for i in range(1000)) + "after\n"
    assert err.getvalue() == "oops\n"
    assert Counting.flushes == 3  # out, err, out
