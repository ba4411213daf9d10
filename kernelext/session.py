"""``%%remote --session NAME``: a persistent remote namespace, hosted by an actor.

Owner: ``Sessions`` (one per ``RemoteCells``) keeps the handle of each session's actor
(``SessionHost``, named ``lumos-session:NAME``) and the names each session defines.
Variables, imports and GPU memory stay in the actor's process across cells; only the
last expression's value (or its display) comes back, and ``--pull``/``--push`` move
names explicitly. Names a cell reads that the session never defined are shipped from
the notebook, like for a plain ``%%remote`` cell.

The actor is placed by the first cell's resource options (``--num-gpus 1`` keeps that
GPU for the session's lifetime); ``%lumos close NAME`` kills it.
"""

from __future__ import annotations

import builtins
import os
import sys
import time
import types
from dataclasses import dataclass, field
from typing import Any

import lumos
from lumos.kernelext.cell import (UNSET, CellAnalysis, CellMeta, CellSpec, ModuleByName, NotShipped,
                                  _pickle_failure, _picklable, _Unset, run_cell)

ACTOR_PREFIX = "lumos-session:"


class SessionHost:
    """The actor behind a session: one namespace, cells run one at a time."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.ns: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
        self.cells = 0

    def run(self, spec: CellSpec, inline: dict[str, Any], *refs: Any) -> tuple[CellMeta, dict[str, Any]]:
        self.cells += 1
        meta = run_cell(spec, inline, *refs, namespace=self.ns)
        return meta, self.pull(spec.pull)

    def pull(self, names: list[str]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in names:
            if name not in self.ns:
                out[name] = UNSET
                continue
            v = self.ns[name]
            if isinstance(v, types.ModuleType):
                out[name] = ModuleByName(v.__name__)
            elif _picklable(v):
                out[name] = v
            else:
                out[name] = NotShipped(name, type(v).__name__, _pickle_failure(v))
        return out

    def info(self) -> dict[str, Any]:
        ctx = lumos.get_runtime_context()
        return {"name": self.name, "pid": os.getpid(), "node_id": ctx.get_node_id(),
                "gpu_ids": lumos.get_gpu_ids(), "cells": self.cells,
                "names": sorted(k for k in self.ns if not k.startswith("__") and k not in ("display", "get_ipython"))}


@dataclass
class SessionInfo:
    name: str
    handle: Any
    options: dict[str, Any]
    created: float
    #: names the session defined itself (or received by --push): not shipped again
    defined: set[str] = field(default_factory=set)
    names: list[str] = field(default_factory=list)
    cells: int = 0
    node_id: str = ""


class Sessions:
    def __init__(self, cells: Any) -> None:
        self._cells = cells
        self.by_name: dict[str, SessionInfo] = {}
        self._actor_class: Any = None

    # ------------------------------------------------------------------ lifecycle

    def _create(self, name: str, task_options: dict[str, Any]) -> SessionInfo:
        if self._actor_class is None:
            self._actor_class = lumos.remote(SessionHost)
        opts = {k: v for k, v in task_options.items()
                if k in ("num_cpus", "num_gpus", "memory", "resources", "scheduling_strategy")}
        # Without --num-cpus a session holds no CPU while idle (Ray's actor default), so
        # several sessions fit on a small machine.
        handle = self._actor_class.options(name=ACTOR_PREFIX + name, max_concurrency=1, **opts).remote(name)
        info = SessionInfo(name, handle, opts, time.time())
        self.by_name[name] = info
        return info

    def get_or_create(self, name: str, task_options: dict[str, Any], explicit: bool) -> SessionInfo:
        if not name or not name.replace("-", "_").replace(".", "_").isidentifier():
            raise ValueError(f"--session {name!r}: use a name made of letters, digits, '-', '_' or '.'")
        info = self.by_name.get(name)
        if info is None:
            return self._create(name, task_options)
        if explicit:
            sys.stderr.write(f"lumos: session {name!r} already exists; resource options apply only when a "
                             f"session starts (close it with %lumos close {name} to change them)\n")
        return info

    def close(self, name: str) -> None:
        info = self.by_name.pop(name, None)
        if info is None:
            known = ", ".join(sorted(self.by_name)) or "none"
            raise ValueError(f"no session named {name!r} (sessions: {known})")
        try:
            lumos.kill(info.handle)
        except lumos.exceptions.LumosError:
            pass

    def close_all(self) -> None:
        for name in list(self.by_name):
            try:
                self.close(name)
            except (ValueError, RuntimeError):
                pass

    def rows(self) -> list[dict[str, Any]]:
        out = []
        for info in self.by_name.values():
            state, node, names = "alive", info.node_id, info.names
            try:
                live = lumos.get(info.handle.info.remote(), timeout=5)
                node, names = live["node_id"], live["names"]
                info.node_id = node
            except lumos.exceptions.GetTimeoutError:
                state = "busy"
            except lumos.exceptions.LumosError as e:
                state = f"dead ({type(e).__name__})"
            out.append({"name": info.name, "state": state, "node": node or "?", "resources": info.options,
                        "cells": info.cells, "names": names})
        return out

    # ------------------------------------------------------------------ cells

    def run(self, args: Any, source: str, display_source: str, filename: str, analysis: CellAnalysis,
            title: str) -> Any:
        from lumos.kernelext.output import ROUTER, CellSink
        from lumos.kernelext.remote import _Run, cell_error
        cells = self._cells
        if args.map:
            raise ValueError("--map cannot be combined with --session (a session runs one cell at a time)")
        if getattr(args, "out", None) is not None:
            raise ValueError("--out/--no-out do not apply to a --session cell: its names stay in the "
                             "session; bring some back with --pull NAME")
        if args.async_ and args.pull:
            raise ValueError("--pull needs the cell to finish; drop --async or pull in a later cell")
        explicit = any(getattr(args, k) is not None for k in ("num_cpus", "num_gpus", "memory", "resources",
                                                                 "node", "placement_group"))
        session = self.get_or_create(args.session, cells.options(args, title), explicit)
        ns = cells.shell.user_ns
        push = list(args.push or [])
        missing = [n for n in push if n not in ns]
        if missing:
            raise NameError(f"--push {' '.join(missing)}: not defined in the notebook")
        reads = [n for n in cells.readable(analysis.reads) if n not in session.defined and n not in push]
        inline, ref_names, refs = cells.ship(reads + push)
        spec = CellSpec(source, display_source, filename, 1, [], analysis.last_expr, analysis.quiet,
                        ref_names, pull=list(args.pull or []))
        ref = session.handle.run.remote(spec, inline, *refs)
        sink = CellSink(spec.nonce)
        ROUTER.register(ref.task_id().binary(), sink)
        session.cells += 1
        session.defined |= set(analysis.assigns) | set(push)
        run = _Run(spec, [[ref]], sink, None, f"{title} in session {session.name}", session=session.name)
        from lumos.kernelext.remote import RunRecord
        cells.last = RunRecord({"session": session.name, **session.options}, reads + push, analysis.assigns,
                               [ref], cells.shipper.last)
        if args.async_:
            return cells._finish_async(run, args.timeout, ns)
        cells._wait_done(run, args.timeout)
        try:
            meta, pulled = lumos.get(ref, timeout=60)
        except lumos.exceptions.LumosError as e:
            run.sink.drain(time.monotonic() + 1.0, lambda: -1 in run.sink.ended)
            run.sink.go_late(None, ROUTER.print_fallback)
            if isinstance(e, (lumos.exceptions.ActorDiedError, lumos.exceptions.ActorUnschedulableError)):
                sys.stderr.write(f"lumos: session {session.name!r} is dead: its worker is gone, and its "
                                 f"variables with it; %lumos close {session.name} lets the next "
                                 f"--session {session.name} cell start it anew\n")
            raise cell_error(e, filename) from None
        if meta.wrote_output:
            from lumos.kernelext.remote import OUTPUT_GRACE_S
            run.sink.drain(time.monotonic() + OUTPUT_GRACE_S, lambda: -1 in run.sink.ended)
        run.sink.go_late(None, ROUTER.print_fallback)
        if meta.namespace is not None:
            session.names = meta.namespace
        cells._bind(ns, list(pulled), [pulled[n] if not isinstance(pulled[n], _Unset) else _missing(n, session)
                                       for n in pulled])
        if meta.bundle is not None:
            from IPython.display import display
            display(meta.bundle["data"], metadata=meta.bundle.get("metadata") or None, raw=True)
            return None
        return meta.value if meta.has_value else None


def _missing(name: str, session: SessionInfo) -> Any:
    sys.stderr.write(f"lumos: --pull {name}: session {session.name!r} has no variable {name!r}\n")
    return UNSET
