"""``init(runtime_env={"working_dir": ..., "py_modules": [...]})``: the job's code on
every worker.

The driver zips the directory (at most ``MAX_BYTES`` of files, without ``.git``,
``__pycache__`` and the ``excludes`` patterns) and stores the zip in the GCS KV under its
content hash. A worker that runs the job's first task fetches it once per node, unpacks
it under the session directory, and runs the job's tasks there: it is their working
directory and the first entry of ``sys.path``, so the job's modules import and its
relative paths resolve as on the driver.

Each of ``py_modules`` (a package's directory, a ``.py`` file, or an imported module)
travels the same way, zipped under its own name, and its unpacked directory goes on the
workers' ``sys.path`` (after the working_dir): ``import <name>`` works there as on the
driver, wherever the driver's copy lives.

```
driver: zip(dir) ──KvPut("pkg", sha256)──► GCS ◄──KvGet── worker: unpack once per node, chdir, sys.path
```
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import io
import os
import shutil
import zipfile
from typing import Any, Iterable

#: Largest working directory (bytes of files before compression), as a clear error beyond.
MAX_BYTES = 100 * 1024 * 1024
_ALWAYS_SKIPPED = (".git", "__pycache__", ".ipynb_checkpoints")


@dataclasses.dataclass
class JobCode:
    """What a driver ships with its job (``init(runtime_env=...)``), zipped: each a
    ``(content hash, zip bytes)``; uploaded to the GCS KV (``"pkg"``) as the job registers."""
    working_dir: tuple[str, bytes] | None
    py_modules: list[tuple[str, bytes]]
    #: ``worker_process_setup_hook``: ``{"name": "module.function"}`` or ``{"pickled":
    #: base64 of the pickled function}``, kept in the job's config (``setup_hook_of``).
    setup_hook: dict[str, str] | None = None
    #: ``init(logging_config=...)`` as ``LoggingConfig.to_dict`` gives it.
    logging_config: dict[str, Any] | None = None

    def packages(self) -> list[tuple[str, bytes]]:
        return ([self.working_dir] if self.working_dir else []) + self.py_modules


#: Largest pickled ``worker_process_setup_hook`` (it travels in the job's config).
MAX_HOOK_BYTES = 1 << 20


def job_code_of(runtime_env: Any) -> JobCode | None:
    """Zip a job runtime_env's ``working_dir`` and ``py_modules`` and pickle its
    ``worker_process_setup_hook`` (None when it has none of them)."""
    if not runtime_env:
        return None
    wd, modules = runtime_env.get("working_dir"), runtime_env.get("py_modules")
    hook = setup_hook_of(runtime_env.get("worker_process_setup_hook"))
    if wd is None and modules is None and hook is None:
        return None
    excludes = runtime_env.get("excludes")
    return JobCode(package(wd, excludes) if wd is not None else None,
                   package_modules(modules, excludes) if modules is not None else [], hook)


def setup_hook_of(hook: Any) -> dict[str, str] | None:
    """A ``worker_process_setup_hook`` (a function, or a ``"module.function"`` name) as
    the job's config holds it.

    Raises:
        SerializationError: the function cannot be pickled.
        ValueError: it pickles to more than ``MAX_HOOK_BYTES``.
    """
    if hook is None:
        return None
    if isinstance(hook, str):
        return {"name": hook}
    import base64

    from lumos._private import serialization as ser
    data = ser.dumps_code(hook)
    if len(data) > MAX_HOOK_BYTES:
        raise ValueError(f"runtime_env['worker_process_setup_hook'] pickles to {len(data)} bytes, more than "
                         f"{MAX_HOOK_BYTES}: does it capture a large object? Have it load what it needs instead")
    return {"pickled": base64.b64encode(data).decode("ascii")}


def run_setup_hook(hook: Any) -> None:
    """Run a job's ``worker_process_setup_hook`` (as ``setup_hook_of`` made it) in this
    worker.

    Raises:
        RuntimeEnvSetupError: it could not be loaded, or it raised.
    """
    import base64
    import importlib
    import traceback

    from lumos import exceptions as exc
    from lumos._private import serialization as ser
    try:
        if not isinstance(hook, dict):
            raise TypeError(f"malformed setup hook {hook!r} in the job's config")
        if "name" in hook:
            module, _, name = str(hook["name"]).rpartition(".")
            fn = getattr(importlib.import_module(module), name)
        else:
            fn = ser.deserialize_code(base64.b64decode(str(hook["pickled"])))
        fn()
    except BaseException as e:
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        raise exc.RuntimeEnvSetupError(
            "the job's runtime_env['worker_process_setup_hook'] failed in this worker:\n"
            + "".join(traceback.format_exception(type(e), e, e.__traceback__.tb_next)).rstrip()) from None


def package(path: Any, excludes: Any = None) -> tuple[str, bytes]:
    """Zip the directory ``path``; returns ``(content hash, zip bytes)``.

    Raises:
        ValueError: ``path`` is not a directory, or holds more than ``MAX_BYTES``.
        TypeError: ``path`` is not a str or path, or ``excludes`` not a list of str.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"runtime_env['working_dir'] must be a local directory path, not {type(path).__name__}")
    root = os.path.abspath(os.fspath(path))
    if not os.path.isdir(root):
        raise ValueError(f"runtime_env['working_dir'] {root!r} is not a directory (lumos takes local "
                         "directories; remote URIs and zip files are not supported)")
    return _zip(_walk(root, "", _patterns(excludes), "runtime_env['working_dir']"))


