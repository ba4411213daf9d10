"""``--session``, ``%lumos`` commands, the GPU panel and rich displays in a real ipykernel."""

from __future__ import annotations

import pytest

from tests.kernelext.conftest import KernelSession, displays, errors, result_text, stdout

pytestmark = pytest.mark.timeout(180)


def test_session_keeps_state_on_one_worker_across_cells(kernel: KernelSession) -> None:
    kernel.run("lr = 0.5")
    cell = kernel.run("%%remote --session train --num-cpus 1\nimport os\nweights = [1, 2, 3]\n"
                      "step = 0\nspid = os.getpid()\nprint('lr is', lr)")
    assert not errors(cell), errors(cell)
    assert "lr is 0.5" in stdout(cell)
    assert kernel.value("'weights' in globals() or 'spid' in globals()") is False  # stays remote
    cell = kernel.run("%%remote --session train\nstep += 1\nweights = [w * 2 for w in weights]\n"
                      "(step, os.getpid() == spid)")
    assert not errors(cell), errors(cell)
    assert result_text(cell) == "(1, True)"
    cell = kernel.run("%%remote --session train --pull weights spid\npass")
    assert not errors(cell), errors(cell)
    assert kernel.value("weights") == [2, 4, 6]
    kernel.run("extra = {'a': 1}")
    cell = kernel.run("%%remote --session train --push extra\nextra['a'] + step")
    assert result_text(cell) == "2"
    kernel.run("%lumos close train")


def test_session_error_keeps_namespace_and_shows_traceback(kernel: KernelSession) -> None:
    cell = kernel.run("%%remote --session errs\nkept = 1\nraise KeyError('nope')")
    errs = errors(cell)
    assert errs and "KeyError" in errs[0]["ename"]
    assert "line 3" in "\n".join(errs[0]["traceback"])
    cell = kernel.run("%%remote --session errs\nkept + 1")
    assert result_text(cell) == "2"
    kernel.run("%lumos close errs")


def test_a_dead_session_says_how_to_start_it_anew(kernel: KernelSession) -> None:
    """Every later cell of a session whose worker died raised the same ActorDiedError,
    with nothing saying that %lumos close lets it start again."""
    kernel.run("%%remote --session gone\nimport os\nos._exit(1)")
    cell = kernel.run("%%remote --session gone\n1 + 1")
    assert errors(cell) and "ActorDiedError" in errors(cell)[0]["ename"]
    assert "%lumos close gone" in stdout(cell, "stderr"), cell.outputs
    kernel.run("%lumos close gone")
    cell = kernel.run("%%remote --session gone\n1 + 1")
    assert not errors(cell) and result_text(cell) == "2", cell.outputs
    kernel.run("%lumos close gone")


def test_sessions_listed_and_closed(kernel: KernelSession) -> None:
    kernel.run("%%remote --session listed\nv = 1")
    cell = kernel.run("%lumos sessions")
    html = " ".join(str(d.get("text/html", "")) for d in [o.data for o in cell.outputs if "data" in o])
    assert "listed" in html and "alive" in html
    cell = kernel.run("%lumos close listed")
    assert "closed" in stdout(cell)
    cell = kernel.run("%lumos sessions")
    assert "listed" not in str(result_text(cell))
    cell = kernel.run("%lumos close listed")
    assert "UsageError: no session named 'listed'" in stdout(cell, "stderr")


def test_lumos_status_shows_nodes_resources_and_store(kernel: KernelSession) -> None:
    cell = kernel.run("%lumos status")
    out = [o for o in cell.outputs if o.output_type == "execute_result"]
    assert out, cell.outputs
    html = out[0].data["text/html"]
    assert "CPU" in html and "GPU" in html and "object store" in html and "(head)" in html


