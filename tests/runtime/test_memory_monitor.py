"""The raylet's memory monitor: its decisions (pure), cgroup reading, and a real kill."""

from __future__ import annotations

import os
import time
from typing import Any, Callable

import pytest

import lumos
from lumos._private.raylet.memory_monitor import (ACTOR, OOM_KILL_REASON, TASK, Candidate, KillForMemory,
                                                  MemoryMonitorState, MemorySampled, MemoryUsage,
                                                  cgroup_memory, is_retriable, read_memory)

GIB = 1024 ** 3


def sample(used_gib: float, candidates: list[Candidate], now: float = 0.0, total_gib: float = 8.0) -> MemorySampled:
    return MemorySampled(MemoryUsage(int(used_gib * GIB), int(total_gib * GIB)), candidates, now)


def task(n: int, order: int, retriable: bool | None = None) -> Candidate:
    return Candidate(b"t%d" % n, 1000 + n, TASK, order, 100 * 1024 * 1024, retriable)


def actor(n: int, order: int, retriable: bool | None = None) -> Candidate:
    return Candidate(b"a%d" % n, 2000 + n, ACTOR, order, 100 * 1024 * 1024, retriable)


def victims(actions: list[KillForMemory]) -> list[bytes]:
    return [a.worker_id for a in actions]


def test_below_the_threshold_nothing_is_killed() -> None:
    s = MemoryMonitorState(0.9, "3fa2", validate=True)
    assert s.handle(sample(7.0, [task(1, 1), actor(1, 2)])) == []
    assert s.handle(sample(7.2, [task(1, 1)])) == []  # exactly 0.9
    assert s.kills == 0


def test_newest_task_worker_goes_before_any_actor() -> None:
    s = MemoryMonitorState(0.9, "3fa2", validate=True)
    workers = [task(1, 3), actor(1, 9), task(2, 5), actor(2, 1)]
    assert victims(s.handle(sample(7.9, workers))) == [b"t2"]


def test_an_actor_is_killed_only_when_no_task_worker_is_left() -> None:
    s = MemoryMonitorState(0.9, "3fa2", validate=True)
    assert victims(s.handle(sample(7.9, [actor(1, 1), actor(2, 4)]))) == [b"a2"]


def test_retriable_work_goes_first_whatever_its_kind() -> None:
    s = MemoryMonitorState(0.9, "3fa2", validate=True)
    # A task with max_retries=0 (newest) and an actor that can restart: the actor.
    (kill,) = s.handle(sample(7.9, [actor(1, 1, retriable=True), task(1, 5, retriable=False)]))
    assert kill.worker_id == b"a1" and "an actor's worker that can restart" in kill.reason
    # Among retriable work, tasks still go before actors.
    s = MemoryMonitorState(0.9, "3fa2", validate=True)
    assert victims(s.handle(sample(7.9, [actor(1, 9, retriable=True), task(1, 1, retriable=True)]))) == [b"t1"]
    # Nothing retriable left: tasks before actors, and the reason says so.
    s = MemoryMonitorState(0.9, "3fa2", validate=True)
    (kill,) = s.handle(sample(7.9, [actor(1, 9, retriable=False), task(1, 1, retriable=False)]))
    assert kill.worker_id == b"t1" and "max_retries=0" in kill.reason


def test_what_counts_as_retriable() -> None:
    assert is_retriable(TASK, 3) and is_retriable(TASK, -1) and not is_retriable(TASK, 0)
    assert is_retriable(ACTOR, 1) and is_retriable(ACTOR, -1) and not is_retriable(ACTOR, 0)
    # An owner that does not say (an older peer): tasks are, actors are not.
    assert is_retriable(TASK, None) and not is_retriable(ACTOR, None)
    assert task(1, 1).retriable and not actor(1, 1).retriable


