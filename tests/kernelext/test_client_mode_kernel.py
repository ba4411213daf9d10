"""A notebook kernel drives a cluster in client mode: ``%lumos init --address lumos://…``.

The kernel runs with a session root of its own (no cluster was started there), so
nothing but the ``lumos://`` link can serve it: ``%%remote`` cells in each mode, a
progress bar, the status card with the dashboard link.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from typing import Any, Iterator

import pytest

from tests.conftest import TEST_CONFIG
from tests.kernelext.kernel_client import DirectKernel, lumos_cli, shut_down_all

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]


@contextlib.contextmanager
def _client_kernel(tmp_path: Any, *start: str) -> Iterator[tuple[DirectKernel, dict[str, Any]]]:
    """A head of its own (``lumos start --head`` with ``start``'s options) and a kernel
    connected to it with ``%lumos init --address lumos://…``; the head's record."""
    root = tempfile.mkdtemp(prefix="lumos-kcm-")
    elsewhere = tempfile.mkdtemp(prefix="lumos-kcm-client-")
    k: DirectKernel | None = None
    try:
        out = lumos_cli(root, "start", "--head", "--port", "0", "--client-server-port", "0", *start,
                         "--system-config", json.dumps(TEST_CONFIG))
        address = next(line.split("client address:", 1)[1].strip() for line in out.splitlines()
                       if "client address:" in line)
        assert address.startswith("lumos://127.0.0.1:")
        with open(os.path.join(root, "current_cluster.json")) as f:
            record = json.load(f)
        token_file = tmp_path / "token"
        shutil.copy(os.path.join(record["session_dir"], "token"), token_file)
        token_file.chmod(0o600)

        k = DirectKernel(str(tmp_path), env={"LUMOS_TMPDIR": elsewhere})
        k.ok("%load_ext lumos\nimport lumos")
        ctx = k.ok(f"%lumos init --address {address} --token-file {token_file}")
        if record["dashboard_url"]:
            assert record["dashboard_url"] in json.dumps(ctx.results), ctx
        yield k, record
    finally:
        try:
            shut_down_all(k, root)
        finally:
            shutil.rmtree(root, ignore_errors=True)
            shutil.rmtree(elsewhere, ignore_errors=True)


def test_kernel_in_client_mode_runs_remote_cells_of_every_kind(tmp_path: Any) -> None:
    with _client_kernel(tmp_path, "--num-cpus", "3", "--dashboard-port", "0",
                        "--object-store-memory", str(200 << 20)) as (k, record):
        assert record["dashboard_url"]
        out = k.ok("%%remote\nimport os, lumos\nnode = lumos.get_runtime_context().get_node_id()\n"
                   "print('on', node)\nbig = bytes(3 << 20)")
        assert f"on {record['node_id']}" in out.stdout, out
        k.ok("assert node == " + repr(record["node_id"]) + " and len(big) == 3 << 20")

        out = k.ok("%%remote --map x=range(4)\nsq = x * x")
        k.ok("assert sq == [0, 1, 4, 9], sq")

        k.ok("%%remote --session trainer\nsteps = 1")
        k.ok("extra = 41")
        k.ok("%%remote --session trainer --push extra\nsteps += extra")
        k.ok("%%remote --session trainer --pull steps\npass")
        k.ok("assert steps == 42, steps")

        k.ok("%%remote --async --out later\nimport time\ntime.sleep(0.5)\nlater = 'done'")
        k.ok("assert type(later).__name__ == 'ObjectRef'\nassert lumos.get(later, timeout=60) == 'done'", timeout_s=90)

        out = k.run("%%remote\nraise KeyError('missing-7')")
        assert [e["ename"] for e in out.errors] and "missing-7" in out.traceback(), out

        out = k.ok("@lumos.remote\ndef f(i):\n    return i\n"
                   "p = lumos.progress([f.remote(i) for i in range(5)], 'client')\np.wait(60)\nprint(p.text())")
        assert "5/5" in out.stdout, out

        status = k.ok("%lumos status")
        assert record["dashboard_url"] in json.dumps(status.results + status.displays), status
        k.ok("%lumos shutdown")


def test_a_cell_in_client_mode_finds_lumos_sigint_handler_on_its_first_line(tmp_path: Any) -> None:
    """The kernel puts Python's default SIGINT handler back before each cell; while a
    ``lumos://`` driver is connected, lumos's own is back in place from the cell's first
    line (else a press landing in a finalizer before the cell's first put, call or get
    left the finalizer's work half done), as for a local driver; after ``%lumos shutdown``
    no longer."""
    with _client_kernel(tmp_path, "--num-cpus", "1", "--no-dashboard",
                        "--object-store-memory", str(100 << 20)) as (k, _):
        k.ok("import signal\nfrom lumos._private import interrupts\n"
             "ours = lambda: signal.getsignal(signal.SIGINT) is interrupts._on_sigint\n"
             "assert lumos.get(lumos.put(1), timeout=30) == 1")
        for _ in range(2):
            assert "ours True" in k.ok("print('ours', ours())").stdout
        k.ok("assert lumos.get(lumos.put(2), timeout=30) == 2")
        assert "ours True" in k.ok("print('ours', ours())").stdout
        k.ok("%lumos shutdown")
        assert "ours False" in k.ok("print('ours', ours())").stdout
