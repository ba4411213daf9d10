"""A driver of another lumos meeting a cluster: the handshake carries the wire version
(``auth.WIRE_VERSION``), and a mismatch is refused at once with a message naming both
versions, on both ends, while the cluster serves its own processes as before."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import textwrap

import pytest

import lumos
from tests.conftest import wait_for

pytestmark = pytest.mark.timeout(120)

CONNECT_AS = """
    import lumos
    from lumos._private.protocol import auth
    {patch}
    try:
        lumos.init(address={address!r}, _token={token!r})
    except ConnectionError as e:
        print("REFUSED", e)
    else:
        print("CONNECTED")
        lumos.shutdown()
"""


def _connect_as(cluster: lumos.LumosContext, patch: str) -> str:
    info = cluster.address_info
    with open(os.path.join(info["session_dir"], "token")) as f:
        token = f.read().strip()
    code = textwrap.dedent(CONNECT_AS).format(patch=patch, address=info["gcs_address"], token=token)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


# Each test has its own cluster: the GCS rate-limits a peer's drop warnings.


def _gcs_log(cluster: lumos.LumosContext) -> str:
    text = ""
    for path in glob.glob(os.path.join(cluster.address_info["session_dir"], "logs", "gcs*.log")):
        with open(path, errors="replace") as f:
            text += f.read()
    return text


@lumos.remote
def double(x: int) -> int:
    return 2 * x


def test_a_driver_of_another_wire_version_is_refused_with_both_versions(fresh_cluster) -> None:
    from lumos._private.protocol import auth
    cluster = fresh_cluster()
    out = _connect_as(cluster, "auth.WIRE_VERSION = 999")
    assert "REFUSED" in out, out
    assert f"wire format {auth.WIRE_VERSION}" in out and "wire format 999" in out, out
    assert "same lumos version" in out and "token" not in out.split("REFUSED", 1)[1].split("(")[0], out
    wait_for(lambda: "lumos wire format 999" in _gcs_log(cluster), 10)
    assert lumos.get(double.remote(21), timeout=30) == 42  # the cluster serves on


def test_a_driver_from_before_wire_versions_is_refused_and_logged(fresh_cluster) -> None:
    cluster = fresh_cluster()
    out = _connect_as(cluster, "auth.client_hello = lambda nonce: nonce")
    assert "REFUSED" in out, out
    wait_for(lambda: "an older lumos (without wire versions)" in _gcs_log(cluster), 10)
    assert lumos.get(double.remote(4), timeout=30) == 8


def test_the_same_version_connects(fresh_cluster) -> None:
    cluster = fresh_cluster()
    assert "CONNECTED" in _connect_as(cluster, "pass")
