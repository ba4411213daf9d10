"""The front ends stand on public surfaces, and those work from inside a running event loop.

``kernelext/`` and ``dashboard/`` may import only lumos's public API, ``lumos.state``
and ``lumos.util`` (never ``lumos._private``, which may change any day); a notebook
cell and a Jupyter server run an asyncio loop in the caller's thread, so ``init``,
``Cluster``, the state API and the CLI must work there too.
"""

from __future__ import annotations

import ast
import asyncio
import io
import os
import contextlib
from pathlib import Path
from typing import Any, Iterator

import pytest

import lumos
from tests.conftest import TEST_CONFIG, check_no_leaks

ROOT = Path(__file__).resolve().parent.parent
#: Folder -> the package it is installed as.
FRONT_ENDS = {"kernelext": "lumos.kernelext", "dashboard": "lumos.dashboard"}


def _module_of(path: Path, folder: str) -> str:
    rel = path.relative_to(ROOT / folder).with_suffix("")
    parts = [FRONT_ENDS[folder], *rel.parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(module: str, is_package: bool, level: int, name: str | None) -> str:
    """The absolute name a relative ``from ... import`` in ``module`` refers to."""
    if level == 0:
        return name or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def private_imports(path: Path, module: str) -> Iterator[str]:
    """``file:line: what`` for each import of ``lumos._private`` in ``path`` (the source
    of ``module``), at any depth (functions, methods, conditional blocks), relative or
    through ``importlib``, in line order."""
    tree = ast.parse(path.read_text(), str(path))
    nodes = sorted((n for n in ast.walk(tree) if hasattr(n, "lineno")), key=lambda n: (n.lineno, n.col_offset))

    def private(name: str) -> bool:
        return name == "lumos._private" or name.startswith("lumos._private.")

    for node in nodes:
        where = f"{path.name}:{node.lineno}"
        if isinstance(node, ast.Import):
            for alias in node.names:
                if private(alias.name):
                    yield f"{where}: import {alias.name}"
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, path.name == "__init__.py", node.level, node.module)
            for alias in node.names:
                if private(target) or private(f"{target}.{alias.name}"):
                    yield f"{where}: from {'.' * node.level}{node.module or ''} import {alias.name}"
        elif isinstance(node, ast.Call):
            func = node.func
            fname = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if fname in ("import_module", "__import__") and node.args:
                arg = node.args[0]
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and private(arg.value):
                    yield f"{where}: {fname}({arg.value!r})"
        elif isinstance(node, ast.Attribute) and node.attr == "_private":
            if isinstance(node.value, ast.Name) and node.value.id == "lumos":
                yield f"{where}: lumos._private"


def front_end_files() -> list[tuple[Path, str]]:
    out = []
    for folder in FRONT_ENDS:
        out.extend((p, folder) for p in sorted((ROOT / folder).rglob("*.py")))
    return out


def test_front_ends_import_nothing_from_lumos_private() -> None:
    files = front_end_files()
    assert len(files) > 15, "the front ends' sources were not found"
    found = [f"{folder}/{hit}" for path, folder in files for hit in private_imports(path, _module_of(path, folder))]
    assert not found, ("kernelext/ and dashboard/ must use lumos's public API, lumos.state and lumos.util "
                       "only; these import lumos._private:\n" + "\n".join(found))


def test_the_import_walk_sees_nested_relative_and_dynamic_imports(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import lumos\n"
        "def f():\n"
        "    if True:\n"
        "        from lumos._private import worker_context\n"
        "    from ... import _private\n"
        "    from ..._private.gcs import client\n"
        "    import importlib\n"
        "    importlib.import_module('lumos._private.node')\n"
        "    return lumos._private\n")
    hits = list(private_imports(probe, "lumos.dashboard.components.probe"))
    assert [h.split(": ", 1)[1] for h in hits] == [
        "from lumos._private import worker_context", "from ... import _private",
        "from ..._private.gcs import client", "import_module('lumos._private.node')", "lumos._private"], hits


