"""``bench/actors.py`` runs end to end on a real cluster: its own run, and the rows it
adds to ``bench/microbench.py``. Figures are checked for presence and sign only, never
against a bound: the machine's load moves them."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from types import ModuleType

import pytest

import lumos

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "bench", "actors.py")


def _module() -> ModuleType:
    """The script as a module (``bench/`` is not a package)."""
    spec = importlib.util.spec_from_file_location("bench_actors", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_actors_bench_reports_rate_memory_and_cpu_by_role() -> None:
    proc = subprocess.Popen([sys.executable, SCRIPT, "--impl", "lumos", "--actors", "10", "--json"],
                            cwd=os.path.join(ROOT, "bench"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        stdout, stderr = proc.communicate(timeout=200)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr[-3000:]
    result = json.loads(stdout.strip().splitlines()[-1])
    assert result["actors answering"] == 10 and result["creation (/s)"] > 0
    assert 0 < result["USS per actor (MiB)"] <= result["RSS per actor (MiB)"]
    for role in ("driver", "GCS", "raylet", "fork server", "worker"):
        assert result[f"CPU per creation, {role} (ms)"] > 0, (role, result)


def test_microbench_rows_add_creation_and_memory_per_actor(fresh_cluster) -> None:  # type: ignore[no-untyped-def]
    fresh_cluster(num_cpus=1, include_dashboard=False)
    results: dict[str, float] = {}
    _module().microbench_rows(lumos, results, 1, 0.2)
    assert results["actor creation, 10 num_cpus=0 at once (/s)"] > 0
    assert results["memory per actor, USS (MiB)"] > 0
