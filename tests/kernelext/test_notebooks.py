"""The demo notebooks run top to bottom in a real kernel and show what they promise.

Each notebook's cell tagged ``parameters`` sets its sizes; the tests append smaller ones
to it (``SMALL``), so a notebook takes a few seconds of compute here and its full size
when a person runs it. Every notebook shuts down the clusters it starts in its last cell,
and no lumos process may be left after it.
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient

from tests.conftest import check_no_leaks
from tests.kernelext.conftest import displays, errors, result_text, stdout
from tests.kernelext.kernel_client import KERNEL_START_ATTEMPTS

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"

#: Sizes the tests run the notebooks with, appended to their ``parameters`` cell.
SMALL: dict[str, str] = {
    "04-evolution-strategies.ipynb": "ITERATIONS = 4\nSPEEDUP_ITERATIONS = 2",
    "05-ppo-parameter-server.ipynb": "UPDATES = 8",
    "06-allreduce.ipynb": "SIZES_MB = [0.25, 1]\nWORKERS = [3]\nITERATIONS = 1",
    "07-serving-latency.ipynb": "REQUESTS = 100",
    "08-hyperparameter-search.ipynb": "TRIALS = 8\nEPOCHS = 3",
    "09-data-with-arrow.ipynb": "ROWS = 200_000",
}


class _Client(NotebookClient):
    """Records the widgets the kernel closed: JupyterLab removes their views (nbclient keeps their state)."""

    def handle_comm_msg(self, outs: list[Any], msg: dict[str, Any], cell_index: int) -> None:
        if msg["msg_type"] == "comm_close":
            self.closed_comms.add(msg["content"]["comm_id"])
        super().handle_comm_msg(outs, msg, cell_index)


def shrink(nb: Any, name: str) -> Any:
    """Append the test sizes of ``name`` to its ``parameters`` cell."""
    if name in SMALL:
        cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
        cell.source += "\n# test sizes\n" + SMALL[name]
    return nb


def execute(path: Path, workdir: Path, timeout_s: int = 90) -> Any:
    """Run the notebook in a fresh kernel. A kernel that dies before its first reply (a
    free TCP port taken by another process before the kernel bound it: see
    ``DirectKernel``) is started again; no cell has run then."""
    env_address = os.environ.pop("LUMOS_ADDRESS", None)
    try:
        for attempt in range(1, KERNEL_START_ATTEMPTS + 1):
            nb = shrink(nbformat.read(path, as_version=4), path.name)
            client = _Client(nb, kernel_name="python3", timeout=timeout_s, store_widget_state=True,
                             resources={"metadata": {"path": str(workdir)}})
            client.closed_comms = set()
            try:
                client.execute()
                break
            except RuntimeError as e:
                if "before replying to kernel_info" not in str(e) or attempt == KERNEL_START_ATTEMPTS:
                    raise
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


def _text(cell: Any) -> str:
    return stdout(cell) + (result_text(cell) or "")


def _has_image(cell: Any) -> bool:
    return any("image/png" in d for d in displays(cell))


def _widget_models(nb: Any) -> list[dict[str, Any]]:
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    return list(state.values())


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")))
def test_notebook_runs_clean(name: str, tmp_path: Path) -> None:
    nb = execute(NOTEBOOKS / name, tmp_path)
    for c in nb.cells:
        if c.cell_type == "code" and "raises-exception" not in c.metadata.get("tags", []):
            assert not errors(c), (c.source, errors(c))
    CHECKS[name](nb)


def test_notebooks_are_committed_without_outputs_and_all_checked() -> None:
    names = sorted(p.name for p in NOTEBOOKS.glob("*.ipynb"))
    assert names == sorted(CHECKS), "every notebook needs its checks here"
    assert [n[:3] for n in names] == [f"{i:02d}-" for i in range(1, 11)]
    for name in names:
        nb = nbformat.read(NOTEBOOKS / name, as_version=4)
        nbformat.validate(nb)
        assert nb.cells[0].cell_type == "markdown", f"{name} starts with its story"
        for c in nb.cells:
            if c.cell_type == "code":
                assert not c.outputs and c.execution_count is None, f"{name}: commit it without outputs"
        assert "widgets" not in nb.metadata, f"{name}: commit it without widget state"


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
    assert result_text(_cell(nb, "import time\nfrom lumos.util.metrics")) == "{'even': 5.0, 'odd': 5.0}"
    models = {m["model_name"] for m in _widget_models(nb)}
    assert {"IntProgressModel", "BoundedFloatTextModel", "ToggleButtonsModel"} <= models
    # After Run All the GPU panel still shows (the shutdown cell below it froze it, not closed it).
    panel = next(o for o in _cell(nb, "panel = %lumos gpus").outputs
                 if "application/vnd.jupyter.widget-view+json" in o.get("data", {}))
    panel_id = panel["data"]["application/vnd.jupyter.widget-view+json"]["model_id"]
    assert panel_id not in nb.metadata["closed_comms"]
    html = " ".join(str(m["state"].get("value", "")) for m in _widget_models(nb) if m["model_name"] == "HTMLModel")
    assert "lumos-gpus" in html and "in use" in html


def _check_remote_cells(nb: Any) -> None:
    assert "cluster: 4 CPUs, 2 GPUs" in stdout(_cell(nb, "GPUS ="))
    assert result_text(_cell(nb, "%%remote\nimport os\nfit")) == "[1.0, -2.0, 0.5]"
    assert result_text(_cell(nb, "np.allclose")) == "True"
    assert float(result_text(_cell(nb, "%%remote\nround(model_norm")) or "nan") > 0
    assert "best alpha 0.0" in stdout(_cell(nb, "best = min"))
    assert result_text(_cell(nb, "%%remote --session trainer --num-gpus")).startswith("'GPU ")
    assert result_text(_cell(nb, "%%remote --session trainer\nfor")) == "(200, [1.0, -2.0, 0.5])"
    assert "trainer" in str(displays(_cell(nb, "%lumos sessions")) or result_text(_cell(nb, "%lumos sessions")))
    spec = result_text(_cell(nb, "panel.num_gpus.value = 0.5"))
    assert "'num_gpus': 0.5" in spec and "'strategy': 'SPREAD'" in spec
    gpu_ids, visible = ast.literal_eval(result_text(_cell(nb, "%%remote\nimport os\n(lumos.get_gpu_ids()")) or "")
    assert len(gpu_ids) == 1 and visible is not None


def _check_dashboard_and_lineage(nb: Any) -> None:
    first = stdout(nb.cells[1])
    assert "2 nodes" in first, first
    doomed_id = first.split("kill: ")[1].strip()
    for c in (_cell(nb, "lumos.dashboard.graph()"), _cell(nb, "%lumos graph result")):
        assert any("application/vnd.jupyter.widget-view+json" in d for d in displays(c) + [
            dict(o.get("data", {})) for o in c.outputs]), c.outputs
    joined = stdout(_cell(nb, "import time\ncluster.remove_node"))
    assert "alive nodes: 2" in joined, joined
    replacement = joined.split("replacement: ")[1].strip()
    assert "rebuilt checksum matches: True" in stdout(_cell(nb, "rebuilt ="))
    runs = stdout(_cell(nb, "rows ="))
    # Both ran again (attempt 0 was the first run), on the replacement node.
    assert "make       attempt 1" in runs and "normalize  attempt 1" in runs, runs
    assert doomed_id not in runs and runs.count(replacement) == 2, runs
    assert "BokehModel" in {m["model_name"] for m in _widget_models(nb)}


def _check_es(nb: Any) -> None:
    out = stdout(_cell(nb, "def show(r)"))
    assert len(re.findall(r"^iteration +\d+  mean reward", out, re.M)) == 4, out
    assert "timesteps/s" in out and "with 2 workers" in out
    assert _has_image(_cell(nb, "fig, ax = plt.subplots(figsize=(6, 3))"))
    speed = stdout(_cell(nb, "speed = {}"))
    assert "1 workers:" in speed and "2 workers:" in speed and "speed-up: {1: 1.0, 2:" in speed


def _check_ppo(nb: Any) -> None:
    out = stdout(_cell(nb, "curve = []"))
    assert "updates: 8" in out and "timesteps/s" in out and "1 parameter server" in out
    assert "ray.wait" in stdout(_cell(nb, "import inspect"))
    assert _has_image(_cell(nb, "fig, (a, b)"))
    assert "1 rollout workers:" in stdout(_cell(nb, "for n in WORKER_COUNTS"))


def _check_allreduce(nb: Any) -> None:
    out = stdout(_cell(nb, "rows = []"))
    assert out.count("sum correct: True") == 2, out
    assert _has_image(_cell(nb, "fig, axes"))


def _check_serving(nb: Any) -> None:
    out = stdout(_cell(nb, "result = serving.run"))
    assert "p99 (ms)" in out and "small 16 float32" in out and "large 128x128x4 uint8" in out
    assert _has_image(_cell(nb, "names = list"))


def _check_hpo(nb: Any) -> None:
    out = stdout(_cell(nb, "bar = widgets.IntProgress"))
    assert "trials: 8 (" in out and "best: trial" in out
    bars = [m["state"] for m in _widget_models(nb) if m["model_name"] == "IntProgressModel"]
    assert bars and bars[0]["value"] == 8 and bars[0]["max"] == 8
    htmls = [m["state"]["value"] for m in _widget_models(nb) if m["model_name"] == "HTMLModel"]
    assert any("best so far: trial" in v for v in htmls)
    assert _has_image(_cell(nb, "import matplotlib"))


def _check_arrow(nb: Any) -> None:
    where = stdout(_cell(nb, "def backing_file"))
    lines = where.strip().splitlines()
    assert len(lines) == 2 and all("/dev/shm/lumos-" in line for line in lines), where
    assert lines[0].split()[-1] == lines[1].split()[-1], "the task maps the same store file"
    assert "50 groups from 4 tasks" in stdout(_cell(nb, "import pyarrow.compute"))
    assert "matches a local group-by: True" in stdout(_cell(nb, "direct ="))


def _check_multi_node(nb: Any) -> None:
    spread = stdout(_cell(nb, "@lumos.remote\ndef where"))
    assert spread.count(":") >= 3, spread  # tasks landed on at least two nodes
    assert "distinct nodes: 3" in stdout(_cell(nb, "pg = placement_group"))
    node, visible = ast.literal_eval(result_text(_cell(nb, "%%remote --num-gpus 1")) or "")
    assert visible in ("0", "1") and len(node) == 12


CHECKS = {
    "01-quickstart.ipynb": _check_quickstart,
    "02-remote-cells.ipynb": _check_remote_cells,
    "03-dashboard-and-lineage.ipynb": _check_dashboard_and_lineage,
    "04-evolution-strategies.ipynb": _check_es,
    "05-ppo-parameter-server.ipynb": _check_ppo,
    "06-allreduce.ipynb": _check_allreduce,
    "07-serving-latency.ipynb": _check_serving,
    "08-hyperparameter-search.ipynb": _check_hpo,
    "09-data-with-arrow.ipynb": _check_arrow,
    "10-multi-node.ipynb": _check_multi_node,
}
