"""A notebook kernel drives a cluster in client mode: ``%lumos init --address lumos://…``.

The kernel runs with a session root of its own (no cluster was started there), so
nothing but the ``lumos://`` link can serve it: ``%%remote`` cells in each mode, a
progress bar, the status card with the dashboard link.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import Any

import pytest

from tests.conftest import TEST_CONFIG
from tests.kernelext.kernel_client import DirectKernel, lumos_cli

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]


def test_kernel_in_client_mode_runs_remote_cells_of_every_kind(tmp_path: Any) -> None:
    root = tempfile.mkdtemp(prefix="lumos-kcm-")
    elsewhere = tempfile.mkdtemp(prefix="lumos-kcm-client-")
    k: DirectKernel | None = None
    try:
        out = lumos_cli(root, "start", "--head", "--port", "0", "--client-server-port", "0", "--num-cpus", "3",
                         "--dashboard-port", "0", "--object-store-memory", str(200 << 20),
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
        assert record["dashboard_url"] and record["dashboard_url"] in json.dumps(ctx.results), ctx

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
    finally:
        try:
            if k is not None:
                try:
                    k.run("lumos.shutdown()", timeout_s=30)
                finally:
                    k.close()
        finally:
            lumos_cli(root, "stop")
            shutil.rmtree(root, ignore_errors=True)
            shutil.rmtree(elsewhere, ignore_errors=True)
