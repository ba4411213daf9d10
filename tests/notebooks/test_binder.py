"""Binder's environment, built from ``binder/`` alone, runs every demo notebook.

Builds a fresh virtual environment from exactly the files Binder reads
(``runtime.txt``, ``apt.txt``, ``requirements.txt``, ``postBuild``, ``start``) in a copy
of the repository, with no other ``pip install``, then executes every notebook through a
real jupyter-server started by ``binder/start`` with the extensions the environment
enables (``binder_runner.py``). Building the environment takes minutes (about 1.5 on
an idle 2-core machine with a warm pip cache; more when packages must be downloaded),
so it runs in CI (``CI=true``) and where asked: ``LUMOS_BINDER_TEST=1 .ci/run
tests/notebooks``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import check_no_leaks
from tests.kernelext.test_notebooks import SMALL

REPO = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("LUMOS_BINDER_TEST") != "1" and os.environ.get("CI") != "true",
                       reason="builds a Binder environment (minutes): set LUMOS_BINDER_TEST=1"),
]


def _copy_repo(dest: Path) -> None:
    """The repository as Binder clones it: tracked and untracked files, nothing ignored."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout_s: float) -> str:
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s)
    assert out.returncode == 0, f"{' '.join(cmd)} exited {out.returncode}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out.stdout


@pytest.mark.timeout(1800)
def test_binder_environment_runs_every_notebook_through_jupyter_server(tmp_path: Path) -> None:
    repo, venv = tmp_path / "repo", tmp_path / "venv"
    _copy_repo(repo)
    binder = repo / "binder"
    assert sorted(p.name for p in binder.iterdir()) == ["apt.txt", "postBuild", "requirements.txt",
                                                        "runtime.txt", "start"]
    wanted = (binder / "runtime.txt").read_text().strip()
    assert wanted == f"python-{sys.version_info.major}.{sys.version_info.minor}", (
        f"binder/runtime.txt asks for {wanted}; this test builds with Python {sys.version.split()[0]}")
    for package in (binder / "apt.txt").read_text().split():
        found = subprocess.run(["dpkg", "-s", package], capture_output=True).returncode == 0
        if not found:
            pytest.skip(f"apt.txt's {package} is not installed here (Binder installs it)")
    for line in (binder / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        assert not line or "==" in line, f"binder/requirements.txt: pin {line!r} (name==version)"

    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "LUMOS_ADDRESS")}
    env["PATH"] = f"{venv / 'bin'}:{env['PATH']}"
    env["JUPYTER_CONFIG_DIR"] = str(tmp_path / "jupyter-config")
    env["JUPYTER_RUNTIME_DIR"] = str(tmp_path / "jupyter-runtime")
    env["JUPYTER_DATA_DIR"] = str(tmp_path / "jupyter-data")
    env["LUMOS_TMPDIR"] = str(Path("/tmp") / f"lb{os.getpid()}")  # short: Unix socket paths
    _run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "-r", "binder/requirements.txt"],
         repo, env, 1200)
    _run(["bash", "binder/postBuild"], repo, env, 600)

    sizes = tmp_path / "sizes.json"
    sizes.write_text(json.dumps(SMALL))
    shutil.copy(REPO / "tests" / "notebooks" / "binder_runner.py", tmp_path / "binder_runner.py")
    try:
        out = _run([str(venv / "bin" / "python"), str(tmp_path / "binder_runner.py"), str(repo / "notebooks"),
                    str(sizes)], repo, env, 900)
    finally:
        shutil.rmtree(env["LUMOS_TMPDIR"], ignore_errors=True)
        check_no_leaks(None)
    reports: list[dict[str, Any]] = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert "lumos dashboard served" in reports[0].get("extension", ""), reports
    assert reports[-1] == {"live_dashboard_redirects": 1}, reports  # 01-quickstart's cluster
    ran = {r["notebook"]: r for r in reports if "notebook" in r}
    assert sorted(ran) == sorted(p.name for p in (REPO / "notebooks").glob("*.ipynb")), out
    assert all(r["cells"] > 3 for r in ran.values()), ran
