"""``%%remote`` in a real ipykernel: shipping, results, output, errors, options."""

from __future__ import annotations

import os
import re
import threading
import time

import pytest

from tests.kernelext.conftest import KernelSession, displays, errors, result_text, stdout

pytestmark = pytest.mark.timeout(180)


def test_load_ext_registers_both_magics(kernel: KernelSession) -> None:
    assert kernel.value("sorted(k for k in get_ipython().magics_manager.magics['cell'] if k == 'remote')") == \
        ["remote"]
    assert kernel.value("'lumos' in get_ipython().magics_manager.magics['line']")
    cell = kernel.run("%load_ext lumos.kernelext")
    assert not errors(cell)


def test_cell_runs_on_a_worker_with_shipped_names_and_returns_assignments(kernel: KernelSession) -> None:
    kernel.run("import os\nimport numpy as np\nk = 3\na = np.arange(5)\n"
               "def sq(v):\n    return v * v\nclass Point:\n    def __init__(self, x): self.x = x")
    cell = kernel.run("%%remote\nb = a * k\nc = sq(k)\np = Point(c)\npid = os.getpid()\n"
                      "import json\nb.sum()")
    assert not errors(cell), errors(cell)
    assert result_text(cell) == "np.int64(30)"
    assert kernel.value("b.tolist()") == [0, 3, 6, 9, 12]
    assert kernel.value("c") == 9
    assert kernel.value("p.x") == 9
    assert kernel.value("json.__name__") == "json"  # imported remotely, re-imported here
    assert kernel.value("pid != os.getpid()")


def test_last_expression_semicolon_suppresses_display(kernel: KernelSession) -> None:
    cell = kernel.run("%%remote\n1 + 1;")
    assert result_text(cell) is None
    cell = kernel.run("%%remote\nNone")
    assert result_text(cell) is None


def test_names_assigned_before_read_are_not_shipped(kernel: KernelSession) -> None:
    kernel.run("shadow = 'notebook'")
    cell = kernel.run("%%remote\nshadow = 'remote'\nout = shadow + '!'")
    assert not errors(cell)
    assert kernel.value("get_ipython()._lumos_magics.cells.last.shipped") == []
    assert kernel.value("out") == "remote!"


def test_print_streams_into_the_cell_while_it_runs(kernel: KernelSession, tmp_path: object) -> None:
    flag = os.path.join(str(tmp_path), "go")
    cell = kernel.add(
        "%%remote\nimport os, time, sys\nprint('first line', flush=True)\n"
        f"deadline = time.time() + 20\nwhile not os.path.exists({flag!r}) and time.time() < deadline:\n"
        "    time.sleep(0.05)\nprint('saw flag' if os.path.exists(" + repr(flag) + ") else 'timed out')\n"
        "print('to stderr', file=sys.stderr)")

    def release_when_streamed() -> None:
        # the cell waits for the flag; we set it only once its first line is in the cell
        deadline = time.monotonic() + 25
        while time.monotonic() < deadline:
            if any("first line" in o.get("text", "") for o in list(cell.outputs)):
                open(flag, "w").close()
                return
            time.sleep(0.05)

    watcher = threading.Thread(target=release_when_streamed, name="test-watcher")
    watcher.start()
    try:
        kernel.execute(cell)
    finally:
        watcher.join(30)
    assert "saw flag" in stdout(cell), "output did not reach the cell while it was running"
    assert "to stderr" in stdout(cell, "stderr")
    assert "pid=" not in stdout(cell)  # no "(task pid=N)" prefix inside the cell


def test_async_output_lands_in_the_submitting_cell(kernel: KernelSession) -> None:
    first = kernel.run("%%remote --async\nimport time\ntime.sleep(1.0)\nprint('late line')\nlate_value = 7")
    assert not errors(first)
    assert kernel.value("type(late_value).__name__") == "ObjectRef"
    second = kernel.run("import time\ntime.sleep(4)\nprint('second cell')")
    assert "late line" not in stdout(second)
    text = " ".join(str(d.get("text/plain")) for d in displays(first))
    assert "late line" in text and "finished" in text, displays(first)
    # a later remote cell receives the value, not the ref
    third = kernel.run("%%remote\nlate_value * 6")
    assert result_text(third) == "42"
    assert kernel.value("type(late_value).__name__") == "ObjectRef"


