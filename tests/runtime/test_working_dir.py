"""init(runtime_env={"working_dir": ...}): the job's code directory on every worker."""

from __future__ import annotations

import os
import re
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
    src = str(tmp_path / "src")
    with pytest.raises(ValueError, match="^" + re.escape(f"runtime_env['py_modules'] entry '{src}' holds more than")):
        working_dir.package_modules([src])  # (it named the path twice)
    evil = io.BytesIO()
    with zipfile.ZipFile(evil, "w") as zf:
        zf.writestr("../escaped.txt", "x")
    with pytest.raises(ValueError, match="outside"):
        working_dir.unpack(evil.getvalue(), str(tmp_path / "evil"))
    assert not (tmp_path / "escaped.txt").exists()


def test_py_modules_ship_packages_files_and_imported_modules_to_workers(fresh_cluster: Any, tmp_path: Any) -> None:
    import sys
    lib = tmp_path / "elsewhere"  # on no path the workers have: only py_modules brings them
    (lib / "pm_pkg" / "sub").mkdir(parents=True)
    (lib / "pm_pkg" / "__init__.py").write_text("from .sub.deep import VALUE\n")
    (lib / "pm_pkg" / "sub" / "__init__.py").write_text("")
    (lib / "pm_pkg" / "sub" / "deep.py").write_text("VALUE = 'from a package'\n")
    (lib / "pm_pkg" / "weights.bin").write_bytes(b"x" * 100)
    (lib / "pm_single.py").write_text("WHO = 'a single file'\n")
    imported = tmp_path / "imported"
    (imported / "pm_imported").mkdir(parents=True)
    (imported / "pm_imported" / "__init__.py").write_text("KIND = 'an imported module'\n")
    sys.path.insert(0, str(imported))
    try:
        import pm_imported  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(imported))  # (the driver's sys.path goes to its workers)
    try:
        fresh_cluster(runtime_env={"py_modules": [str(lib / "pm_pkg"), lib / "pm_single.py", pm_imported],
                                   "excludes": ["*.bin"]})

        @lumos.remote
        def probe() -> tuple[Any, ...]:
            import pm_imported
            import pm_pkg  # type: ignore[import-not-found]
            import pm_single  # type: ignore[import-not-found]
            here = os.path.dirname(pm_pkg.__file__)
            return (pm_pkg.VALUE, pm_single.WHO, pm_imported.KIND, sorted(os.listdir(here)),
                    "runtime_resources" in here)

        @lumos.remote
        class User:
            def value(self) -> str:
                import pm_pkg
                return str(pm_pkg.VALUE)

        value, who, kind, files, shipped = lumos.get(probe.remote(), timeout=60)
        assert (value, who, kind) == ("from a package", "a single file", "an imported module")
        assert files == ["__init__.py", "sub"] and shipped  # excludes apply; __pycache__ never travels
        assert lumos.get(User.remote().value.remote(), timeout=60) == "from a package"
    finally:
        sys.modules.pop("pm_imported", None)


def test_py_modules_errors_are_clear(tmp_path: Any) -> None:
    import sys
    (tmp_path / "notes.txt").write_text("x")
    cases = [
        ("s3://bucket/pkg.zip", ValueError, "remote URIs are not supported"),
        (str(tmp_path / "pkg-1.0-py3-none-any.whl"), ValueError, "wheels and zip files"),
        (str(tmp_path / "missing"), ValueError, "not a directory or a .py file"),
        (str(tmp_path / "notes.txt"), ValueError, "not a directory or a .py file"),
        (sys, ValueError, "has no file to ship"),
        (42, TypeError, "local paths or modules"),
    ]
    for entry, error, message in cases:
        with pytest.raises(error, match=message):
            lumos.init(runtime_env={"py_modules": [entry]})
    with pytest.raises(TypeError, match="must be a list"):
        lumos.init(runtime_env={"py_modules": str(tmp_path)})
    with pytest.raises(ValueError, match="whole job only"):
        env_of.options(runtime_env={"py_modules": [str(tmp_path)]})
    assert not lumos.is_initialized()


def _hook_marks_the_worker() -> None:
    import logging
    os.environ["LUMOS_TEST_HOOKED"] = str(os.getpid())
    logging.getLogger("hooked_app").setLevel(logging.DEBUG)


def _hook_fails() -> None:
    raise RuntimeError("no licence server here")


