"""What a ``%%remote`` cell reads and writes, and the function that runs it on a worker.

Driver side (the notebook kernel):

- ``analyze(source)``: AST + symtable scan of the cell. Names it *reads* before it
  (surely) assigns them are shipped from the notebook; names it *binds* at top level
  come back; the last statement, when an expression, is displayed.
- ``Shipper``: turns the names read into task arguments. Modules go by name,
  ``ObjectRef``s stay refs (refs bound by an ``--async`` cell are resolved on the
  cluster), small values travel inline, and a large value is ``put`` once and its ref
  reused while its content hash is unchanged.

Worker side: ``run_cell`` (a plain module-level function, so it is exported by
reference) executes the cell in a fresh namespace (or a session's persistent one),
streams ``display()`` calls as marker lines on stdout, and returns one value per
assigned name plus a small ``CellMeta``.

```
 notebook                              worker
 analyze ─► Shipper ─► run_cell.remote(spec, inline, *refs)
                                       exec(cell) ─► prints / display markers ─► log stream
 bind names ◄─ [meta, v1, v2, ...] ◄──┘
```

This module imports neither IPython nor lumos internals at module level: it is loaded
by every worker that runs a cell.
"""

from __future__ import annotations

import ast
import base64
import builtins
import hashlib
import io
import json
import linecache
import os
import pickle
import symtable
import sys
import types
from dataclasses import dataclass, field
from typing import Any

import cloudpickle

from lumos.util.pickling import dumps as cloudpickle_dumps

#: The matplotlib backend of remote cells (``mpl_backend``), as ``MPLBACKEND`` names it.
MPL_BACKEND = "module://lumos.kernelext.mpl_backend"
#: True while a remote cell runs in this process (its ``plt.show()`` displays figures).
in_remote_cell = False

#: Prefix of a stdout line that carries a ``display()`` bundle (JSON, base64); the run's
#: secret nonce and a colon follow (``display_prefix``), so printed data that happens to
#: start like a marker is never taken for one.
DISPLAY_MARKER = "\ue000lumos-display-"
#: Prefix of the last stdout line of a cell that wrote output: everything before it
#: arrived (``end_prefix``: with the run's nonce, like ``DISPLAY_MARKER``).
END_MARKER = "\ue000lumos-end-"
#: Values whose pickled size is at least this are put in the object store once.
LARGE_VALUE_BYTES = 100 * 1024


# =========================================================================== analysis


@dataclass
class CellAnalysis:
    """What a cell touches in the module namespace."""

    #: Names the cell may read before assigning them (first-use order).
    reads: list[str]
    #: Names the cell binds at module level (assignments, imports, defs, del, global).
    assigns: list[str]
    #: The last top-level statement is an expression (its value is displayed).
    last_expr: bool
    #: The cell's last line ends with ``;`` (no display, like a local cell).
    quiet: bool
    #: The names of ``assigns`` the cell gives a value (``x = ...``, ``x += ...``,
    #: ``with ... as x``, ``(x := ...)``), not those bound only by an import, a ``for``
    #: target, a ``def``/``class`` or an ``except ... as``: what an ``--async`` cell binds.
    values: list[str] = field(default_factory=list)


