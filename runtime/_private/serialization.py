"""The serialized form of user values, shared by inline values and store files.

```
offset 0   u8 version | u8 kind | u16 reserved | u32 nbuf | u64 pickle_len
offset 16  nbuf x (u64 offset, u64 length)        buffer table, offsets from the start
           pickle-5 stream (cloudpickle when the value needs code by value)
           out-of-band buffers, each at a 64-byte aligned offset
```
A store file is exactly this blob, so a reader maps the file and hands memoryviews of
the buffer regions to ``pickle.loads``: numpy arrays and Arrow buffers come back
zero-copy and read-only. Inline values use the same bytes.

Refs found while pickling (``ObjectRef.__reduce__``) are collected in a thread-local
context so the caller can track them as nested references.
"""

from __future__ import annotations

import io
import pickle
import struct
import sys
import threading
import types
from collections import ChainMap
from typing import Any, Callable

import cloudpickle

from lumos.exceptions import LumosSystemError

VERSION = 1
KIND_VALUE = 0
KIND_ERROR = 1
ALIGN = 64

_HEAD = struct.Struct("<BBHIQ")
_ENTRY = struct.Struct("<QQ")
_VERSION_BYTE = bytes((VERSION,))
_NO_BUFFERS = bytes(4)   # the nbuf field of a blob without out-of-band buffers
_PLAIN_SCALARS = frozenset((int, float, str, bytes, bool, type(None), complex))

_local = threading.local()

_code_reduce = cloudpickle.Pickler.dispatch_table[types.CodeType]
_CO_FILENAME = 10   # place of co_filename in CodeType's arguments (3.8 to 3.13)


def _code_reduce_keeping_file(code: types.CodeType) -> tuple:
    """cloudpickle's reduction of a code object, with the object's own file name.

    cloudpickle 3.1.3 writes ``"<dynamic-code>"`` in place of every file name (for
    byte-identical pickles); a remote function's traceback would then point at no file,
    and a notebook cell's frames could not be told from the user's modules.
    """
    ctor, args = _code_reduce(code)
    if args[_CO_FILENAME] != code.co_filename and isinstance(args[_CO_FILENAME], str):
        args = args[:_CO_FILENAME] + (code.co_filename,) + args[_CO_FILENAME + 1:]
    return ctor, args


#: Reductions of lumos's own, ahead of cloudpickle's; torch's tensor joins it once torch
#: has been imported (``_note_torch``).
_own_reductions: dict[type, Callable[[Any], tuple]] = {types.CodeType: _code_reduce_keeping_file}


#: The user's reductions (``register_reduction``), ahead of lumos's own.
_user_reductions: dict[type, Callable[[Any], tuple]] = {}


class _Pickler(cloudpickle.Pickler):
    dispatch_table = ChainMap(_user_reductions, _own_reductions, cloudpickle.Pickler.dispatch_table)


#: False while a user's reduction is registered for a type ``serialize`` otherwise
#: pickles with the plain C pickler (a scalar, None, tuple, list, dict, ndarray): every
#: value then goes through ``_Pickler``, which applies it.
_plain_ok = True


def _plain_types() -> tuple[type, ...]:
    return (*_PLAIN_SCALARS, tuple, list, dict, type(None), _ndarray_type() or tuple)


def register_reduction(cls: type, reduce: Callable[[Any], tuple]) -> None:
    """Pickle instances of exactly ``cls`` with ``reduce`` in this process, ahead of
    lumos's and cloudpickle's own (``ray.util.register_serializer``)."""
    global _plain_ok
    if not isinstance(cls, type):
        raise TypeError(f"a serializer is registered for a class, got {type(cls).__name__} {cls!r}")
    _user_reductions[cls] = reduce
    if cls in _plain_types():
        _plain_ok = False


def unregister_reduction(cls: type) -> None:
    """Undo ``register_reduction``: ``cls`` pickles as before (nothing if it has none)."""
    global _plain_ok
    _user_reductions.pop(cls, None)
    _plain_ok = not any(c in _user_reductions for c in _plain_types())


