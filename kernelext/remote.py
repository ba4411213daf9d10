"""Running a ``%%remote`` cell: options, shipping, submission, output, results.

Owner of the notebook-side state of the extension (``RemoteCells``, one per shell):
the ``Shipper`` (large values already put), the defaults set by the GPU panel, and the
sessions. ``magics.py`` parses flags and calls ``RemoteCells.run``.

A synchronous cell: submit ``run_cell`` as a task, let the main thread write the
task's output into the cell while it waits (Ctrl-C cancels the task), then bind the
assigned names and return the last expression's value (it becomes ``Out[n]``). An
``--async`` cell binds each assigned name to its ``ObjectRef`` and returns at once; a
``LiveDisplay`` in the cell shows progress, output and the outcome.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any

import lumos
from lumos.kernelext import cell as cellmod
from lumos.kernelext.cell import CellMeta, CellSpec, ModuleByName, NotShipped, Shipper, _Deleted, _Unset
from lumos.kernelext.display import LiveDisplay, flush_live_displays
from lumos.kernelext.output import ROUTER, CellSink
from lumos.kernelext.tracebacks import CellInterrupted, CellSyntaxError

logger = logging.getLogger(__name__)

#: How long a finished cell waits for the rest of its output (it is already on its way).
OUTPUT_GRACE_S = 3.0

#: Names IPython puts in the user namespace that are never shipped.
_IPYTHON_NAMES = frozenset(("In", "Out", "get_ipython", "exit", "quit", "_", "__", "___", "_i", "_ii",
                            "_iii", "_oh", "_ih", "_dh", "display", "__builtins__", "__builtin__",
                            "__name__", "__doc__", "__loader__", "__spec__", "__package__"))
_HISTORY_NAME = re.compile(r"^_i?\d+$")

_runner: Any = None


def _remote_runner() -> Any:
    global _runner
    if _runner is None:
        _runner = lumos.remote(cellmod.run_cell)
    return _runner


def parse_bytes(text: str) -> int:
    """``"2GB"``, ``"512MiB"``, ``"1e9"`` -> bytes."""
    m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([kKmMgGtT]?)(i?)[bB]?\s*", text)
    if not m:
        raise ValueError(f"--memory {text!r}: expected bytes like 2GB, 512MiB or 1e9")
    base = 1024 if m.group(3) else 1000
    power = " KMGT".index(m.group(2).upper() or " ")
    try:
        number = float(m.group(1))
    except ValueError:
        number = -1.0
    if not number >= 0 or number == float("inf"):
        raise ValueError(f"--memory {text!r}: expected bytes like 2GB, 512MiB or 1e9")
    return int(number * base ** power)


@dataclass
class RunRecord:
    """What the last cell did (for tests, the benchmark and ``%lumos``)."""

    options: dict[str, Any]
    shipped: list[str]
    assigns: list[str]
    refs: list[Any]
    stats: cellmod.ShipStats
    live: LiveDisplay | None = None


@dataclass
class Defaults:
    """Resource defaults for the next cells (set by the GPU panel or by hand)."""

    num_gpus: float | None = None
    node: str | None = None
    strategy: str | None = None
    placement_group: Any = None
    bundle_index: int = -1


@dataclass
class _Run:
    """One submission of a cell (one task, or one per element for ``--map``)."""

    spec: CellSpec
    refs: list[list[Any]]          # per task: [meta_ref, value_ref...]
    sink: CellSink
    map_name: str | None
    title: str
    futures: list[Any] = field(default_factory=list)
    #: the --session the cell runs in (its actor's running call cannot be interrupted)
    session: str | None = None
    #: the names were asked for with --out (one the cell did not set is reported)
    named_out: bool = False


class RemoteCells:
    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self.shipper = Shipper()
        self.defaults = Defaults()
        self.last: RunRecord | None = None
        self._runs = 0
        self._counts_used: set[int] = set()
        from lumos.kernelext.session import Sessions
        self.sessions = Sessions(self)

    # ================================================================== entry

    def run(self, args: Any, line: str, body: str) -> Any:
        try:
            return self._run(args, line, body)
        finally:
            # updates of earlier --async cells reach the frontend while a cell is running
            flush_live_displays()

    def _run(self, args: Any, line: str, body: str) -> Any:
        if not lumos.is_initialized():
            self._auto_init()
        ROUTER.install()
        n = self.cell_number()
        self._runs += 1
        # unique per run (cells run without history share a count), so remote linecache
        # entries never mix two versions of a cell
        filename = f"<cell In[{n}]>" if n not in self._counts_used else f"<cell In[{n}]#{self._runs}>"
        self._counts_used.add(n)
        source = self.shell.transform_cell(body) if body.strip() else body
        try:
            analysis = cellmod.analyze(source)
        except SyntaxError as e:
            raise CellSyntaxError(e.msg, (filename, (e.lineno or 0) + 1, e.offset, e.text)) from None
        title = args.name or f"cell In[{n}]"
        display_source = f"%%remote {line}\n{body}"
        map_name, map_values = self._map_values(args)
        if args.session:
            return self.sessions.run(args, source, display_source, filename, analysis, title)
        if args.pull or args.push:
            raise ValueError("--pull and --push move names to and from a --session; add --session NAME")
        options = self.options(args, title)
        ns = self.shell.user_ns
        reads = self.readable(analysis.reads, exclude={map_name} if map_name else None)
        inline, ref_names, refs = self.ship(reads)
        assigns = outputs(args, analysis)
        spec = CellSpec(source, display_source, filename, 1, assigns, analysis.last_expr,
                        analysis.quiet, ref_names)
        runner = _remote_runner().options(num_returns=1 + len(assigns), **options)
        sink = CellSink(spec.nonce)
        run_refs: list[list[Any]] = []

        def submit(item_spec: CellSpec, item_inline: dict[str, Any], label: str) -> None:
            out = runner.remote(item_spec, item_inline, *refs)
            task_refs = out if isinstance(out, list) else [out]
            tid = task_refs[0].task_id().binary()
            if label:
                sink.labels[tid] = label  # (before its route: a line must not arrive unlabelled)
            ROUTER.register(tid, sink)
            run_refs.append(task_refs)

        if map_name is None:
            # A fast task can print before its id is registered: its output is routed by
            # the task's name meanwhile. (Not for --map: every element has that name, and
            # each line needs its element's label.)
            ROUTER.expect(options["name"], sink)
            try:
                submit(spec, inline, "")
            finally:
                ROUTER.settled(options["name"])
        else:
            for i, element in enumerate(map_values):
                item_inline = dict(inline)
                item_inline[map_name] = element
                submit(replace(spec, map_index=i), item_inline, f"[{i}] ")
        run = _Run(spec, run_refs, sink, map_name, title, named_out=getattr(args, "out", None) is not None)
        self.last = RunRecord(options, reads, assigns, [r for rs in run_refs for r in rs],
                              self.shipper.last)
        if args.async_:
            return self._finish_async(run, args.timeout, ns)
        return self._finish_sync(run, args.timeout, ns)

    def cell_number(self) -> int:
        """The ``In[n]`` of the cell running now, as IPython's own tracebacks name it.

        ``shell.execution_count`` is not it: IPython 9 increments it before the cell runs
        (and only for cells stored in the history). The cell's code object carries the
        file name IPython compiled it under, which its compiler maps to the number.
        """
        names = getattr(getattr(self.shell, "compile", None), "_filename_map", None)
        if isinstance(names, dict):
            frame = sys._getframe(1)
            while frame is not None:
                n = names.get(frame.f_code.co_filename)
                if isinstance(n, int):
                    return n
                frame = frame.f_back
        return int(self.shell.execution_count)

    @staticmethod
    def _auto_init() -> None:
        """The first cell without ``lumos.init()``: a private cluster, said in one line.

        Never after a failed ``init(address=...)``: the user meant that cluster, and cells
        quietly running on a private one instead would be worse than an error.
        """
        from lumos import api
        if api.failed_connect is not None:
            raise ConnectionError(f"lumos is not connected: {api.failed_connect}. Run %lumos init --address "
                                  "ADDRESS again, or %lumos init (no address) for a private cluster")
        lumos.init()
        cpus = lumos.cluster_resources().get("CPU", 0)
        sys.stderr.write(f"lumos: started a private cluster for this kernel ({cpus:g} CPUs); "
                         "%lumos init --address auto joins a running one instead\n")

    # ================================================================== options

    def options(self, args: Any, title: str) -> dict[str, Any]:
        """Task options from the flags, falling back to the panel's defaults."""
        from lumos.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        d = self.defaults
        opts: dict[str, Any] = {"name": title}
        if args.num_cpus is not None:
            opts["num_cpus"] = args.num_cpus
        num_gpus = args.num_gpus if args.num_gpus is not None else d.num_gpus
        if num_gpus:
            opts["num_gpus"] = num_gpus
        if args.memory is not None:
            opts["memory"] = parse_bytes(args.memory)
        if args.resources is not None:
            try:
                res = json.loads(args.resources)
            except ValueError as e:
                raise ValueError(f"--resources must be a JSON object like '{{\"TPU\": 1}}': {e}") from None
            if not isinstance(res, dict):
                raise ValueError("--resources must be a JSON object like '{\"TPU\": 1}'")
            opts["resources"] = res
        if args.retries is not None:
            opts["max_retries"] = args.retries
        if args.bundle is not None and not args.placement_group:
            raise ValueError("--bundle needs --placement-group NAME")
        if args.node and args.placement_group:
            raise ValueError("--node and --placement-group cannot be combined; pick one")
        strategy: Any = None
        if args.placement_group:
            strategy = self._pg_strategy(_placement_group_by_name(args.placement_group),
                                         -1 if args.bundle is None else args.bundle)
        elif args.node:
            strategy = NodeAffinitySchedulingStrategy(resolve_node(args.node), soft=False)
        elif args.strategy:
            strategy = args.strategy.upper()
            if strategy not in ("SPREAD", "DEFAULT"):
                raise ValueError(f"--strategy {args.strategy!r}: use SPREAD or DEFAULT")
        elif d.placement_group is not None:
            strategy = self._pg_strategy(d.placement_group, d.bundle_index)
        elif d.node:
            strategy = NodeAffinitySchedulingStrategy(resolve_node(d.node), soft=False)
        elif d.strategy:
            strategy = d.strategy
        if strategy is not None and strategy != "DEFAULT":
            opts["scheduling_strategy"] = strategy
        return opts

    @staticmethod
    def _pg_strategy(pg: Any, bundle: int) -> Any:
        from lumos.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        return PlacementGroupSchedulingStrategy(pg, bundle)

    def _map_values(self, args: Any) -> tuple[str | None, list[Any]]:
        if not args.map:
            return None, []
        name, sep, expr = args.map.partition("=")
        name = name.strip()
        if not sep or not name.isidentifier() or not expr.strip():
            raise ValueError(f"--map {args.map!r}: expected NAME=ITERABLE, e.g. --map x=range(8)")
        try:
            values = list(eval(expr, self.shell.user_ns))  # noqa: S307 - the user's own expression
        except Exception as e:
            raise ValueError(f"--map {name}={expr}: could not evaluate the iterable: "
                             f"{type(e).__name__}: {e}") from None
        if not values:
            raise ValueError(f"--map {name}={expr}: the iterable is empty")
        return name, values

    # ================================================================== shipping

    def readable(self, names: list[str], exclude: set[str] | None = None) -> list[str]:
        """The names read by a cell that the notebook defines (not IPython's own)."""
        ns = self.shell.user_ns
        hidden = getattr(self.shell, "user_ns_hidden", {})
        out = []
        for name in names:
            if (exclude and name in exclude) or name not in ns or name in _IPYTHON_NAMES or _HISTORY_NAME.match(name):
                continue
            if name in hidden and hidden[name] is ns[name]:
                continue
            out.append(name)
        return out

    def ship(self, names: list[str]) -> tuple[dict[str, Any], list[str], list[Any]]:
        """Inline values and ref arguments for ``names`` (see ``Shipper.ship``)."""
        ns = self.shell.user_ns
        resolve = self.shipper.resolve_refs
        plain: list[str] = []
        list_names: list[str] = []
        list_refs: list[Any] = []
        for name in names:
            value = ns[name]
            if isinstance(value, lumos.ObjectRef):
                gone = lumos.state.ended_session_of(value)
                if gone:  # (shipped, the cell saw a bare ObjectRef, not its value)
                    raise ValueError(f"the cell reads {name}, an ObjectRef whose value is gone: {gone}; "
                                     f"run the cell that made {name} again")
            if (isinstance(value, list) and value and resolve
                    and all(isinstance(v, lumos.ObjectRef) and v.binary() in resolve for v in value)):
                # an --async --map result: each element is resolved on the cluster
                list_names += [f"{name}\x00{i}" for i in range(len(value))]
                list_refs += value
            else:
                plain.append(name)
        inline, ref_names, refs = self.shipper.ship(plain, ns)
        return inline, ref_names + list_names, refs + list_refs

    # ================================================================== waiting

    def _wait_done(self, run: _Run, timeout: float | None) -> None:
        metas = [rs[0] for rs in run.refs]
        futures = [r.future() for r in metas]
        run.futures = futures
        for f in futures:
            f.add_done_callback(lambda _f: run.sink.done())
        deadline = time.monotonic() + (timeout if timeout is not None else 10 ** 9)
        try:
            run.sink.drain(deadline, lambda: all(f.done() for f in futures))
        except KeyboardInterrupt:
            for r in metas:
                try:
                    lumos.cancel(r)
                except Exception as e:  # the task may have finished meanwhile
                    logger.debug("cancel after Ctrl-C: %s", e)
            run.sink.go_late(None, None)  # a cancelled cell's last lines are dropped
            if run.session is not None:
                raise CellInterrupted(
                    f"{run.title} interrupted; if it had started it runs to its end in the session "
                    f"(%lumos close {run.session} ends the session and the cell)") from None
            what = "its remote task was" if len(metas) == 1 else f"its {len(metas)} remote tasks were"
            raise CellInterrupted(f"{run.title} interrupted; {what} cancelled") from None
        if not all(f.done() for f in futures):
            for r in metas:
                try:
                    lumos.cancel(r, force=True)
                except Exception as e:
                    logger.debug("cancel after timeout: %s", e)
            raise lumos.exceptions.GetTimeoutError(
                f"{run.title} did not finish within --timeout {timeout:g} s; its task was cancelled")

    def _finish_sync(self, run: _Run, timeout: float | None, ns: dict[str, Any]) -> Any:
        self._wait_done(run, timeout)
        error: BaseException | None = None
        metas: list[CellMeta] = []
        for rs in run.refs:
            try:
                metas.append(lumos.get(rs[0], timeout=60))
            except lumos.exceptions.TaskError as e:
                error = error or e
                metas.append(CellMeta(wrote_output=True))
            except lumos.exceptions.LumosError as e:
                error = error or e
                metas.append(CellMeta())
        wanted = {i if run.map_name else -1 for i, m in enumerate(metas) if m.wrote_output}
        run.sink.drain(time.monotonic() + OUTPUT_GRACE_S, lambda: wanted <= run.sink.ended)
        late = None
        if not wanted <= run.sink.ended:
            late = LiveDisplay(f"{run.title} (output still arriving)", show_progress=False)
            late.finish("finished")
        run.sink.go_late(late, ROUTER.print_fallback)
        if error is not None:
            raise cell_error(error, run.spec.filename)
        values_per_task = [lumos.get(rs[1:], timeout=60) for rs in run.refs]
        if run.map_name is None:
            self._bind(ns, run.spec.assigns, values_per_task[0], run.named_out)
            meta = metas[0]
            if meta.bundle is not None:
                from IPython.display import display
                display(meta.bundle["data"], metadata=meta.bundle.get("metadata") or None, raw=True)
                return None
            return meta.value if meta.has_value else None
        for j, name in enumerate(run.spec.assigns):
            column = [vals[j] for vals in values_per_task]
            if all(isinstance(v, _Unset) for v in column):
                continue
            ns[name] = [None if isinstance(v, _Unset) else _local_value(name, v) for v in column]
        if any(m.has_value or m.bundle is not None for m in metas):
            return [m.value if m.has_value else m.bundle for m in metas]
        return None

    def _bind(self, ns: dict[str, Any], names: list[str], values: list[Any], named: bool = False) -> None:
        """Bind the names a cell brought back; ``named``: they were asked for by name
        (``--out``), so one the cell did not set is reported rather than passed over."""
        skipped = []
        unset = []
        for name, value in zip(names, values):
            if isinstance(value, _Deleted):
                ns.pop(name, None)
            elif isinstance(value, _Unset):
                if named:
                    unset.append(name)
                continue
            elif isinstance(value, NotShipped):
                skipped.append(f"{name} ({value.type_name}: {value.reason})")
            else:
                try:
                    ns[name] = _local_value(name, value)
                except ImportError as e:
                    skipped.append(f"{name} (module {value.name} is not importable here: {e})")
        if skipped:
            sys.stderr.write("lumos: not brought back to the notebook: " + "; ".join(skipped) + "\n")
        if unset:
            sys.stderr.write("lumos: --out " + ", ".join(unset) + ": the cell did not set "
                             + ("it" if len(unset) == 1 else "them") + "\n")

    def _finish_async(self, run: _Run, timeout: float | None, ns: dict[str, Any]) -> None:
        live = LiveDisplay(run.title, total=len(run.refs))
        run.sink.go_late(live, None)
        assert self.last is not None
        self.last.live = live
        resolve = self.shipper.resolve_refs
        for rs in run.refs:
            for r in rs[1:]:
                resolve.add(r.binary())
        for j, name in enumerate(run.spec.assigns):
            refs = [rs[j + 1] for rs in run.refs]
            ns[name] = refs[0] if run.map_name is None else refs
        metas = [rs[0] for rs in run.refs]
        state = {"left": len(metas), "error": ""}
        lock = threading.Lock()

        def settle(futures: list[Any]) -> None:
            # "finished" once the cell's output is in the display too (it trails the result)
            expected = 0
            for f in futures:
                err = f.exception()
                if isinstance(err, lumos.exceptions.TaskError) or (err is None and f.result().wrote_output):
                    expected += 1
            deadline = time.monotonic() + OUTPUT_GRACE_S
            while len(run.sink.ended) < expected and time.monotonic() < deadline:
                time.sleep(0.02)
            if state["error"]:
                live.finish("failed", error_text=state["error"])
            else:
                names = ", ".join(run.spec.assigns[:8])
                live.finish("finished", f"{names} ready" if names else "")

        futures = [r.future() for r in metas]

        def one_done(fut: Any) -> None:
            err = fut.exception()
            live.task_done(err is None)
            with lock:
                state["left"] -= 1
                if err is not None and not state["error"]:
                    e = cell_error(err, run.spec.filename)
                    render = getattr(e, "_render_traceback_", None)
                    state["error"] = "\n".join(render()) if render else f"{type(e).__name__}: {e}"
                last = state["left"] == 0
            if last:
                threading.Thread(target=settle, args=(futures,), name="lumos-cell-settle", daemon=True).start()

        for f in futures:
            f.add_done_callback(one_done)
        if timeout is not None:
            def expire() -> None:
                if state["left"]:
                    for r in metas:
                        try:
                            lumos.cancel(r, force=True)
                        except Exception as e:
                            logger.debug("cancel after timeout: %s", e)
            t = threading.Timer(timeout, expire)
            t.daemon = True
            t.start()
        return None