_INJECT = ("import base64, json\n"
           "b = base64.b64encode(json.dumps({'data': {'text/html': '<b id=injected>x</b>'}, "
           "'metadata': {}}).encode()).decode()\n"
           "for p in ['\\ue000lumos-display:', '\\ue000lumos-display-' + '0' * 32 + ':', "
           "'\\ue000lumos-end-' + '0' * 32 + ':']:\n"
           "    print(p + (b if 'display' in p else '-1'))\n"
           "print('printed', 'end')\n")


def test_printed_marker_lines_stay_text(kernel: KernelSession) -> None:
    cell = kernel.run("%%remote\n" + _INJECT)
    assert not errors(cell), errors(cell)
    assert not displays(cell), displays(cell)
    assert stdout(cell).count("\ue000lumos-") == 3 and "printed end" in stdout(cell)
    late = kernel.run("%%remote --async\nimport time\ntime.sleep(0.5)\n" + _INJECT)
    kernel.run("import time\ntime.sleep(4)")
    shown = " ".join(str(d.get("text/html", "")) for d in displays(late))
    assert "printed end" in shown and "<b id=injected>" not in shown, shown


def test_display_inside_cell_reaches_notebook_with_rich_repr(kernel: KernelSession) -> None:
    cell = kernel.run("%%remote\nclass Card:\n    def _repr_html_(self):\n        return '<b>rich card</b>'\n"
                      "    def __repr__(self):\n        return 'Card()'\nprint('before')\ndisplay(Card())\n"
                      "print('after')")
    assert not errors(cell), errors(cell)
    html = [d["text/html"] for d in displays(cell) if "text/html" in d]
    assert html == ["<b>rich card</b>"]
    kinds = [o.output_type for o in cell.outputs]
    assert kinds.index("display_data") > 0  # after the first print, in order
    assert "before" in stdout(cell) and "after" in stdout(cell)


def test_matplotlib_figures_of_a_remote_cell_reach_the_notebook(kernel: KernelSession) -> None:
    import base64
    cell = kernel.run("%%remote\nimport matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title('first')\n"
                      "plt.show()\nprint('between')\nplt.figure()\nplt.bar([1, 2], [3, 4])\nbackend = plt.get_backend()")
    assert not errors(cell), errors(cell)
    pngs = [base64.b64decode(d["image/png"]) for d in displays(cell) if "image/png" in d]
    # One at plt.show(), one left open when the cell ended: both shown, in order with the print.
    assert len(pngs) == 2 and all(p.startswith(b"\x89PNG") for p in pngs)
    kinds = [o.output_type for o in cell.outputs]
    assert kinds.index("stream") > kinds.index("display_data")
    assert kernel.value("backend") == "module://lumos.kernelext.mpl_backend"
    # The figures were closed: the next cell shows only its own.
    cell = kernel.run("%%remote\nimport matplotlib.pyplot as plt\nplt.plot([0, 1])\nopen_before = len(plt.get_fignums())")
    assert len([d for d in displays(cell) if "image/png" in d]) == 1
    assert kernel.value("open_before") == 1


def test_error_shows_remote_traceback_with_cell_line_numbers(kernel: KernelSession) -> None:
    cell = kernel.run("%%remote\nx = 1\ndef boom(v):\n    return v / 0\nboom(x)")
    errs = errors(cell)
    assert len(errs) == 1
    assert "ZeroDivisionError" in errs[0]["ename"]
    tb = "\n".join(errs[0]["traceback"])
    assert "Cell In[" in tb and "line 5" in tb and "line 4" in tb  # boom(x) is cell line 5, v / 0 line 4
    assert "return v / 0" in tb
    assert "kernelext" not in tb and "run_cell" not in tb


