"""Jupyter's stop button, sent exactly as JupyterLab sends it (``KernelManager.interrupt_kernel``).

The interrupt reaches the kernel's whole process group; the private cluster runs in its
own session, so it survives, and the interrupted lumos calls show one line, not lumos's frames.
"""

from __future__ import annotations

import os
import time
from typing import Any, Iterator

import pytest

from tests.conftest import TEST_CONFIG, check_no_leaks, process_gone, wait_for
from tests.kernelext.kernel_client import DirectKernel

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]


def _start_lumos(k: DirectKernel, extension: bool = True) -> str:
    """``lumos.init()`` of a private cluster in the kernel, after ``%load_ext lumos``
    unless ``extension`` is False; returns its session directory."""
    out = k.ok(("%load_ext lumos\n" if extension else "") + "import lumos, time\n"
               f"_ctx = lumos.init(num_cpus=2, object_store_memory=300 * 1024 * 1024, "
               f"_system_config={TEST_CONFIG!r})\nprint(_ctx.address_info['session_dir'])")
    return out.stdout.strip().splitlines()[-1]


@pytest.fixture
def direct_kernel(tmp_path: Any) -> Iterator[tuple[DirectKernel, str]]:
    k = DirectKernel(str(tmp_path))
    session_dir = None
    try:
        session_dir = _start_lumos(k)
        yield k, session_dir
    finally:
        k.shut_down()
    check_no_leaks(session_dir)


def _cluster_answers(k: DirectKernel) -> None:
    out = k.ok("print('value', lumos.get(lumos.put(41), timeout=30) + 1)\n"
               "print('cpus', lumos.cluster_resources()['CPU'])", timeout_s=60)
    assert "value 42" in out.stdout and "cpus 2.0" in out.stdout, out


def test_stop_button_leaves_the_private_cluster_running(direct_kernel: tuple[DirectKernel, str],
                                                         tmp_path: Any) -> None:
    k, _ = direct_kernel
    # plain local code
    out = k.run("print('sleeping', flush=True)\ntime.sleep(60)", interrupt_on="sleeping")
    assert [e["ename"] for e in out.errors] == ["KeyboardInterrupt"], out
    _cluster_answers(k)

    # a %%remote cell: its task is cancelled, one line is shown
    marker = os.path.join(str(tmp_path), "not-cancelled")
    out = k.run(f"%%remote\nimport time\nprint('started', flush=True)\ntime.sleep(8)\nopen({marker!r}, 'w').close()",
                interrupt_on="started")
    assert [e["ename"] for e in out.errors] == ["KeyboardInterrupt"], out
    tb = out.traceback()
    assert len(out.errors[0]["traceback"]) == 1 and "cancelled" in tb, tb
    assert "kernelext" not in tb and "remote.py" not in tb, tb
    _cluster_answers(k)

    # a blocking get in the notebook: the task is cancelled, only the user's line shows
    k.ok("@lumos.remote\ndef slow(path):\n    import time\n    time.sleep(8)\n    open(path, 'w').close()")
    marker2 = os.path.join(str(tmp_path), "get-not-cancelled")
    out = k.run(f"ref = slow.remote({marker2!r})\nprint('waiting', flush=True)\nlumos.get(ref)",
                interrupt_on="waiting", interrupt_after_s=0.5)  # get has started by then
    assert [e["ename"] for e in out.errors] == ["KeyboardInterrupt"], out
    tb = out.traceback()
    assert "lumos.get(ref)" in tb and "core_worker" not in tb and "api.py" not in tb, tb
    _cluster_answers(k)

    # a --session cell: a running actor call is not interrupted; the line says so
    out = k.run("%%remote --session s1\nimport time\nprint('in session', flush=True)\ntime.sleep(2)",
                interrupt_on="in session")
    assert [e["ename"] for e in out.errors] == ["KeyboardInterrupt"], out
    assert len(out.errors[0]["traceback"]) == 1 and "%lumos close s1" in out.traceback(), out.traceback()
    assert "after" in k.ok("%%remote --session s1\nprint('after')").stdout
    time.sleep(9)  # the cancelled tasks would have written their markers by now
    assert not os.path.exists(marker) and not os.path.exists(marker2)