def analyze(source: str) -> CellAnalysis:
    """Scan ``source`` (already transformed from IPython syntax to Python).

    Raises:
        SyntaxError: the cell does not parse.
    """
    tree = ast.parse(source)
    table = symtable.symtable(source, "<cell>", "exec")
    global_reads: set[str] = set()
    binds: set[str] = set()
    for sym in table.get_symbols():
        if sym.is_referenced():
            global_reads.add(sym.get_name())
        if sym.is_assigned() or sym.is_imported():
            binds.add(sym.get_name())
    stack = list(table.get_children())
    while stack:
        t = stack.pop()
        stack.extend(t.get_children())
        for sym in t.get_symbols():
            if sym.is_global() and sym.is_referenced():
                global_reads.add(sym.get_name())
            if sym.is_declared_global() and sym.is_assigned():
                binds.add(sym.get_name())
    reads: list[str] = []
    seen: set[str] = set()
    surely_bound: set[str] = set()
    for stmt in tree.body:
        loop_bound: set[str] = set()
        in_iter: set[int] = set()
        if isinstance(stmt, (ast.For, ast.AsyncFor)):
            # the loop variable is bound before the body reads it
            loop_bound = _target_names(stmt.target)
            in_iter = {id(n) for n in ast.walk(stmt.iter)}
        for node in ast.walk(stmt):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                name = node.id
                if name in loop_bound and id(node) not in in_iter:
                    continue
                if name in global_reads and name not in surely_bound and name not in seen:
                    seen.add(name)
                    reads.append(name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Del) and node.id in binds:
                # `del x` at top level needs x to exist remotely; the notebook then drops it
                if node.id not in surely_bound and node.id not in seen:
                    seen.add(node.id)
                    reads.append(node.id)
            elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
                name = node.target.id
                if name not in surely_bound and name not in seen:
                    seen.add(name)
                    reads.append(name)
        surely_bound |= _sure_bindings(stmt)
    order = [n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id in binds]
    order += [a.asname or a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
              for a in n.names]
    order += [n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    assigns = [n for n in dict.fromkeys(order) if n in binds and n != "*"]
    assigns += sorted(binds - set(assigns))
    last_expr = bool(tree.body) and isinstance(tree.body[-1], ast.Expr)
    lines = [ln for ln in source.rstrip().splitlines() if ln.strip()]
    quiet = bool(lines) and lines[-1].split("#")[0].rstrip().endswith(";")
    valued = _value_targets(tree)
    values = [n for n in assigns if n in valued]
    return CellAnalysis(reads, assigns, last_expr, quiet, values)


def _value_targets(tree: ast.Module) -> set[str]:
    """Names the module scope of ``tree`` assigns a value to (see ``CellAnalysis.values``)."""
    out: set[str] = set()
    stack: list[ast.AST] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            # their bodies are other scopes; `global x` assignments in them count
            for sub in ast.walk(node):
                if isinstance(sub, ast.Global):
                    declared = set(sub.names)
                    for inner in ast.walk(node):
                        if isinstance(inner, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                            targets = inner.targets if isinstance(inner, ast.Assign) else [inner.target]
                            for t in targets:
                                out |= _target_names(t) & declared
            continue
        if isinstance(node, ast.Assign):
            for t in node.targets:
                out |= _target_names(t)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)) and (
                not isinstance(node, ast.AnnAssign) or node.value is not None):
            out |= _target_names(node.target)
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            out |= _target_names(node.optional_vars)
        elif isinstance(node, ast.NamedExpr):
            out |= _target_names(node.target)  # binds the enclosing scope, even in a comprehension
        stack.extend(ast.iter_child_nodes(node))
    return out


def _sure_bindings(stmt: ast.stmt) -> set[str]:
    """Names a top-level statement always binds, after evaluating what it reads."""
    out: set[str] = set()
    if isinstance(stmt, ast.Assign):
        for t in stmt.targets:
            out |= _target_names(t)
    elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
        out |= _target_names(stmt.target)
    elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
        out |= {a.asname or a.name.split(".")[0] for a in stmt.names if a.name != "*"}
    elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        out.add(stmt.name)
    return out


def _target_names(t: ast.expr) -> set[str]:
    if isinstance(t, ast.Name):
        return {t.id}
    if isinstance(t, (ast.Tuple, ast.List)):
        out: set[str] = set()
        for e in t.elts:
            out |= _target_names(e)
        return out
    if isinstance(t, ast.Starred):
        return _target_names(t.value)
    return set()


# =========================================================================== markers