def test_one_kill_at_a_time_until_the_victim_is_gone() -> None:
    s = MemoryMonitorState(0.9, "3fa2", kill_timeout_s=5.0, validate=True)
    assert victims(s.handle(sample(7.9, [task(1, 1), task(2, 2)], now=0.0))) == [b"t2"]
    # Still there (dying): no second victim, however high memory is.
    assert s.handle(sample(7.99, [task(1, 1), task(2, 2)], now=1.0)) == []
    # Gone, memory still high: the next one.
    assert victims(s.handle(sample(7.9, [task(1, 1)], now=1.5))) == [b"t1"]
    # Gone and memory back to normal: nothing.
    assert s.handle(sample(4.0, [], now=2.0)) == []
    assert s.kills == 2


def test_a_victim_that_does_not_die_is_given_up_on_after_the_timeout() -> None:
    s = MemoryMonitorState(0.9, "3fa2", kill_timeout_s=5.0, validate=True)
    assert victims(s.handle(sample(7.9, [task(1, 1), task(2, 2)], now=0.0))) == [b"t2"]
    assert s.handle(sample(7.9, [task(1, 1), task(2, 2)], now=4.9)) == []
    assert victims(s.handle(sample(7.9, [task(1, 1), task(2, 2)], now=5.0))) == [b"t2"]


def test_the_reason_names_the_node_the_figures_and_what_to_do() -> None:
    s = MemoryMonitorState(0.9, "3fa2")
    [action] = s.handle(sample(7.6, [task(1, 1)]))
    assert action.pid == 1001
    assert action.reason.startswith(OOM_KILL_REASON)
    for part in ("node 3fa2", "7.60 GiB of 8.00 GiB", "95%", "memory_usage_threshold=0.9", "pid 1001",
                 "100 MiB", "less memory"):
        assert part in action.reason, part


def test_bad_threshold_is_refused() -> None:
    for bad in (0, 1.5, -0.1):
        with pytest.raises(ValueError, match="memory_usage_threshold"):
            MemoryMonitorState(bad, "x")
    from lumos._private.config import Config
    with pytest.raises(ValueError, match="memory_usage_threshold.*<= 1"):
        Config.resolve({"memory_usage_threshold": 1.5})


# ----------------------------------------------------------------------------- sampling