def cloudpickle_dumps(value: Any, protocol: int = 5,
                      buffer_callback: Callable[[pickle.PickleBuffer], Any] | None = None
                      ) -> bytes:
    """``cloudpickle.dumps``, keeping the file names of code pickled by value."""
    if _torch_pending and "torch" in sys.modules:
        _note_torch()
    with io.BytesIO() as f:
        _Pickler(f, protocol=protocol, buffer_callback=buffer_callback).dump(value)
        return f.getvalue()

_np_ndarray: type | None = None


def _ndarray_type() -> type | None:
    global _np_ndarray
    if _np_ndarray is None:
        np = sys.modules.get("numpy")
        if np is None:
            return None
        _np_ndarray = np.ndarray
    return _np_ndarray


# --- torch tensors ------------------------------------------------------------------
#
# torch pickles a tensor's storage in band, through ``torch.save`` into a bytes object:
# two copies and a zip writer per storage. A dense CPU tensor is written here as its
# storage's bytes (one out-of-band buffer, which the store copies once) and its dtype,
# offset, shape, stride and ``requires_grad``, and rebuilt on a fresh storage holding a
# copy of those bytes: torch has no read-only tensor, and a write to the store's
# read-only mapping would crash the process; a large storage read from the store is
# rebuilt on the object's pages copy-on-write instead (``StoreClient.writable``).
# As in torch's pickling, the whole storage goes (a slice carries its base's bytes);
# tensors of one value that share a storage share it when rebuilt, as ``torch.save``
# keeps them (torch's pickle gives each its own). ``nn.Parameter`` reduces to its
# ``.data``, a plain tensor, so it takes this path too.
# Anything else (another device, sparse, quantized, nested, a subclass, a tensor with
# Python attributes or hooks, conjugate or negative bits) is left to torch.

_torch_pending = True


def _note_torch() -> None:
    """Registers the tensor reduction once torch is imported (lumos never imports it)."""
    global _torch_pending
    torch = sys.modules.get("torch")
    tensor = getattr(torch, "Tensor", None)
    if tensor is None or not hasattr(torch, "strided"):
        return   # not imported, or still importing
    _torch_pending = False
    _own_reductions[tensor] = _reduce_tensor


class _Storage:
    """One storage of the value being pickled; the pickler's memo writes it once."""

    __slots__ = ("storage",)

    def __init__(self, storage: Any) -> None:
        self.storage = storage

    def __reduce__(self) -> tuple:
        import torch
        storage = self.storage
        raw = torch.empty(0, dtype=torch.uint8).set_(storage).numpy()   # a view, no copy
        return _rebuild_storage, (pickle.PickleBuffer(raw),)


def _reduce_tensor(t: Any) -> tuple:
    torch = sys.modules["torch"]
    if (t.layout is not torch.strided or t.device.type != "cpu" or t.is_quantized
            or t.is_nested or t.is_conj() or t.is_neg() or t.__dict__
            or t._backward_hooks):
        return t.__reduce_ex__(5)  # type: ignore[no-any-return]
    storage = t.untyped_storage()
    memo = getattr(_local, "storages", None)
    key = storage.data_ptr()
    box = memo.get(key) if memo is not None and key else None
    if box is None:
        box = _Storage(storage)
        if memo is not None and key:
            memo[key] = box
    return _rebuild_tensor, (box, t.dtype, t.storage_offset(), tuple(t.shape), t.stride(),
                             t.requires_grad)


def _rebuild_storage(buf: Any) -> Any:
    import numpy as np
    import torch
    if type(buf) is memoryview:   # (a view of a store object or of an inline blob)
        exporter = buf.obj
        store = getattr(exporter, "_lumos_store", None)
        if store is not None:
            writable = store[0].writable(buf, exporter)
            if writable is not None:
                return torch.frombuffer(writable, dtype=torch.uint8).untyped_storage()
    src = np.frombuffer(buf, dtype=np.uint8)
    dst = torch.empty(src.nbytes, dtype=torch.uint8)
    if src.nbytes:
        dst.numpy()[:] = src
    return dst.untyped_storage()


