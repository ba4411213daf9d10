"""The demo notebooks run top to bottom in a real kernel and show what they promise."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient

from tests.conftest import check_no_leaks
from tests.kernelext.conftest import displays, errors, result_text, stdout

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


class _Client(NotebookClient):
    """Records the widgets the kernel closed: JupyterLab removes their views (nbclient keeps their state)."""

    def handle_comm_msg(self, outs: list[Any], msg: dict[str, Any], cell_index: int) -> None:
        if msg["msg_type"] == "comm_close":
            self.closed_comms.add(msg["content"]["comm_id"])
        super().handle_comm_msg(outs, msg, cell_index)


def _execute(path: Path, tmp_path: Path) -> Any:
    nb = nbformat.read(path, as_version=4)
    env_address = os.environ.pop("LUMOS_ADDRESS", None)
    try:
        client = _Client(nb, kernel_name="python3", timeout=60, store_widget_state=True,
                         resources={"metadata": {"path": str(tmp_path)}})
        client.closed_comms = set()
        client.execute()
        nb.metadata["closed_comms"] = sorted(client.closed_comms)
    finally:
        if env_address is not None:
            os.environ["LUMOS_ADDRESS"] = env_address
        check_no_leaks(None)
    return nb


def _cell(nb: Any, startswith: str) -> Any:
    for c in nb.cells:
        if c.cell_type == "code" and c.source.startswith(startswith):
            return c
    raise AssertionError(f"no cell starts with {startswith!r}")


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")))
def test_notebook_runs_clean(name: str, tmp_path: Path) -> None:
    nb = _execute(NOTEBOOKS / name, tmp_path)
    for c in nb.cells:
        if c.cell_type == "code" and "raises-exception" not in c.metadata.get("tags", []):
            assert not errors(c), (c.source, errors(c))
    if name == "quickstart.ipynb":
        _check_quickstart(nb)


def _check_quickstart(nb: Any) -> None:
    init = nb.cells[1].outputs
    assert any("text/html" in o.get("data", {}) for o in init)
    assert result_text(_cell(nb, "%%remote\nimport os")) == "2.0"
    assert "computed on worker pid" in stdout(_cell(nb, "%%remote\nimport os"))
    assert result_text(_cell(nb, "scaled.shape")) == "(1000000,)"
    assert result_text(_cell(nb, "%%remote --map")).startswith("[")
    live = " ".join(str(d.get("text/plain")) for d in displays(_cell(nb, "%%remote --async")))
    assert "finished" in live and "done sleeping" in live
    assert result_text(_cell(nb, "%%remote\nslow + 1")) == "1025.0"
    assert result_text(_cell(nb, "%%remote --session demo\ncounter += 1")) == "1"
    err = errors(_cell(nb, "%%remote\nvalues"))
    assert err and "ZeroDivisionError" in err[0]["ename"] and "line 3" in "\n".join(err[0]["traceback"])
    assert result_text(_cell(nb, "@lumos.remote")) == "True"
    assert "ObjectRef" in result_text(_cell(nb, "refs[3]"))
    assert result_text(_cell(nb, "lumos.get(refs)")) == "[0, 1, 4, 9, 16, 25, 36, 49]"
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    models = {m["model_name"] for m in state.values()}
    assert {"IntProgressModel", "BoundedFloatTextModel", "ToggleButtonsModel"} <= models
    # After Run All the GPU panel still shows (the shutdown cell below it froze it, not closed it).
    panel = next(o for o in _cell(nb, "panel = %lumos gpus").outputs
                 if "application/vnd.jupyter.widget-view+json" in o.get("data", {}))
    panel_id = panel["data"]["application/vnd.jupyter.widget-view+json"]["model_id"]
    assert panel_id not in nb.metadata["closed_comms"]
    html = " ".join(str(m["state"].get("value", "")) for m in state.values() if m["model_name"] == "HTMLModel")
    assert "lumos-gpus" in html and "in use" in html
