"""``binder/start`` gives the notebook kernels (the drivers) glibc's non-temporal copy size,
as lumos's workers have it, keeping a user's other tunables and a setting of its own."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

import pytest

START = Path(__file__).resolve().parents[2] / "binder" / "start"
TUNABLE = "glibc.cpu.x86_non_temporal_threshold"

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.skipif(platform.machine() != "x86_64", reason="an x86-64 glibc tunable")]


def _tunables(user: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    if user is not None:
        env["GLIBC_TUNABLES"] = user
    out = subprocess.run(["bash", str(START), "printenv", "GLIBC_TUNABLES"], env=env, capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_the_kernels_get_the_size() -> None:
    assert _tunables(None) == f"{TUNABLE}=1048576"
    assert _tunables("") == f"{TUNABLE}=1048576"


def test_a_users_other_tunables_are_kept() -> None:
    assert _tunables("glibc.malloc.tcache_count=5") == f"glibc.malloc.tcache_count=5:{TUNABLE}=1048576"


def test_a_users_own_size_stands() -> None:
    assert _tunables(f"{TUNABLE}=300000") == f"{TUNABLE}=300000"
    assert _tunables(f"glibc.malloc.tcache_count=5:{TUNABLE}=300000") == f"glibc.malloc.tcache_count=5:{TUNABLE}=300000"