def new_nonce() -> str:
    """A run's secret: only lines carrying it are display bundles or end markers."""
    import secrets
    return secrets.token_hex(16)


def display_prefix(nonce: str) -> str:
    return f"{DISPLAY_MARKER}{nonce}:"


def end_prefix(nonce: str) -> str:
    return f"{END_MARKER}{nonce}:"


#: The nonce of the cell running in this process (None outside a cell): ``display()``
#: marks its lines with it.
_running_nonce: str | None = None


class _Unset:
    """The cell did not bind this name (a branch not taken)."""

    _instance: "_Unset | None" = None

    def __new__(cls) -> "_Unset":
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __reduce__(self) -> Any:
        return (_Unset, ())

    def __repr__(self) -> str:
        return "<unset>"


class _Deleted(_Unset):
    """The cell deleted this name."""

    _instance: "_Deleted | None" = None  # type: ignore[assignment]

    def __reduce__(self) -> Any:
        return (_Deleted, ())

    def __repr__(self) -> str:
        return "<deleted>"


UNSET = _Unset()
DELETED = _Deleted()


@dataclass(frozen=True)
class ModuleByName:
    """A module travels as its import name and is imported on arrival."""

    name: str

    def load(self) -> types.ModuleType:
        import importlib
        return importlib.import_module(self.name)


@dataclass(frozen=True)
class NotShipped:
    """A value that could not be pickled; reading it raises with this reason."""

    name: str
    type_name: str
    reason: str

    def message(self, where: str) -> str:
        return (f"variable {self.name!r} (a {self.type_name}) could not be sent {where}: {self.reason}. "
                f"Create it inside the cell, or keep it remote with --session")


@dataclass
class CellMeta:
    """Return value 0 of a cell task."""

    #: The last expression's value (when picklable), else None.
    value: Any = None
    has_value: bool = False
    #: The last expression's mime bundle when its value could not come back.
    bundle: dict[str, Any] | None = None
    #: The cell wrote to stdout/stderr (an END_MARKER line follows the output).
    wrote_output: bool = False
    #: Assigned names that could not come back: name -> reason.
    not_returned: dict[str, str] = field(default_factory=dict)
    #: Names present in the namespace afterwards (sessions only).
    namespace: list[str] | None = None


@dataclass
class CellSpec:
    """What the worker needs to run a cell."""

    source: str             #: transformed Python source
    display_source: str     #: the cell as the user wrote it (for tracebacks)
    filename: str           #: e.g. "<cell In[5]>"
    line_offset: int        #: lines before the cell body (the %%remote line)
    assigns: list[str]
    last_expr: bool
    quiet: bool
    #: names of the positional ref arguments (values resolved by lumos)
    ref_names: list[str]
    #: --pull names (sessions)
    pull: list[str] = field(default_factory=list)
    #: map element index (for --map), else -1
    map_index: int = -1
    #: this run's secret for its display and end marker lines (never printed by user code)
    nonce: str = field(default_factory=new_nonce)


# =========================================================================== driver side


@dataclass
class _Shipped:
    digest: bytes
    ref: Any
    size_bytes: int


@dataclass
class ShipStats:
    """What the last cell sent: counts for the benchmark and for tests."""

    inline_bytes: int = 0
    put_bytes: int = 0
    reused_bytes: int = 0
    hashed_bytes: int = 0