def package_modules(modules: Any, excludes: Any = None) -> list[tuple[str, bytes]]:
    """Zip each of ``py_modules`` under its own name: a package directory ``.../pkg`` as
    ``pkg/...``, a file ``.../mod.py`` as ``mod.py``, an imported module as its file or
    package directory. Returns one ``(content hash, zip bytes)`` per entry.

    Raises:
        TypeError: not a list, or an entry that is not a path or a module.
        ValueError: a remote URI, a wheel or zip, a path that is not there, a module
            without a file (built in), or more than ``MAX_BYTES`` in one.
    """
    if not isinstance(modules, (list, tuple)):
        raise TypeError(f"runtime_env['py_modules'] must be a list of local paths or modules, "
                        f"not {type(modules).__name__}")
    patterns = _patterns(excludes)
    packages = []
    for entry in modules:
        path = _module_path(entry)
        name = os.path.basename(path)
        if os.path.isdir(path):
            files = _walk(path, name, patterns, "runtime_env['py_modules'] entry")
        else:
            files = [(path, name)]
        packages.append(_zip(files))
    return packages


def _module_path(entry: Any) -> str:
    """The local path a ``py_modules`` entry names (checked)."""
    import types
    if isinstance(entry, types.ModuleType):
        file = getattr(entry, "__file__", None)
        if not file:
            raise ValueError(f"runtime_env['py_modules']: module {entry.__name__!r} has no file to ship "
                             "(built in, or a namespace package: give its directory)")
        file = os.path.abspath(file)
        return os.path.dirname(file) if os.path.basename(file) == "__init__.py" else file
    if not isinstance(entry, (str, os.PathLike)):
        raise TypeError(f"runtime_env['py_modules'] entries are local paths or modules, not {type(entry).__name__}")
    text = os.fspath(entry)
    if "://" in str(text):
        raise ValueError(f"runtime_env['py_modules'] entry {text!r}: remote URIs are not supported; "
                         "give a local directory or .py file")
    path = os.path.abspath(text).rstrip(os.sep) or os.sep
    if path.endswith((".whl", ".zip")):
        raise ValueError(f"runtime_env['py_modules'] entry {path!r}: wheels and zip files are not supported; "
                         "give the package's directory")
    if os.path.isdir(path) or (os.path.isfile(path) and path.endswith(".py")):
        return path
    raise ValueError(f"runtime_env['py_modules'] entry {path!r} is not a directory or a .py file")


def _walk(root: str, prefix: str, patterns: list[str], what: str) -> list[tuple[str, str]]:
    """``(file, name in the zip)`` of the files under ``root`` (names under ``prefix``)."""
    files: list[tuple[str, str]] = []
    total = 0
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        dirnames[:] = sorted(d for d in dirnames
                             if d not in _ALWAYS_SKIPPED and not _excluded(_join(rel_dir, d), patterns))
        for name in sorted(filenames):
            rel = _join(rel_dir, name)
            full = os.path.join(dirpath, name)
            if _excluded(rel, patterns) or not os.path.isfile(full):
                continue
            total += os.path.getsize(full)
            if total > MAX_BYTES:
                raise ValueError(f"{what} {root!r} holds more than "
                                 f"{MAX_BYTES // (1024 * 1024)} MiB of files; add large data to "
                                 "'excludes' and read it from shared storage or the object store")
            files.append((full, _join(prefix, rel) if prefix else rel))
    return files


def _zip(files: list[tuple[str, str]]) -> tuple[str, bytes]:
    """Zip ``(file, name)`` pairs; ``(content hash, zip bytes)``."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        for full, rel in files:
            info = zipfile.ZipInfo.from_file(full, rel)
            info.date_time = (1980, 1, 1, 0, 0, 0)  # the hash depends on contents only
            info.compress_type = zipfile.ZIP_DEFLATED
            with open(full, "rb") as f:
                zf.writestr(info, f.read(), compresslevel=1)
    data = buf.getvalue()
    return hashlib.sha256(data).hexdigest()[:32], data


def unpacked_dir(session_dir: str, package: str) -> str:
    """Where a node keeps its unpacked copy of the package ``package`` (its content hash,
    alphanumeric: checked by the callers). Workers unpack into it; the raylet removes it
    when the GCS drops the package."""
    return os.path.join(session_dir, "runtime_resources", f"working_dir_{package}")


def unpack(data: bytes, target: str) -> str:
    """Unpack a working directory's zip to ``target`` (once: several workers of a node may
    race; the first rename wins). Returns ``target``."""
    if os.path.isdir(target):
        return target
    tmp = f"{target}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        for info in zf.infolist():
            dest = os.path.realpath(os.path.join(tmp, info.filename))
            if not dest.startswith(os.path.realpath(tmp) + os.sep):
                raise ValueError(f"working_dir package entry {info.filename!r} points outside it")
        zf.extractall(tmp)
    try:
        os.rename(tmp, target)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not os.path.isdir(target):
            raise
    return target


def _patterns(excludes: Any) -> list[str]:
    if excludes is None:
        return []
    if not isinstance(excludes, (list, tuple)) or not all(isinstance(p, str) for p in excludes):
        raise TypeError("runtime_env['excludes'] must be a list of path patterns (str)")
    return [p.strip("/") for p in excludes]


def _excluded(rel: str, patterns: Iterable[str]) -> bool:
    name = rel.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatch(rel, p) or fnmatch.fnmatch(name, p) for p in patterns)


def _join(rel_dir: str, name: str) -> str:
    return name if rel_dir in ("", ".") else f"{rel_dir}/{name}".replace(os.sep, "/")
