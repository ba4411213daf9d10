"""The ``%lumos`` line magic and the ``%%remote`` cell magic: flag parsing only.

The work is in ``remote.py`` (cells), ``session.py`` (sessions), ``widgets.py`` (the
GPU panel) and ``display.py`` (rich displays).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
from typing import Any, Iterator

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

import lumos
from lumos.kernelext import tracebacks
from lumos.kernelext.remote import RemoteCells

_LUMOS_HELP = """%lumos COMMAND

  init [--address A] [--num-cpus N] [--num-gpus N] [--resources JSON]
                      start a local cluster, or join one at A
  init --address lumos://HOST:PORT [--token-file PATH]
                      client mode: drive a remote cluster from a machine with no lumos node
  status              nodes, resources in use / total, object store, dashboard link
  shutdown            close the sessions and disconnect (stops a local cluster)
  gpus                the GPU placement panel (defaults for the next %%remote cells)
  sessions            the --session namespaces of this notebook
  close NAME          end a session (its actor and the GPUs it holds)
  dashboard [PAGE]    embed a live dashboard page (status, tasks, graph, lineage, actors, gpus)
  graph [REF]         the live task graph, or the lineage of the ObjectRef bound to REF
"""


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def _unquote(value: Any) -> Any:
    """IPython splits magic lines without removing quotes: '{"a": 1}' arrives quoted."""
    if isinstance(value, str) and len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


@magics_class
class LumosMagics(Magics):
    def __init__(self, shell: Any) -> None:
        super().__init__(shell)
        self.cells = RemoteCells(shell)
        self.panel: Any = None

    # ================================================================== %%remote

    @magic_arguments()
    @argument("--async", dest="async_", action="store_true",
              help="return at once: names the cell assigns a value become ObjectRefs (not its imports, "
                   "loop variables or defs); a live display shows progress")
    @argument("--out", metavar="A,B", help="bring back only these names (default: what the cell assigns)")
    @argument("--no-out", dest="no_out", action="store_true", help="bring back no names")
    @argument("--map", nargs="+", metavar="NAME=ITERABLE",
              help="run the cell once per element, in parallel (e.g. --map x=range(8))")
    @argument("--session", metavar="NAME", help="run in a persistent remote namespace (an actor)")
    @argument("--pull", nargs="+", metavar="VAR", help="with --session: bring these names back")
    @argument("--push", nargs="+", metavar="VAR", help="with --session: send these names first")
    @argument("--num-cpus", type=_float, metavar="N",
              help="CPUs reserved (default 1); numpy's BLAS runs one thread per whole CPU")
    @argument("--num-gpus", type=_float, metavar="N", help="GPUs reserved; fractions below 1 share a GPU")
    @argument("--memory", metavar="BYTES", help="memory reserved, e.g. 2GB")
    @argument("--resources", metavar="JSON", help="custom resources, e.g. '{\"TPU\": 1}'")
    @argument("--node", metavar="ID|ADDRESS", help="run on this node (id, id prefix, IP or host name)")
    @argument("--strategy", metavar="SPREAD|DEFAULT", help="scheduling strategy")
    @argument("--placement-group", metavar="NAME", help="run in this named placement group")
    @argument("--bundle", type=int, metavar="I", help="bundle index in --placement-group")
    @argument("--retries", type=int, metavar="N", help="retries if the worker dies (max_retries)")
    @argument("--timeout", type=_float, metavar="S", help="cancel the cell after S seconds")
    @argument("--name", metavar="NAME", help="task name (shown in the dashboard)")
    @cell_magic
    def remote(self, line: str, cell: str) -> Any:
        """Run this cell on the lumos cluster.

        Names the cell reads are shipped from the notebook; names it assigns come
        back; the last expression is displayed; output streams into the cell.
        """
        if _asks_for_help(line):
            # (magic_arguments' parser has no -h: "unrecognized arguments: -h" was the answer)
            print(_cell_magic_help(self.remote.parser.format_help()))  # type: ignore[attr-defined]
            return None
        try:
            args = parse_argstring(self.remote, line)
        except UsageError as e:
            raise UsageError(f"%%remote: {e} (%%remote -h lists the options)") from None
        if args.map:
            args.map = " ".join(args.map)  # an expression may contain spaces: --map x=[1, 2]
        for key in ("map", "resources", "memory", "node", "strategy", "placement_group", "session", "name"):
            setattr(args, key, _unquote(getattr(args, key)))
        if args.timeout is not None and not 0 < args.timeout < float("inf"):  # (nan, inf too)
            raise UsageError("--timeout must be a positive number of seconds")
        for key in ("session", "name", "node"):  # (an empty one ran the cell as if not given)
            value = getattr(args, key)
            if value is not None and not value.strip():
                raise UsageError(f"--{key} needs a non-empty value")
        args.out = _out_names(_unquote(args.out), args.no_out)
        with _short_errors():
            return self.cells.run(args, line, cell)

    # ================================================================== %lumos

    @line_magic
    def lumos(self, line: str) -> Any:
        """%lumos init|status|shutdown|gpus|sessions|close NAME (see %lumos help)."""
        try:
            words = shlex.split(line)
        except ValueError as e:  # an unclosed quote
            raise UsageError(f"%lumos {line}: {e}") from None
        if not words or words[0] in ("help", "-h", "--help"):
            print(_LUMOS_HELP)
            return None
        cmd, rest = words[0], words[1:]
        handler = getattr(self, f"_cmd_{cmd}", None)
        if handler is None:
            raise UsageError(f"%lumos {cmd}: unknown command; commands: init, status, shutdown, gpus, "
                             "sessions, close, dashboard, graph")
        with _short_errors():
            return handler(rest)

    def _cmd_init(self, rest: list[str]) -> Any:
        p = _Parser(prog="%lumos init")
        p.add_argument("--address")
        p.add_argument("--token-file", help="the cluster token's file (client mode, lumos://HOST:PORT)")
        p.add_argument("--num-cpus", type=_float)
        p.add_argument("--num-gpus", type=_float)
        p.add_argument("--resources")
        a = p.parse(rest)
        kwargs: dict[str, Any] = {}
        if a.num_cpus is not None:
            kwargs["num_cpus"] = a.num_cpus
        if a.num_gpus is not None:
            kwargs["num_gpus"] = a.num_gpus
        if a.resources is not None:
            try:
                kwargs["resources"] = json.loads(a.resources)
            except ValueError as e:
                raise UsageError(f"--resources must be JSON like '{{\"TPU\": 2}}': {e}") from None
        if a.token_file is not None:
            a.token_file = os.path.expanduser(a.token_file)
            if not os.path.isfile(a.token_file):
                raise UsageError(f"--token-file {a.token_file}: no such file (copy the head's token file here)")
            kwargs["_token"] = a.token_file
        if lumos.is_initialized():
            raise UsageError("lumos is already initialized in this kernel; %lumos shutdown first")
        return lumos.init(a.address, **kwargs)

    def _cmd_status(self, rest: list[str]) -> Any:
        _Parser(prog="%lumos status").parse(rest)
        from lumos.kernelext.display import ClusterStatus
        self._require_init()
        from lumos.util.session import current
        ctx = current()
        info = getattr(ctx, "address_info", None) or {}
        return ClusterStatus.current(getattr(ctx, "dashboard_url", "") or "", str(info.get("gcs_address") or ""))

    def _cmd_shutdown(self, rest: list[str]) -> None:
        _Parser(prog="%lumos shutdown").parse(rest)
        from lumos.kernelext.display import flush_live_displays
        flush_live_displays(settle_s=5.0 if lumos.is_initialized() else 0.0)
        if self.panel is not None:
            self.panel.close(keep_view=True)  # a Run All keeps the panel's last view
            self.panel = None
        if lumos.is_initialized():
            self.cells.sessions.close_all()
        self.cells.shipper.forget()
        self.cells.sessions.by_name.clear()
        lumos.shutdown()

    def _cmd_gpus(self, rest: list[str]) -> Any:
        _Parser(prog="%lumos gpus").parse(rest)
        self._require_init()
        from lumos.kernelext.widgets import GpuPanel
        if self.panel is not None:
            self.panel.close()
        self.panel = GpuPanel(self.cells)
        return self.panel

    def _cmd_dashboard(self, rest: list[str]) -> Any:
        p = _Parser(prog="%lumos dashboard")
        p.add_argument("page", nargs="?", default="status",
                       choices=["status", "tasks", "graph", "lineage", "actors", "gpus"])
        p.add_argument("--height", type=int, default=620)
        a = p.parse(rest)
        self._require_init()
        from lumos import dashboard
        return dashboard.show(a.page, height=a.height)

    def _cmd_graph(self, rest: list[str]) -> Any:
        p = _Parser(prog="%lumos graph")
        p.add_argument("ref", nargs="?", default=None, help="a notebook name bound to an ObjectRef")
        a = p.parse(rest)
        self._require_init()
        ref = None
        if a.ref is not None:
            ref = self.shell.user_ns.get(a.ref)
            if not isinstance(ref, lumos.ObjectRef):
                raise UsageError(f"%lumos graph {a.ref}: {a.ref!r} is not a name bound to an ObjectRef")
        from lumos import dashboard
        return dashboard.graph(ref)

    def _cmd_sessions(self, rest: list[str]) -> Any:
        _Parser(prog="%lumos sessions").parse(rest)
        from lumos.kernelext.display import SessionList
        if not lumos.is_initialized():
            return SessionList([])
        return SessionList(self.cells.sessions.rows())

    def _cmd_close(self, rest: list[str]) -> None:
        p = _Parser(prog="%lumos close")
        p.add_argument("name")
        a = p.parse(rest)
        try:
            self.cells.sessions.close(a.name)
        except ValueError as e:
            raise UsageError(str(e)) from None
        print(f"session {a.name!r} closed")

    @staticmethod
    def _require_init() -> None:
        if not lumos.is_initialized():
            raise UsageError("lumos is not initialized; run %lumos init (or lumos.init()) first")


@contextlib.contextmanager
def _short_errors() -> Iterator[None]:
    """Errors lumos raises on purpose in a magic (a bad flag, a value that cannot be sent)
    show as their message, without the frames of the magic machinery."""
    try:
        yield
    except tracebacks.MAGIC_ERRORS as e:
        if tracebacks.deliberate(e):
            tracebacks.message_only(e)
        raise


def _out_names(text: str | None, no_out: bool) -> list[str] | None:
    """``--out a,b`` -> ``["a", "b"]``; ``--no-out`` -> ``[]``; neither -> None (the cell's own)."""
    if text is None:
        return [] if no_out else None
    if no_out:
        raise UsageError("--out and --no-out cannot be combined; pick one")
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if not n.isidentifier()]
    if bad or not names:
        raise UsageError(f"--out {text!r}: expected comma-separated names, e.g. --out model,loss")
    return list(dict.fromkeys(names))