def outputs(args: Any, analysis: cellmod.CellAnalysis) -> list[str]:
    """The names a cell brings back: ``--out``/``--no-out``, else what it assigns (an
    ``--async`` cell: only names it gives a value, since each becomes an ObjectRef)."""
    if getattr(args, "out", None) is not None:
        return list(args.out)
    return list(analysis.values) if args.async_ else list(analysis.assigns)


def _local_value(name: str, value: Any) -> Any:
    if isinstance(value, ModuleByName):
        return value.load()
    return value


def cell_error(err: BaseException, filename: str) -> BaseException:
    """The error to raise in the cell: a task error keeps only the cell's frames."""
    if isinstance(err, lumos.exceptions.TaskError):
        text = err.traceback_str
        err.traceback_str = _clean_traceback(text, filename)
    return err


def _clean_traceback(text: str, filename: str) -> str:
    """Drop frames above the cell (the runner) and show the cell file IPython's way."""
    lines = text.splitlines(True)
    out: list[str] = []
    skipping = False
    for line in lines:
        if line.startswith("  File ") and "kernelext" in line and "cell.py" in line:
            skipping = True
            continue
        if skipping and line.startswith("    "):
            continue
        skipping = False
        m = _CELL_FRAME.match(line)
        if m:
            line = f"  Cell {m.group(1)}, line {m.group(2)}{m.group(3) or ''}\n"
        out.append(line)
    return "".join(out)


