"""Ray's lazy DAG API: ``.bind(...)`` builds a graph of calls, ``execute(...)`` runs it.

``f.bind(...)``, ``Cls.bind(...)`` and ``node.method.bind(...)`` (or
``handle.method.bind(...)`` on a live actor) record a call without making it; a node
passed as an argument of another becomes the ref (or actor handle) it produces, so the
graph runs as ordinary tasks and actor calls, as asynchronous as ``.remote`` ones. Each
``execute`` runs every node once (a node two others use runs once for both) and returns
the last node's ref; ``InputNode`` stands for what ``execute`` is given::

    import lumos as ray
    from lumos.dag import InputNode, MultiOutputNode

    with InputNode() as inp:
        dag = add.bind(square.bind(inp[0]), inp.offset)
    ray.get(dag.execute(3, offset=1))        # 10

Not in lumos: compiled graphs (``experimental_compile``) and visualisation.
"""

from __future__ import annotations

from typing import Any

from lumos._private.compat import not_implemented_error


class DAGNode:
    """A call recorded by ``.bind(...)``; ``execute`` runs it and what it depends on."""

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        """Run the graph ending here with ``args``/``kwargs`` as the ``InputNode``;
        returns this node's ``ObjectRef`` (an ``ActorHandle`` for an actor's node, a list
        for a ``MultiOutputNode``)."""
        return _Run(args, kwargs).value(self)

    def experimental_compile(self, *args: Any, **kwargs: Any) -> Any:
        raise not_implemented_error("compiled graphs (DAGNode.experimental_compile)",
                                    "run the graph with execute(...)")

    def _run(self, run: _Run) -> Any:
        raise NotImplementedError


