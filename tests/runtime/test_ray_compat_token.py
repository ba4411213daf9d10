"""``lumos.init(address=...)`` finds the token of a cluster this user started on this
machine, as Ray does for a local cluster; when it cannot, the error says where it looked."""

from __future__ import annotations

import os
from typing import Any, Iterator

import pytest

import lumos
from lumos._private.node import session_root
from lumos.testing import Cluster
from tests.conftest import TEST_CONFIG, check_no_leaks


@pytest.fixture
def local_cluster(monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    monkeypatch.delenv("LUMOS_CLUSTER_TOKEN", raising=False)
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "_system_config": dict(TEST_CONFIG)})
    try:
        yield c
    finally:
        lumos.shutdown()
        c.shutdown()
        check_no_leaks(c.session_dir)


@lumos.remote
def one() -> int:
    return 1


def test_init_finds_the_token_of_a_local_cluster_by_its_address(local_cluster: Cluster) -> None:
    lumos.init(address=local_cluster.address, _system_config=dict(TEST_CONFIG))  # no _token=
    assert lumos.get(one.remote(), timeout=30) == 1
    with open(os.path.join(local_cluster.session_dir, "gcs_address")) as f:
        assert f.read().strip().endswith(local_cluster.address.rsplit(":", 1)[1])


def test_init_without_a_token_says_where_it_looked(local_cluster: Any) -> None:
    host, port = local_cluster.address.rsplit(":", 1)
    elsewhere = f"{host}:{int(port) + 1 if int(port) < 65535 else 1}"
    with pytest.raises(ConnectionError, match="needs the cluster token") as info:
        lumos.init(address=elsewhere, _system_config=dict(TEST_CONFIG))
    assert os.path.join(session_root(), "session_*", "gcs_address") in str(info.value)
