"""How lumos's errors look in a notebook: the user's frames, not lumos's.

Owner: the custom exception handler the extension installs on the shell
(``install``). For interrupts, timeouts, connection errors and lumos's own errors it
drops the frames of lumos (``lumos``, ``lumos.kernelext``, ``lumos.dashboard``) and of
IPython's magic dispatch before IPython renders the traceback as usual, so Ctrl-C in
``lumos.get(ref)`` shows the user's ``lumos.get`` line and one ``KeyboardInterrupt``
line instead of thirty lines of the core worker. Errors that render themselves
(``_render_traceback_``: a remote ``TaskError``, an interrupted ``%%remote`` cell) are
left to that. Any other exception is shown exactly as IPython would. Once shown, lumos's
frames in the error's traceback let go of their locals (``lumos.util.tracebacks``): IPython
keeps the last error's frames, and a ref in one kept its value in the store.
"""

from __future__ import annotations

import os
import types
from typing import Any

import lumos
from lumos.util import tracebacks as shown

#: Files under these directories are lumos's own frames.
_LUMOS_DIRS = shown.lumos_dirs()

_MAGIC_DISPATCH = ("run_cell_magic", "run_line_magic")


def _ipython_dir() -> str:
    import IPython
    return os.path.dirname(os.path.abspath(IPython.__file__)) + os.sep


class CellInterrupted(KeyboardInterrupt):
    """Ctrl-C (or Jupyter's stop button) during a ``%%remote`` cell: its tasks were cancelled.

    Shown as one line; its class name reads ``KeyboardInterrupt`` in the notebook.
    """

    def _render_traceback_(self) -> list[str]:
        return [f"KeyboardInterrupt: {self}"]


CellInterrupted.__name__ = CellInterrupted.__qualname__ = "KeyboardInterrupt"


class CellSyntaxError(SyntaxError):
    """A ``%%remote`` cell that does not compile. Shown as a local syntax error is: the
    cell's line and a caret, without the frames of IPython and the magic (IPython shows
    every frame for an exact ``SyntaxError`` raised by running code); its class name
    reads ``SyntaxError`` in the notebook."""

    def _render_traceback_(self) -> list[str]:
        import traceback
        text = "".join(traceback.format_exception_only(SyntaxError, self))
        name = self.filename or ""
        if name.startswith("<cell ") and name.endswith(">"):
            text = text.replace(f'File "{name}"', "C" + name[2:-1], 1)  # Cell In[n], line k
        return text.rstrip("\n").split("\n")


CellSyntaxError.__name__ = CellSyntaxError.__qualname__ = "SyntaxError"


def _filtered_types() -> tuple[type[BaseException], ...]:
    return (KeyboardInterrupt, TimeoutError, ConnectionError, lumos.exceptions.LumosError, CellSyntaxError)


def _is_internal(frame: types.FrameType, ipython_dir: str) -> bool:
    name = frame.f_code.co_filename
    return name.startswith(_LUMOS_DIRS) or name.startswith(ipython_dir) or name.startswith("<decorator-gen")


def user_traceback(tb: types.TracebackType | None) -> types.TracebackType | None:
    """``tb`` (whose first entry is IPython's ``run_code``) without lumos's and IPython's frames.

    A cell frame whose only job was to call a magic (``get_ipython().run_cell_magic(...)``)
    goes too: the error is the magic's, and that line is not something the user wrote.
    """
    if tb is None:
        return None
    ipython_dir = _ipython_dir()
    entries: list[types.TracebackType] = []
    t = tb.tb_next
    while t is not None:
        nxt = t.tb_next
        calls_magic = (nxt is not None and nxt.tb_frame.f_code.co_name in _MAGIC_DISPATCH
                       and nxt.tb_frame.f_code.co_filename.startswith(ipython_dir))
        if not _is_internal(t.tb_frame, ipython_dir) and not calls_magic:
            entries.append(t)
        t = nxt
    new: types.TracebackType | None = None
    for e in reversed(entries):
        new = types.TracebackType(new, e.tb_frame, e.tb_lasti, e.tb_lineno)
    return types.TracebackType(new, tb.tb_frame, tb.tb_lasti, tb.tb_lineno)


def deliberate(e: BaseException) -> bool:
    """``e`` was raised on purpose by lumos (a ``raise`` line in lumos's own files), not by
    a bug or by the user's code: its message says it all."""
    if hasattr(e, "_render_traceback_"):
        return False  # renders itself (a remote TaskError, which may also be a ValueError)
    tb = e.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    filename = tb.tb_frame.f_code.co_filename
    if not filename.startswith(_LUMOS_DIRS):
        return False
    import linecache
    return linecache.getline(filename, tb.tb_lineno).lstrip().startswith("raise ")


def message_only(e: BaseException) -> None:
    """Show ``e`` in the notebook as its one ``Type: message`` line."""
    text = f"{type(e).__name__}: {e}"
    e._render_traceback_ = lambda: [text]  # type: ignore[attr-defined]


#: What a magic's own argument and state checks raise.
MAGIC_ERRORS = (ValueError, TypeError, NameError, KeyError, ImportError, RuntimeError)


def _handler(shell: Any, etype: type[BaseException], value: BaseException, tb: Any,
             tb_offset: int | None = None) -> None:
    try:
        _show(shell, etype, value, tb, tb_offset)
    finally:
        shown.let_go_of_locals(value, tb)


def _show(shell: Any, etype: type[BaseException], value: BaseException, tb: Any,
          tb_offset: int | None) -> None:
    if isinstance(value, CellSyntaxError):
        # (showtraceback would show IPython's frames for any SyntaxError raised by code)
        shell._showtraceback(etype, value, value._render_traceback_())
        return
    if hasattr(value, "_render_traceback_"):
        shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
        return
    short = user_traceback(tb)
    if value.__context__ is not None and not value.__suppress_context__:
        # "During handling of ... another exception occurred" inside lumos is not the user's
        ctx_tb = value.__context__.__traceback__
        ipython_dir = _ipython_dir()
        inner = []
        while ctx_tb is not None:
            inner.append(_is_internal(ctx_tb.tb_frame, ipython_dir))
            ctx_tb = ctx_tb.tb_next
        if all(inner):
            value.__suppress_context__ = True
    value.__traceback__ = short
    shell.showtraceback((etype, value, short), tb_offset=tb_offset)


def install(shell: Any) -> None:
    """Show lumos's interrupts, timeouts and connection errors with the user's frames only."""
    if getattr(shell, "custom_exceptions", ()) and getattr(shell, "_lumos_custom_exc", False) is False:
        return  # the user installed their own handler: leave it
    shell.set_custom_exc(_filtered_types(), _handler)
    shell._lumos_custom_exc = True


def uninstall(shell: Any) -> None:
    if getattr(shell, "_lumos_custom_exc", False):
        shell.set_custom_exc((), None)
        shell._lumos_custom_exc = False
