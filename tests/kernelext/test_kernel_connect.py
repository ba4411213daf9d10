"""A notebook kernel joins a running cluster from a cell (inside ipykernel's running loop)."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from lumos.testing import Cluster
from tests.conftest import TEST_CONFIG, check_no_leaks
from tests.kernelext.kernel_client import DirectKernel

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]


def test_kernel_joins_a_running_cluster_and_never_falls_back_to_a_private_one(tmp_path: Any) -> None:
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 3, "object_store_memory": 200 * 1024 * 1024, "_system_config": TEST_CONFIG})
    head = cluster.head_node
    assert head is not None
    # "auto" reads the machine's current cluster record; this test's is in its own root
    root = tmp_path / "root"
    root.mkdir(mode=0o700)
    (root / "current_cluster.json").write_text(json.dumps(
        {"gcs_address": cluster.gcs_address, "session_dir": cluster.session_dir}))
    k = DirectKernel(str(tmp_path), env={"LUMOS_TMPDIR": str(root)})
    try:
        k.ok("%load_ext lumos\nimport asyncio, lumos\nasyncio.get_running_loop()")  # cells run in a loop
        k.ok("%lumos init --address auto")
        out = k.ok("%%remote\nimport lumos\nnode = lumos.get_runtime_context().get_node_id()\n"
                   "print('on', node)\nprint('cpus', lumos.cluster_resources()['CPU'])")
        assert f"on {head.node_id}" in out.stdout and "cpus 3.0" in out.stdout, out
        k.ok("%lumos shutdown")

        token = cluster._token
        k.ok(f"ctx = lumos.init(address={cluster.gcs_address!r}, _token={token!r})\n"
             "assert lumos.cluster_resources()['CPU'] == 3\nlumos.shutdown()")

        # a failed connect raises, and the next cell does not start a private cluster instead
        out = k.run("%lumos init --address 127.0.0.1:1")
        assert [e["ename"] for e in out.errors] == ["ConnectionError"], out
        assert "127.0.0.1:1" in out.errors[0]["evalue"]
        out = k.run("%%remote\n1 + 1")
        assert [e["ename"] for e in out.errors] == ["ConnectionError"], out
        assert "not connected" in out.errors[0]["evalue"] and "--address" in out.errors[0]["evalue"]
        assert "remote.py" not in out.traceback() and "magics.py" not in out.traceback()
        out = k.ok("print(lumos.is_initialized())")
        assert out.stdout.strip() == "False"
    finally:
        try:
            k.run("lumos.shutdown()", timeout_s=30)
        finally:
            k.close()
            cluster.shutdown()
    check_no_leaks(cluster.session_dir)
    assert not os.path.exists(os.path.join(cluster.session_dir, "sockets", "gcs.sock"))