class Shipper:
    """Turns notebook names into task arguments; remembers large values already put."""

    def __init__(self, large_value_bytes: int = LARGE_VALUE_BYTES) -> None:
        self.large_value_bytes = large_value_bytes
        #: name -> the ref of the large value last shipped under that name.
        self._cache: dict[str, _Shipped] = {}
        #: ids of refs created by --async cells: resolved (not kept as refs) when read.
        self.resolve_refs: set[bytes] = set()
        self.last = ShipStats()

    def forget(self) -> None:
        self._cache.clear()
        self.resolve_refs.clear()

    def ship(self, names: list[str], ns: dict[str, Any]) -> tuple[dict[str, Any], list[str], list[Any]]:
        """Split ``names`` into inline values and ref arguments.

        Returns:
            ``(inline, ref_names, refs)``: ``inline`` maps names to values sent with the
            task; ``refs[i]`` is a top-level ObjectRef argument whose value lumos resolves
            on the worker and binds to ``ref_names[i]``.

        Raises:
            TypeError: a value cannot be pickled (names the variable).
        """
        import lumos
        stats = ShipStats()
        inline: dict[str, Any] = {}
        ref_names: list[str] = []
        refs: list[Any] = []
        for name in names:
            value = ns[name]
            if isinstance(value, types.ModuleType):
                inline[name] = ModuleByName(value.__name__)
                continue
            if isinstance(value, lumos.ObjectRef):
                if value.binary() in self.resolve_refs:
                    ref_names.append(name)
                    refs.append(value)
                else:
                    inline[name] = value  # nested in a dict: stays a ref, as it would locally
                continue
            size, digest = self._measure(name, value)
            if size < self.large_value_bytes:
                inline[name] = value
                stats.inline_bytes += size
                self._cache.pop(name, None)
                continue
            stats.hashed_bytes += size
            cached = self._cache.get(name)
            if cached is not None and cached.digest == digest:
                stats.reused_bytes += size
            else:
                cached = _Shipped(digest, lumos.put(value), size)
                self._cache[name] = cached
                stats.put_bytes += size
            ref_names.append(name)
            refs.append(cached.ref)
        self.last = stats
        return inline, ref_names, refs

    def _measure(self, name: str, value: Any) -> tuple[int, bytes]:
        buffers: list[pickle.PickleBuffer] = []
        try:
            stream = cloudpickle_dumps(value, protocol=5, buffer_callback=buffers.append)
        except Exception as e:
            raise TypeError(f"cannot send variable {name!r} (a {type(value).__name__}) to the cluster: "
                            f"{type(e).__name__}: {e}. Create it inside the cell, or keep it remote "
                            f"with --session") from None
        size = len(stream) + sum(b.raw().nbytes for b in buffers)
        if size < self.large_value_bytes:
            return size, b""
        h = hashlib.sha1(stream)
        for b in buffers:
            raw = b.raw()
            h.update(raw.nbytes.to_bytes(8, "little"))
            h.update(raw)
        return size, h.digest()


# =========================================================================== worker side


