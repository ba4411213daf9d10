"""lumos's frames in a shown error's traceback let go of their locals.

A front end that shows errors to a person and keeps them (a shell, a notebook kernel)
calls ``let_go_of_locals(error, traceback)`` once an error is shown; lumos does so itself
where it knows the front end (``watch``, from ``lumos.init``).

IPython keeps the last error: ``sys.last_traceback`` until the next one, the cell's
``ExecutionResult``, and (where lumos's notebook extension shortened the traceback) the
whole one through ``run_code``'s own frame. Each frame on it keeps its locals, so an
error or a press of the stop button inside ``lumos.get(ref)`` kept ``ref``, and its value
in the store, after the user's ``del ref``, for as long as no other error came. The
frames of lumos (``lumos``, ``lumos.kernelext``, ``lumos.dashboard``) are never what
the user inspects, so once the error is shown they are cleared (``let_go_of_locals``):
by the extension's exception handler, in IPython after each cell that failed (with or
without the extension loaded), and at Python's own prompt after its ``sys.excepthook``
(``watch``). The user's frames keep theirs for ``%debug`` and ``pdb.pm()``.
"""

from __future__ import annotations

import os
import sys
import types
from typing import Any

from lumos.progress import ipython_shell

_dirs: tuple[str, ...] | None = None


def lumos_dirs() -> tuple[str, ...]:
    """The directories of lumos's packages (their files are lumos's own frames)."""
    global _dirs
    if _dirs is None:
        import importlib.util

        import lumos
        files = [lumos.__file__]
        for name in ("lumos.kernelext", "lumos.dashboard"):
            try:
                spec = importlib.util.find_spec(name)
            except (ImportError, ValueError):
                spec = None
            if spec is not None and spec.origin:
                files.append(spec.origin)
        _dirs = tuple(os.path.dirname(os.path.abspath(f)) + os.sep for f in files if f)
    return _dirs


def let_go_of_locals(value: BaseException, tb: types.TracebackType | None) -> None:
    """lumos's frames on the call chain ``tb`` records (all returned by now) let go of
    their locals, and so do those of the exceptions ``value`` was raised while handling.
    A frame is cleared only where the traceback links it to its caller: the part of a
    traceback that an exception brought from elsewhere (raised again, from another
    thread or a coroutine that may still run) is left as it is."""
    dirs = lumos_dirs()
    chain: set[types.FrameType] = set()
    _clear_callees(tb, chain, dirs)
    seen = {id(value)}
    e = value.__cause__ or value.__context__
    while e is not None and id(e) not in seen:  # (a context's catching frame is on the chain)
        seen.add(id(e))
        if e.__traceback__ is not None and e.__traceback__.tb_frame in chain:
            _clear_callees(e.__traceback__, chain, dirs)
        e = e.__cause__ or e.__context__


def _clear_callees(tb: types.TracebackType | None, chain: set[types.FrameType], dirs: tuple[str, ...]) -> None:
    t = tb
    if t is not None:
        chain.add(t.tb_frame)
    while t is not None and t.tb_next is not None:
        frame = t.tb_next.tb_frame
        if frame.f_back is not t.tb_frame:
            return
        chain.add(frame)
        if frame.f_code.co_filename.startswith(dirs):
            try:
                frame.clear()
            except RuntimeError:  # (still running: not one that returned)
                return
            # Before 3.13 a frame keeps the dict its ``f_locals`` made (IPython's
            # traceback reads each frame's, for ``__tracebackhide__``), which clear()
            # leaves: reading it again empties it.
            _ = frame.f_locals
        t = t.tb_next


def after_cell(result: Any) -> None:
    """IPython's ``post_run_cell``: the cell's error, if any, lets go (``let_go_of_locals``)."""
    error = getattr(result, "error_in_exec", None)
    if isinstance(error, BaseException):
        let_go_of_locals(error, error.__traceback__)


def watch(on: bool = True) -> None:
    """Where this process shows errors to a person, have each shown error let go
    (``after_cell``): in IPython, a kernel's or a terminal's, after each cell; at
    Python's own interactive prompt (``python``, ``python -i``), through
    ``sys.excepthook``. ``on=False``: no longer."""
    shell = ipython_shell()
    if shell is not None:
        watch_cells(shell, on)
    elif on:
        if (hasattr(sys, "ps1") or sys.flags.interactive) and not isinstance(sys.excepthook, _ShownError):
            sys.excepthook = _ShownError(sys.excepthook)
    elif isinstance(sys.excepthook, _ShownError):
        sys.excepthook = sys.excepthook.previous


class _ShownError:
    """``sys.excepthook`` at the interactive prompt: the previous hook shows the error
    (the prompt has kept it in ``sys.last_traceback``), then lumos's frames let go."""

    __slots__ = ("previous",)

    def __init__(self, previous: Any) -> None:
        self.previous = previous

    def __call__(self, etype: Any, value: Any, tb: Any) -> None:
        try:
            self.previous(etype, value, tb)
        finally:
            if isinstance(value, BaseException):
                let_go_of_locals(value, tb)


def watch_cells(shell: Any, on: bool = True) -> None:
    """Have an IPython ``shell`` run ``after_cell`` after each cell; ``on=False``: no longer."""
    try:
        if on:
            if after_cell not in shell.events.callbacks["post_run_cell"]:
                shell.events.register("post_run_cell", after_cell)
        else:
            shell.events.unregister("post_run_cell", after_cell)
    except (AttributeError, KeyError, ValueError):
        pass  # (an IPython without these events, or not registered)


__all__ = ["let_go_of_locals", "lumos_dirs"]