def _rebuild_tensor(storage: Any, dtype: Any, offset: int, shape: tuple[int, ...],
                    stride: tuple[int, ...], requires_grad: bool) -> Any:
    import torch
    t = torch.empty(0, dtype=dtype).set_(storage, offset, shape, stride)
    if requires_grad:
        t.requires_grad_(True)
    return t


class SerializationError(TypeError):
    """A value could not be pickled; says which and why."""


class DeserializationError(LumosSystemError):
    """A serialized value could not be rebuilt in this process: a ``LumosSystemError``
    (Ray's ``RaySystemError``, which Ray raises for it)."""


_NOT_PLAIN, _PLAIN, _PLAIN_WITH_ARRAYS = 0, 1, 2


def _plainness(value: Any, depth: int = 0) -> int:
    """``_PLAIN`` for scalars and small containers of them, ``_PLAIN_WITH_ARRAYS`` when
    such a value holds numpy arrays (of no Python objects), else ``_NOT_PLAIN``: a plain
    value holds no ObjectRef and no code, so the C pickler can write it."""
    t = type(value)
    if t in _PLAIN_SCALARS:
        return _PLAIN
    if depth < 2:
        if t is tuple or t is list:
            if len(value) > 64:
                return _NOT_PLAIN
            found = _PLAIN
            for v in value:
                p = _plainness(v, depth + 1)
                if p == _NOT_PLAIN:
                    return _NOT_PLAIN
                found |= p
            return found
        if t is dict:
            if len(value) > 64:
                return _NOT_PLAIN
            found = _PLAIN
            for k, v in value.items():
                if type(k) not in _PLAIN_SCALARS:
                    return _NOT_PLAIN
                p = _plainness(v, depth + 1)
                if p == _NOT_PLAIN:
                    return _NOT_PLAIN
                found |= p
            return found
    nd = _ndarray_type()
    if nd is not None and t is nd and value.dtype.kind != "O":
        return _PLAIN_WITH_ARRAYS
    return _NOT_PLAIN


_SIMPLE_DTYPE_KINDS = frozenset("biufcSU")   # (datetimes export no buffer)


def _reduce_ndarray(arr: Any) -> tuple:
    """A C-contiguous array of a simple dtype as its buffer (out of band), dtype string
    and shape: cheaper to write and read than numpy's reduction (which pickles a dtype
    object); any other array as numpy reduces it."""
    dtype = arr.dtype
    if dtype.kind in _SIMPLE_DTYPE_KINDS and arr.flags.c_contiguous and dtype.fields is None \
            and dtype.subdtype is None and dtype.metadata is None:
        return _rebuild_ndarray, (pickle.PickleBuffer(arr), dtype.str, arr.shape)
    return arr.__reduce_ex__(5)  # type: ignore[no-any-return]


def _rebuild_ndarray(buf: Any, dtype: str, shape: tuple[int, ...]) -> Any:
    import numpy as np
    return np.frombuffer(buf, dtype=dtype).reshape(shape)


_array_dispatch: dict[type, Callable[[Any], tuple]] = {}


def _dumps_with_arrays(value: Any, buffer_callback: Callable[[pickle.PickleBuffer], Any]) -> bytes:
    """``pickle.dumps`` of a plain value holding arrays, each reduced by ``_reduce_ndarray``."""
    if not _array_dispatch:
        _array_dispatch[_ndarray_type()] = _reduce_ndarray  # type: ignore[index]
    with io.BytesIO() as f:
        p = pickle.Pickler(f, protocol=5, buffer_callback=buffer_callback)
        p.dispatch_table = _array_dispatch
        p.dump(value)
        return f.getvalue()