def run_cell(spec: CellSpec, inline: dict[str, Any], *ref_values: Any,
             namespace: dict[str, Any] | None = None) -> Any:
    """Run a cell on a worker; returns ``(CellMeta, value_of_assign_1, ...)``, or the
    ``CellMeta`` alone when the cell assigns nothing.

    ``namespace`` is a session's persistent namespace; without it a fresh one is used.
    Exceptions from the cell propagate with the runner's frames removed, so the
    traceback starts at the cell (with the cell's own line numbers).
    """
    ns = namespace if namespace is not None else {"__name__": "__main__", "__builtins__": builtins}
    ns.setdefault("display", display)
    if not hasattr(builtins, "display"):
        # notebook functions sent by value look display up in builtins, as IPython provides it
        builtins.display = display  # type: ignore[attr-defined]
    ns.setdefault("get_ipython", _RemoteShell)
    lists: dict[str, dict[int, Any]] = {}
    for name, value in list(inline.items()) + list(zip(spec.ref_names, ref_values)):
        if "\x00" in name:  # one element of an --async --map result
            base, _, index = name.partition("\x00")
            lists.setdefault(base, {})[int(index)] = value
            continue
        _bind_input(ns, name, value)
    for base, items in lists.items():
        ns[base] = [items[i] for i in sorted(items)]
    before = set(ns)
    lines = spec.display_source.splitlines(True)
    linecache.cache[spec.filename] = (len(spec.display_source), None, lines, spec.filename)
    _trim_linecache()
    tree = ast.parse(spec.source, spec.filename)
    ast.increment_lineno(tree, spec.line_offset)
    last = None
    if spec.last_expr and tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    meta = CellMeta()
    if "matplotlib" not in sys.modules:
        os.environ["MPLBACKEND"] = MPL_BACKEND  # read when the cell first imports matplotlib
    global in_remote_cell, _running_nonce
    in_remote_cell = True
    outer_nonce, _running_nonce = _running_nonce, spec.nonce
    out, err = sys.stdout, sys.stderr
    counting_out, counting_err = _Counting(out), _Counting(err)
    sys.stdout, sys.stderr = counting_out, counting_err  # type: ignore[assignment]
    failed = False
    try:
        try:
            exec(compile(tree, spec.filename, "exec"), ns)
            if last is not None:
                value = eval(compile(last, spec.filename, "eval"), ns)
                if value is not None and not spec.quiet:
                    if _picklable(value):
                        meta.value, meta.has_value = value, True
                    else:
                        meta.bundle = mimebundle(value)
        except BaseException as e:
            failed = True
            tb = e.__traceback__
            while tb is not None and tb.tb_frame.f_code.co_filename != spec.filename:
                tb = tb.tb_next
            if tb is not None:
                e.__traceback__ = tb
            raise
    finally:
        _flush_figures()
        in_remote_cell = False
        _running_nonce = outer_nonce
        sys.stdout, sys.stderr = out, err
        if counting_out.written or counting_err.written or failed:
            meta.wrote_output = True
            err.flush()
            out.flush()
            out.write(f"{end_prefix(spec.nonce)}{spec.map_index}\n")
            out.flush()
    values: list[Any] = []
    for name in spec.assigns:
        if name not in ns:
            values.append(DELETED if name in before else UNSET)
            continue
        v = ns[name]
        if isinstance(v, types.ModuleType):
            values.append(ModuleByName(v.__name__))
        elif _picklable(v):
            values.append(v)
        else:
            reason = _pickle_failure(v)
            meta.not_returned[name] = reason
            values.append(NotShipped(name, type(v).__name__, reason))
    if namespace is not None:
        meta.namespace = sorted(k for k in ns if not k.startswith("__") and k not in ("display", "get_ipython"))
    if not spec.assigns:
        return meta  # num_returns=1: the task's one value
    return (meta, *values)


def _flush_figures() -> None:
    """Send the figures the cell left open to the notebook, as the inline backend does."""
    backend = sys.modules.get("lumos.kernelext.mpl_backend")
    if backend is None or "matplotlib.pyplot" not in sys.modules:
        return
    try:
        import matplotlib
        if matplotlib.get_backend() == MPL_BACKEND:
            backend.flush_figures()
    except Exception as e:  # a figure that cannot be drawn must not lose the cell's result
        print(f"lumos: could not send the cell's figures: {type(e).__name__}: {e}", file=sys.stderr)


def _bind_input(ns: dict[str, Any], name: str, value: Any) -> None:
    if isinstance(value, ModuleByName):
        try:
            ns[name] = value.load()
        except ImportError as e:
            raise ImportError(f"module {value.name!r} (notebook name {name!r}) cannot be imported on "
                              f"this worker: {e}") from None
    elif isinstance(value, NotShipped):
        raise TypeError(value.message("to this cell"))
    elif isinstance(value, _Unset):
        ns.pop(name, None)
    else:
        ns[name] = value


_PLAIN = (int, float, str, bytes, bool, complex, type(None))


def _picklable(value: Any) -> bool:
    if type(value) in _PLAIN:
        return True
    try:
        cloudpickle.dumps(value, protocol=5, buffer_callback=lambda b: False)
        return True
    except Exception:
        return False


