"""Node failure across real raylet processes: nothing waiting on a dead node hangs."""

from __future__ import annotations

import os
from typing import Any, Iterator

import psutil
import pytest

import lumos
from lumos.testing import Cluster
from tests.conftest import TEST_CONFIG, check_no_leaks, running_two_nodes, wait_for


@lumos.remote(resources={"far": 1})
def make(seed: int) -> Any:
    import numpy as np
    return np.random.default_rng(seed).random(500_000)  # 4 MB: kept in the node's store


@pytest.fixture
def far() -> Iterator[tuple[Cluster, Any]]:
    """A head of one CPU and a node with the "far" resource (to be killed)."""
    yield from running_two_nodes(1, num_cpus=1, resources={"far": 1})


@lumos.remote
def total(a: Any) -> float:
    return float(a.sum())


def _kill(cluster: Cluster, node: Any) -> None:
    """Kill ``node`` without grace and wait until the cluster counts it dead."""
    cluster.remove_node(node)
    wait_for(lambda: not [n for n in lumos.nodes() if n["NodeID"] == node.node_id and n["Alive"]], 10)


@pytest.mark.slow
def test_object_on_a_dead_node_raises_object_lost() -> None:
    import numpy as np
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "_system_config": dict(TEST_CONFIG)})
    try:
        node = cluster.add_node(num_cpus=1, resources={"doomed": 1})
        cluster.connect()

        @lumos.remote(resources={"doomed": 1}, max_retries=0)
        def make() -> Any:
            return np.ones(2_000_000)

        ref = make.remote()
        lumos.wait([ref], timeout=60, fetch_local=False)  # (its only copy stays there)
        cluster.remove_node(node)
        wait_for(lambda: not [n for n in lumos.nodes() if n["NodeID"] == node.node_id and n["Alive"]], 10)
        with pytest.raises(lumos.exceptions.ObjectLostError, match="could not be copied"):
            lumos.get(ref, timeout=30)
    finally:
        cluster.shutdown()
        check_no_leaks(cluster.session_dir)


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_task_running_on_a_killed_node_is_retried_on_another(tmp_path: Any) -> None:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "_system_config": dict(TEST_CONFIG)})
    try:
        nodes = {n.node_id: n for n in (cluster.add_node(num_cpus=1, resources={"w": 1}),
                                         cluster.add_node(num_cpus=1, resources={"w": 1}))}
        cluster.connect()
        marker = str(tmp_path / "first_attempt")

        @lumos.remote(resources={"w": 1}, max_retries=2)
        def long_job(path: str) -> tuple[str, int]:
            import os
            import time
            here = lumos.get_runtime_context().get_node_id()
            if not os.path.exists(path):
                with open(path + ".tmp", "w") as f:
                    f.write(here)
                os.rename(path + ".tmp", path)
                time.sleep(300)  # ends only with its node
            return here, os.getpid()

        ref = long_job.remote(marker)
        def first_node() -> str | None:
            if not os.path.exists(marker):
                return None
            with open(marker) as f:
                return f.read()

        first = wait_for(first_node, 30, 0.05)
        assert first in nodes
        cluster.remove_node(nodes[first])
        where, _pid = lumos.get(ref, timeout=60)
        assert where != first and where in nodes
        # The task's record shows the retry.
        rows = [t for t in lumos.state.list_tasks() if t["name"].endswith("long_job")]
        assert rows and max(r["attempt_number"] for r in rows) >= 1, rows
        # The workers of the killed node are dead, a system error, for the node's death.
        there = [w for w in lumos.state.list_workers() if w["node_id"] == first]
        assert there and all(w["state"] == "DEAD" and w["exit_type"] == "SYSTEM_ERROR"
                             and w["exit_detail"].startswith("node died") for w in there), there
        # No retries left: Ray's NodeDiedError (a WorkerCrashedError too, as lumos said before).
        os.remove(marker)
        (survivor,) = [n for n in nodes if n != first]
        ref = long_job.options(max_retries=0).remote(marker)
        assert wait_for(first_node, 30, 0.05) == survivor
        cluster.remove_node(nodes[survivor])
        with pytest.raises(lumos.exceptions.NodeDiedError, match="node died|declared dead") as info:
            lumos.get(ref, timeout=60)
        assert isinstance(info.value, lumos.exceptions.WorkerCrashedError)
    finally:
        cluster.shutdown()
        check_no_leaks(cluster.session_dir)


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_object_of_a_dead_owner_on_another_node_raises_owner_died() -> None:
    import numpy as np
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "_system_config": dict(TEST_CONFIG)})
    try:
        cluster.add_node(num_cpus=1, resources={"far": 1})
        cluster.connect()

        @lumos.remote(resources={"far": 1})
        class Owner:
            def make(self, big: bool) -> list[Any]:
                # The actor owns what it puts; the driver only borrows it.
                return [lumos.put(np.ones(1_000_000) if big else 7)]

            def pid(self) -> int:
                return os.getpid()

        owner = Owner.remote()
        [small], [big] = lumos.get([owner.make.remote(False), owner.make.remote(True)], timeout=60)
        assert lumos.get(small, timeout=30) == 7
        pid = lumos.get(owner.pid.remote(), timeout=30)
        lumos.kill(owner)  # returns at once, as Ray's does: wait until the process is gone
        wait_for(lambda: not psutil.pid_exists(pid), 30, 0.05)
        with pytest.raises(lumos.exceptions.OwnerDiedError):
            lumos.get(big, timeout=30)
        # Nothing else broke: new work runs.
        assert lumos.get(lumos.remote(lambda: 1).remote(), timeout=30) == 1
    finally:
        cluster.shutdown()
        check_no_leaks(cluster.session_dir)


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_value_lost_with_its_node_is_rebuilt_from_lineage(far: tuple[Cluster, Any]) -> None:
    import numpy as np
    cluster, doomed = far

    @lumos.remote(resources={"far": 1})
    def double(a: Any) -> Any:
        return a * 2

    @lumos.remote(resources={"far": 1}, max_retries=0)
    def once() -> Any:
        return np.ones(500_000)

    base = make.remote(7)
    chained = double.remote(base)  # its argument is lost with it: rebuilt first
    single = once.remote()
    lumos.wait([base, chained, single], num_returns=3, timeout=60, fetch_local=False)
    _kill(cluster, doomed)
    replacement = cluster.add_node(num_cpus=1, resources={"far": 1})

    expected = np.random.default_rng(7).random(500_000)
    # A new task whose argument died with the node: the argument is rebuilt first.
    assert lumos.get(total.remote(base), timeout=60) == pytest.approx(float(expected.sum()))
    assert np.array_equal(lumos.get(chained, timeout=60), expected * 2)
    assert np.array_equal(lumos.get(base, timeout=60), expected)
    # max_retries=0 also means no reconstruction (as in Ray): the loss is reported.
    with pytest.raises(lumos.exceptions.ObjectReconstructionFailedError, match="cannot be rebuilt"):
        lumos.get(single, timeout=30)  # (an ObjectLostError, Ray's class for it)
    rows = [r for r in lumos.state.list_tasks() if r["name"].endswith(("make", "double"))]
    # make ran twice: once on the dead node, once to rebuild the value (for total and double).
    assert len(rows) == 2 and all(r["attempt_number"] >= 1 for r in rows), rows
    assert all(r["node_id"] == replacement.node_id for r in rows), rows

    # The lineage is kept while the values are referenced, and let go with them.
    from lumos._private import worker_context
    cw = worker_context.core_worker
    assert cw is not None and len(cw.lineage) == 2
    del base, chained
    wait_for(lambda: not cw.lineage, 10, 0.05)


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_borrowers_and_queued_calls_get_a_lost_value_rebuilt_by_its_owner(tmp_path: Any) -> None:
    import time

    import numpy as np
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"home": 1},
                                                            "_system_config": dict(TEST_CONFIG)})
    try:
        doomed = cluster.add_node(num_cpus=1, resources={"far": 1})
        cluster.connect()

        @lumos.remote(num_cpus=0, resources={"home": 1})
        class Holder:
            def hold(self, refs: list[Any]) -> bool:
                self.ref = refs[0]  # a borrowed ref: the driver owns it
                # Learn where the value lives without copying it here.
                ready, _ = lumos.wait([self.ref], timeout=30, fetch_local=False)
                return bool(ready)

            def wait_for(self, path: str) -> None:
                while not os.path.exists(path):
                    time.sleep(0.02)

            def total_of(self, a: Any) -> float:
                return float(a.sum())

            def total_borrowed(self) -> float:
                return float(lumos.get(self.ref, timeout=60).sum())

            def total_first(self, refs: list[Any]) -> float:
                return float(lumos.get(refs[0], timeout=60).sum())

        as_arg, borrowed = make.remote(1), make.remote(2)
        once = make.options(max_retries=0).remote(3)  # cannot be rebuilt
        lumos.wait([as_arg, borrowed, once], num_returns=3, timeout=60, fetch_local=False)
        holder = Holder.remote()
        assert lumos.get(holder.hold.remote([borrowed]), timeout=30)
        gate = tmp_path / "go"
        blocker = holder.wait_for.remote(str(gate))
        # Sent to the actor now, with the argument's location; it runs after the node died.
        queued = holder.total_of.remote(as_arg)
        later = holder.total_borrowed.remote()
        _kill(cluster, doomed)
        replacement = cluster.add_node(num_cpus=1, resources={"far": 1})
        gate.write_text("go")
        lumos.get(blocker, timeout=30)

        def expected(seed: int) -> float:
            return pytest.approx(float(np.random.default_rng(seed).random(500_000).sum()))

        # The queued call could not copy its argument from the dead node: the owner ran
        # make(1) again, and the call read the new copy.
        assert lumos.get(queued, timeout=60) == expected(1)
        # The borrower knew the old location only: the owner rebuilt make(2) for it.
        assert lumos.get(later, timeout=60) == expected(2)
        # A borrower of a value its owner cannot rebuild gets Ray's class for it, as the owner would.
        with pytest.raises(lumos.exceptions.ObjectReconstructionFailedError, match="cannot be rebuilt"):
            lumos.get(holder.total_first.remote([once]), timeout=60)
        rows = [r for r in lumos.state.list_tasks() if r["name"].endswith("make") and r["attempt_number"] >= 1]
        assert len(rows) == 2 and all(r["node_id"] == replacement.node_id for r in rows), rows
    finally:
        cluster.shutdown()
        check_no_leaks(cluster.session_dir)