def test_a_cell_that_prints_a_hundred_thousand_lines_shows_every_one(kernel: KernelSession) -> None:
    """A flush per line made a message per line on the kernel's iopub socket, which drops
    messages past its high-water mark: a tenth of 200,000 lines was lost, in silence."""
    cell = kernel.run("%%remote\nfor i in range(100_000):\n    print('line', i)")
    assert not errors(cell), errors(cell)
    lines = [ln for ln in stdout(cell).splitlines() if ln.startswith("line ")]
    assert [int(ln.split()[1]) for ln in lines] == list(range(100_000))


def test_bad_timeout_and_unclosed_quotes_are_usage_errors(kernel: KernelSession) -> None:
    """--timeout nan got past the check and failed deep in the output queue; an unclosed
    quote in %lumos showed shlex's traceback."""
    for source, message in (("%%remote --timeout nan\n1", "--timeout must be a positive number"),
                            ("%%remote --timeout inf\n1", "--timeout must be a positive number"),
                            # an empty session ran the cell outside any session, silently
                            ("%%remote --session ''\nx_empty = 1", "--session needs a non-empty value"),
                            ('%%remote --name ""\n1', "--name needs a non-empty value"),
                            ("%lumos init --address 'oops", "No closing quotation")):
        cell = kernel.run(source)
        shown = stdout(cell, "stderr") + " ".join(e["evalue"] for e in errors(cell))
        assert "UsageError: " in shown and message in shown and "Traceback" not in shown, (source, cell.outputs)


def test_a_syntax_error_in_a_remote_cell_shows_as_a_local_one_does(kernel: KernelSession) -> None:
    """The cell's line and a caret (it showed the frames of IPython and the magic)."""
    cell = kernel.run("%%remote\nx_q = (1,\ny_q = 2")
    errs = errors(cell)
    assert len(errs) == 1 and errs[0]["ename"] == "SyntaxError", errs
    tb = "\n".join(errs[0]["traceback"])
    assert f"Cell In[{cell.execution_count}], line" in tb and "^" in tb, tb
    assert "interactiveshell" not in tb and "magics.py" not in tb and "remote.py" not in tb, tb
    assert not errors(kernel.run("%%remote\nok_q = 1"))  # the kernel goes on


def test_cell_numbers_are_the_cells_execution_counts(kernel: KernelSession) -> None:
    import IPython
    cell = kernel.run("%%remote\nx = 1\ny = 2\n1 / 0")
    n = cell.execution_count
    tb = "\n".join(errors(cell)[0]["traceback"])
    assert f"Cell In[{n}], line 4" in tb and "None" not in tb, (IPython.__version__, n, tb)
    cell = kernel.run("%%remote --async\nnumbered_q = 1")
    shown = " ".join(str(d.get("text/plain")) for d in displays(cell))
    assert f"cell In[{cell.execution_count}]" in shown, shown


def test_unpicklable_value_names_the_variable(kernel: KernelSession) -> None:
    kernel.run("import threading\nlk = threading.Lock()")
    cell = kernel.run("%%remote\nprint(lk)")
    errs = errors(cell)
    assert errs and "'lk'" in errs[0]["evalue"], errs
    assert errs[0]["traceback"] == [f"TypeError: {errs[0]['evalue']}"]  # the message, not lumos's frames


def test_large_value_is_put_once_and_reused_while_unchanged(kernel: KernelSession) -> None:
    kernel.run("big = np.ones(1_000_000)")
    cell = kernel.run("%%remote\ns1 = float(big.sum())")
    assert not errors(cell), errors(cell)
    stats = "get_ipython()._lumos_magics.cells.last.stats"
    assert kernel.value(f"{stats}.put_bytes") >= 8_000_000
    kernel.run("%%remote\ns2 = float(big.sum())")
    assert kernel.value(f"{stats}.put_bytes") == 0
    assert kernel.value(f"{stats}.reused_bytes") >= 8_000_000
    kernel.run("big[0] = 101.0")
    kernel.run("%%remote\ns3 = float(big.sum())")
    assert kernel.value(f"{stats}.put_bytes") >= 8_000_000
    assert kernel.value("[s1, s2, s3]") == [1e6, 1e6, 1e6 + 100]