# ------------------------------------------------------------------ inside a running loop


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_init_cluster_state_api_and_cli_work_inside_a_running_event_loop() -> None:
    """Everything a notebook cell does, from a coroutine run by ``asyncio.run``."""
    from lumos import cli
    from lumos.testing import Cluster

    seen: list[Any] = []

    async def main() -> None:
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "_system_config": TEST_CONFIG})
        try:
            lumos.init(address=cluster.address, _token=cluster.token)
            asyncio.get_running_loop()  # still in the coroutine's loop

            records: list[Any] = []
            printing = lumos.util.output.set_handler(records.extend)

            @lumos.remote
            def square(x: int) -> int:
                print("squaring", x)
                return x * x

            assert lumos.get(square.remote(7), timeout=60) == 49
            deadline = asyncio.get_running_loop().time() + 30
            while not any("squaring 7" in r[5] for r in records):  # worker output reaches the hook
                assert asyncio.get_running_loop().time() < deadline, f"no output record: {records}"
                await asyncio.sleep(0.05)
            assert lumos.util.output.set_handler(printing) == records.extend
            await asyncio.sleep(0)  # the loop still runs
            assert [n["state"] for n in lumos.state.list_nodes()] == ["ALIVE"]
            assert any(t["name"].endswith("square") for t in lumos.state.list_tasks())
            assert lumos.state.list_workers() and lumos.state.list_jobs()
            assert lumos.state.list_actors() == []
            assert isinstance(lumos.state.list_objects(), list)
            assert lumos.util.state.summarize_tasks()

            # The async client on this very loop: snapshots, the task log, a subscription.
            client = lumos.state.StateClient.for_current_cluster(name="test->gcs")
            client.subscribe("nodes", seen.append)
            await client.connect(timeout_s=30)
            try:
                nodes = await client.nodes()
                assert [n.state for n in nodes] == ["ALIVE"]
                assert (await client.node_resources())[0].node_id == nodes[0].node_id
                assert await client.jobs() and await client.workers()
                assert await client.actors() == [] and await client.placement_groups() == []
                updates = await client.task_updates(0)
                names = [row[lumos.state.TASK_ROW_FIELDS.index("name")] for row in updates.rows]
                assert any(n.endswith("square") for n in names) and not updates.more
                with pytest.raises(ValueError, match="channels: nodes"):
                    client.subscribe("nodez", seen.append)
                counts: list[Any] = []
                client.subscribe("task_events", counts.append)
                await client.nodes()  # the subscription is in place once a later call is answered
                assert lumos.get(square.remote(3), timeout=60) == 9  # its events are published
                cluster.add_node(num_cpus=1)  # publishes the new node on "nodes"
                deadline = asyncio.get_running_loop().time() + 30
                while not (counts and any(isinstance(n, lumos.state.NodeInfo) and n.state == "ALIVE"
                                          for n in seen)):
                    assert asyncio.get_running_loop().time() < deadline, f"no changes arrived: {counts} {seen}"
                    await asyncio.sleep(0.05)
                assert all(isinstance(c, int) and c > 0 for c in counts), counts
            finally:
                client.close()

            # The CLI's functions (what `lumos status` runs).
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                rc = cli.main(["status", "--address", cluster.address,
                               "--token-file", os.path.join(cluster.session_dir, "token")])
            assert rc == 0 and "2 node(s) alive" in out.getvalue(), out.getvalue()
        finally:
            lumos.shutdown()
            cluster.shutdown()

    asyncio.run(main())
    check_no_leaks(None)


@pytest.mark.timeout(60)
def test_output_hook_needs_init_and_a_callable() -> None:
    assert lumos.util.output.get_handler() is None
    with pytest.raises(RuntimeError, match="lumos.init"):
        lumos.util.output.set_handler(print)
    with pytest.raises(TypeError, match="callable"):
        lumos.util.output.set_handler("print")  # type: ignore[arg-type]
