"""Actor tests that need a cluster of their own: detached actors, GPUs."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import lumos

from tests.conftest import wait_for
from tests.runtime.test_actors import _named_exists


def test_detached_actor_outlives_its_driver() -> None:
    from lumos.testing import Cluster
    from tests.conftest import TEST_CONFIG
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "_system_config": TEST_CONFIG})
    try:
        script = textwrap.dedent(f"""
            import lumos
            lumos.init(address={cluster.address!r}, _token={cluster.token!r}, namespace="team")
            @lumos.remote
            class Store:
                def __init__(self):
                    self.items = []
                def add(self, x):
                    self.items.append(x)
                    return len(self.items)
                def all(self):
                    return self.items
            s = Store.options(name="store", lifetime="detached").remote()
            t = Store.options(name="temp").remote()
            print(lumos.get(s.add.remote("first")), lumos.get(t.add.remote(1)))
        """)
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split()[-2:] == ["1", "1"]
        cluster.connect(namespace="team")
        store = lumos.get_actor("store")
        assert lumos.get(store.add.remote("second")) == 2
        assert lumos.get(store.all.remote()) == ["first", "second"]
        with pytest.raises(ValueError):  # the non-detached one died with its job
            wait_for(lambda: not _named_exists("temp"), 10)
            lumos.get_actor("temp")
        lumos.kill(store)
    finally:
        cluster.shutdown()


def test_actor_gpus(fresh_cluster) -> None:  # type: ignore[no-untyped-def]
    fresh_cluster(num_cpus=2, num_gpus=2)

    @lumos.remote(num_gpus=1)
    class GpuUser:
        def ids(self) -> tuple[list[int], str | None]:
            return lumos.get_gpu_ids(), os.environ.get("CUDA_VISIBLE_DEVICES")

    a, b = GpuUser.remote(), GpuUser.remote()
    ids_a, env_a = lumos.get(a.ids.remote())
    ids_b, env_b = lumos.get(b.ids.remote())
    assert len(ids_a) == 1 and len(ids_b) == 1 and ids_a != ids_b
    assert env_a == str(ids_a[0]) and env_b == str(ids_b[0])
    assert lumos.get(a.ids.remote()) == (ids_a, env_a)  # kept across calls
    assert lumos.available_resources().get("GPU", 0) == 0


def test_an_actor_runs_in_its_creators_namespace_whoever_calls_it() -> None:
    """As in Ray: get_runtime_context().namespace, get_actor and named children inside an
    actor are its creator's namespace, also while it runs another job's call (it took the
    calling job's)."""
    from lumos.testing import Cluster
    from tests.conftest import TEST_CONFIG
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "_system_config": TEST_CONFIG})
    try:
        script = textwrap.dedent(f"""
            import lumos
            lumos.init(address={cluster.address!r}, _token={cluster.token!r}, namespace="home")

            @lumos.remote
            class Where:
                def namespace(self):
                    return lumos.get_runtime_context().namespace

                def sibling(self):
                    return lumos.get(lumos.get_actor("sibling").namespace.remote())

            Where.options(name="where", lifetime="detached").remote()
            Where.options(name="sibling", lifetime="detached").remote()
            print(lumos.get(lumos.get_actor("where").namespace.remote()))
        """)
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split()[-1] == "home"
        cluster.connect(namespace="visitor")
        where = lumos.get_actor("where", namespace="home")
        assert lumos.get(where.namespace.remote(), timeout=30) == "home"
        assert lumos.get(where.sibling.remote(), timeout=30) == "home"
        lumos.kill(where)
        lumos.kill(lumos.get_actor("sibling", namespace="home"))
    finally:
        cluster.shutdown()
