"""Which errors show as one line in a notebook (pure; no kernel)."""

from __future__ import annotations

import pytest

from lumos.kernelext import tracebacks
from lumos.kernelext.remote import parse_bytes


def _caught(fn, *args):  # type: ignore[no-untyped-def]
    with pytest.raises(Exception) as info:
        fn(*args)
    return info.value


def test_only_errors_lumos_raises_on_purpose_are_shortened() -> None:
    on_purpose = _caught(parse_bytes, "lots")  # a `raise ValueError(...)` line of lumos
    assert tracebacks.deliberate(on_purpose)
    tracebacks.message_only(on_purpose)
    assert on_purpose._render_traceback_() == [f"ValueError: {on_purpose}"]

    assert not tracebacks.deliberate(_caught(parse_bytes, None))  # a TypeError deep in `re`: a bug
    assert not tracebacks.deliberate(_caught(int, "x"))            # not lumos's
    assert not tracebacks.deliberate(ValueError("never raised"))   # no traceback


def test_interrupted_cell_reads_as_keyboard_interrupt_in_one_line() -> None:
    e = tracebacks.CellInterrupted("cell In[3] interrupted; its remote task was cancelled")
    assert isinstance(e, KeyboardInterrupt) and type(e).__name__ == "KeyboardInterrupt"
    assert e._render_traceback_() == ["KeyboardInterrupt: cell In[3] interrupted; its remote task was cancelled"]


def test_a_malformed_memory_value_is_a_one_line_error() -> None:
    """'1.2.3GB' matched the pattern and failed in float(): a traceback of lumos's frames."""
    for bad in ("1.2.3GB", "e", "1e999"):
        e = _caught(parse_bytes, bad)
        assert isinstance(e, ValueError) and tracebacks.deliberate(e), bad
        assert "expected bytes like 2GB" in str(e)
    assert parse_bytes("1.5GiB") == int(1.5 * 1024 ** 3)
