"""``ObjectRef``: a reference to an immutable value somewhere in the cluster.

A ref is an object id plus the address of its *owner* (the process that submitted the
task or called ``put``). Refs are counted: while any process holds one, the value
stays. Pickling a ref (inside a task argument or a value) makes the receiver a
borrower; the owner keeps the value until every borrower lets go.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import types
from typing import Any, Generator

from lumos._private import interrupts, serialization
from lumos._private.protocol import messages as m
from lumos._private.ids import ObjectID, TaskID

#: The core worker of this process, set by ``lumos.init`` / worker start-up.
_core_worker: Any = None


class ObjectRef:
    """A reference to a (possibly not yet computed) value. Get it with ``lumos.get``."""

    #: ``ObjectRef[int]`` and the like in annotations, as in Ray.
    __class_getitem__ = classmethod(types.GenericAlias)

    __slots__ = ("_id", "_owner", "_counted", "__weakref__")

    def __init__(self, object_id: ObjectID, owner: m.Address | None = None, _counted: bool = False) -> None:
        self._id = object_id
        self._owner = owner
        #: This instance was added to its entry's ``local`` count.
        self._counted = _counted

    @interrupts.finalizer  # (a stop pressed while it runs: sent again after it)
    def __del__(self) -> None:
        if self._counted:
            cw = _core_worker
            if cw is not None:
                cw.objects.decrements.append(self._id)
                if cw._flush_idle:
                    cw.wake_flush()

    # ------------------------------------------------------------------ identity

    def binary(self) -> bytes:
        return self._id

    def hex(self) -> str:
        return self._id.hex()

    def task_id(self) -> "TaskIDView":
        return TaskIDView(self._id[:16])

    def owner_address(self) -> m.Address | None:
        return self._owner

    def is_nil(self) -> bool:
        """Whether this is the all-zero id (never true for a ref lumos made)."""
        return not any(self._id)

    def size(self) -> int:
        """The id's length in bytes (Ray's ``BaseID.size``)."""
        return len(self._id)

    def call_site(self) -> str:
        """Where the ref was made; lumos does not record it (Ray records it only with
        ``RAY_record_ref_creation_sites=1``): always ``""``."""
        return ""

    def as_future(self, _internal: bool = False) -> "asyncio.Future[Any]":
        """The value as an ``asyncio.Future`` of the running event loop."""
        return asyncio.wrap_future(self.future())

    from lumos._private.compat import missing_function as _missing
    nil = staticmethod(_missing("ray.ObjectRef.nil", "refs are made by .remote() and lumos.put()"))
    from_binary = staticmethod(_missing("ray.ObjectRef.from_binary",
                                        "refs are made by .remote() and lumos.put(); pass refs, not ids"))
    from_hex = staticmethod(_missing("ray.ObjectRef.from_hex",
                                     "refs are made by .remote() and lumos.put(); pass refs, not ids"))
    from_random = staticmethod(_missing("ray.ObjectRef.from_random", "refs are made by .remote() and lumos.put()"))
    job_id = _missing("ray.ObjectRef.job_id", "ids do not encode their job in lumos; see lumos.state.list_objects()")
    redis_shard_hash = _missing("ray.ObjectRef.redis_shard_hash", "lumos shards nothing by object id")
    tensor_transport = _missing("ray.ObjectRef.tensor_transport",
                                "lumos has no GPU tensor transport; values travel through the object store")
    del _missing

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObjectRef) and other._id == self._id

    def __hash__(self) -> int:
        return hash(self._id)

    def __repr__(self) -> str:
        return f"ObjectRef({self._id.hex()})"

    def __copy__(self) -> "ObjectRef":
        return _new_counted(self._id, self._owner)

    def __deepcopy__(self, memo: Any) -> "ObjectRef":
        return _new_counted(self._id, self._owner)

    def __reduce__(self) -> Any:
        serialization.record_ref(self)
        return (_deserialize_ref, (self._id, self._owner))

    # ------------------------------------------------------------------ async

    def future(self) -> concurrent.futures.Future[Any]:
        """A ``concurrent.futures.Future`` that resolves to the value (or its error)."""
        cw = _require_core_worker()
        return cw.future_of(self)  # type: ignore[no-any-return]

    def __await__(self) -> Generator[Any, None, Any]:
        return asyncio.wrap_future(self.future()).__await__()

    def _repr_html_(self) -> str:
        """Notebook display: id, state, size, owner and node."""
        from html import escape
        info: dict[str, Any] = {"state": "?"}
        cw = _core_worker
        if cw is not None:
            info = cw.describe_object(self._id)
        state = str(info.get("state", "?"))
        colour = {"ready": "#1a7f37", "pending": "#1f6feb", "failed": "#cf222e"}.get(state, "#666")
        size = info.get("size")
        size_text = "" if not size else (f"{size} B" if size < 1024 else f"{size / 1024:.1f} KiB"
                                         if size < 1024 ** 2 else f"{size / 1024 ** 2:.1f} MiB")
        owner = info.get("owner") or (self._owner.worker_id.hex() if self._owner is not None else "")
        node = info.get("node_id") or ""
        where = "inline" if info.get("inline") else (f"node {escape(node[:8])}" if node else "")
        parts = [f"<span style='color:{colour}'>{escape(state)}</span>"]
        if size_text:
            parts.append(escape(size_text))
        if owner:
            parts.append(f"owner {escape(owner[:8])}")
        if where:
            parts.append(where)
        return (f"<span class='lumos-ref'><code>ObjectRef({escape(self._id.hex()[:16])}…)</code> "
                f"<span style='color:#666'>{' · '.join(parts)}</span></span>")


class TaskIDView:
    __slots__ = ("_id",)

    def __init__(self, task_id: TaskID) -> None:
        self._id = task_id

    def hex(self) -> str:
        return self._id.hex()

    def binary(self) -> bytes:
        return self._id

    def is_nil(self) -> bool:
        return not any(self._id)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TaskIDView) and other._id == self._id

    def __hash__(self) -> int:
        return hash(self._id)

    def __repr__(self) -> str:
        return f"TaskID({self._id.hex()})"


def _new_counted(object_id: ObjectID, owner: m.Address | None) -> ObjectRef:
    cw = _core_worker
    if cw is None:
        return ObjectRef(object_id, owner)
    cw.objects.ref_created(object_id, owner, cw.worker_id)
    return ObjectRef(object_id, owner, True)


def _deserialize_ref(object_id: ObjectID, owner: m.Address | None) -> ObjectRef:
    cw = _core_worker
    if cw is None:
        return ObjectRef(object_id, owner)
    return cw.on_ref_deserialized(object_id, owner)  # type: ignore[no-any-return]


def _require_core_worker() -> Any:
    if _core_worker is None:
        raise RuntimeError("lumos is not initialized; call lumos.init() first")
    return _core_worker