class SerializedValue:
    """A pickled value with its out-of-band buffers, not yet laid out."""

    __slots__ = ("kind", "pickled", "buffers", "nested_refs", "total_size", "_offsets", "_blob")

    def __init__(self, kind: int, pickled: bytes, buffers: list[memoryview],
                 nested_refs: list[Any]) -> None:
        self.kind = kind
        self.pickled = pickled
        #: Raw (1-D, byte) views of the out-of-band buffers.
        self.buffers = buffers
        #: ObjectRefs met while pickling.
        self.nested_refs = nested_refs
        self._blob: bytes | None = None
        if not buffers:
            self._offsets: list[int] = []
            #: Size of the laid-out blob.
            self.total_size = _HEAD.size + len(pickled)
            return
        header = _HEAD.size + _ENTRY.size * len(buffers)
        pos = header + len(pickled)
        offsets = []
        for buf in buffers:
            pos = (pos + ALIGN - 1) & ~(ALIGN - 1)
            offsets.append(pos)
            pos += buf.nbytes
        self._offsets = offsets
        self.total_size = pos

    def _header(self) -> bytes:
        parts = [_HEAD.pack(VERSION, self.kind, 0, len(self.buffers), len(self.pickled))]
        for off, buf in zip(self._offsets, self.buffers):
            parts.append(_ENTRY.pack(off, buf.nbytes))
        return b"".join(parts)

    def to_bytes(self) -> bytes:
        """The blob as one bytes object (for inline values)."""
        if not self.buffers:
            blob = self._blob
            if blob is None:
                blob = self._blob = _HEAD.pack(VERSION, self.kind, 0, 0, len(self.pickled)) + self.pickled
            return blob
        # One join copies each buffer once (a bytearray filled and then turned into
        # bytes would copy the whole blob twice).
        return b"".join(self.pieces())

    def pieces(self) -> list[Any]:
        """The blob as the buffers that lay it out in order (zero padding included), for
        a gather write (``os.pwritev``) into a fresh store file: nothing is copied here."""
        parts: list[Any] = [self._header(), self.pickled]
        if not self.buffers:
            return parts
        pos = len(parts[0]) + len(self.pickled)
        for off, buf in zip(self._offsets, self.buffers):
            if off > pos:
                parts.append(bytes(off - pos))
            parts.append(buf)
            pos = off + buf.nbytes
        return parts

    def write_into(self, dest: memoryview, copy: Callable[[memoryview, memoryview], None] | None = None) -> None:
        """Lay the blob out in ``dest`` (at least ``total_size`` bytes).

        ``copy(dst, src)`` copies large buffers (the store passes a multi-threaded one).
        """
        header = self._header()
        n = len(header)
        dest[:n] = header
        dest[n:n + len(self.pickled)] = self.pickled
        for off, buf in zip(self._offsets, self.buffers):
            target = dest[off:off + buf.nbytes]
            if copy is not None:
                copy(target, buf)
            else:
                target[:] = buf


def serialize(value: Any, kind: int = KIND_VALUE) -> SerializedValue:
    """Pickle ``value`` with protocol 5, buffers out of band. Raises ``SerializationError``.

    The result for ``None`` and ``()`` is shared (its fields must not be changed).
    """
    if not _plain_ok:
        plain = _NOT_PLAIN
    else:
        if kind == KIND_VALUE:
            if value is None:
                return _NONE
            if type(value) is tuple and not value:
                return _EMPTY_TUPLE
        plain = _plainness(value)
    if plain != _NOT_PLAIN:
        # No refs to record and no code to pickle by value: the C pickler suffices.
        pickled_buffers: list[pickle.PickleBuffer] = []
        try:
            if plain == _PLAIN:
                pickled = pickle.dumps(value, protocol=5, buffer_callback=pickled_buffers.append)
            else:
                pickled = _dumps_with_arrays(value, pickled_buffers.append)
        except Exception as e:
            if _too_deep(e):
                return _serialize_deep(value, kind, e)
            raise SerializationError(_describe_failure(value, e)) from e
        return SerializedValue(kind, pickled, [pb.raw() for pb in pickled_buffers]
                               if pickled_buffers else pickled_buffers, [])
    buffers: list[memoryview] = []

    def on_buffer(pb: pickle.PickleBuffer) -> bool:
        buffers.append(pb.raw())
        return False

    prev = getattr(_local, "refs", None)
    prev_storages = getattr(_local, "storages", None)
    refs: list[Any] = []
    _local.refs = refs
    _local.storages = {}
    try:
        pickled = cloudpickle_dumps(value, protocol=5, buffer_callback=on_buffer)
    except SerializationError:
        raise
    except Exception as e:
        if _too_deep(e):
            deep = e
        else:
            raise SerializationError(_describe_failure(value, e)) from e
    else:
        return SerializedValue(kind, pickled, buffers, refs)
    finally:
        _local.refs = prev
        _local.storages = prev_storages
    return _serialize_deep(value, kind, deep)


