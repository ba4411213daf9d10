"""Ray's lazy DAG API (lumos.dag): .bind(...) records calls, execute(...) makes them."""

from __future__ import annotations

import pytest

import lumos
from lumos.dag import ClassNode, FunctionNode, InputNode, MultiOutputNode


@lumos.remote
def add(a: int, b: int) -> int:
    return a + b


@lumos.remote
def square(x: int) -> int:
    return x * x


@lumos.remote
def count_calls(path: str) -> int:
    with open(path, "a") as f:
        f.write("x")
    return 1


@lumos.remote(num_cpus=0)
class Counter:
    def __init__(self, start: int) -> None:
        self.n = start

    def inc(self, k: int) -> int:
        self.n += k
        return self.n

    @lumos.method(num_returns=2)
    def both(self) -> tuple[int, int]:
        return self.n, -self.n


def test_functions_inputs_and_shared_nodes(cluster: lumos.LumosContext, tmp_path) -> None:
    dag = add.bind(add.bind(1, 2), 3)
    assert isinstance(dag, FunctionNode) and lumos.get(dag.execute(), timeout=60) == 6
    with InputNode() as inp:
        dag = add.bind(square.bind(inp[0]), inp.offset)
    assert lumos.get(dag.execute(3, offset=1), timeout=60) == 10
    assert lumos.get(dag.execute(4, offset=0), timeout=60) == 16  # a graph runs again with new input
    with InputNode() as inp:
        doubled = add.bind(inp, inp)
    assert lumos.get(doubled.execute(21), timeout=60) == 42
    with InputNode() as inp:
        from_dict = add.bind(inp["a"], inp["b"])
    assert lumos.get(from_dict.execute({"a": 1, "b": 2}), timeout=60) == 3
    # A node two others use runs once per execute.
    calls = tmp_path / "calls"
    once = count_calls.bind(str(calls))
    assert lumos.get(add.bind(once, once).execute(), timeout=60) == 2 and calls.read_text() == "x"
    # Options bind too; nodes nested in lists reach the task as their refs' values.
    assert lumos.get(add.options(num_cpus=0).bind(1, 1).execute(), timeout=60) == 2
    assert lumos.get(MultiOutputNode([square.bind(2), add.bind(1, 1)]).execute(), timeout=60) == [4, 2]


def test_actor_nodes_and_calls_on_live_handles(cluster: lumos.LumosContext) -> None:
    with InputNode() as inp:
        counter = Counter.bind(10)
        out = MultiOutputNode([counter.inc.bind(inp), counter.inc.bind(inp)])
    assert isinstance(counter, ClassNode)
    assert lumos.get(out.execute(5), timeout=60) == [15, 20]  # one actor per execute, both calls on it
    assert lumos.get(out.execute(1), timeout=60) == [11, 12]
    assert lumos.get(counter.inc.options(name="bump").bind(2).execute(), timeout=60) == 12
    handle = Counter.remote(0)
    assert lumos.get(handle.inc.bind(7).execute(), timeout=60) == 7
    first, second = handle.both.bind()  # a node per value, as in Ray
    assert lumos.get([first.execute(), second.execute()], timeout=60) == [7, -7]
    first, second = Counter.bind(3).both.bind()  # (on a class node too)
    assert lumos.get([first.execute(), second.execute()], timeout=60) == [3, -3]


def test_dag_input_mistakes_are_clear(cluster: lumos.LumosContext) -> None:
    with InputNode() as inp:
        dag = add.bind(inp, 1)
    with pytest.raises(ValueError, match="uses its InputNode as one value, but execute"):
        dag.execute(1, 2)
    with InputNode() as inp:
        dag = add.bind(inp.missing, 1)
    with pytest.raises(KeyError, match="reads input 'missing'"):
        dag.execute(x=1)
    with pytest.raises(IndexError, match="positional input 3"):
        add.bind(inp[3], 1).execute(1)
    with pytest.raises(NotImplementedError, match="compiled graphs"):
        dag.experimental_compile()