def _asks_for_help(line: str) -> bool:
    """``%%remote -h`` or ``--help`` (as a word of its own, not inside a value)."""
    try:
        words = shlex.split(line)
    except ValueError:  # an unclosed quote: the parser says so
        return False
    return "-h" in words or "--help" in words


def _cell_magic_help(text: str) -> str:
    """magic_arguments' help, written for a line magic's docstring (a ``::`` block,
    ``%remote``), as a cell magic's usage text."""
    lines = text.rstrip().split("\n")
    if lines and lines[0].strip() == "::":
        lines = lines[1:]
        while lines and not lines[0].strip():
            lines.pop(0)
        usage_end = next((i for i, ln in enumerate(lines) if not ln.strip()), len(lines))
        lines[:usage_end] = [ln[2:] if ln.startswith("  ") else ln for ln in lines[:usage_end]]
    if lines and lines[0].startswith("%") and not lines[0].startswith("%%"):
        lines[0] = "%" + lines[0]
    return "\n".join(lines)


class _Parser(argparse.ArgumentParser):
    def __init__(self, prog: str) -> None:
        super().__init__(prog=prog, add_help=False)

    def error(self, message: str) -> Any:
        raise UsageError(f"{self.prog}: {message}")

    def parse(self, words: list[str]) -> argparse.Namespace:
        return self.parse_args(words)
