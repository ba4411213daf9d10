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