def _pickle_failure(value: Any) -> str:
    try:
        cloudpickle.dumps(value, protocol=5, buffer_callback=lambda b: False)
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return "unknown"


def _trim_linecache(keep: int = 256) -> None:
    ours = [k for k in linecache.cache if k.startswith("<cell ")]
    for k in ours[:-keep]:
        linecache.cache.pop(k, None)


class _Counting(io.TextIOBase):
    """Passes writes through and remembers that something was written."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.written = False

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if text:
            self.written = True
        return int(self._inner.write(text))

    def flush(self) -> None:
        self._inner.flush()

    def __del__(self) -> None:
        """Nothing: the stream is not ours to flush or close. (IOBase's finalizer closes,
        and so flushes, the stream it wraps, whenever the garbage collector gets to this
        wrapper, as inside a write of that same stream: a deadlock.)"""

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return int(self._inner.fileno())

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"


# ------------------------------------------------------------------ display on a worker

_formatter: Any = None


def mimebundle(obj: Any) -> dict[str, Any]:
    """``{"data": {...}, "metadata": {...}}`` for ``obj``, as IPython would format it."""
    global _formatter
    try:
        if _formatter is None:
            from IPython.core.formatters import DisplayFormatter
            _formatter = DisplayFormatter()
        data, md = _formatter.format(obj)
    except Exception as e:  # a broken _repr_*_ must not lose the cell
        data, md = {"text/plain": f"{object.__repr__(obj)} (display failed: {e})"}, {}
    if not data:
        data = {"text/plain": repr(obj)}
    clean = {k: (base64.b64encode(v).decode() if isinstance(v, bytes) else v) for k, v in data.items()}
    return {"data": clean, "metadata": md or {}}


def display(*objs: Any, raw: bool = False, **kwargs: Any) -> None:
    """``display()`` inside a remote cell: the rich output reaches the notebook cell.

    Outside a cell (a plain task calling a notebook function) it prints the plain text.
    """
    nonce = _running_nonce
    for obj in objs:
        bundle = {"data": obj, "metadata": kwargs.get("metadata") or {}} if raw else mimebundle(obj)
        out = sys.stdout
        if nonce is None:
            data = bundle.get("data") or {}
            print(data.get("text/plain", "") if isinstance(data, dict) else data, file=out)
            continue
        text = base64.b64encode(json.dumps(bundle, default=str).encode()).decode()
        out.flush()
        out.write(f"{display_prefix(nonce)}{text}\n")
        out.flush()


def decode_display(line: str, nonce: str) -> dict[str, Any] | None:
    """The bundle of a display line of the run with ``nonce``; None for any other line."""
    prefix = display_prefix(nonce)
    if not line.startswith(prefix):
        return None
    try:
        bundle = json.loads(base64.b64decode(line[len(prefix):]))
    except (ValueError, TypeError):
        return None
    return bundle if isinstance(bundle, dict) else None


class _RemoteShell:
    """``get_ipython()`` inside a remote cell: ``!cmd`` works, other magics explain why not."""

    def system(self, cmd: str) -> int:
        import subprocess
        p = subprocess.run(cmd, shell=True, capture_output=True, text=True)
        if p.stdout:
            sys.stdout.write(p.stdout)
        if p.stderr:
            sys.stderr.write(p.stderr)
        return p.returncode

    def getoutput(self, cmd: str, split: bool = True) -> Any:
        import subprocess
        text = subprocess.run(cmd, shell=True, capture_output=True, text=True).stdout
        return text.splitlines() if split else text

    def run_line_magic(self, name: str, line: str, _stack_depth: int = 1) -> Any:
        raise RuntimeError(f"%{name} is a notebook magic; it cannot run inside a remote cell")

    def run_cell_magic(self, name: str, line: str, cell: str) -> Any:
        raise RuntimeError(f"%%{name} is a notebook magic; it cannot run inside a remote cell")

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"get_ipython().{name} is not available inside a remote cell")