def test_worker_process_setup_hook_runs_once_in_each_worker_before_its_tasks(fresh_cluster: Any,
                                                                            tmp_path: Any) -> None:
    import logging
    code = tmp_path / "project"
    code.mkdir()
    (code / "hook_mod.py").write_text(
        "import os\n"
        "def setup():\n"
        "    with open(os.path.join(os.environ['HOOK_LOG_DIR'], str(os.getpid())), 'a') as f:\n"
        "        f.write('x')\n")
    logs = tmp_path / "calls"
    logs.mkdir()
    # A function (pickled by value: it lives in this test module) ...
    fresh_cluster(num_cpus=2, runtime_env={"worker_process_setup_hook": _hook_marks_the_worker})

    @lumos.remote
    def probe() -> tuple[str | None, int, int]:
        return os.environ.get("LUMOS_TEST_HOOKED"), os.getpid(), logging.getLogger("hooked_app").level

    @lumos.remote
    class Probe:
        def hooked(self) -> bool:
            return os.environ.get("LUMOS_TEST_HOOKED") == str(os.getpid())

    for hooked, pid, level in lumos.get([probe.remote() for _ in range(6)], timeout=60):
        assert hooked == str(pid) and level == logging.DEBUG
    assert lumos.get(Probe.remote().hooked.remote(), timeout=60)
    lumos.shutdown()
    # ... or a "module.function" name, importable from the job's working_dir.
    fresh_cluster(num_cpus=1, runtime_env={"working_dir": str(code), "worker_process_setup_hook": "hook_mod.setup",
                                           "env_vars": {"HOOK_LOG_DIR": str(logs)}})
    pids = {pid for _, pid, _ in lumos.get([probe.remote() for _ in range(5)], timeout=60)}
    assert {int(p.name) for p in logs.iterdir()} == pids
    assert all(p.read_text() == "x" for p in logs.iterdir())  # once per worker, not per task
    ctx_env = lumos.get(lumos.remote(lambda: lumos.get_runtime_context().runtime_env).remote(), timeout=60)
    assert isinstance(ctx_env, lumos.runtime_env.RuntimeEnv) and ctx_env.working_dir().startswith("gcs://")
    assert re.fullmatch(r"gcs://_lumos_pkg_\w+\.zip", ctx_env["working_dir"]), ctx_env
    assert ctx_env["env_vars"]["HOOK_LOG_DIR"] == str(logs)
    assert lumos.get_runtime_context().runtime_env["working_dir"] == ctx_env["working_dir"]  # the driver's view


def test_a_failing_setup_hook_fails_the_tasks_with_its_traceback(fresh_cluster: Any) -> None:
    fresh_cluster(num_cpus=1, runtime_env={"worker_process_setup_hook": _hook_fails})

    @lumos.remote
    def never() -> int:
        return 1

    for _ in range(2):  # each task tries the hook again, and says why it failed
        with pytest.raises(lumos.exceptions.RuntimeEnvSetupError) as info:
            lumos.get(never.remote(), timeout=60)
        text = str(info.value)
        assert "worker_process_setup_hook" in text and "no licence server here" in text and "_hook_fails" in text


def test_setup_hook_and_empty_install_keys_are_checked() -> None:
    import threading
    lock, big = threading.Lock(), b"x" * (2 << 20)
    for hook, error, message in ((42, TypeError, "a function or a 'module.function' name"),
                                 ("nodots", TypeError, "a function or a 'module.function' name"),
                                 (lambda: lock, TypeError, "lock"),
                                 (lambda: big, ValueError, "pickles to .* bytes, more than")):
        with pytest.raises(error, match=message):
            lumos.init(runtime_env={"worker_process_setup_hook": hook})
    with pytest.raises(ValueError, match="whole job only"):
        env_of.options(runtime_env={"worker_process_setup_hook": _hook_fails})
    with pytest.raises(ValueError, match=r"keys \['pip'\] are not supported"):
        env_of.options(runtime_env={"pip": ["requests"]})
    assert not lumos.is_initialized()
    # Ray's install keys with nothing to install are accepted, as Ray accepts them.
    env_of.options(runtime_env={"pip": [], "conda": None, "env_vars": {"A": "1"}})
    lumos.runtime_env.RuntimeEnv(pip=[], uv=[], env_vars={"A": "1"})


def test_an_actor_called_by_another_job_stays_in_its_creators_environment(tmp_path: Any) -> None:
    import subprocess
    import sys
    import textwrap
    from lumos.testing import Cluster
    from tests.conftest import TEST_CONFIG
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / f"only_in_{name}.py").write_text("")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "_system_config": TEST_CONFIG})
    try:
        script = textwrap.dedent(f"""
            import os, sys, lumos
            lumos.init(address={cluster.address!r}, _token={cluster.token!r}, namespace="team",
                       runtime_env={{"working_dir": {str(tmp_path / "a")!r}, "env_vars": {{"WHO": "a"}}}})
            @lumos.remote
            class Keeper:
                def where(self):
                    import logging
                    return (os.path.basename(os.getcwd()), os.environ.get("LUMOS_TEST_HOOKED"),
                            os.environ.get("WHO"), any(os.path.isfile(os.path.join(p, "only_in_b.py")) for p in sys.path),
                            logging.getLogger("hooked_app").level,
                            lumos.get_runtime_context().runtime_env["working_dir"])
            k = Keeper.options(name="keeper", lifetime="detached").remote()
            print(repr(lumos.get(k.where.remote(), timeout=60)))
        """)
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=90)
        assert out.returncode == 0, out.stderr
        first = eval(out.stdout.strip().splitlines()[-1])
        assert first[1:5] == (None, "a", False, 0), first
        # A second job with its own working_dir, env_vars and setup hook calls the actor.
        cluster.connect(namespace="team", runtime_env={"working_dir": str(tmp_path / "b"), "env_vars": {"WHO": "b"},
                                                        "worker_process_setup_hook": _hook_marks_the_worker})
        keeper = lumos.get_actor("keeper")
        assert lumos.get(keeper.where.remote(), timeout=60) == first

        @lumos.remote
        def mine() -> tuple[str | None, str | None]:
            return os.environ.get("LUMOS_TEST_HOOKED"), os.environ.get("WHO")

        assert lumos.get(mine.remote(), timeout=60)[1] == "b"  # the second job's own tasks have its environment
        assert lumos.get(mine.remote(), timeout=60)[0] is not None
        lumos.kill(keeper)
    finally:
        cluster.shutdown()