def test_cluster_card_shows_totals_in_human_units_and_links_through_the_notebook_server(
        kernel: KernelSession) -> None:
    import re
    kernel.run("import os\nos.environ['JUPYTERHUB_SERVICE_PREFIX'] = '/user/ci/'")
    try:
        for source in ("%lumos status", "_ctx"):
            cell = kernel.run(source)
            out = [o for o in cell.outputs if o.output_type == "execute_result"]
            assert out, cell.outputs
            html = out[0].data["text/html"]
            assert "/user/ci/lumos/dashboard/status?cluster=session_" in html, html
            for label in ("Nodes", "CPUs", "GPUs", "Workers", "Memory", "Object store", "<details", "(head)"):
                assert label in html, (label, html)
            assert "GiB" in html and "MiB" in html and not re.search(r"\d{6,}\.\d", html), html
        text = out[0].data["text/plain"]
        assert text.startswith("LumosContext(")
        plain = kernel.run("print(repr(get_ipython().run_line_magic('lumos', 'status')))")
        assert "cpus 2 (" in stdout(plain) and "/user/ci/lumos/dashboard/status" in stdout(plain)
    finally:
        kernel.run("del os.environ['JUPYTERHUB_SERVICE_PREFIX']")


def test_lumos_bad_command_is_a_usage_error(kernel: KernelSession) -> None:
    cell = kernel.run("%lumos frobnicate")
    assert "UsageError: %lumos frobnicate: unknown command" in stdout(cell, "stderr")
    cell = kernel.run("%lumos init")
    assert "already initialized" in stdout(cell, "stderr")
    cell = kernel.run("%lumos status --bogus")
    assert "unrecognized arguments" in stdout(cell, "stderr")


def test_gpu_panel_controls_set_the_next_cells_request(kernel: KernelSession) -> None:
    cell = kernel.run("panel = %lumos gpus\npanel")
    assert not errors(cell), errors(cell)
    assert any("application/vnd.jupyter.widget-view+json" in d for d in
               [o.data for o in cell.outputs if "data" in o])
    assert "GPU 0 (declared)" in kernel.value("panel.nodes_html.value")
    node = kernel.value("lumos.nodes()[0]['NodeID']")
    kernel.run(f"panel.num_gpus.value = 0.5\npanel.node.value = {node!r}\npanel.strategy.value = 'SPREAD'")
    assert kernel.value("panel.spec") == {"num_gpus": 0.5, "node": node, "strategy": "SPREAD",
                                          "placement_group": None}
    assert "0.5 GPU" in kernel.value("panel.summary.value")
    cell = kernel.run("%%remote\npanel_gpus = lumos.get_gpu_ids()\n"
                      "panel_node = lumos.get_runtime_context().get_node_id()")
    assert not errors(cell), errors(cell)
    assert len(kernel.value("panel_gpus")) == 1
    assert kernel.value("panel_node") == node
    opts = kernel.value("{k: str(v) for k, v in get_ipython()._lumos_magics.cells.last.options.items()}")
    assert opts["num_gpus"] == "0.5" and "NodeAffinity" in opts["scheduling_strategy"]
    # a flag still wins over the panel
    kernel.run("%%remote --num-gpus 0\nno_gpus = lumos.get_gpu_ids()")
    assert kernel.value("no_gpus") == []
    # invalid fraction is refused, the previous default stays
    kernel.run("panel.num_gpus.value = 1.5")
    assert kernel.value("panel.spec['num_gpus']") == 0.5
    assert "not applied" in kernel.value("panel.summary.value")
    # the reserve button makes a placement group the default (or says why it cannot)
    kernel.run("panel.reserve_count.value = 1\npanel.reserve_button.click()")
    assert kernel.value("panel.spec['placement_group'] is not None")
    # The next cell runs inside the reserved group, and sees its GPU.
    cell = kernel.run("%%remote\nimport lumos\n_cur = lumos.util.get_current_placement_group()\n"
                      "reserved_in = _cur.id.hex() if _cur is not None else None\nreserved_gpus = lumos.get_gpu_ids()")
    assert not errors(cell), errors(cell)
    assert kernel.value("reserved_in") == kernel.value("panel.spec['placement_group']")
    assert len(kernel.value("reserved_gpus")) == 1
    kernel.run("panel.release_button.click()")
    assert kernel.value("panel.spec['placement_group']") is None
    kernel.run("panel.num_gpus.value = 0\npanel.node.value = ''\npanel.strategy.value = 'DEFAULT'")
    assert kernel.value("panel.spec") == {"num_gpus": 0, "node": None, "strategy": "DEFAULT",
                                          "placement_group": None}


