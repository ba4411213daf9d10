"""init(runtime_env={"working_dir": ...}): the job's code directory on every worker."""

from __future__ import annotations

import os
from typing import Any

import pytest

import lumos


@lumos.remote
def env_of() -> None:
    return None


def test_working_dir_is_shipped_to_workers(fresh_cluster: Any, tmp_path: Any) -> None:
    code = tmp_path / "project"
    (code / "pkg").mkdir(parents=True)
    (code / "wd_probe_mod.py").write_text("def answer():\n    return 42\n")
    (code / "pkg" / "__init__.py").write_text("NAME = 'inner'\n")
    (code / "data.txt").write_text("relative data")
    (code / "big.bin").write_bytes(b"x" * 1000)
    (code / "__pycache__").mkdir()
    (code / "__pycache__" / "junk.pyc").write_bytes(b"junk")
    fresh_cluster(runtime_env={"working_dir": str(code), "excludes": ["*.bin"],
                               "env_vars": {"JOB_VAR": "wd"}})
    (code / "data.txt").write_text("changed after init")  # the job runs the snapshot

    @lumos.remote
    def probe() -> dict[str, Any]:
        import wd_probe_mod
        from pkg import NAME
        with open("data.txt") as f:
            data = f.read()
        return {"answer": wd_probe_mod.answer(), "name": NAME, "data": data, "cwd": os.getcwd(),
                "files": sorted(os.listdir(".")), "env": os.environ.get("JOB_VAR")}

    out = lumos.get(probe.remote(), timeout=60)
    assert out["answer"] == 42 and out["name"] == "inner" and out["data"] == "relative data"
    assert out["files"] == ["data.txt", "pkg", "wd_probe_mod.py"], out["files"]
    assert out["cwd"] != str(code) and "runtime_resources" in out["cwd"]
    assert out["env"] == "wd"


def test_working_dir_errors_are_clear(tmp_path: Any) -> None:
    with pytest.raises(ValueError, match="not a directory"):
        lumos.init(runtime_env={"working_dir": str(tmp_path / "missing")})
    with pytest.raises(TypeError, match="excludes"):
        lumos.init(runtime_env={"working_dir": str(tmp_path), "excludes": "*.bin"})
    with pytest.raises(ValueError, match="whole job only"):
        env_of.options(runtime_env={"working_dir": str(tmp_path)})
    assert not lumos.is_initialized()


def test_package_limits_size_and_unpack_stays_inside(tmp_path: Any, monkeypatch: Any) -> None:
    import io
    import zipfile

    from lumos._private import working_dir
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text("a" * 100)
    h1, data = working_dir.package(tmp_path / "src")
    assert working_dir.package(tmp_path / "src")[0] == h1  # same contents, same id
    target = working_dir.unpack(data, str(tmp_path / "out"))
    with open(os.path.join(target, "a.txt")) as f:
        assert f.read() == "a" * 100
    monkeypatch.setattr(working_dir, "MAX_BYTES", 50)
    with pytest.raises(ValueError, match="more than"):
        working_dir.package(tmp_path / "src")
    evil = io.BytesIO()
    with zipfile.ZipFile(evil, "w") as zf:
        zf.writestr("../escaped.txt", "x")
    with pytest.raises(ValueError, match="outside"):
        working_dir.unpack(evil.getvalue(), str(tmp_path / "evil"))
    assert not (tmp_path / "escaped.txt").exists()