def test_objectrefs_stay_refs_and_resolve_on_cluster(kernel: KernelSession) -> None:
    kernel.run("r = lumos.put(5)")
    cell = kernel.run("%%remote\nkind = type(r).__name__\nval = lumos.get(r)")
    assert not errors(cell), errors(cell)
    assert kernel.value("[kind, val]") == ["ObjectRef", 5]


def test_map_runs_per_element_and_returns_lists_in_order(kernel: KernelSession) -> None:
    cell = kernel.run("%%remote --map x=range(5)\nimport os\nsq = x * x\nprint('item', x)\nsq + 1")
    assert not errors(cell), errors(cell)
    assert kernel.value("sq") == [0, 1, 4, 9, 16]
    assert result_text(cell) == "[1, 2, 5, 10, 17]"
    for i in range(5):
        assert f"[{i}] item {i}" in stdout(cell)


def test_async_binds_only_values_the_cell_assigns(kernel: KernelSession) -> None:
    kernel.run("import json")
    cell = kernel.run("%%remote --async\nimport json\nimport os as os_q\nacc_q = 0\n"
                      "for loop_q in range(3):\n    acc_q += loop_q\nsq_q = [comp_q * comp_q for comp_q in range(3)]\n"
                      "def helper_q(v):\n    inner_q = v\n    return inner_q\n"
                      "with open('/dev/null') as fh_q:\n    text_q = json.dumps({'acc': helper_q(acc_q)})")
    assert not errors(cell), errors(cell)
    assert kernel.value("[type(v).__name__ for v in (acc_q, sq_q, text_q, fh_q)]") == ["ObjectRef"] * 4
    assert kernel.value("json.dumps([1])") == "[1]"  # the notebook's module, not a ref
    assert kernel.value("[n in globals() for n in ('os_q', 'loop_q', 'comp_q', 'inner_q', 'helper_q')]") == [False] * 5
    later = kernel.run("%%remote\nprint(text_q, sum(sq_q))")
    assert not errors(later), errors(later)
    assert '{"acc": 3} 5' in stdout(later)


def test_out_and_no_out_choose_the_names_brought_back(kernel: KernelSession) -> None:
    assert not errors(kernel.run("%%remote --out kept_q\nkept_q = 1\ndropped_q = 2"))
    assert kernel.value("[kept_q, 'dropped_q' in globals()]") == [1, False]
    cell = kernel.run("%%remote --no-out\nnothing_q = 3\nnothing_q * 2")
    assert result_text(cell) == "6"
    assert kernel.value("'nothing_q' in globals()") is False
    assert not errors(kernel.run("%%remote --async --out a_q\nimport colorsys as cs_q\na_q = 1\nb_q = 2"))
    assert kernel.value("[type(a_q).__name__, 'b_q' in globals(), 'cs_q' in globals()]") == ["ObjectRef", False, False]
    # A name asked for that the cell did not set is reported (it was passed over in silence).
    cell = kernel.run("%%remote --out kept_q,typo_q\nkept_q = 5")
    assert not errors(cell), errors(cell)
    assert "--out typo_q: the cell did not set it" in stdout(cell, "stderr"), cell.outputs
    assert kernel.value("[kept_q, 'typo_q' in globals()]") == [5, False]
    for flags, message in (("--out 1x", "comma-separated names"), ("--out a --no-out", "cannot be combined")):
        cell = kernel.run(f"%%remote {flags}\nx = 1")
        shown = stdout(cell, "stderr") + " ".join(e["evalue"] for e in errors(cell))
        assert "UsageError" in shown and message in shown, cell.outputs


def test_async_map_results_are_resolved_by_a_later_cell(kernel: KernelSession) -> None:
    kernel.run("%%remote --async --map i=[1, 2, 3]\nhalf = i / 2")
    assert kernel.value("[type(h).__name__ for h in half]") == ["ObjectRef"] * 3
    cell = kernel.run("%%remote\ntotal = sum(half)")
    assert not errors(cell), errors(cell)
    assert kernel.value("total") == 3.0