def test_gpu_panel_shows_holders_and_refreshes(kernel: KernelSession) -> None:
    kernel.run("panel2 = %lumos gpus\npanel2.refresh_s")
    kernel.run("%%remote --async --num-gpus 1 --name gpu-holder\nimport time\ntime.sleep(4)\nheld = 1")
    kernel.run("import time\nfor _ in range(60):\n    if 'gpu-holder' in panel2.nodes_html.value: break\n"
               "    time.sleep(0.1)")
    assert "gpu-holder" in kernel.value("panel2.nodes_html.value")
    kernel.run("lumos.get(held, timeout=30)\npanel2.close()")


def test_progress_widget_advances_as_refs_finish(kernel: KernelSession) -> None:
    cell = kernel.run("@lumos.remote\ndef slow(i):\n    import time; time.sleep(0.2)\n    return i\n"
                      "prog = lumos.progress([slow.remote(i) for i in range(4)], 'four')\nprog.wait(30)")
    assert result_text(cell) == "True"
    assert any("application/vnd.jupyter.widget-view+json" in d for d in displays(cell))
    assert kernel.value("[prog._bar.value, prog._bar.max, prog._bar.bar_style]") == [4, 4, "success"]
    state = kernel.nb.metadata.get("widgets", {})
    assert state == {} or isinstance(state, dict)


def test_objectref_and_task_error_rich_displays(kernel: KernelSession) -> None:
    cell = kernel.run("ref = lumos.put(list(range(10)))\nref")
    out = [o for o in cell.outputs if o.output_type == "execute_result"]
    html = out[0].data["text/html"]
    assert "ready" in html and "owner" in html and "inline" in html
    cell = kernel.run("@lumos.remote\ndef bad():\n    raise ValueError('bad value')\n"
                      "try:\n    lumos.get(bad.remote(), timeout=30)\nexcept lumos.exceptions.TaskError as e:\n"
                      "    err = e\nerr")
    out = [o for o in cell.outputs if o.output_type == "execute_result"]
    html = out[0].data["text/html"]
    assert "lumos-task-error" in html and "bad value" in html and "Traceback" in html


def test_init_result_has_a_rich_display(kernel: KernelSession) -> None:
    cell = kernel.run("_ctx")
    out = [o for o in cell.outputs if o.output_type == "execute_result"]
    assert "lumos" in out[0].data["text/html"] and "CPU" in out[0].data["text/html"]


def test_lumos_dashboard_and_graph_magics_embed_live_views(kernel: KernelSession) -> None:
    cell = kernel.run("%lumos dashboard tasks")
    assert not errors(cell), errors(cell)
    html = "".join(str(o.data.get("text/html", "")) for o in cell.outputs if "data" in o)
    assert "<iframe" in html and "tasks" in html
    cell = kernel.run("_r = lumos.put(41)\n%lumos graph _r")
    assert not errors(cell), errors(cell)
    assert any("application/vnd.jupyter.widget-view+json" in o.data for o in cell.outputs if "data" in o)
    cell = kernel.run("%lumos graph not_a_ref")
    assert "is not a name bound to an ObjectRef" in stdout(cell, "stderr")
    cell = kernel.run("%lumos dashboard nowhere")
    assert "invalid choice" in stdout(cell, "stderr")