def write(path: Any, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cgroup_v2_limit_and_usage_without_reclaimable_cache(tmp_path: Any) -> None:
    write(tmp_path / "proc_cgroup", "0::/lumos.slice/job\n")
    d = tmp_path / "cg" / "lumos.slice" / "job"
    write(d / "memory.max", f"{2 * GIB}\n")
    write(d / "memory.current", f"{GIB}\n")
    write(d / "memory.stat", f"anon 1\ninactive_file {GIB // 4}\nactive_file 5\n")
    u = cgroup_memory(str(tmp_path / "cg"), str(tmp_path / "proc_cgroup"))
    assert u == MemoryUsage(GIB - GIB // 4, 2 * GIB, "cgroup v2")
    write(d / "memory.max", "max\n")  # no limit: the node's figures count
    assert cgroup_memory(str(tmp_path / "cg"), str(tmp_path / "proc_cgroup")) is None


def test_cgroup_v1_limit_and_usage(tmp_path: Any) -> None:
    write(tmp_path / "proc_cgroup", "5:cpu,cpuacct:/x\n4:memory:/docker/abc\n")
    d = tmp_path / "cg" / "memory" / "docker" / "abc"
    write(d / "memory.limit_in_bytes", f"{4 * GIB}\n")
    write(d / "memory.usage_in_bytes", f"{3 * GIB}\n")
    write(d / "memory.stat", f"total_inactive_file {GIB}\n")
    u = cgroup_memory(str(tmp_path / "cg"), str(tmp_path / "proc_cgroup"))
    assert u == MemoryUsage(2 * GIB, 4 * GIB, "cgroup v1")
    write(d / "memory.limit_in_bytes", "9223372036854771712\n")  # v1's "unlimited"
    assert cgroup_memory(str(tmp_path / "cg"), str(tmp_path / "proc_cgroup")) is None


def test_read_memory_gives_this_machines_figures() -> None:
    u = read_memory()
    assert 0 < u.used_bytes < u.total_bytes and 0 < u.fraction < 1


# ----------------------------------------------------------------------------- a real raylet

#: Any use of memory is "too much": the monitor kills every worker that runs work.
LOW_THRESHOLD = {"memory_usage_threshold": 0.001, "memory_monitor_refresh_ms": 50,
                 "task_oom_retry_delay_base_ms": 20}


@lumos.remote
def hold_memory() -> int:
    block = bytearray(32 * 1024 * 1024)
    time.sleep(60)
    return len(block)


@pytest.mark.slow
def test_task_killed_for_memory_is_retried_then_raises_out_of_memory(
        fresh_cluster: Callable[..., Any]) -> None:
    fresh_cluster(num_cpus=1, _system_config=LOW_THRESHOLD)
    node = lumos.get_runtime_context().get_node_id()
    ref = hold_memory.options(max_retries=1).remote()
    with pytest.raises(lumos.exceptions.OutOfMemoryError) as e:
        lumos.get(ref, timeout=60)
    assert isinstance(e.value, MemoryError)
    text = str(e.value)
    for part in ("hold_memory()", f"node {node[:8]}", OOM_KILL_REASON, "GiB", "memory_usage_threshold=0.001",
                 "Retried 1 times"):
        assert part in text, (part, text)
    from lumos import state

    from tests.conftest import wait_for

    def failed_on_second_attempt() -> bool:
        [t] = [t for t in state.list_tasks() if t["func_or_class_name"].endswith("hold_memory")]
        return t["state"] == "FAILED" and t["attempt_number"] == 1
    wait_for(failed_on_second_attempt, 10, 0.1)
    # The rows of both attempts' workers say why they ended (and so does a worker killed
    # while leased, before the task reached it: seen once at the cluster's start, where the
    # threshold kills at once; that task went to another worker without using a retry).
    wait_for(lambda: len(state.list_workers(filters=[("exit_type", "=", "NODE_OUT_OF_MEMORY")])) >= 2, 10, 0.1)


def test_memory_monitor_is_off_with_refresh_zero(fresh_cluster: Callable[..., Any]) -> None:
    fresh_cluster(num_cpus=1, _system_config={**LOW_THRESHOLD, "memory_monitor_refresh_ms": 0})

    @lumos.remote
    def quick() -> int:
        time.sleep(0.5)
        return os.getpid()

    assert lumos.get(quick.remote(), timeout=30) > 0


@lumos.remote(max_restarts=1)
class Holder:
    def __init__(self) -> None:
        self.block = bytearray(32 * 1024 * 1024)

    def pid(self) -> int:
        return os.getpid()


@lumos.remote
def hold_and_mark(path: str) -> int:
    block = bytearray(32 * 1024 * 1024)
    with open(path, "w") as f:
        f.write(str(os.getpid()))
    time.sleep(60)
    return len(block)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_an_actor_that_can_restart_is_killed_before_a_task_with_no_retries(
        fresh_cluster: Callable[..., Any], tmp_path: Any) -> None:
    """The lease tells the raylet the retry budget: the newest worker runs a task with
    max_retries=0, yet the actor (max_restarts=1) is the first victim."""
    import glob
    # The first sample comes one refresh after the raylet starts: time to lease both.
    refresh_s = 8.0
    t0 = time.monotonic()
    ctx = fresh_cluster(num_cpus=2, _system_config={**LOW_THRESHOLD, "memory_monitor_refresh_ms": int(refresh_s * 1000)})
    holder = Holder.remote()
    actor_pid = lumos.get(holder.pid.remote(), timeout=30)
    marker = tmp_path / "task.pid"
    ref = hold_and_mark.options(max_retries=0).remote(str(marker))
    from tests.conftest import wait_for
    wait_for(marker.exists, 30, 0.05)
    if time.monotonic() - t0 > refresh_s - 1:
        pytest.skip("the machine is too slow to lease both workers before the monitor's first sample")
    log = glob.glob(f"{ctx.address_info['session_dir']}/logs/raylet-*.log")[0]

    def kills() -> list[str]:
        with open(log) as f:
            return [line for line in f if OOM_KILL_REASON in line]
    wait_for(kills, 30, 0.1)
    first = kills()[0]
    assert f"pid {actor_pid} " in first and "an actor's worker that can restart" in first, first
    assert f"pid {marker.read_text()} " not in first  # the task with no retries was spared
    del ref
