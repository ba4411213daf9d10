"""Spilling primaries to disk when the object store is full: real raylets, workers and files."""

from __future__ import annotations

import gc
import glob
import json
import os
import random
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest

import lumos
import lumos.state
from lumos.testing import Cluster
from tests.conftest import TEST_CONFIG, check_no_leaks, wait_for

MIB = 1024 * 1024


def spill_files(session_dir: str) -> list[str]:
    return glob.glob(os.path.join(session_dir, "spill", "*", "*"))


def block(i: int, size: int = 4 * MIB) -> np.ndarray:
    return np.random.default_rng(i).integers(0, 256, size, dtype=np.uint8)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_spill_three_times_the_store_and_read_back_byte_for_byte(fresh_cluster: Any) -> None:
    ctx = fresh_cluster(num_cpus=1, object_store_memory=64 * MIB, include_dashboard=False)
    session = ctx.address_info["session_dir"]

    @lumos.remote
    def digest(a: np.ndarray, i: int) -> bool:
        return bool(np.array_equal(a, block(i)))

    n = 48  # 192 MiB through a 64 MiB store
    refs = [lumos.put(block(i)) for i in range(n)]
    assert spill_files(session), "nothing was spilled"
    order = list(range(n)) * 2
    random.Random(7).shuffle(order)
    for i in order[:60]:
        a = lumos.get(refs[i], timeout=60)
        assert np.array_equal(a, block(i)), f"object {i} came back different"
        del a
    # Spilled objects as task arguments, restored in the worker.
    assert all(lumos.get([digest.remote(refs[i], i) for i in order[60:80]], timeout=120))
    (row,) = lumos.state.spill_stats()
    assert row["spilled_objects"] >= n - 16 and row["spilled_bytes"] >= (n - 16) * 4 * MIB
    assert row["restored_objects"] > 0 and row["spill_mib_s"] > 0 and not row["out_of_disk"]
    del refs
    gc.collect()
    lumos.put(0)  # drains dropped refs
    wait_for(lambda: not spill_files(session), 20)


@pytest.mark.timeout(120)
def test_object_larger_than_the_store_goes_to_disk(fresh_cluster: Any) -> None:
    ctx = fresh_cluster(num_cpus=1, object_store_memory=32 * MIB, include_dashboard=False)
    session = ctx.address_info["session_dir"]

    @lumos.remote
    def total(a: np.ndarray) -> int:
        return int(a.sum(dtype=np.int64))

    big = lumos.put(np.ones(80 * MIB, dtype=np.uint8))
    assert len(spill_files(session)) == 1
    assert int(lumos.get(big, timeout=60).sum(dtype=np.int64)) == 80 * MIB
    assert lumos.get(total.remote(big), timeout=60) == 80 * MIB
    del big
    gc.collect()
    lumos.put(0)
    wait_for(lambda: not spill_files(session), 20)


@pytest.mark.timeout(120)
def test_a_store_full_of_viewed_arrays_takes_more_objects_on_disk(fresh_cluster: Any) -> None:
    """Arrays read with get() and kept fill the store; nothing can be spilled while they
    are viewed. New puts and task returns go to the spill dir (Ray's fallback
    allocation): they waited object_store_full_timeout_s and raised ObjectStoreFullError."""
    ctx = fresh_cluster(num_cpus=1, object_store_memory=64 * MIB, include_dashboard=False,
                        _system_config={"object_store_full_timeout_s": 30.0})
    session = ctx.address_info["session_dir"]
    refs = [lumos.put(block(i, 20 * MIB)) for i in range(3)]
    views = [lumos.get(r, timeout=30) for r in refs]  # 60 of 64 MiB viewed

    @lumos.remote
    def make(i: int) -> np.ndarray:
        return block(i, 24 * MIB)

    extra = lumos.put(block(10, 20 * MIB))
    made = make.remote(11)
    assert np.array_equal(lumos.get(extra, timeout=20), block(10, 20 * MIB))
    assert np.array_equal(lumos.get(made, timeout=20), block(11, 24 * MIB))
    (row,) = lumos.state.spill_stats()
    assert row["fallback_objects"] >= 1 and spill_files(session)
    assert all(np.array_equal(v, block(i, 20 * MIB)) for i, v in enumerate(views))
    del views, refs, extra, made
    gc.collect()
    lumos.put(0)
    wait_for(lambda: not spill_files(session), 20)


