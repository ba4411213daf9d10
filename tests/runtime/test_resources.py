"""Resources: CPUs, custom resources and GPUs limit concurrency; the cluster's views of them.

Concurrency is measured, not inferred from wall time: every task returns the
``time.time()`` interval it ran in, and the test computes how many intervals overlap.
Tasks that must be running at the same moment wait on files the test creates.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest

import lumos
from lumos.exceptions import GetTimeoutError

from ..conftest import wait_for


@lumos.remote
def interval(t):
    start = time.time()
    time.sleep(t)
    return start, time.time()


@lumos.remote
def hold_until(path, t_max=30.0):
    """Run until ``path`` exists; return the interval and what the task saw."""
    start = time.time()
    deadline = start + t_max
    while not os.path.exists(path) and time.time() < deadline:
        time.sleep(0.01)
    return {"start": start, "end": time.time(), "gpus": lumos.get_gpu_ids(),
            "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"), "pid": os.getpid()}


def max_overlap(intervals):
    """Largest number of intervals that contain one instant."""
    points = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals],
                    key=lambda p: (p[0], p[1]))  # an end before a start at the same instant
    best = cur = 0
    for _, d in points:
        cur += d
        best = max(best, cur)
    return best


def settle() -> None:
    """Wait until owners have returned their idle leases (they keep them briefly for reuse)."""
    total = lumos.cluster_resources()
    keys = [k for k in total if k not in ("memory", "object_store_memory")]
    wait_for(lambda: all(lumos.available_resources().get(k, 0) == total[k] for k in keys), 30)


def test_max_overlap_helper():
    assert max_overlap([(0, 1), (1, 2)]) == 1
    assert max_overlap([(0, 2), (1, 3), (1.5, 1.6)]) == 3
    assert max_overlap([]) == 0


# --------------------------------------------------------------------------- CPUs


def test_num_cpus_limits_concurrency(fresh_cluster):
    fresh_cluster(num_cpus=2)
    runs = lumos.get([interval.remote(0.3) for _ in range(6)], timeout=60)
    assert max_overlap(runs) == 2  # never more than the CPUs, and the CPUs were used
    settle()
    runs = lumos.get([interval.options(num_cpus=2).remote(0.2) for _ in range(3)], timeout=60)
    assert max_overlap(runs) == 1
    settle()
    runs = lumos.get([interval.options(num_cpus=1.5).remote(0.2) for _ in range(3)], timeout=60)
    assert max_overlap(runs) == 1


def test_fractional_cpus_run_more_tasks_at_once(fresh_cluster, tmp_path):
    fresh_cluster(num_cpus=1)
    go = str(tmp_path / "go")
    refs = [hold_until.options(num_cpus=0.25).remote(go) for _ in range(5)]
    # Four fit on one CPU; they are all running before the fifth can start.
    wait_for(lambda: lumos.available_resources().get("CPU", 0) == 0, 30)
    ready, _ = lumos.wait(refs, num_returns=1, timeout=0.5)
    assert not ready
    open(go, "w").close()
    runs = lumos.get(refs, timeout=60)
    assert max_overlap([(r["start"], r["end"]) for r in runs]) == 4


def test_zero_cpu_tasks_are_not_limited_by_cpus(fresh_cluster, tmp_path):
    fresh_cluster(num_cpus=1)
    go = str(tmp_path / "go")
    refs = [hold_until.options(num_cpus=0).remote(go) for _ in range(3)]
    wait_for(lambda: len(lumos.state.list_tasks(filters=[("state", "=", "RUNNING")])) == 3, 30)
    open(go, "w").close()
    runs = lumos.get(refs, timeout=60)
    assert max_overlap([(r["start"], r["end"]) for r in runs]) == 3


# --------------------------------------------------------------------------- custom resources


def test_custom_resources_limit_concurrency(fresh_cluster):
    fresh_cluster(num_cpus=4, resources={"accel": 2, "license": 1})
    res = lumos.cluster_resources()
    assert res["accel"] == 2 and res["license"] == 1
    runs = lumos.get([interval.options(num_cpus=0, resources={"accel": 1}).remote(0.3) for _ in range(5)],
                     timeout=60)
    assert max_overlap(runs) == 2
    settle()
    runs = lumos.get([interval.options(resources={"license": 1}).remote(0.2) for _ in range(3)], timeout=60)
    assert max_overlap(runs) == 1
    settle()
    runs = lumos.get([interval.options(resources={"accel": 0.5}).remote(0.3) for _ in range(4)], timeout=60)
    assert max_overlap(runs) == 4


def test_custom_resource_names_cannot_shadow_cpu_or_gpu():
    try:
        with pytest.raises(ValueError, match="num_cpus"):
            lumos.init(resources={"CPU": 4})
        with pytest.raises(ValueError, match="num_gpus"):
            lumos.init(resources={"GPU": 1})
        assert not lumos.is_initialized()
    finally:
        lumos.shutdown()


# --------------------------------------------------------------------------- GPUs


def test_declared_gpus_are_assigned_to_tasks(fresh_cluster, tmp_path):
    fresh_cluster(num_cpus=4, num_gpus=2)
    assert lumos.cluster_resources()["GPU"] == 2
    assert lumos.get_gpu_ids() == []  # the driver holds none
    go = str(tmp_path / "go")
    a = hold_until.options(num_gpus=1).remote(go)
    b = hold_until.options(num_gpus=1).remote(go)
    wait_for(lambda: "GPU" not in lumos.available_resources(), 30)
    open(go, "w").close()
    ra, rb = lumos.get([a, b], timeout=30)
    assert sorted(ra["gpus"] + rb["gpus"]) == [0, 1]
    for r in (ra, rb):
        assert len(r["gpus"]) == 1
        assert r["cuda"] == str(r["gpus"][0])
    both = lumos.get(hold_until.options(num_gpus=2).remote(go), timeout=30)
    assert sorted(both["gpus"]) == [0, 1]
    assert sorted(both["cuda"].split(",")) == ["0", "1"]


def test_gpu_tasks_are_limited_by_gpus(fresh_cluster):
    fresh_cluster(num_cpus=4, num_gpus=2)
    runs = lumos.get([interval.options(num_gpus=1).remote(0.3) for _ in range(5)], timeout=60)
    assert max_overlap(runs) == 2


def test_cuda_visible_devices_is_restored_after_a_gpu_task(fresh_cluster):
    fresh_cluster(num_cpus=1, num_gpus=1)

    @lumos.remote
    def cuda():
        return os.getpid(), os.environ.get("CUDA_VISIBLE_DEVICES"), lumos.get_gpu_ids()

    pid1, env1, ids1 = lumos.get(cuda.options(num_gpus=1).remote(), timeout=30)
    assert (env1, ids1) == ("0", [0])
    pid2, env2, ids2 = lumos.get(cuda.options(num_gpus=0).remote(), timeout=30)
    assert ids2 == []
    if pid2 == pid1:  # the same worker: the GPU task's setting must not leak into the next task
        assert env2 != "0"


@lumos.remote
def pid_of():
    return os.getpid()


def test_log_files_of_only_the_last_exited_workers_are_kept(fresh_cluster):
    # A long-lived node whose workers come and go (max_calls, actors) kept every worker's
    # log files forever.
    import glob
    ctx = fresh_cluster(num_cpus=1, _system_config={"worker_logs_kept": 2})
    logs = os.path.join(ctx.address_info["session_dir"], "logs")
    once = pid_of.options(max_calls=1)
    pids = [lumos.get(once.remote(), timeout=30) for _ in range(5)]
    name_of = {w["pid"]: f"worker-{w['worker_id'][:12]}" for w in lumos.state.list_workers() if w["pid"] in pids}
    mine = set(name_of.values())
    assert len(mine) == 5

    def kept() -> set[str]:
        names = {os.path.basename(p).rsplit(".", 1)[0] for p in glob.glob(os.path.join(logs, "worker-*"))}
        return names & mine
    wait_for(lambda: kept() == {name_of[pids[-2]], name_of[pids[-1]]}, 10)  # the last two exited
    assert all(os.path.exists(os.path.join(logs, f"{name}.out")) for name in kept())


def test_max_calls_ends_a_worker_after_that_many_runs(fresh_cluster):
    fresh_cluster(num_cpus=2, num_gpus=1)
    once = pid_of.options(max_calls=1)
    pids = [lumos.get(once.remote(), timeout=30) for _ in range(4)]
    assert len(set(pids)) == 4  # a fresh worker each time
    # Many at once, pipelined onto workers that leave after two: every task still runs
    # once, without using a retry (max_retries=0 would turn a lost task into an error).
    twice = pid_of.options(max_calls=2, max_retries=0)
    pids = lumos.get([twice.remote() for _ in range(12)], timeout=60)
    assert max(pids.count(p) for p in set(pids)) <= 2
    # Bursts onto workers that leave after one: the owner's next push can find a worker
    # gone before it read that worker's last reply (the write fails first); the reply is
    # still read (it was lost, and the task, counted as in flight, failed or ran twice).
    once_only = pid_of.options(max_calls=1, max_retries=0)
    for _ in range(20):
        pids = lumos.get([once_only.remote() for _ in range(3)], timeout=60)
        assert len(set(pids)) == 3
    # As in Ray, a GPU task's worker exits after it by default (releasing GPU memory);
    # max_calls=0 keeps it.
    gpu = pid_of.options(num_gpus=1)
    assert len({lumos.get(gpu.remote(), timeout=30) for _ in range(3)}) == 3
    kept = pid_of.options(num_gpus=1, max_calls=0)
    assert len({lumos.get(kept.remote(), timeout=30) for _ in range(3)}) == 1


def test_fractional_gpus_share_one_device_and_overlap(fresh_cluster, tmp_path):
    fresh_cluster(num_cpus=4, num_gpus=2)
    go = str(tmp_path / "go")
    halves = [hold_until.options(num_gpus=0.5).remote(go) for _ in range(2)]
    # Both halves are placed on one GPU, leaving the other whole.
    wait_for(lambda: lumos.available_resources().get("GPU") == 1, 30)
    whole = hold_until.options(num_gpus=1).remote(go)
    wait_for(lambda: "GPU" not in lumos.available_resources(), 30)
    open(go, "w").close()
    h1, h2 = lumos.get(halves, timeout=30)
    w = lumos.get(whole, timeout=30)
    assert h1["gpus"] == h2["gpus"] and len(h1["gpus"]) == 1
    assert w["gpus"] != h1["gpus"]
    assert h1["cuda"] == h2["cuda"] == str(h1["gpus"][0])
    assert max_overlap([(h1["start"], h1["end"]), (h2["start"], h2["end"])]) == 2


def test_gpu_request_above_one_must_be_whole():
    with pytest.raises(ValueError):
        interval.options(num_gpus=1.5)


@pytest.mark.gpu
@pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="needs an NVIDIA GPU (nvidia-smi)")
def test_gpus_are_detected_with_nvidia_smi(fresh_cluster):
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    count = sum(1 for line in out.splitlines() if line.startswith("GPU "))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        count = len([v for v in visible.split(",") if v.strip()])
    fresh_cluster(num_cpus=2)
    assert lumos.cluster_resources().get("GPU", 0) == count
    seen = lumos.get(hold_until.options(num_gpus=1).remote("/"), timeout=60)
    assert len(seen["gpus"]) == 1 and seen["cuda"]



@pytest.mark.parametrize("name, model", [
    ("Tesla V100-SXM2-16GB", "V100"), ("NVIDIA A100-SXM4-40GB", "A100"), ("NVIDIA H100 80GB HBM3", "H100"),
    ("NVIDIA H200", "H200"), ("NVIDIA A10G", "A10G"), ("Tesla T4", "T4"), ("NVIDIA L40S", "L40S"),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "RTX-PRO-6000"), ("Quadro RTX 8000", "RTX-8000"),
    ("NVIDIA GeForce RTX 4090", "GeForce-RTX-4090"), ("", None)])
def test_gpu_models_are_named_as_ray_names_accelerator_types(name, model):
    from lumos._private.node import accelerator_type_of
    assert accelerator_type_of(name) == model


def test_a_node_with_nvidia_gpus_offers_its_model_as_accelerator_type(fresh_cluster, tmp_path, monkeypatch):
    """As Ray's nodes do: ``accelerator_type:<model>`` of its first GPU, which
    ``accelerator_type=`` (and ``lumos.util.accelerators``' names) ask for. The GPUs are
    those of an ``nvidia-smi`` on PATH that lists two A100s (CI has no GPU)."""
    from lumos.util.accelerators import NVIDIA_A100, NVIDIA_H100
    smi, calls = tmp_path / "nvidia-smi", tmp_path / "calls"
    smi.write_text("#!/bin/sh\n"
                   f"echo \"$@\" >> '{calls}'\n"
                   "[ \"$1\" = -L ] || exit 9\n"
                   "echo 'GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-0a)'\n"
                   "echo 'GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-1b)'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    fresh_cluster(num_cpus=2)
    resources = lumos.cluster_resources()
    assert resources["GPU"] == 2 and resources["accelerator_type:A100"] == 1, resources
    assert calls.read_text().splitlines() == ["-L"]  # (one look gave the count and the model)
    assert lumos.get_runtime_context().get_node_labels()["ray.io/accelerator-type"] == "A100"
    on_a100 = hold_until.options(num_gpus=1, accelerator_type=NVIDIA_A100).remote("/")
    assert len(lumos.get(on_a100, timeout=60)["gpus"]) == 1
    on_h100 = hold_until.options(num_gpus=1, accelerator_type=NVIDIA_H100).remote("/")
    ready, _ = lumos.wait([on_h100], timeout=1.0)
    assert ready == []  # no such node
    lumos.cancel(on_h100)
    # Declared GPUs of another model: the node says what it was told.
    lumos.shutdown()
    fresh_cluster(num_cpus=2, num_gpus=1, resources={"accelerator_type:H100": 1})
    resources = lumos.cluster_resources()
    assert resources["accelerator_type:H100"] == 1 and "accelerator_type:A100" not in resources
    assert len(lumos.get(hold_until.options(num_gpus=1, accelerator_type=NVIDIA_H100).remote("/"),
                         timeout=60)["gpus"]) == 1

# --------------------------------------------------------------------------- infeasible


def test_infeasible_task_warns_stays_pending_and_does_not_block(fresh_cluster, capfd):
    fresh_cluster(num_cpus=2)
    stuck = interval.options(num_cpus=64).remote(0)
    custom = interval.options(resources={"nowhere": 1}).remote(0)
    # Other work goes on meanwhile.
    assert len(lumos.get([interval.remote(0.01) for _ in range(10)], timeout=30)) == 10
    with pytest.raises(GetTimeoutError):
        lumos.get(stuck, timeout=0.5)
    ready, _ = lumos.wait([stuck, custom], num_returns=1, timeout=0.5)
    assert ready == []
    err = wait_for(lambda: capfd.readouterr().err, 10)
    seen = err
    while "nowhere" not in seen or "64" not in seen:
        seen += wait_for(lambda: capfd.readouterr().err, 10)
    assert "infeasible" in seen
    # The state API reports the shapes as infeasible too.
    wait_for(lambda: lumos.state.list_nodes()[0]["infeasible"], 10)
    shapes = lumos.state.list_nodes()[0]["infeasible"]
    assert {"CPU": 64} in shapes or any(s.get("CPU") == 64 for s in shapes)
    settle()  # the pending requests hold nothing
    lumos.cancel(stuck)
    lumos.cancel(custom)


def test_an_infeasible_actor_warns_and_a_busy_one_does_not(fresh_cluster, capfd):
    # Tasks warned; an actor no node can hold waited in silence, its calls too.
    fresh_cluster(num_cpus=2)

    @lumos.remote(num_cpus=1)
    class Holder:
        def ping(self):
            return "pong"

    held = [Holder.remote() for _ in range(2)]
    assert lumos.get([h.ping.remote() for h in held], timeout=30) == ["pong"] * 2
    busy = Holder.remote()  # waits for a CPU: not infeasible
    big = Holder.options(num_cpus=64).remote()
    call = big.ping.remote()
    seen = ""
    while "actor Holder needs {'CPU': 64.0}, but no node has that much" not in seen:
        seen += wait_for(lambda: capfd.readouterr().err, 15)
    assert "{'CPU': 1.0}" not in seen
    del held
    assert lumos.get(busy.ping.remote(), timeout=30) == "pong"
    with pytest.raises(GetTimeoutError):
        lumos.get(call, timeout=0.2)
    assert "{'CPU': 1.0}" not in capfd.readouterr().err


# --------------------------------------------------------------------------- cluster views


def test_cluster_resources_report_the_node(fresh_cluster):
    fresh_cluster(num_cpus=3, num_gpus=1, resources={"accel": 2.5}, object_store_memory=200 * 1024 * 1024)
    res = lumos.cluster_resources()
    assert res["CPU"] == 3 and res["GPU"] == 1 and res["accel"] == 2.5
    assert res["object_store_memory"] == 200 * 1024 * 1024
    assert res["memory"] > 0
    assert res["node:127.0.0.1"] == 1
    settle()


def test_available_resources_change_while_tasks_run(fresh_cluster, tmp_path):
    fresh_cluster(num_cpus=2, resources={"accel": 1})
    full = lumos.available_resources()
    assert full["CPU"] == 2 and full["accel"] == 1
    go = str(tmp_path / "go")
    one = hold_until.remote(go)
    wait_for(lambda: lumos.available_resources().get("CPU") == 1, 30)
    two = hold_until.options(resources={"accel": 1}).remote(go)
    wait_for(lambda: "CPU" not in lumos.available_resources(), 30)
    assert "accel" not in lumos.available_resources()
    assert lumos.cluster_resources()["CPU"] == 2  # totals do not move
    open(go, "w").close()
    lumos.get([one, two], timeout=30)
    wait_for(lambda: lumos.available_resources().get("CPU") == 2
             and lumos.available_resources().get("accel") == 1, 30)


def test_available_object_store_memory_drops_with_puts(fresh_cluster):
    import numpy as np
    fresh_cluster(object_store_memory=256 * 1024 * 1024, _system_config={"object_store_recycle_bytes": 0})
    before = lumos.available_resources()["object_store_memory"]
    ref = lumos.put(np.zeros(50 * 1024 * 1024, dtype=np.uint8))
    after = lumos.available_resources()["object_store_memory"]
    assert before - after >= 50 * 1024 * 1024
    del ref


def test_nodes_lists_this_node(fresh_cluster):
    ctx = fresh_cluster(num_cpus=2, resources={"accel": 1})
    assert ctx.python_version.count(".") == 2 and ctx.ray_version == lumos.__version__  # as Ray's context
    (node,) = lumos.nodes()
    assert node["Alive"] is True and node["alive"] is True
    assert node["NodeID"] == ctx.address_info["node_id"] == lumos.get_runtime_context().get_node_id()
    assert node["NodeManagerAddress"] == "127.0.0.1"
    assert node["NodeManagerPort"] > 0 and node["ObjectManagerPort"] == node["NodeManagerPort"]
    assert os.path.exists(node["RayletSocketName"])
    assert node["Resources"]["CPU"] == 2 and node["Resources"]["accel"] == 1
    assert node["Resources"]["object_store_memory"] == lumos.cluster_resources()["object_store_memory"]  # (as Ray's)
    assert node["IsHead"] is True


# --------------------------------------------------------------------------- runtime context


def test_runtime_context_in_driver_and_tasks(fresh_cluster):
    ctx = fresh_cluster(num_cpus=2)

    @lumos.remote
    def where():
        c = lumos.get_runtime_context()
        return {"job": c.get_job_id(), "node": c.get_node_id(), "task": c.get_task_id(),
                "worker": c.get_worker_id(), "pid": os.getpid(), "name": c.get_task_name(),
                "resources": c.get_assigned_resources(), "actor": c.get_actor_id()}

    @lumos.remote
    def parent():
        own = lumos.get_runtime_context().get_task_id()
        return own, lumos.get(where.remote(), timeout=30)

    driver = lumos.get_runtime_context()
    assert driver.get_job_id() == ctx.address_info["job_id"]
    assert driver.get_node_id() == ctx.address_info["node_id"]
    assert driver.get_task_id() is None and driver.get_actor_id() is None
    assert len(driver.get_worker_id()) == 32

    a = lumos.get(where.options(name="where-a", num_cpus=0.5).remote(), timeout=30)
    assert a["job"] == driver.get_job_id() and a["node"] == driver.get_node_id()
    assert a["worker"] != driver.get_worker_id() and a["pid"] != os.getpid()
    assert a["name"] == "where-a"
    assert a["resources"] == {"CPU": 0.5}
    assert a["actor"] is None
    # The ids are the ones the cluster's tables use.
    workers = {w["worker_id"]: w for w in lumos.state.list_workers()}
    assert workers[a["worker"]]["pid"] == a["pid"]
    assert workers[driver.get_worker_id()]["is_driver"]
    wait_for(lambda: any(t["task_id"] == a["task"] and t["name"] == "where-a" for t in lumos.state.list_tasks()), 10)
    # A different task has a different id; a nested task runs in the same job.
    b = lumos.get(where.remote(), timeout=30)
    assert b["task"] != a["task"]
    parent_id, child = lumos.get(parent.remote(), timeout=60)
    assert child["job"] == driver.get_job_id()
    assert child["task"] not in (parent_id, a["task"], b["task"])


def test_an_actors_methods_are_assigned_what_the_actor_holds(fresh_cluster):
    # As in Ray: a call asks for no resources of its own, and get_assigned_resources()
    # in any method of an actor, sync or async, gives what the actor holds for its life.
    fresh_cluster(num_cpus=4, resources={"thing": 2})

    @lumos.remote
    class Holder:
        def __init__(self) -> None:
            self.at_init = lumos.get_runtime_context().get_assigned_resources()

        def assigned(self) -> tuple[dict, dict]:
            return self.at_init, lumos.get_runtime_context().get_assigned_resources()

    @lumos.remote
    class AsyncHolder:
        async def assigned(self) -> dict:
            return lumos.get_runtime_context().get_assigned_resources()

    held = {"CPU": 2.0, "thing": 1.0}
    a = Holder.options(num_cpus=2, resources={"thing": 1}).remote()
    assert lumos.get(a.assigned.remote(), timeout=30) == (held, held)
    b = AsyncHolder.options(num_cpus=1).remote()
    assert lumos.get(b.assigned.remote(), timeout=30) == {"CPU": 1.0}
    # The default actor holds nothing while it lives (its CPU is for placing it).
    assert lumos.get(Holder.remote().assigned.remote(), timeout=30) == ({}, {})


def test_runtime_context_needs_init():
    assert not lumos.is_initialized()
    with pytest.raises(RuntimeError, match="init"):
        lumos.get_runtime_context()
