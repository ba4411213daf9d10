"""``lumos.progress(refs)``: a progress bar that advances as refs finish.

In a Jupyter kernel it is an ipywidgets bar (shown at once in the calling cell, updated
from a ``lumos-progress`` thread); elsewhere a text bar on stderr. IPython and
ipywidgets are imported only when a kernel is already running in this process, so
``import lumos`` stays free of them.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, Sequence

from lumos.object_ref import ObjectRef

__all__ = ["progress", "Progress"]


def ipython_shell() -> Any:
    """This process's IPython shell (a kernel's or a terminal's), or None (never imports
    IPython)."""
    get_ipython = getattr(sys.modules.get("IPython"), "get_ipython", None)
    return get_ipython() if get_ipython is not None else None


def kernel_shell() -> Any:
    """The IPython kernel shell of this process, or None (never imports IPython)."""
    if "ipykernel" not in sys.modules:
        return None
    shell = ipython_shell()
    return shell if getattr(shell, "kernel", None) is not None else None


class Progress:
    """How many of a list of refs are finished; see ``lumos.progress``."""

    def __init__(self, refs: Sequence[ObjectRef], desc: str = "", *, widget: bool | None = None,
                 stream: Any = None) -> None:
        self.refs = list(refs)
        self.desc = desc
        self.total = len(self.refs)
        self.finished = 0
        self.failed = 0
        self.started = time.monotonic()
        self.ended: float | None = None if self.refs else self.started
        self._cond = threading.Condition()
        self._changed = True
        self._widget: Any = None
        self._shown_in: int | None = None
        self._stream = stream if stream is not None else sys.stderr
        shell = kernel_shell()
        use_widget = shell is not None if widget is None else widget
        if use_widget:
            self._make_widget()
        for r in self.refs:
            r.future().add_done_callback(self._one_done)
        if use_widget and shell is not None:
            from IPython.display import display
            display(self._widget)
            self._shown_in = getattr(shell, "execution_count", None)
        self._thread = threading.Thread(target=self._run, name="lumos-progress", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ state

    def _one_done(self, fut: Any) -> None:
        failed = fut.cancelled() or fut.exception() is not None
        with self._cond:
            if failed:
                self.failed += 1
            else:
                self.finished += 1
            if self.finished + self.failed == self.total:
                self.ended = time.monotonic()
            self._changed = True
            self._cond.notify_all()

    @property
    def done(self) -> bool:
        return self.finished + self.failed >= self.total

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every ref is finished (or ``timeout`` s); True when all are."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not self.done:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(0.1 if left is None else min(left, 0.1))
        self._thread.join(timeout=2)
        return True

    def text(self, width: int = 30) -> str:
        n = self.finished + self.failed
        filled = int(width * n / self.total) if self.total else width
        elapsed = (self.ended or time.monotonic()) - self.started
        label = f"{self.desc}: " if self.desc else ""
        tail = f", {self.failed} failed" if self.failed else ""
        return f"{label}[{'#' * filled}{'.' * (width - filled)}] {n}/{self.total}{tail} {elapsed:.1f}s"

    def __repr__(self) -> str:
        return f"<lumos.progress {self.text()}>"

    # ------------------------------------------------------------------ rendering

    def _make_widget(self) -> None:
        import ipywidgets as w
        self._bar = w.IntProgress(value=0, min=0, max=max(self.total, 1), description=self.desc or "",
                                  bar_style="info")
        self._label = w.HTML(value=f"0/{self.total}")
        self._widget = w.HBox([self._bar, self._label])

    def _ipython_display_(self) -> None:
        from IPython.display import display
        shell = kernel_shell()
        count = getattr(shell, "execution_count", None)
        if self._widget is not None:
            if count is None or count != self._shown_in:
                display(self._widget)
                self._shown_in = count
        else:
            print(self.text())

    def _render(self) -> None:
        if self._widget is not None:
            n = self.finished + self.failed
            self._bar.value = n
            self._label.value = (f"{n}/{self.total}" + (f", {self.failed} failed" if self.failed else "")
                                 + f" · {((self.ended or time.monotonic()) - self.started):.1f} s")
            if self.done:
                self._bar.bar_style = "danger" if self.failed else "success"
            return
        stream = self._stream
        try:
            tty = stream.isatty()
        except (AttributeError, ValueError):
            tty = False
        try:
            if tty:
                stream.write("\r" + self.text() + ("\n" if self.done else ""))
            elif self.done:
                stream.write(self.text() + "\n")
            stream.flush()
        except (ValueError, OSError):
            pass

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._changed:
                    self._cond.wait(0.5)
                self._changed = False
                done = self.done
            self._render()
            if done:
                return
            time.sleep(0.1)  # at most 10 updates a second


def progress(refs: ObjectRef | Sequence[ObjectRef], desc: str = "") -> Progress:
    """Show a progress bar that advances as ``refs`` finish; returns at once.

    In a notebook the bar is an ipywidget shown in the calling cell; elsewhere a text
    bar is written to stderr. ``.wait(timeout)`` blocks until all are finished.

    Args:
        refs: an ObjectRef or a list of them.
        desc: a label shown before the bar.

    Returns:
        A ``Progress`` (``finished``, ``failed``, ``total``, ``done``, ``wait()``).

    Raises:
        TypeError: ``refs`` is not an ObjectRef or a list of them.

    Example:
        >>> refs = [f.remote(i) for i in range(100)]
        >>> lumos.progress(refs, "training").wait()
    """
    if isinstance(refs, ObjectRef):
        refs = [refs]
    if not isinstance(refs, (list, tuple)):
        raise TypeError(f"progress() expects an ObjectRef or a list of ObjectRefs, got {type(refs).__name__}")
    for r in refs:
        if not isinstance(r, ObjectRef):
            raise TypeError(f"progress() expects a list of ObjectRefs, but it contains a {type(r).__name__}")
    if not isinstance(desc, str):
        raise TypeError(f"desc must be a str, not {type(desc).__name__}")
    return Progress(refs, desc)