def test_resource_options_reach_the_task(kernel: KernelSession) -> None:
    node = kernel.value("lumos.nodes()[0]['NodeID']")
    cell = kernel.run(f"%%remote --num-cpus 1 --num-gpus 0.5 --memory 1MB --resources '{{}}' --node {node[:8]} "
                      "--retries 1 --name my-cell\ngpus = lumos.get_gpu_ids()\n"
                      "here = lumos.get_runtime_context().get_node_id()")
    assert not errors(cell), errors(cell)
    assert len(kernel.value("gpus")) == 1
    assert kernel.value("here") == node
    opts = kernel.value("{k: str(v) for k, v in get_ipython()._lumos_magics.cells.last.options.items()}")
    assert opts["num_gpus"] == "0.5" and opts["memory"] == "1000000" and opts["name"] == "my-cell"
    assert opts["max_retries"] == "1" and "NodeAffinity" in opts["scheduling_strategy"]
    cell = kernel.run("%%remote --strategy SPREAD\nok = 1")
    assert not errors(cell)


@pytest.mark.parametrize("flags, message", [
    ("--node nosuchnode", "no alive node"),
    ("--num-gpus 1.5", "fractions"),
    ("--resources notjson", "JSON"),
    ("--strategy PACKED", "SPREAD or DEFAULT"),
    ("--bundle 1", "--placement-group"),
    ("--map nothing", "NAME=ITERABLE"),
    ("--pull a", "--session"),
])
def test_bad_options_give_clear_errors(kernel: KernelSession, flags: str, message: str) -> None:
    cell = kernel.run(f"%%remote {flags}\nx = 1")
    errs = errors(cell)
    assert errs and message in errs[0]["evalue"], errs
    assert len(errs[0]["traceback"]) == 1 and "magics.py" not in errs[0]["traceback"][0], errs


def test_help_lists_the_options_and_runs_nothing(kernel: KernelSession) -> None:
    """``%%remote -h`` said "unrecognized arguments: -h"."""
    for flag in ("-h", "--help"):
        cell = kernel.run(f"%%remote {flag}\nhelp_ran = 1")
        assert not errors(cell), cell.outputs
        text = stdout(cell)
        assert text.startswith("%%remote [--async]") and "--session NAME" in text and "--timeout S" in text, text
    assert kernel.value("'help_ran' in globals()") is False
    cell = kernel.run("%%remote --bogus\nx = 1")
    shown = stdout(cell, "stderr") + " ".join(e["evalue"] for e in errors(cell))
    assert "UsageError: " in shown and "unrecognized arguments: --bogus" in shown and "%%remote -h" in shown, \
        cell.outputs


def test_placement_group_option(kernel: KernelSession) -> None:
    kernel.run("_pg = lumos.util.placement_group([{'CPU': 1}], name='cellpg')\nlumos.get(_pg.ready(), timeout=30)")
    try:
        cell = kernel.run("%%remote --placement-group cellpg --bundle 0\n"
                          "import lumos\n_cur = lumos.util.get_current_placement_group()\n"
                          "in_pg = _cur.id.hex() if _cur is not None else None")
        assert not errors(cell), errors(cell)
        assert kernel.value("in_pg") == kernel.value("_pg.id.hex()")
        # Without the option the cell runs outside the group.
        kernel.run("%%remote\nimport lumos\n_cur = lumos.util.get_current_placement_group()\n"
                   "outside = _cur.id.hex() if _cur is not None else None")
        assert kernel.value("outside") is None
        cell = kernel.run("%%remote --placement-group no-such-group\nx = 1")
        assert errors(cell) and "no-such-group" in errors(cell)[0]["evalue"]
    finally:
        kernel.run("lumos.util.remove_placement_group(_pg)")


def test_timeout_cancels_the_cell(kernel: KernelSession) -> None:
    start = time.monotonic()
    cell = kernel.run("%%remote --timeout 1\nimport time\ntime.sleep(30)")
    assert time.monotonic() - start < 20
    errs = errors(cell)
    assert errs and "GetTimeoutError" in errs[0]["ename"] and "--timeout 1" in errs[0]["evalue"], errs


_LUMOS_FRAMES = ("magics.py", "remote.py", "core_worker", "api.py", "interactiveshell.py", "decorator-gen")


