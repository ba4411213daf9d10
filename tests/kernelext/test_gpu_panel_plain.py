"""The GPU panel driven from plain Python (ipywidgets' dummy comm): what it shows on a
cluster without GPUs, and how it looks once the cluster is shut down."""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any, Callable

import pytest

import lumos

pytestmark = pytest.mark.timeout(120)


def test_reserve_is_disabled_without_gpus_and_the_table_aligns(fresh_cluster: Callable[..., Any]) -> None:
    from lumos.kernelext.remote import Defaults
    from lumos.kernelext.widgets import GpuPanel
    fresh_cluster(num_gpus=0)
    panel = GpuPanel(SimpleNamespace(defaults=Defaults()), refresh_s=60)
    try:
        assert panel.reserve_button.disabled
        assert "no GPUs" in panel.reserve_button.tooltip
        table = panel.nodes_html.value
        # Header cells and row cells carry the same alignment.
        styles = set(re.findall(r"<t[hd] style='([^']*?)(?:;font-weight:bold)?'", table))
        assert len(styles) == 1 and "text-align:left" in styles.pop()
        assert table.count("<th ") == 4 and table.count("<td ") == 4
        # Frozen at shutdown: the view stays, its controls no longer act.
        panel.close(keep_view=True)
        assert panel.num_gpus.disabled and panel.strategy.disabled and panel.reserve_button.disabled
        assert "shut down" in panel.summary.value
        assert panel.widget.comm is not None  # not closed: the view stays in the notebook
    finally:
        panel.close()
    assert lumos.is_initialized()


def test_an_actor_holding_a_gpu_is_listed_on_its_node(fresh_cluster: Callable[..., Any]) -> None:
    from lumos.kernelext.remote import Defaults
    from lumos.kernelext.widgets import GpuPanel, gpu_holders
    fresh_cluster(num_cpus=2, num_gpus=1)

    @lumos.remote(num_gpus=1)
    class Trainer:
        def ready(self) -> bool:
            return True

    trainer = Trainer.remote()
    assert lumos.get(trainer.ready.remote(), timeout=60)
    node = lumos.state.list_nodes()[0]["node_id"]
    assert gpu_holders() == {node: [{"kind": "actor", "name": "Trainer", "GPU": 1.0, "ids": None}]}
    panel = GpuPanel(SimpleNamespace(defaults=Defaults()), refresh_s=60)
    try:
        assert "Trainer (actor, 1 GPU)" in panel.nodes_html.value
    finally:
        panel.close()
    lumos.kill(trainer)
