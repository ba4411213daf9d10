"""``bench/gpu_check.py`` and ``bench/scaling.py`` run end to end (each in a subprocess,
on its own private cluster), so the scripts that are run by hand on a GPU machine or a
many-core one keep working where CI runs. Figures are never compared with a bound."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(script: str, *args: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, os.path.join(ROOT, "bench", script), *args], capture_output=True,
                          text=True, timeout=timeout_s, cwd=ROOT)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_gpu_check_with_a_declared_gpu_passes_every_placement_check() -> None:
    out = _run("gpu_check.py", "--fake", "1", timeout_s=150)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    checks = [ln for ln in out.stdout.splitlines() if ln.startswith(("PASS", "FAIL"))]
    assert len(checks) == 9 and all(ln.startswith("PASS") for ln in checks), checks  # 5b needs a real GPU
    assert "0 failed" in out.stdout


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_scaling_reports_each_size_with_its_drivers_and_leases() -> None:
    out = _run("scaling.py", "--nodes", "1", "2", "--tasks", "1000", "--warmup", "50", "--batch", "250",
               "--baseline", "--json", timeout_s=150)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = json.loads(out.stdout.strip().splitlines()[-1])
    assert [r["nodes"] for r in rows] == [1, 2] and [r["drivers"] for r in rows] == [1, 2]
    for r in rows:
        assert r["tasks"] == 1000 * r["drivers"] and r["tasks_per_s"] > 0
        assert len(r["driver_seconds"]) == r["drivers"] and all(s > 0 for s in r["driver_seconds"])
        assert 0 <= r["leases_elsewhere"] <= r["leases"] and r["machine_work"] > 0
    assert "machine" in out.stdout and "drivers s" in out.stdout