def test_timeouts_show_only_the_users_frames(kernel: KernelSession) -> None:
    cell = kernel.run("%%remote --timeout 0.5\nimport time\ntime.sleep(30)")
    tb = "\n".join(errors(cell)[0]["traceback"])
    assert "--timeout 0.5" in tb and not [f for f in _LUMOS_FRAMES if f in tb], tb
    kernel.run("@lumos.remote\ndef slow_q():\n    import time\n    time.sleep(30)")
    cell = kernel.run("def wait_q(r):\n    return lumos.get(r, timeout=0.2)\nref_q = slow_q.remote()\nwait_q(ref_q)")
    errs = errors(cell)
    tb = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(errs[0]["traceback"]))
    assert errs[0]["ename"] == "GetTimeoutError" and "lumos.get(r, timeout=0.2)" in tb and "wait_q(ref_q)" in tb
    assert not [f for f in _LUMOS_FRAMES if f in tb], tb
    kernel.run("lumos.cancel(ref_q, force=True)")


def test_shell_escape_runs_remotely(kernel: KernelSession) -> None:
    cell = kernel.run("%%remote\n!echo from-the-worker")
    assert "from-the-worker" in stdout(cell)


def test_del_in_remote_cell_removes_the_notebook_name(kernel: KernelSession) -> None:
    kernel.run("doomed = 1\nkeep = 2")
    cell = kernel.run("%%remote\ndel doomed\nkeep2 = keep")
    assert not errors(cell), errors(cell)
    assert kernel.value("'doomed' in globals()") is False
    assert kernel.value("keep2") == 2


def test_notebook_function_calling_display_works_remotely(kernel: KernelSession) -> None:
    kernel.run("class Tag:\n    def _repr_html_(self):\n        return '<i>tag</i>'\n"
               "def show():\n    display(Tag())")
    cell = kernel.run("%%remote\nshow()")
    assert not errors(cell), errors(cell)
    assert [d["text/html"] for d in displays(cell) if "text/html" in d] == ["<i>tag</i>"]


def test_interrupt_cancels_the_remote_cell(kernel: KernelSession, tmp_path: object) -> None:
    import signal
    kernel_pid = kernel.value("__import__('os').getpid()")
    marker = os.path.join(str(tmp_path), "not-cancelled")
    cell = kernel.add("%%remote\nimport time\nprint('started', flush=True)\ntime.sleep(6)\n"
                      f"open({marker!r}, 'w').close()")

    def interrupt_when_started() -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if any("started" in o.get("text", "") for o in list(cell.outputs)):
                os.kill(kernel_pid, signal.SIGINT)
                return
            time.sleep(0.05)

    watcher = threading.Thread(target=interrupt_when_started, name="test-interrupter")
    watcher.start()
    try:
        kernel.execute(cell)
    finally:
        watcher.join(30)
    errs = errors(cell)
    assert errs and errs[0]["ename"] == "KeyboardInterrupt", cell.outputs
    time.sleep(7)
    assert not os.path.exists(marker), "the remote cell kept running after Ctrl-C"


def test_tab_completes_an_actor_handles_methods(kernel: KernelSession) -> None:
    # The notebook's Tab after ``handle.`` sends a complete_request; the kernel's
    # completer lists what ``dir(handle)`` gives, so the handle must list its methods.
    from nbclient.util import run_sync
    cell = kernel.run("@lumos.remote\nclass Tally:\n    def increment(self):\n        return 1\n"
                      "    def reset(self):\n        pass\n_tally = Tally.remote()")
    assert not errors(cell), errors(cell)
    kc = kernel.client.kc
    code = "_tally.inc"
    msg_id = kc.complete(code, len(code))
    deadline = time.monotonic() + 30
    while True:
        reply = run_sync(kc.get_shell_msg)(timeout=max(0.1, deadline - time.monotonic()))
        if reply["parent_header"].get("msg_id") == msg_id:
            break
    assert reply["content"]["status"] == "ok"
    assert "_tally.increment" in [code[:reply["content"]["cursor_start"]] + m
                                  for m in reply["content"]["matches"]], reply["content"]
