"""Matplotlib in remote cells: figures reach the notebook cell as PNG images.

Jupyter's inline backend shows a cell's figures when the cell ends (and at
``plt.show()``). A ``%%remote`` cell runs on a worker, so ``run_cell`` selects this
backend there (``MPLBACKEND``, before the cell's first ``import matplotlib``): it draws
with Agg, and ``show()`` / the end of the cell send each open figure through the cell's
``display()`` as ``image/png`` and close it. Outside a remote cell (a plain task on the
same worker) ``show()`` does nothing, like Agg's.
"""

from __future__ import annotations

import base64
import io
from typing import Any

from matplotlib.backend_bases import FigureManagerBase
from matplotlib.backends.backend_agg import FigureCanvasAgg

FigureCanvas = FigureCanvasAgg
FigureManager = FigureManagerBase


def show(*args: Any, **kwargs: Any) -> None:
    """``plt.show()``: in a remote cell, send the open figures to the notebook."""
    from lumos.kernelext import cell
    if cell.in_remote_cell:
        flush_figures()


def flush_figures() -> None:
    """Display every open figure as a PNG, then close them all."""
    from matplotlib import pyplot as plt

    from lumos.kernelext.cell import display
    try:
        for num in plt.get_fignums():
            fig = plt.figure(num)
            buf = io.BytesIO()
            fig.savefig(buf, format="png", bbox_inches="tight")
            display({"image/png": base64.b64encode(buf.getvalue()).decode("ascii"),
                     "text/plain": repr(fig)}, raw=True)
    finally:
        plt.close("all")
