"""lumos's IPython extension: ``%load_ext lumos`` (or ``%load_ext lumos.kernelext``).

Registers ``%%remote`` (run a cell on the cluster) and ``%lumos`` (init, status,
shutdown, gpus, sessions, close). IPython and ipywidgets are imported only here, when
the extension is loaded; workers import ``lumos.kernelext.cell`` without them.
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
