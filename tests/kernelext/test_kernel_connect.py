"""A notebook kernel joins a running cluster from a cell (inside ipykernel's running loop)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import Any

import pytest

from tests.conftest import TEST_CONFIG, check_no_leaks, process_gone, wait_for
from tests.kernelext.kernel_client import DirectKernel, lumos_cli, shut_down_all

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]


def test_kernel_joins_a_running_cluster_and_never_falls_back_to_a_private_one(tmp_path: Any) -> None:
    # `lumos start --head` in a root of this test's own: "auto" finds it, `lumos stop` ends it
    # (a short path: Unix socket paths are limited to 107 bytes)
    root = tempfile.mkdtemp(prefix="lumos-kc-")
    try:
        _run_against_cli_cluster(root, tmp_path)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _run_against_cli_cluster(root: str, tmp_path: Any) -> None:
    lumos_cli(root, "start", "--head", "--port", "0", "--num-cpus", "3", "--no-dashboard",
               "--object-store-memory", str(200 * 1024 * 1024), "--system-config", json.dumps(TEST_CONFIG))
    record: dict[str, Any] = {}
    k: DirectKernel | None = None
    try:
        with open(os.path.join(root, "current_cluster.json")) as f:
            record = json.load(f)
        with open(os.path.join(record["session_dir"], "token")) as f:
            token = f.read().strip()
        k = DirectKernel(str(tmp_path), env={"LUMOS_TMPDIR": root})
        k.ok("%load_ext lumos\nimport asyncio, lumos\nasyncio.get_running_loop()")  # cells run in a loop
        k.ok("%lumos init --address auto")
        out = k.ok("%%remote\nimport lumos\nnode = lumos.get_runtime_context().get_node_id()\n"
                   "print('on', node)\nprint('cpus', lumos.cluster_resources()['CPU'])")
        assert f"on {record['node_id']}" in out.stdout and "cpus 3.0" in out.stdout, out
        k.ok("%lumos shutdown")

        k.ok(f"ctx = lumos.init(address={record['gcs_address']!r}, _token={token!r})\n"
             "assert lumos.cluster_resources()['CPU'] == 3\nlumos.shutdown()")

        # a failed connect raises, and the next cell does not start a private cluster instead
        out = k.run("%lumos init --address 127.0.0.1:1")
        assert [e["ename"] for e in out.errors] == ["ConnectionError"], out
        assert "127.0.0.1:1" in out.errors[0]["evalue"]
        assert "magics.py" not in out.traceback() and "api.py" not in out.traceback()
        out = k.run("%%remote\n1 + 1")
        assert [e["ename"] for e in out.errors] == ["ConnectionError"], out
        assert "not connected" in out.errors[0]["evalue"] and "--address" in out.errors[0]["evalue"]
        assert "remote.py" not in out.traceback() and "magics.py" not in out.traceback()
        out = k.ok("print(lumos.is_initialized())")
        assert out.stdout.strip() == "False"
    finally:
        shut_down_all(k, root)
    wait_for(lambda: all(process_gone(pid) for pid in record.get("pids", [])), timeout_s=20)
    check_no_leaks(record.get("session_dir"))