class _RemoteNode(DAGNode):
    """A ``.remote(...)`` of ``target`` (a remote function or actor class, with or
    without ``.options``) with the bound arguments, their nodes resolved."""

    def __init__(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self._target, self._args, self._kwargs = target, args, kwargs

    def _run(self, run: _Run) -> Any:
        return self._target.remote(*run.resolve(self._args), **run.resolve(self._kwargs))


class FunctionNode(_RemoteNode):
    """``f.bind(...)``: a task."""

    def __repr__(self) -> str:
        return f"FunctionNode({getattr(self._target, '__name__', self._target)!s})"


class ClassNode(_RemoteNode):
    """``Cls.bind(...)``: an actor, created once per ``execute``; ``node.method.bind(...)``
    records a call on it."""

    def __getattr__(self, name: str) -> _MethodBinder:
        if name.startswith("_"):
            raise AttributeError(name)
        cls = getattr(self._target, "_actor_class", self._target)  # (a class with options: its class)
        defaults = getattr(cls, "_methods", {}).get(name) or {}  # ``@lumos.method(...)``'s options
        return _MethodBinder(self, name, dict(defaults))


class _MethodBinder:
    """``class_node.method``: ``.bind(...)`` records the call; ``.options(...)`` sets its options."""

    def __init__(self, actor: Any, name: str, options: dict[str, Any]) -> None:
        self._actor, self._name, self._options = actor, name, options

    def bind(self, *args: Any, **kwargs: Any) -> ClassMethodNode | tuple[DAGNode, ...]:
        return ClassMethodNode(self._actor, self._name, self._options, args, kwargs).outputs()

    def options(self, **options: Any) -> _MethodBinder:
        return _MethodBinder(self._actor, self._name, {**self._options, **options})


class ClassMethodNode(DAGNode):
    """``actor_node.method.bind(...)`` (or ``handle.method.bind(...)``): an actor call."""

    def __init__(self, actor: Any, name: str, options: dict[str, Any], args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> None:
        self._actor, self._name, self._options = actor, name, options
        self._args, self._kwargs = args, kwargs

    def outputs(self) -> ClassMethodNode | tuple[DAGNode, ...]:
        """This node, or, for a method with ``num_returns`` of 2 or more, a node per value
        (as Ray's ``bind`` returns them)."""
        n = self._options.get("num_returns", 1)
        if isinstance(n, int) and not isinstance(n, bool) and n > 1:
            return tuple(_OutputNode(self, i) for i in range(n))
        return self

    def _run(self, run: _Run) -> Any:
        handle = run.value(self._actor) if isinstance(self._actor, DAGNode) else self._actor
        method = getattr(handle, self._name)
        if self._options:
            method = method.options(**self._options)
        return method.remote(*run.resolve(self._args), **run.resolve(self._kwargs))


class _OutputNode(DAGNode):
    """Value ``index`` of a call with several returns."""

    def __init__(self, call: DAGNode, index: int) -> None:
        self._call, self._index = call, index

    def _run(self, run: _Run) -> Any:
        return run.value(self._call)[self._index]


class InputNode(DAGNode):
    """What ``execute(...)`` is given: the node itself is its one positional argument;
    ``inp[i]`` is positional argument ``i``, ``inp.key`` and ``inp["key"]`` keyword
    argument ``key`` (or item ``key`` of the one positional argument)."""

    def __enter__(self) -> InputNode:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        return None

    def __getitem__(self, key: Any) -> InputAttributeNode:
        return InputAttributeNode(self, key)

    def __getattr__(self, name: str) -> InputAttributeNode:
        if name.startswith("_"):
            raise AttributeError(name)
        return InputAttributeNode(self, name)

    def _run(self, run: _Run) -> Any:
        if len(run.args) == 1 and not run.kwargs:
            return run.args[0]
        raise ValueError(f"this graph uses its InputNode as one value, but execute() got {len(run.args)} "
                         f"positional and {len(run.kwargs)} keyword arguments: pass one, or read them with "
                         "inp[i] and inp.name")


class InputAttributeNode(DAGNode):
    """``inp[i]``, ``inp.key`` or ``inp["key"]``."""

    def __init__(self, parent: InputNode, key: Any) -> None:
        self._parent, self._key = parent, key

    def _run(self, run: _Run) -> Any:
        key = self._key
        if isinstance(key, int) and not isinstance(key, bool):
            if key >= len(run.args):
                raise IndexError(f"the graph reads positional input {key}, but execute() got {len(run.args)}")
            return run.args[key]
        if key in run.kwargs:
            return run.kwargs[key]
        if len(run.args) == 1:
            try:
                return run.args[0][key]
            except (KeyError, IndexError, TypeError):
                pass
        raise KeyError(f"the graph reads input {key!r}, which execute() was not given "
                       f"(keywords: {sorted(run.kwargs)})")


class MultiOutputNode(DAGNode):
    """Several nodes' results at once: ``execute`` returns their refs in a list."""

    def __init__(self, outputs: list[Any]) -> None:
        self._outputs = list(outputs)

    def _run(self, run: _Run) -> Any:
        return [run.value(n) if isinstance(n, DAGNode) else n for n in self._outputs]


class _Run:
    """One ``execute``: its input, and each node's result (a node runs once)."""

    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.args, self.kwargs = args, kwargs
        self._done: dict[int, Any] = {}
        self._keep: list[DAGNode] = []  # (ids stay unique while their nodes live)

    def value(self, node: DAGNode) -> Any:
        key = id(node)
        if key not in self._done:
            self._done[key] = node._run(self)
            self._keep.append(node)
        return self._done[key]

    def resolve(self, value: Any) -> Any:
        """``value`` with every node in it (also inside lists, tuples and dicts) replaced
        by its result."""
        if isinstance(value, DAGNode):
            return self.value(value)
        t = type(value)
        if t is tuple or t is list:
            return t(self.resolve(v) for v in value)
        if t is dict:
            return {k: self.resolve(v) for k, v in value.items()}
        return value


__all__ = ["DAGNode", "FunctionNode", "ClassNode", "ClassMethodNode", "InputNode", "InputAttributeNode",
           "MultiOutputNode"]