@lumos.remote(resources={"far": 1})
class Maker:
    def make(self, seed: int) -> Any:
        import numpy as np
        return np.random.default_rng(seed).random(500_000)


def _files_in(node: Any, refs: list[Any]) -> set[str]:
    """Which of ``refs`` have a file in ``node``'s object store."""
    return {r.hex() for r in refs} & set(os.listdir(node.object_store_dir))


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_value_whose_node_died_lives_on_in_a_copy_on_another_node(far: tuple[Cluster, Any]) -> None:
    # As in Ray: a copy another node pulled becomes the value's home. The task's value is
    # not made again, and an actor's return (no lineage) is not lost.
    import numpy as np
    from lumos.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    cluster, doomed = far

    maker = Maker.remote()
    value, returned = make.remote(3), maker.make.remote(4)
    lumos.wait([value, returned], num_returns=2, timeout=60, fetch_local=False)
    survivor = cluster.add_node(num_cpus=1, resources={"far": 1})
    there = total.options(scheduling_strategy=NodeAffinitySchedulingStrategy(survivor.node_id, soft=False))
    expected = {seed: float(np.random.default_rng(seed).random(500_000).sum()) for seed in (3, 4)}
    # A task on the survivor pulls copies of both into its store.
    assert lumos.get([there.remote(value), there.remote(returned)], timeout=60) == \
        pytest.approx([expected[3], expected[4]])
    assert _files_in(survivor, [value, returned]) == {value.hex(), returned.hex()}
    _kill(cluster, doomed)
    assert float(lumos.get(value, timeout=60).sum()) == pytest.approx(expected[3])
    assert float(lumos.get(returned, timeout=60).sum()) == pytest.approx(expected[4])
    # Read there by a new task too (its argument is not taken for lost).
    assert lumos.get(there.remote(returned), timeout=60) == pytest.approx(expected[4])
    rows = [r for r in lumos.state.list_tasks() if r["name"].endswith("make")]
    assert len(rows) == 2 and all(r["attempt_number"] == 0 for r in rows), rows  # nothing ran again
    # The copies are the values now: freed with the last reference.
    del value, returned
    wait_for(lambda: not [f for f in os.listdir(survivor.object_store_dir) if len(f) == 40], 10, 0.05)


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_wait_copies_ready_values_here_unless_fetch_local_is_false(far: tuple[Cluster, Any]) -> None:
    import numpy as np
    cluster, doomed = far
    head = cluster.head_node
    once = make.options(max_retries=0)
    kept, elsewhere = once.remote(1), once.remote(2)
    # (Pending when asked: the first values of other nodes this driver hears of.)
    ready, not_ready = lumos.wait([kept, elsewhere], num_returns=1, timeout=60)  # (fetch_local=True)
    assert len(ready) == 1 and len(not_ready) == 1 and _files_in(head, ready) == {ready[0].hex()}
    ready, _ = lumos.wait([kept, elsewhere], num_returns=2, timeout=60)
    assert ready == [kept, elsewhere] and _files_in(head, ready) == {kept.hex(), elsewhere.hex()}
    there = once.remote(3)
    ready, _ = lumos.wait([there], timeout=60, fetch_local=False)
    assert ready == [there] and not _files_in(head, [there])
    _kill(cluster, doomed)
    # The copies here outlive the node (max_retries=0: nothing could rebuild them).
    for ref, seed in ((kept, 1), (elsewhere, 2)):
        assert np.array_equal(lumos.get(ref, timeout=30), np.random.default_rng(seed).random(500_000))
    with pytest.raises(lumos.exceptions.ObjectReconstructionFailedError):
        lumos.get(there, timeout=30)


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_copy_evicted_before_its_node_died_is_not_used_the_value_is_rebuilt(far: tuple[Cluster, Any]) -> None:
    import numpy as np
    from lumos.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    cluster, doomed = far

    @lumos.remote
    def fill() -> int:
        # 16 MB more in a 16 MiB store that holds a 4 MB copy: the copy, a cache, goes.
        refs = [lumos.put(np.ones(500_000)) for _ in range(4)]
        return len(refs)

    value = make.remote(5)
    lumos.wait([value], timeout=60, fetch_local=False)
    survivor = cluster.add_node(num_cpus=1, resources={"far": 1}, object_store_memory=16 * 1024 * 1024)
    there = NodeAffinitySchedulingStrategy(survivor.node_id, soft=False)
    expected = float(np.random.default_rng(5).random(500_000).sum())
    assert lumos.get(total.options(scheduling_strategy=there).remote(value), timeout=60) == pytest.approx(expected)
    # (Filled again while the copy stays: the reader's view of it may not be let go yet.)
    wait_for(lambda: lumos.get(fill.options(scheduling_strategy=there).remote(), timeout=60) == 4
             and not _files_in(survivor, [value]), 30, 0.1)
    _kill(cluster, doomed)
    # The owner tried the copy, the survivor no longer had it: make runs again there.
    assert float(lumos.get(value, timeout=60).sum()) == pytest.approx(expected)
    rows = [r for r in lumos.state.list_tasks() if r["name"].endswith("make")]
    assert len(rows) == 1 and rows[0]["attempt_number"] >= 1 and rows[0]["node_id"] == survivor.node_id, rows


@lumos.remote(resources={"far": 1})
def stream_make(n: int) -> Any:
    import numpy as np
    for seed in range(n):
        yield np.random.default_rng(seed).random(500_000)  # 4 MB each: kept in the node's store


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_values_of_a_stream_lost_with_their_node_are_rebuilt(far: tuple[Cluster, Any]) -> None:
    import numpy as np
    cluster, doomed = far
    refs = list(stream_make.remote(3))
    lumos.wait(refs, num_returns=3, timeout=60, fetch_local=False)  # (no copies here)
    _kill(cluster, doomed)
    replacement = cluster.add_node(num_cpus=1, resources={"far": 1})
    expected = np.random.default_rng(1).random(500_000)
    assert np.array_equal(lumos.get(refs[1], timeout=60), expected)  # the stream ran again
    assert np.array_equal(lumos.get(refs[2], timeout=60), np.random.default_rng(2).random(500_000))
    rows = [r for r in lumos.state.list_tasks() if r["name"].endswith("stream_make")]
    assert len(rows) == 1 and rows[0]["attempt_number"] >= 1 and rows[0]["node_id"] == replacement.node_id
