"""Fixtures for the notebook front end: a real ipykernel driven through nbclient.

``kernel`` (module scope) starts an ipykernel, loads the extension and starts a
private lumos cluster *inside the kernel* (2 CPUs, 2 declared GPUs, the test config).
Tests append cells one at a time with ``kernel.run(source)`` and assert on the cell's
outputs and on values read back from the kernel. At teardown the cluster is shut down
in the kernel, the kernel is stopped, and no lumos process may remain.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any, Iterator

import nbformat
import pytest
from nbclient import NotebookClient

from tests.conftest import TEST_CONFIG, check_no_leaks

CELL_TIMEOUT_S = 60


class KernelSession:
    """A notebook being executed cell by cell in a live kernel."""

    def __init__(self, client: NotebookClient, nb: Any) -> None:
        self.client = client
        self.nb = nb
        self.session_dir: str | None = None

    def add(self, source: str) -> Any:
        cell = nbformat.v4.new_code_cell(source)
        self.nb.cells.append(cell)
        return cell

    def execute(self, cell: Any) -> Any:
        self.client.execute_cell(cell, self.nb.cells.index(cell), store_history=True)
        return cell

    def run(self, source: str) -> Any:
        """Run one cell; returns it (``.outputs``). Errors stay in the outputs."""
        return self.execute(self.add(source))

    def value(self, expr: str) -> Any:
        """``expr`` evaluated in the kernel, passed back as JSON."""
        cell = self.run(f"import json as _json\nprint(_json.dumps({expr}))")
        err = errors(cell)
        assert not err, f"evaluating {expr!r} failed: {err}"
        return json.loads(stdout(cell).strip().splitlines()[-1])


def stdout(cell: Any, name: str = "stdout") -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream" and o.name == name)


def errors(cell: Any) -> list[Any]:
    return [o for o in cell.outputs if o.output_type == "error"]


def result_text(cell: Any) -> str | None:
    for o in cell.outputs:
        if o.output_type == "execute_result":
            return str(o.data.get("text/plain"))
    return None


def displays(cell: Any) -> list[dict[str, Any]]:
    return [dict(o.data) for o in cell.outputs if o.output_type == "display_data"]


def start_kernel(tmp_path: Any, init: str) -> KernelSession:
    nb = nbformat.v4.new_notebook()
    client = NotebookClient(nb, kernel_name="python3", timeout=CELL_TIMEOUT_S, allow_errors=True,
                            store_widget_state=True, resources={"metadata": {"path": str(tmp_path)}})
    k = KernelSession(client, nb)
    return k


@contextlib.contextmanager
def running_kernel(tmp_path: Any, init_args: str = "num_cpus=2, num_gpus=2") -> Iterator[KernelSession]:
    """A kernel with the extension loaded and a lumos cluster started in it."""
    k = start_kernel(tmp_path, init_args)
    with k.client.setup_kernel():
        try:
            cell = k.run("%load_ext lumos\nimport lumos\n"
                         f"_ctx = lumos.init({init_args}, object_store_memory=600 * 1024 * 1024, "
                         f"_system_config={TEST_CONFIG!r})\n"
                         "print(_ctx.address_info['session_dir'])")
            assert not errors(cell), errors(cell)
            k.session_dir = stdout(cell).strip().splitlines()[-1]
            yield k
        finally:
            with contextlib.suppress(Exception):
                k.run("lumos.shutdown()")
    check_no_leaks(k.session_dir)


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: Any) -> Iterator[KernelSession]:
    with running_kernel(tmp_path_factory.mktemp("nb")) as k:
        yield k


@pytest.fixture(autouse=True)
def _no_stray_env() -> Iterator[None]:
    # nbclient kernels inherit the environment: a LUMOS_ADDRESS would join a foreign cluster.
    old = os.environ.pop("LUMOS_ADDRESS", None)
    try:
        yield
    finally:
        if old is not None:
            os.environ["LUMOS_ADDRESS"] = old
