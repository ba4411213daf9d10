"""SIGINT held off while lumos changes its own state in a process's main thread.

Jupyter's stop button (and Ctrl-C) sends SIGINT; Python raises ``KeyboardInterrupt`` in
the main thread at whatever bytecode it is running. Landing inside ``put`` or a
``.remote()``, between two of lumos's steps (a store slot taken and the object sealed,
a return's entry counted and its ref made, an argument counted as submitted and the
task handed to the io thread), it left memory in the store that nothing would free
until the driver ended: a notebook stopped a few hundred times in a loop of puts held
over a GiB.

``hold()`` ... ``release()`` brackets such a stretch (short, never a wait): a SIGINT
that comes meanwhile is noted and raised by ``release()``, once the stretch is whole.
The hold works through lumos's own SIGINT handler, which behaves exactly as Python's
``signal.default_int_handler`` outside a stretch. It is put in place by the first hold
that finds Python's default handler there (a kernel puts that back before each cell it
runs: one ``sigaction`` per cell). A worker's handler (a cancel's SIGINT) takes part
too (``cooperate``): a task cancelled inside a put left the object to its worker for
the worker's life. Where something else handles SIGINT (a user's own handler), nothing
is held. Only the main thread is ever interrupted so.

A finalizer (an ``ObjectRef``'s ``__del__``, the weakref callback that gives a store
view's pin back) runs wherever the last reference went, in the user's code or in
lumos's, and Python only prints an exception raised in one, its work left half done: a
press landing there lost a ref's decrement or left a value pinned in the store, and the
press itself. lumos's handler finds such a frame (``finalizer``) on the interrupted
stack (or one of the standard library's weakref callbacks: ``_weakref_callbacks``) and,
outside a held stretch, sends the signal again a moment later
(``RESEND_AFTER_S``, from the io thread: ``set_later``), once the finalizer is over.
In a kernel lumos's handler is put in place as each cell starts (``watch_cells``), so a
finalizer is covered before the cell's first hold. An ``asyncio.run`` started after
lumos's handler is in place leaves SIGINT to it (it installs its own only over Python's
default); lumos's handler then cancels the runner's main task as the runner's own would
(``_asyncio_runner``).
"""

from __future__ import annotations

import _signal  # (signal's own getsignal turns the number into an enum first: 2 us, this 20 ns)
import functools
import signal
import sys
import threading
from typing import Any, Callable, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

_MAIN = threading.main_thread().ident
_SIGINT = int(signal.SIGINT)
_DEFAULT = signal.default_int_handler
_depth = 0
_pending = False
#: A process's own SIGINT handler that honours holds (``cooperate``).
_coop: Any = None
#: The code of lumos's finalizers (``finalizer``).
_FINALIZERS: set[Any] = set()
#: Seconds after which a SIGINT that landed in a finalizer is sent again.
RESEND_AFTER_S = 0.002
#: ``later(fn)``: run ``fn`` on another thread ``RESEND_AFTER_S`` from now; False where
#: it cannot (``set_later``: the core worker's io thread).
_later: Callable[[Callable[[], None]], bool] | None = None
#: SIGINTs lumos's handlers have been called for (``noted``).
_handled = 0
#: Times a SIGINT that landed in a finalizer is sent again while none is handled (one
#: sent as the main thread goes to wait, after its last look for signals and before
#: its system call, is only handled once the wait ends: the next one ends the wait).
RESEND_TRIES = 10
#: The depths that the open ``Window``s will put back (innermost last).
_windows: list[int] = []


def _on_sigint(signum: int, frame: Any) -> None:
    global _pending, _handled
    _handled += 1
    if _depth:
        _pending = True
        return
    if in_finalizer(frame) and resend_later(_send_again):
        return
    _press(frame)


def _press(frame: Any, leave: bool = True) -> None:
    """A press, where nothing holds it off: ``KeyboardInterrupt`` (main thread), or under an
    ``asyncio.run`` that left SIGINT to lumos, its main task cancelled, as asyncio's own
    handler would. ``leave``: it leaves the innermost open window (``leaving``)."""
    runner = _asyncio_runner(frame)
    if runner is not None:
        try:
            runner[0]._on_sigint(_SIGINT, frame, runner[1])
            return
        except KeyboardInterrupt:  # (a second press, or the main task done)
            if leave:
                leaving()
            raise
    if leave:
        leaving()
    raise KeyboardInterrupt