#: The recursion limit a value nested too deeply for the interpreter's own is pickled
#: again under (a nested dict costs two levels; the C stack holds this in any thread).
DEEP_RECURSION_LIMIT = 6000
_deep_lock = threading.Lock()


def _too_deep(e: BaseException) -> bool:
    """Pickling ran out of recursion (cloudpickle says so in a PicklingError)."""
    return isinstance(e, RecursionError) or (isinstance(e, pickle.PicklingError) and "recursion" in str(e))


def _serialize_deep(value: Any, kind: int, error: BaseException) -> SerializedValue:
    """``serialize`` of a value nested deeper than the recursion limit allows (a long
    linked list, a deep tree): once more under ``DEEP_RECURSION_LIMIT``."""
    if getattr(_local, "deep", False) or sys.getrecursionlimit() >= DEEP_RECURSION_LIMIT:  # (this is the retry)
        raise SerializationError(
            f"could not serialize a value of type {type(value).__name__}: it is nested more deeply than "
            f"pickling can follow ({max(sys.getrecursionlimit(), DEEP_RECURSION_LIMIT)} levels of recursion)"
        ) from error
    with _deep_lock:  # (the limit is the process's: one such value at a time raises it)
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(DEEP_RECURSION_LIMIT)
        _local.deep = True
        try:
            return serialize(value, kind)
        finally:
            _local.deep = False
            sys.setrecursionlimit(limit)


_NONE = SerializedValue(KIND_VALUE, pickle.dumps(None, protocol=5), [], [])
_NONE.to_bytes()
_EMPTY_TUPLE = SerializedValue(KIND_VALUE, pickle.dumps((), protocol=5), [], [])
_EMPTY_TUPLE.to_bytes()


def _describe_failure(value: Any, e: Exception) -> str:
    what = type(value).__name__
    return (f"could not serialize a value of type {what}: {describe_culprit(value, e)}. "
            "Values sent to tasks and actors must be picklable (cloudpickle); "
            "objects holding locks, sockets or open files are not.")


def _pickles(value: Any) -> Exception | None:
    """None when ``value`` pickles, else the error it raises."""
    try:
        cloudpickle_dumps(value, protocol=5, buffer_callback=lambda pb: False)
    except Exception as e:
        return e
    return None


def _parts(value: Any) -> list[tuple[str, Any]]:
    """``(path suffix, part)`` for what ``value`` is made of, where that can be seen cheaply."""
    t = type(value)
    if t in (tuple, list):
        return [(f"[{i}]", v) for i, v in enumerate(value[:1000])]
    if t in (set, frozenset):
        return [("{...}", v) for v in list(value)[:1000]]
    if t is dict:
        items = list(value.items())[:1000]
        return [(f"[{k!r}]", v) for k, v in items] + [(f" key {k!r}", k) for k, _ in items]
    if isinstance(value, type) or callable(value):
        return []
    attrs = getattr(value, "__dict__", None)
    if isinstance(attrs, dict):
        return [(f".{k}", v) for k, v in list(attrs.items())[:1000]]
    return []


def find_culprit(value: Any, error: Exception, max_depth: int = 8) -> tuple[str, Any, Exception]:
    """The innermost part of ``value`` that fails to pickle: ``(path, part, its error)``.

    Only called after pickling ``value`` failed (it pickles parts again, which is slow).
    """
    path = ""
    for _ in range(max_depth):
        for suffix, part in _parts(value):
            if part is value:
                continue
            err = _pickles(part)
            if err is not None:
                path, value, error = path + suffix, part, err
                break
        else:
            break
    return path, value, error


