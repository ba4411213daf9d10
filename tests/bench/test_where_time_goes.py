"""``bench/where_time_goes.py`` runs end to end on a real cluster, and its py-spy parsing.

The end-to-end test runs the script's quickest mode in a subprocess (its own private
cluster) and checks the tables: every process role and thread of the hot path has a row,
and the CPU, wake-up and wall figures a call must cost are there and positive. Figures
are never compared with a bound: the machine's load moves them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from types import ModuleType

import psutil
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "bench", "where_time_goes.py")


def _module() -> ModuleType:
    """The script as a module (``bench/`` is not a package)."""
    mod = sys.modules.get("where_time_goes")
    if mod is None:
        spec = importlib.util.spec_from_file_location("where_time_goes", SCRIPT)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules["where_time_goes"] = mod  # its dataclasses look their module up
        spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_quick_run_has_every_role_with_positive_figures() -> None:
    wtg = _module()
    proc = subprocess.Popen([sys.executable, SCRIPT, "--quick", "--json", "--top", "4"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=200)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr[-3000:]
    result = json.loads(stdout)
    assert set(result["scenarios"]) == {"task_sync", "task_async", "actor_sync", "actor_async"}
    for key, sc in result["scenarios"].items():
        assert sc["calls"] > 0 and sc["wall_us"] > 0 and sc["lumos_cpu_us"] > 0, key
        assert sc["machine_cpu_us"] > 0, key
        for role, thread in wtg.REQUIRED_ROWS:
            assert f"{role} / {thread}" in sc["cpu_us"], (key, role, thread, sorted(sc["cpu_us"]))
        # The worker's io thread may do nothing on a sync call: an idle worker's main thread
        # reads its next task itself.
        for row in ("driver / user thread", "driver / lumos-io", "worker / executor"):
            assert sc["cpu_us"][row] > 0, (key, row)
    for key in ("task_sync", "actor_sync"):  # a sync call parks the caller (the callee, idle after
        wakeups = result["scenarios"][key]["wakeups"]  # its reply, may catch the next call awake)
        for row in ("driver / user thread", "driver / lumos-io"):
            assert wakeups[row] > 0, (key, row)
        assert "worker / executor" in wakeups, (key, sorted(wakeups))
    if wtg.py_spy_path() is not None:
        assert set(result["profiles"]) == {"task_sync", "actor_sync"}, result["notes"]
        for key, prof in result["profiles"].items():
            # A thread never caught off its waits in a short profile has no row: ask for one
            # of the threads on the call's path, not each.
            on_path = {"driver / user thread", "driver / lumos-io", "worker / lumos-io", "worker / executor"}
            assert on_path & set(prof), (key, sorted(prof), result["notes"])
            for label, p in prof.items():
                assert p["samples"] > 0 and p["top"], (key, label)
                assert all(0 < f["own"] <= f["inclusive"] <= 1 for f in p["top"]), (key, label, p["top"])
    else:
        assert any("py-spy is not installed" in n for n in result["notes"])
    md = wtg.markdown(result)
    for role, thread in wtg.REQUIRED_ROWS:
        assert f"| {role} / {thread} |" in md
    assert "| wall time per call |" in md and "The hops of one sync task" in md
    assert result["wakeup"]["same_core_us"] > 0 and result["wakeup"]["write_waking_nobody_cpu_us"] > 0
    assert "One wake-up on this machine" in md
    # The script's cluster (its session directory's name holds the driver's pid) and its
    # py-spy samplers (writing into its temporary directory) are gone with it.
    left = [p for p in psutil.process_iter() if _started_by(p, proc.pid)]
    assert not left, [(p.pid, p.cmdline()) for p in left]


def _started_by(p: psutil.Process, driver_pid: int) -> bool:
    try:
        cmd = " ".join(p.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False
    return ("lumos" in cmd and f"_{driver_pid}_" in cmd) or ("py-spy" in cmd and "where-time-goes-" in cmd)


#: ``py-spy record -f raw --threads --native`` lines: a parked io thread, a busy one,
#: and a worker's main thread writing its reply.
_EXECUTOR = ("thread (100): MainThread;run (lumos/_private/worker/main.py:70);"
             "Executor.run (lumos/_private/core_worker/executor.py:164);")
_IO = ("thread (101): lumos-io;Thread._bootstrap (threading.py:1002);"
       "IoLoop._run (lumos/_private/core_worker/io_loop.py:99);")
RAW = "\n".join([
    _EXECUTOR + "_queue_SimpleQueue_get_impl (_queuemodule.c);PyThread_acquire_lock_timed (libpython3.11.so.1.0);"
    "0x7f00 (libc.so.6) 90",
    _EXECUTOR + "Connection.write_now (lumos/_private/transport/connection.py:301);"
    "os_write (libpython3.11.so.1.0);write (libc.so.6) 6",
    _EXECUTOR + "Executor.execute (lumos/_private/core_worker/executor.py:250) 4",
    _IO + "uv_run (core.c);uv__io_poll (linux.c);epoll_pwait (libc.so.6) 50",
    _IO + "Connection.data_received (lumos/_private/transport/connection.py:200) 10",
]) + "\n"


def test_profile_parsing_keeps_on_cpu_samples_and_charges_native_frames_to_python() -> None:
    wtg = _module()
    rows = wtg.parse_raw(RAW)
    assert [(tid, name, count) for tid, name, _, count in rows] == [
        (100, "MainThread", 90), (100, "MainThread", 6), (100, "MainThread", 4), (101, "lumos-io", 50),
        (101, "lumos-io", 10)]
    main = [(frames, c) for tid, _, frames, c in rows if tid == 100]
    total, top, hot = wtg.top_functions(main, 8, native=True)
    assert total == 10  # the 90 samples parked in the queue's lock are off-CPU
    assert hot == [("write (libc.so.6)", pytest.approx(0.6))]
    assert top[0]["function"] == "Connection.write_now (connection.py)"
    assert top[0]["own"] == pytest.approx(0.6) and top[0]["native"] == "write (libc.so.6)"
    assert [(f["function"], f["own"]) for f in top[1:]] == [("Executor.execute (executor.py)", pytest.approx(0.4))]
    io = [(frames, c) for tid, _, frames, c in rows if tid == 101]
    total, top, _ = wtg.top_functions(io, 8, native=True)
    assert total == 10 and top[0]["function"] == "Connection.data_received (connection.py)"
    # Without native frames nothing tells a parked thread from a busy one: all count.
    assert wtg.top_functions(io, 8, native=False)[0] == 60