def _asyncio_runner(frame: Any) -> tuple[Any, Any] | None:
    """The ``asyncio.Runner`` (``asyncio.run``) whose loop runs the interrupted code, and
    its main task, where that runner left SIGINT to lumos's handler: a runner puts its
    own in place only over Python's default, so one started after lumos's first hold
    found lumos's. Its own would cancel the main task (the coroutine sees
    ``CancelledError``, ``asyncio.run`` raises ``KeyboardInterrupt``); this one then does
    the same through the runner, not a ``KeyboardInterrupt`` raised inside the loop."""
    runners = sys.modules.get("asyncio.runners")
    run = getattr(getattr(runners, "Runner", None), "run", None)
    code = getattr(run, "__code__", None)
    while frame is not None and code is not None:
        if frame.f_code is code:
            local = frame.f_locals
            runner, task = local.get("self"), local.get("task")
            if local.get("sigint_handler", 0) is None and task is not None \
                    and hasattr(runner, "_on_sigint"):
                return runner, task
            return None
        frame = frame.f_back
    return None


def leaving() -> None:
    """A ``KeyboardInterrupt`` is about to be raised where nothing is held (main thread):
    inside a ``Window``, it leaves it, and the stretch around the window is held again
    now. (Landing as the window's ``__exit__`` began, it left the rest of that stretch
    unheld: a second press there could stop it half done.)"""
    global _depth
    if _windows:
        _depth = _windows.pop()


def _send_again() -> bool:
    """The SIGINT that landed in a finalizer, again, where lumos's handler still has it
    (a kernel between cells has its own)."""
    if _signal.getsignal(_SIGINT) is not _on_sigint:
        return False
    signal.pthread_kill(_MAIN, _SIGINT)
    return True


def noted() -> None:
    """A cooperating handler (``cooperate``) was called for a SIGINT."""
    global _handled
    _handled += 1


def resend_later(send: Callable[[], bool]) -> bool:
    """(A handler, for a SIGINT that landed in a finalizer.) ``send()`` it again, on
    another thread, ``RESEND_AFTER_S`` from now, and again after each such time while
    no SIGINT is handled (``RESEND_TRIES`` times at most), until ``send`` says no (False:
    nothing to send it to any more). False where nothing can send it (no io thread)."""
    later = _later
    return later is not None and later(functools.partial(_resend, later, send, _handled, RESEND_TRIES))


def _resend(later: Callable[[Callable[[], None]], bool], send: Callable[[], bool], seen: int, tries: int) -> None:
    if _handled != seen:
        return  # (handled meanwhile: raised, held, or in a finalizer again, which resends it)
    if send() and tries > 1:
        later(functools.partial(_resend, later, send, seen, tries - 1))


def finalizer(fn: F) -> F:
    """Mark ``fn`` (a ``__del__``, a weakref callback; every closure a ``def`` makes
    shares its code) as a finalizer of lumos's: a SIGINT that lands while it runs is
    sent again once it is over (see the module's docstring)."""
    _FINALIZERS.add(fn.__code__)
    return fn


def finalizer_code(code: Any) -> None:
    """``finalizer`` for a nested function, by its code (shared by every closure of it)."""
    _FINALIZERS.add(code)


def _weakref_callbacks() -> list[Any]:
    """The code of the standard library's weakref callbacks: the removal callbacks of
    ``WeakSet`` (asyncio's registry of tasks: a task of lumos's io loop whose last
    reference a ``run_sync`` drops goes from there in the main thread) and of the weak
    dictionaries, and ``weakref.finalize``. A press landing in one was printed and lost
    like one in lumos's own (the cell looped on), and left a dead entry behind."""
    import weakref

    return [weakref.WeakSet()._remove.__code__, weakref.WeakValueDictionary()._remove.__code__,
            weakref.WeakKeyDictionary()._remove.__code__, weakref.finalize.__call__.__code__]