def test_private_cluster_still_dies_with_a_killed_kernel(tmp_path: Any) -> None:
    import psutil
    k = DirectKernel(str(tmp_path))
    try:
        out = k.ok("import lumos, os\n"
                   f"_ctx = lumos.init(num_cpus=1, object_store_memory=100 * 1024 * 1024, _system_config={TEST_CONFIG!r})\n"
                   "print(_ctx.address_info['session_dir'])\nprint(os.getpid())")
        session_dir, kernel_pid = out.stdout.split()[-2:]
        cluster = psutil.Process(int(kernel_pid)).children()
        assert cluster and all(os.getsid(p.pid) != os.getsid(int(kernel_pid)) for p in cluster)
        pids = [p.pid for p in psutil.Process(int(kernel_pid)).children(recursive=True)]
    finally:
        k.kc.stop_channels()
        k.km.shutdown_kernel(now=True)  # SIGKILL: no lumos.shutdown() runs
    # orphaned, they are no longer this test's descendants: wait for each by pid
    wait_for(lambda: all(process_gone(pid) for pid in pids), timeout_s=20)
    check_no_leaks(session_dir, timeout_s=20)


def test_a_remote_cell_reading_a_ref_of_an_ended_session_says_so(direct_kernel: tuple[DirectKernel, str]) -> None:
    """After %lumos shutdown, a remote cell that read an ObjectRef of the ended session got
    the bare ref (TypeError: ... 'ObjectRef' and 'int'); it is told the value is gone."""
    k, _ = direct_kernel
    k.ok("%%remote --async\nold_res = 41")
    k.ok("lumos.get(old_res, timeout=30)")
    k.ok("%lumos shutdown")
    out = k.run("%%remote\nold_res + 1", timeout_s=60)
    assert [e["ename"] for e in out.errors] == ["ValueError"], out
    assert "old_res" in out.errors[0]["evalue"] and "earlier lumos session" in out.errors[0]["evalue"]
    assert "remote.py" not in out.traceback()


def test_stop_pressed_in_a_loop_of_puts_and_calls_leaves_the_store_as_it_was(
        direct_kernel: tuple[DirectKernel, str]) -> None:
    """The stop button, pressed again and again at random moments in a cell that puts
    large values, reads them back and passes them to tasks by value: each press ends the
    cell with one KeyboardInterrupt, and once the cell's refs and values are gone the
    store holds what it held before (a press inside a put or a ``.remote()`` used to leave
    its object behind, and one as a get mapped its value, or as the last value's view
    went, left that value pinned). lumos's SIGINT handler is in place from each cell's
    first line (the kernel puts Python's default back before each cell)."""
    import random
    k, _ = direct_kernel
    k.ok("import numpy as np\n"
         "from lumos._private import worker_context\n"
         "from lumos._private.protocol import messages as m\n"
         "def store_objects():\n"
         "    st = worker_context.require().call_raylet(m.GetNodeStats())['store']\n"
         "    return st['num_objects'], st['used_bytes'] - st['pool_bytes'] - st['reserved_bytes']\n"
         "@lumos.remote\n"
         "def nbytes(a):\n"
         "    return a.nbytes\n"
         "arr = np.ones((2 << 20) // 8)\n"
         "lumos.get(nbytes.remote(arr), timeout=30)\n"
         "before = store_objects()\n"
         "import signal\n"
         "from lumos._private import interrupts")
    assert "ours True" in k.ok("print('ours', signal.getsignal(signal.SIGINT) is interrupts._on_sigint)").stdout
    rng = random.Random(5)
    for _ in range(16):
        out = k.run("print('looping', flush=True)\n"
                    "while True:\n"
                    "    r = lumos.put(arr)\n"
                    "    x = lumos.get(r)\n"
                    "    n = nbytes.remote(arr)\n",
                    interrupt_on="looping", interrupt_after_s=0.05 + rng.random() * 0.2)
        assert [e["ename"] for e in out.errors] == ["KeyboardInterrupt"], out
        assert "Exception ignored" not in out.stderr, out.stderr  # (a press in a finalizer comes after it)
    out = k.ok("del r, n, x\n"
               "import gc, time\n"
               "gc.collect()\n"
               "settled = lambda: all(now <= then for now, then in zip(store_objects(), before))\n"
               "deadline = time.monotonic() + 20\n"
               "while not settled() and time.monotonic() < deadline:\n"
               "    time.sleep(0.05)\n"
               "print('settled', settled(), before, store_objects())")
    assert "settled True" in out.stdout, out.stdout