@pytest.mark.timeout(120)
def test_task_whose_returns_exceed_the_store_works(fresh_cluster: Any) -> None:
    fresh_cluster(num_cpus=1, object_store_memory=64 * MIB, include_dashboard=False)

    @lumos.remote(num_returns=4)
    def four() -> tuple[np.ndarray, ...]:
        return tuple(block(i, 24 * MIB) for i in range(4))  # 96 MiB of returns

    refs = four.remote()
    for i, ref in enumerate(refs):
        assert np.array_equal(lumos.get(ref, timeout=60), block(i, 24 * MIB))


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_spilled_objects_are_pulled_by_other_nodes() -> None:
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "object_store_memory": 64 * MIB, "_system_config": dict(TEST_CONFIG)})
    try:
        far = cluster.add_node(num_cpus=1, resources={"far": 1}, object_store_memory=64 * MIB)
        cluster.connect()

        @lumos.remote(resources={"far": 1})
        def same(a: np.ndarray, i: int) -> bool:
            return bool(np.array_equal(a, block(i)))

        @lumos.remote(resources={"far": 1})
        def make(i: int) -> np.ndarray:
            return block(i)

        @lumos.remote(resources={"far": 1})
        def size_of(a: np.ndarray) -> int:
            assert np.array_equal(a, block(99, 80 * MIB))
            return int(a.size)

        refs = [lumos.put(block(i)) for i in range(32)]  # 128 MiB on the head
        assert spill_files(cluster.session_dir)
        assert all(lumos.get([same.remote(refs[i], i) for i in range(0, 32, 3)], timeout=180))
        # Larger than either store: on disk on the head, pulled straight to disk on the far node.
        huge = lumos.put(block(99, 80 * MIB))
        assert lumos.get(size_of.remote(huge), timeout=120) == 80 * MIB
        del huge
        made = [make.remote(i) for i in range(24)]  # 96 MiB of primaries in the far node's store
        lumos.wait(made, num_returns=len(made), timeout=120, fetch_local=False)  # (they stay there)
        before = set(spill_files(cluster.session_dir))
        far_files = [f for f in before if f.split(os.sep)[-2] == f"node-{far.node_id[:12]}"]
        assert far_files, "the far node spilled nothing"
        rows = {r["node_id"]: r for r in lumos.state.spill_stats()}
        assert len(rows) == 2 and rows[far.node_id]["spilled_objects"] > 0
        cluster.remove_node(far)  # SIGKILL: its raylet cannot clean up; its parent does
        wait_for(lambda: not any(os.path.exists(f) for f in far_files), 20)
    finally:
        cluster.shutdown()
        check_no_leaks(cluster.session_dir)
    assert not spill_files(cluster.session_dir)