_FINALIZERS.update(_weakref_callbacks())


def in_finalizer(frame: Any) -> bool:
    """``frame`` (a signal handler's) or a frame that called it runs a finalizer's code."""
    while frame is not None:
        if frame.f_code in _FINALIZERS:
            return True
        frame = frame.f_back
    return False


def set_later(later: Callable[[Callable[[], None]], bool]) -> None:
    """Install ``later`` (a core worker's, as it starts)."""
    global _later
    _later = later


def unset_later(later: Callable[[Callable[[], None]], bool]) -> None:
    """Remove ``later`` (as its core worker shuts down), unless another one replaced it."""
    global _later
    if _later == later:
        _later = None


def hold() -> bool:
    """Hold SIGINT off until ``release()``; False (nothing held, no ``release()`` due) off
    the main thread or where SIGINT is not Python's default ``KeyboardInterrupt``. Call
    it before the stretch begins: it may raise a ``KeyboardInterrupt`` that was pending."""
    global _depth
    if threading.get_ident() != _MAIN:
        return False
    handler = _signal.getsignal(_SIGINT)
    if handler is not _on_sigint and handler is not _coop:
        if handler is not _DEFAULT:
            return False
        signal.signal(signal.SIGINT, _on_sigint)
    _depth += 1
    return True


def install(*_: Any) -> None:
    """lumos's handler in place of Python's default now (main thread; a kernel's
    ``pre_run_cell``: ``watch_cells``), so the finalizers are covered from a cell's start,
    where the first hold would install it only at the cell's first put, call or get."""
    if threading.get_ident() == _MAIN and _signal.getsignal(_SIGINT) is _DEFAULT:
        signal.signal(signal.SIGINT, _on_sigint)


def watch_cells(shell: Any, on: bool = True) -> None:
    """Have an IPython ``shell`` ``install`` lumos's handler as each cell starts (a
    kernel puts Python's default back before each); ``on=False``: no longer."""
    try:
        if on:
            if install not in shell.events.callbacks["pre_run_cell"]:
                shell.events.register("pre_run_cell", install)
            install()
        else:
            shell.events.unregister("pre_run_cell", install)
    except (AttributeError, KeyError, ValueError):
        pass  # (an IPython without these events, or not registered)


def cooperate(handler: Any) -> None:
    """``handler``, this process's SIGINT handler from now on, honours holds: where it
    would raise ``KeyboardInterrupt`` while ``held()``, it calls ``defer()`` instead."""
    global _coop
    _coop = handler


def held() -> bool:
    """A stretch is held now (for a cooperating handler, in the main thread)."""
    return _depth > 0


def defer() -> None:
    """A cooperating handler's ``KeyboardInterrupt``, raised by ``release()`` instead."""
    global _pending
    _pending = True


def is_ours(handler: Any) -> bool:
    """``handler`` is the handler ``hold()`` installs (Python's default, with holds)."""
    return handler is _on_sigint


def release() -> None:
    """End a stretch ``hold()`` began; the outermost raises the ``KeyboardInterrupt``
    held off meanwhile."""
    global _depth, _pending
    # (Never below 0, whatever goes wrong.)
    _depth = _depth - 1 if _depth > 0 else 0
    if not _depth and _pending:
        _pending = False
        _press(sys._getframe(1))


class Window:
    """Inside a held stretch, at a point where nothing is half done: let SIGINT raise
    again (a held one at once) for a wait that may be long (a put waiting for room in a
    full store), then hold it off again. Nothing off the main thread."""

    __slots__ = ("level",)

    def __enter__(self) -> None:
        global _depth, _pending
        if threading.get_ident() != _MAIN:
            self.level = -1
            return
        if _pending:  # (raised before the window opens: ``__exit__`` is not run then)
            _pending = False
            _press(sys._getframe(1), leave=False)
        self.level = len(_windows)
        _windows.append(_depth)
        _depth = 0

    def __exit__(self, *exc_info: Any) -> None:
        global _depth
        if 0 <= self.level < len(_windows):  # (else the KeyboardInterrupt that left it closed it)
            _depth = _windows[self.level]
            del _windows[self.level:]
