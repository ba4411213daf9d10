"""The store while workers are killed under a stream of tasks that put and return large
values: retries make the same object ids again at once, and nothing the dead workers
left behind may touch the new files."""

from __future__ import annotations

import glob
import os
import random
import signal
import threading
import time
import types
from typing import Any, Callable

import psutil
import pytest

import lumos
from lumos._private.raylet.server import RayletServer
from tests.conftest import wait_for

MiB = 1024 * 1024


def test_an_object_file_leaves_its_name_before_its_unlink_is_queued(tmp_path: Any) -> None:
    """The raylet moves an object's file out of its name at once (``_name_gone``) and
    the unlink thread removes it under that other name: a new file made under the
    object's name meanwhile (its task's retry) is never the one removed."""
    raylet = types.SimpleNamespace(_trashed=0)
    name = str(tmp_path / ("ab" * 20))
    with open(name, "wb") as f:
        f.write(b"old")
    trash = RayletServer._name_gone(raylet, name)  # type: ignore[arg-type]
    assert trash is not None and trash != name and not os.path.exists(name)
    with open(name, "wb") as f:  # the same id, created again
        f.write(b"new")
    os.unlink(trash)  # what the unlink thread does later
    with open(name, "rb") as f:
        assert f.read() == b"new"
    tmp = name + ".w"
    with open(tmp, "wb"):
        pass
    assert RayletServer._name_gone(raylet, tmp) not in (None, tmp) and not os.path.exists(tmp)
    assert RayletServer._name_gone(raylet, str(tmp_path / ("cd" * 20))) is None  # no file: nothing to unlink
    slot = str(tmp_path / "pool-3")
    assert RayletServer._name_gone(raylet, slot) == slot  # slot names are never made again


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_workers_killed_under_retried_puts_and_returns_lose_no_value_and_no_file(
        fresh_cluster: Callable[..., Any]) -> None:
    """Workers SIGKILLed every few tens of milliseconds while tasks put 1 MiB values and
    return them: every result is right, the raylet never finds an object's file missing
    (its log's "store rename ... failed", seen ~8 times in 20 s before queued unlinks of
    a dead owner's objects were moved out of their names first), and no object file
    is left once the driver holds nothing."""
    import numpy as np

    from lumos.api import worker_context
    ctx = fresh_cluster(num_cpus=2, object_store_memory=256 * MiB, include_dashboard=False)
    store_dir = worker_context.core_worker.store._prefix

    @lumos.remote(max_retries=20)
    def make(i: int) -> Any:
        a = np.full(MiB // 8, i, dtype=np.int64)
        ref = lumos.put(a)  # the same put id in every attempt
        return a, int(lumos.get(ref).sum())

    stop = threading.Event()
    kills = [0]

    def killer() -> None:
        me = psutil.Process()
        rng = random.Random(7)
        while not stop.wait(rng.uniform(0.005, 0.05)):
            workers = []
            for p in me.children(recursive=True):
                try:
                    if "worker.main" in " ".join(p.cmdline()):
                        workers.append(p)
                except psutil.Error:
                    pass
            if workers:
                try:
                    rng.choice(workers).send_signal(signal.SIGKILL)
                    kills[0] += 1
                except psutil.Error:
                    pass

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    done = 0
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            results = lumos.get([make.remote(i) for i in range(40)], timeout=60)
            for i, (a, total) in enumerate(results):
                assert a[0] == i and a[-1] == i and total == i * (MiB // 8)
            done += len(results)
            del results, a
    finally:
        stop.set()
        thread.join(10)
    assert kills[0] > 50 and done > 0
    (log,) = glob.glob(os.path.join(ctx.address_info["session_dir"], "logs", "raylet-*.log"))
    with open(log) as f:
        missing = [line for line in f if "store rename" in line]
    assert not missing, missing[:3]
    try:
        wait_for(lambda: not [n for n in os.listdir(store_dir) if len(n) == 40], 15)
    except AssertionError:
        raise AssertionError(f"object files left: {[n for n in os.listdir(store_dir) if len(n) == 40]}") from None


def test_a_create_answered_that_the_object_exists_makes_its_creator_the_owner(fresh_cluster) -> None:
    """A create of an id some process views already, at its size, is answered "exists"
    (the value is the creator's result); the object is the creator's owner's from then
    on, so the first owner's death no longer frees it."""
    import numpy as np
    from lumos._private import serialization, worker_context
    from lumos._private.protocol import raylet_messages as rm
    fresh_cluster(num_cpus=1, include_dashboard=False)
    store_dir = worker_context.core_worker.store._prefix

    @lumos.remote(num_cpus=0)
    class Holder:
        def put(self) -> bytes:
            self.ref = lumos.put(np.ones(2 * 1024 * 1024, dtype=np.uint8))
            self.view = lumos.get(self.ref)  # (viewed: never replaced by another's create)
            # A request behind the view's pin on the same connection: the raylet has it.
            worker_context.require().call_raylet(rm.GetNodeStats())
            return self.ref.binary()  # (the id only: this driver borrows nothing)

    holder = Holder.remote()
    oid = lumos.get(holder.put.remote(), timeout=60)
    assert os.path.exists(store_dir + oid.hex())
    cw = worker_context.require()
    size = serialization.serialize(np.ones(2 * 1024 * 1024, dtype=np.uint8)).total_size

    def answered_exists() -> bool:
        try:
            cw.call_raylet(rm.CreateObject(oid, size, cw.worker_id))
        except Exception as e:
            assert "_ObjectExists" in str(e) and "already exists" in str(e)
            return True
        raise AssertionError("created over a viewed object")

    assert answered_exists()
    lumos.kill(holder)
    wait_for(lambda: [a for a in lumos.util.state.list_actors() if a["state"] == "DEAD"], 30)
    # The raylet has handled the holder's death (its other objects went); this one stays.
    time.sleep(1.0)
    assert os.path.exists(store_dir + oid.hex())


def test_a_retrys_create_replaces_the_return_a_dead_attempt_sealed() -> None:
    from lumos._private.object_store import store_state as st
    D = "/dev/shm/lumos-test"
    s = st.ObjectStoreState(D, 64 * MiB, 32 * MiB, 2.0, validate=True)
    final = f"{D}/{b'r1'.hex()}"

    def sealed_by_dead_attempt() -> None:
        s.handle(st.CreateRequested(1, b"r1", MiB, b"dead"), 0)
        s.handle(st.ObjectSealed(b"r1", MiB), 0)

    sealed_by_dead_attempt()
    actions = s.handle(st.CreateRequested(2, b"r1", MiB + 4096, b"retry"), 0)
    assert actions[:2] == [st.UnlinkFile(final), st.DropSlot(b"dead", 1)]
    (grant,) = actions[2:]
    assert isinstance(grant, st.GrantCreate) and grant.object_id == b"r1" and grant.file_size == MiB + 4096
    assert s.objects[b"r1"].creator == b"retry" and s.used_bytes == MiB + 4096
    # Of the same size too (a task of several returns would otherwise mix two attempts').
    s.handle(st.ObjectSealed(b"r1", MiB + 4096), 0)
    actions = s.handle(st.CreateRequested(3, b"r1", MiB + 4096, b"retry2"), 0)
    assert actions[0] == st.UnlinkFile(final) and isinstance(actions[-1], st.GrantCreate)
    s.handle(st.ObjectSealed(b"r1", MiB + 4096), 0)
    # A value some process views is never replaced: at its size it is the create's
    # result ("exists"), at another the create is refused.
    s.handle(st.ObjectsPinned(b"reader", [b"r1"]), 0)
    (refused,) = s.handle(st.CreateRequested(4, b"r1", MiB + 4096, b"retry3"), 0)
    assert isinstance(refused, st.RejectCreate) and refused.exists
    (refused,) = s.handle(st.CreateRequested(5, b"r1", MiB, b"retry4"), 0)
    assert isinstance(refused, st.RejectCreate) and not refused.exists and b"r1" in s.objects


class _DieWhenPickled:
    def __reduce__(self) -> Any:
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("unreachable")


def test_a_retry_returns_its_own_values_when_its_dead_attempt_sealed_one_of_another_size(
        fresh_cluster, tmp_path: Any) -> None:
    import numpy as np
    fresh_cluster(num_cpus=1, include_dashboard=False)

    @lumos.remote(max_retries=2, num_returns=2)
    def nondeterministic(marker: str, mib: int) -> Any:
        first = not os.path.exists(marker)
        open(marker, "a").close()
        if first:  # its first return sealed, then the worker dies making the second
            return np.ones(mib * MiB, dtype=np.uint8), _DieWhenPickled()
        return np.full(mib * MiB + 3 * 4096, 2, dtype=np.uint8), "second"

    for mib in (1, 20):  # (through a reserved slot; through a create)
        a, b = nondeterministic.remote(str(tmp_path / f"ran-{mib}"), mib)
        value = lumos.get(a, timeout=60)
        assert value.size == mib * MiB + 3 * 4096 and int(value[0]) == 2
        assert lumos.get(b, timeout=60) == "second"


def test_a_create_replaces_a_pulled_copy_of_another_size_and_uses_one_of_its_size() -> None:
    """A re-run of a task on a node holding a copy of its earlier value pulled from
    another: of the same size the copy is its result ("exists"); of another (the value
    changed), the copy, a cache, goes. A pull still in progress is never replaced."""
    from lumos._private.object_store import store_state as st
    D = "/dev/shm/lumos-test"
    s = st.ObjectStoreState(D, 64 * MiB, 32 * MiB, 2.0, validate=True)
    s.handle(st.CreateRequested(1, b"v", MiB, st.PULLED), 0)
    (refused,) = s.handle(st.CreateRequested(2, b"v", 2 * MiB, b"rerun"), 0)  # (being pulled)
    assert isinstance(refused, st.RejectCreate) and not refused.exists
    s.handle(st.ObjectSealed(b"v", MiB), 0)
    (refused,) = s.handle(st.CreateRequested(3, b"v", MiB, b"rerun"), 0)
    assert isinstance(refused, st.RejectCreate) and refused.exists
    s.handle(st.ObjectsFreed([b"v"], [False]), 0)
    s.handle(st.CreateRequested(4, b"v", MiB, st.PULLED), 0)
    s.handle(st.ObjectSealed(b"v", MiB), 0)
    actions = s.handle(st.CreateRequested(5, b"v", 2 * MiB, b"rerun"), 0)
    assert st.UnlinkFile(f"{D}/{b'v'.hex()}") in actions and isinstance(actions[-1], st.GrantCreate)
    assert s.objects[b"v"].creator == b"rerun" and s.used_bytes == 2 * MiB
