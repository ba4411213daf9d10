"""lumos's IPython extension: ``%load_ext lumos`` (or ``%load_ext lumos.kernelext``).

Registers ``%%remote`` (run a cell on the cluster) and ``%lumos`` (init, status,
shutdown, gpus, sessions, close). IPython and ipywidgets are imported only here, when
the extension is loaded; workers import ``lumos.kernelext.cell`` without them.

What lives here: ``magics.py`` (argument parsing only), ``cell.py`` (AST analysis of a
cell, shipping names; runs in workers too), ``remote.py`` and ``session.py`` (running a
cell as a task or in a persistent actor), ``output.py`` (routing worker output into
the submitting cell), ``display.py``/``widgets.py`` (rich displays, the GPU panel),
``tracebacks.py`` and ``mpl_backend.py``.

May import: lumos's public API, ``lumos.state``, ``lumos.util`` and ``lumos.dashboard``;
never ``lumos._private`` (``tests/test_public_surfaces.py`` checks every import).
"""

from __future__ import annotations

from typing import Any

__all__ = ["load_ipython_extension", "unload_ipython_extension"]


def load_ipython_extension(ipython: Any) -> None:
    """Register the magics on ``ipython`` (idempotent)."""
    from lumos.kernelext.magics import LumosMagics
    if getattr(ipython, "_lumos_magics", None) is not None:
        return
    from lumos.kernelext import tracebacks
    magics = LumosMagics(ipython)
    ipython.register_magics(magics)
    ipython._lumos_magics = magics
    tracebacks.install(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    from lumos.kernelext import tracebacks
    from lumos.kernelext.output import ROUTER
    magics = getattr(ipython, "_lumos_magics", None)
    if magics is None:
        return
    if magics.panel is not None:
        magics.panel.close()
    ROUTER.uninstall()
    tracebacks.uninstall(ipython)
    ipython._lumos_magics = None