def _stop_a_get_then_drop_its_refs(k: DirectKernel) -> str:
    """Press stop in ``lumos.get([big, slow])`` called from a user's function, ``del``
    the refs; what the next cell prints: the store's objects above what it held before,
    and whether the user's frame still holds its local."""
    k.ok("import numpy as np, weakref\n"
         "from lumos._private import worker_context\n"
         "from lumos._private.protocol import messages as m\n"
         "def store_objects():\n"
         "    return worker_context.require().call_raylet(m.GetNodeStats())['store']['num_objects']\n"
         "@lumos.remote\n"
         "def slow():\n"
         "    import time\n"
         "    time.sleep(30)\n"
         "class Token:\n"
         "    pass\n"
         "token = Token()\n"
         "alive = weakref.ref(token)\n"
         "before = store_objects()\n"
         "big = lumos.put(np.ones(1 << 20))\n"
         "slow_ref = slow.remote()\n"
         "def user_frame(token):\n"
         "    mine = token\n"
         "    return lumos.get([big, slow_ref])")
    out = k.run("print('waiting', flush=True)\nuser_frame(token)", interrupt_on="waiting", interrupt_after_s=0.5)
    assert [e["ename"] for e in out.errors] == ["KeyboardInterrupt"], out
    return k.ok("del big, slow_ref, token\n"
                "import gc, time\n"
                "gc.collect()\n"
                "deadline = time.monotonic() + 20\n"
                "while store_objects() > before and time.monotonic() < deadline:\n"
                "    time.sleep(0.05)\n"
                "print('objects', store_objects() - before)\n"
                "print('user frame keeps its locals', alive() is not None)").stdout


def test_a_get_stopped_by_the_button_keeps_no_ref_once_the_user_drops_it(
        direct_kernel: tuple[DirectKernel, str]) -> None:
    """IPython keeps the last error's traceback, and through ``run_code``'s frame every
    frame it passed, lumos's among them: the stop button pressed in
    ``lumos.get([big, slow])`` kept the list, and ``big``'s 8 MiB in the store, after
    ``del big`` for as long as no other error came. lumos's frames now let go of their
    locals once the interrupt is shown; the user's frames keep theirs (``%debug``)."""
    k, _ = direct_kernel
    out = _stop_a_get_then_drop_its_refs(k)
    assert "objects 0" in out, out
    assert "user frame keeps its locals True" in out, out


def test_without_the_extension_a_stopped_get_keeps_no_ref_either(tmp_path: Any) -> None:
    """``import lumos`` in a notebook without ``%load_ext lumos``: IPython shows the whole
    traceback and keeps it; lumos's frames on it let go once the cell is over."""
    k = DirectKernel(str(tmp_path))
    session_dir = None
    try:
        session_dir = _start_lumos(k, extension=False)
        out = k.ok("print('custom', bool(get_ipython().custom_exceptions))")
        assert "custom False" in out.stdout, out.stdout
        out = _stop_a_get_then_drop_its_refs(k)
        assert "objects 0" in out, out
        assert "user frame keeps its locals True" in out, out
    finally:
        k.shut_down()
    check_no_leaks(session_dir)