_FULL_DISK_SCRIPT = textwrap.dedent("""
    import glob, json, os, sys
    import numpy as np
    import lumos
    from lumos.exceptions import OutOfDiskError
    config = json.loads(sys.argv[2])
    config["object_spilling_directory"] = sys.argv[1]
    ctx = lumos.init(num_cpus=1, object_store_memory=32 * 1024 * 1024, include_dashboard=False,
                     _system_config=config)
    out = {"errors": 0, "ok": 0}
    try:
        keep = []
        for i in range(30):  # 120 MiB into a 32 MiB store and a 48 MiB spill disk
            try:
                keep.append(lumos.put(np.full(4 * 1024 * 1024, i % 251, dtype=np.uint8)))
                out["ok"] += 1
            except OutOfDiskError as e:
                out["errors"] += 1
                out["message"] = str(e)
        out["big"] = ""
        try:
            lumos.put(np.zeros(64 * 1024 * 1024, dtype=np.uint8))
        except OutOfDiskError as e:
            out["big"] = type(e).__name__
        out["readable"] = all(int(lumos.get(r, timeout=60)[0]) == i % 251 for i, r in enumerate(keep))
        out["stats"] = lumos.state.spill_stats()[0]
        logs = glob.glob(os.path.join(ctx.address_info["session_dir"], "logs", "raylet*.log"))
        out["log_lines"] = sum(open(p).read().count("failed (") for p in logs)
        del keep
    finally:
        lumos.shutdown()
    out["left"] = glob.glob(os.path.join(sys.argv[1], "*", "*"))
    print("RESULT " + json.dumps(out))
""")


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_full_spill_disk_raises_out_of_disk_once_per_episode(tmp_path: Any) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a size-limited tmpfs in a private mount namespace")
    mnt = tmp_path / "spill"
    mnt.mkdir()
    probe = subprocess.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size=1m tmpfs {mnt}"],
                           capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs in a private mount namespace here: {probe.stderr.strip()}")
    script = tmp_path / "full_disk.py"
    script.write_text(_FULL_DISK_SCRIPT)
    cmd = (f"mount --make-rprivate / && mount -t tmpfs -o size=48m,mode=0700 tmpfs {mnt} && "
           f"exec {sys.executable} {script} {mnt} '{json.dumps(TEST_CONFIG)}'")
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    proc = subprocess.run(["unshare", "-m", "sh", "-c", cmd], capture_output=True, text=True, timeout=200, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT "):])
    assert out["ok"] >= 10 and out["errors"] >= 2, out  # some fit, then the disk is full
    assert "spill directory" in out["message"]
    assert out["big"] == "OutOfDiskError"
    assert out["readable"], "objects spilled before the disk filled must stay readable"
    assert out["stats"]["out_of_disk_rejects"] >= out["errors"]
    assert out["log_lines"] == 1, f"one log line per out-of-disk episode, got {out['log_lines']}"
    assert out["left"] == [], out["left"]


def deleted_store_mappings(store_prefix: str) -> list[str]:
    """Mappings this process holds of store files already unlinked (memory not given back)."""
    with open("/proc/self/maps") as f:
        return [ln for ln in f if store_prefix in ln and ln.rstrip().endswith("(deleted)")]


@pytest.mark.timeout(120)
def test_spilling_unmaps_what_it_spills_and_never_spills_viewed_objects(fresh_cluster: Any) -> None:
    ctx = fresh_cluster(num_cpus=1, object_store_memory=64 * MIB, include_dashboard=False)
    prefix = "/dev/shm/lumos-" + os.path.basename(ctx.address_info["session_dir"])
    held_ref = lumos.put(block(1000))
    held = lumos.get(held_ref, timeout=30)  # a live zero-copy view: must stay in memory
    refs = [lumos.put(block(i)) for i in range(40)]  # 160 MiB more; the creator mapped every one
    (row,) = lumos.state.spill_stats()
    assert row["spilled_objects"] >= 20
    # The spilled files' pages are really released: this process keeps no mapping of them
    # (unmaps of objects it created are batched, so the last may trail the spill a moment).
    wait_for(lambda: deleted_store_mappings(prefix) == [], 10)
    held_file = os.path.join(lumos._private.worker_context.require().store.directory, held_ref.hex())
    assert os.path.exists(held_file), "an object with a live view was spilled"
    assert np.array_equal(held, block(1000))
    del held
    gc.collect()
    more = [lumos.put(block(i)) for i in range(40, 60)]  # now the old one may go too
    wait_for(lambda: not os.path.exists(held_file), 20)
    assert np.array_equal(lumos.get(held_ref, timeout=30), block(1000))
    del refs, more