_CELL_FRAME = re.compile(r'^  File "<cell (In\[\d+\])(?:#\d+)?>", line (\d+)(, in (?!<module>).*)?(?:, in <module>)?$')


def resolve_node(text: str) -> str:
    """A node id (hex, or a unique prefix of one), IP address or host name -> node id hex."""
    alive = [n for n in lumos.nodes() if n["Alive"]]
    t = text.strip().lower()
    exact = [n for n in alive if n["NodeID"] == t]
    if exact:
        return t
    prefix = [n for n in alive if len(t) >= 4 and n["NodeID"].startswith(t)]
    by_addr = [n for n in alive if t in (n["NodeManagerAddress"].lower(), str(n["NodeManagerHostname"]).lower())]
    for group in (prefix, by_addr):
        if len(group) == 1:
            return str(group[0]["NodeID"])
        if len(group) > 1:
            ids = ", ".join(n["NodeID"][:12] for n in group)
            raise ValueError(f"--node {text!r} matches several nodes ({ids}); give a node id")
    choices = ", ".join(f"{n['NodeID'][:12]} ({n['NodeManagerAddress']})" for n in alive)
    raise ValueError(f"--node {text!r}: no alive node has that id, address or host name; nodes: {choices}")


def _placement_group_by_name(name: str) -> Any:
    try:
        return lumos.util.get_placement_group(name)
    except ValueError:
        raise
    except Exception as e:
        raise ValueError(f"--placement-group {name!r}: {e}") from None