def describe_culprit(value: Any, error: Exception) -> str:
    """Which object in ``value`` could not be pickled, and why, in a phrase:
    "``cfg.lock``: a `lock` that cannot be pickled: TypeError: ..."."""
    if _too_deep(error):  # (no one part is to blame)
        return (f"a `{type(value).__qualname__}` nested more deeply than pickling can follow "
                f"({DEEP_RECURSION_LIMIT} levels of recursion)")
    path, part, err = find_culprit(value, error)
    cls = type(part)
    name = cls.__qualname__
    if cls.__reduce__ is not object.__reduce__:
        how = f"whose `__reduce__` raised {type(err).__name__}: {err}"
    elif cls.__reduce_ex__ is not object.__reduce_ex__:
        how = f"whose `__reduce_ex__` raised {type(err).__name__}: {err}"
    elif getattr(cls, "__getstate__", object.__getstate__) is not object.__getstate__:
        how = f"whose `__getstate__` raised {type(err).__name__}: {err}"
    else:
        how = f"that cannot be pickled ({type(err).__name__}: {err})"
    where = f"at `{path.lstrip('.')}`, " if path else ""
    return f"{where}a `{name}` {how}"


def record_ref(ref: Any) -> None:
    """Called by ``ObjectRef.__reduce__``: note a ref nested in the value being pickled."""
    refs = getattr(_local, "refs", None)
    if refs is not None:
        refs.append(ref)


def dumps_code(obj: Any) -> bytes:
    """Pickle a function or class for export (by value when it is not importable)."""
    try:
        return cloudpickle_dumps(obj, protocol=5)
    except Exception as e:
        raise SerializationError(_describe_failure(obj, e)) from e


def deserialize_code(pickled: bytes) -> Any:
    """A function or class exported with ``dumps_code``."""
    try:
        return cloudpickle.loads(pickled)
    except Exception as e:
        raise DeserializationError(f"could not load code: {type(e).__name__}: {e}") from e


def parse(blob: memoryview) -> tuple[int, memoryview, list[memoryview]]:
    """Split a blob into ``(kind, pickle stream, buffers)`` without copying."""
    if blob.nbytes < _HEAD.size:
        raise DeserializationError("serialized value is truncated")
    version, kind, _, nbuf, plen = _HEAD.unpack_from(blob, 0)
    if version != VERSION:
        raise DeserializationError(f"serialized value has format version {version}, expected {VERSION}")
    pos = _HEAD.size
    buffers = []
    for _ in range(nbuf):
        off, length = _ENTRY.unpack_from(blob, pos)
        pos += _ENTRY.size
        if off + length > blob.nbytes:
            raise DeserializationError("serialized value is truncated")
        buffers.append(blob[off:off + length])
    return kind, blob[pos:pos + plen], buffers


def deserialize(blob: bytes | memoryview) -> tuple[int, Any]:
    """Rebuild a value. Returns ``(kind, value)``; buffers stay views of ``blob``."""
    if type(blob) is bytes and blob[:1] == _VERSION_BYTE and blob[4:8] == _NO_BUFFERS:
        # An inline value without out-of-band buffers (the common small one): no buffer
        # table to read; ``pickle.loads`` ignores the bytes after the stream's STOP, and a
        # length that runs past the end is caught by it as a truncated stream.
        try:
            return blob[1], pickle.loads(memoryview(blob)[16:])
        except Exception as e:
            if len(blob) < _HEAD.size + int.from_bytes(blob[8:16], "little"):
                raise DeserializationError("serialized value is truncated") from e
            raise DeserializationError(
                f"could not deserialize a value: {type(e).__name__}: {e}") from e
    view = blob if isinstance(blob, memoryview) else memoryview(blob)
    kind, stream, buffers = parse(view)
    try:
        return kind, pickle.loads(stream, buffers=buffers)
    except Exception as e:
        raise DeserializationError(f"could not deserialize a value: {type(e).__name__}: {e}") from e


def kind_of(blob: bytes) -> int:
    return blob[1] if len(blob) > 1 else KIND_VALUE
