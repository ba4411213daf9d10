"""The msgpack codec of lumos messages: the message registry, ``encode`` and ``decode``.

Every message is a ``@dataclass(slots=True)`` registered under a one-byte code with
``@message(code)``. On the wire a message is a msgpack extension type whose payload is
the list of its fields, so messages nest (a ``PushTask`` carries a ``TaskSpec`` that
carries ``Address``es).

A frame's payload is ``[kind, request_id, body]``; ``body`` is a message for
``REQUEST`` and ``NOTIFY``, any msgpack value for ``REPLY``, and ``[type_name, text]``
for ``ERROR``.

Decoding checks a message's arity and, for fields annotated with one of the enums of
``vocab.py`` (``TaskKind``, ``ErrorKind | None``, ...), that the value is one of the
enum's wire values; it turns that value into the member. Anything else is a
``ProtocolError``: the peer is dropped, the process keeps serving.
"""

from __future__ import annotations

import dataclasses
import operator
import threading
from typing import Any, Callable, TypeVar, dataclass_transform

import msgpack

from lumos._private.protocol.framing import ProtocolError
from lumos._private.protocol.vocab import WIRE_ENUMS

REQUEST = 0
REPLY = 1
ERROR = 2
NOTIFY = 3

_REGISTRY: dict[int, type] = {}


#: An enum-typed field: (position, wire type, value -> member, None allowed).
_EnumField = tuple[int, type, dict[Any, Any], bool]


def _enum_fields(cls: type) -> tuple[_EnumField, ...]:
    """The fields of ``cls`` annotated with a ``vocab`` enum (``TaskKind``, ``ErrorKind | None``)."""
    out: list[_EnumField] = []
    for i, f in enumerate(dataclasses.fields(cls)):
        ann = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")
        parts = [p.strip() for p in ann.split("|")]
        names = [p for p in parts if p != "None"]
        if len(names) == 1 and names[0] in WIRE_ENUMS:
            enum_cls = WIRE_ENUMS[names[0]]
            wire_type = int if issubclass(enum_cls, int) else str
            out.append((i, wire_type, dict(enum_cls._value2member_map_), len(names) < len(parts)))
    return tuple(out)


_T = TypeVar("_T")


@dataclass_transform()
def message(code: int) -> Callable[[type[_T]], type[_T]]:
    """Register a dataclass as message ``code`` (0..127)."""

    def wrap(cls: type[_T]) -> type[_T]:
        if code in _REGISTRY:
            raise RuntimeError(f"message code {code} used twice ({_REGISTRY[code].__name__}, {cls.__name__})")
        cls = dataclasses.dataclass(slots=True)(cls)
        names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
        if len(names) > 1:
            getter: Callable[[Any], tuple[Any, ...]] = operator.attrgetter(*names)
        elif names:
            single = operator.attrgetter(names[0])
            getter = lambda obj: (single(obj),)  # noqa: E731
        else:
            getter = lambda obj: ()  # noqa: E731
        cls._code = code  # type: ignore[attr-defined]
        cls._fields_of = getter  # type: ignore[attr-defined]
        cls._enum_fields = _enum_fields(cls)  # type: ignore[attr-defined]
        _REGISTRY[code] = cls
        return cls

    return wrap


class _Packers(threading.local):
    """Reused packers, one per nesting depth and thread.

    ``msgpack.packb`` builds a new ``Packer`` (with a 1 MiB buffer) per call; for nested
    messages that dominated encoding time (35 us for a PushTask, 6 us with reuse).
    """

    def __init__(self) -> None:
        self.stack: list[msgpack.Packer] = []
        self.depth = 0


_packers = _Packers()


def _packer(depth: int) -> msgpack.Packer:
    stack = _packers.stack
    while len(stack) <= depth:
        stack.append(msgpack.Packer(default=_default, use_bin_type=True, autoreset=True))
    return stack[depth]


def _default(obj: Any) -> Any:
    code = getattr(type(obj), "_code", None)
    if code is None:
        if isinstance(obj, (set, frozenset)):
            return list(obj)
        raise TypeError(f"cannot encode {type(obj).__name__} in a lumos message")
    local = _packers
    local.depth += 1
    try:
        return msgpack.ExtType(code, _packer(local.depth).pack(type(obj)._fields_of(obj)))
    finally:
        local.depth -= 1


#: Deepest nesting of messages inside messages a frame may carry. Real messages nest a
#: few levels (PushTask > TaskSpec > Address); each level recurses through
#: ``msgpack.unpackb`` on the C stack, and a few kilobytes of nested extension types
#: used to overflow it (SIGSEGV, issue 11).
MAX_MESSAGE_NESTING = 16


class _Nesting(threading.local):
    def __init__(self) -> None:
        self.depth = 0


_nesting = _Nesting()


def _ext_hook(code: int, data: bytes) -> Any:
    cls = _REGISTRY.get(code)
    if cls is None:
        raise ProtocolError(f"unknown message code {code}")
    local = _nesting
    if local.depth >= MAX_MESSAGE_NESTING:
        raise ProtocolError(f"messages nested more than {MAX_MESSAGE_NESTING} deep")
    local.depth += 1
    try:
        fields = msgpack.unpackb(data, ext_hook=_ext_hook, raw=False)
    finally:
        local.depth -= 1
    if not isinstance(fields, list):
        raise ProtocolError(f"malformed {cls.__name__}")
    enums = cls._enum_fields  # type: ignore[attr-defined]
    if enums:
        # Inline (not a helper call): a batch of task events decodes one of these per event.
        n = len(fields)
        for i, wire_type, members, optional in enums:
            if i < n:  # else a defaulted field left out (or wrong arity, refused below)
                value = fields[i]
                if type(value) is wire_type and value in members:
                    fields[i] = members[value]
                elif not (value is None and optional):
                    _bad_enum(cls, i, value)
    try:
        return cls(*fields)
    except TypeError as e:
        raise ProtocolError(f"malformed {cls.__name__}: {e}") from None


def _bad_enum(cls: type, i: int, value: Any) -> None:
    f = dataclasses.fields(cls)[i]
    enum_cls = WIRE_ENUMS[[p.strip() for p in str(f.type).split("|") if p.strip() != "None"][0]]
    raise ProtocolError(f"malformed {cls.__name__}: {f.name}={value!r:.40} is not a {enum_cls.__name__} "
                        f"(one of {', '.join(repr(e.value) for e in enum_cls)})")


def encode(kind: int, request_id: int, body: Any) -> bytes:
    local = _packers
    depth = local.depth
    try:
        return _packer(depth).pack((kind, request_id, body))  # type: ignore[no-any-return]
    except BaseException:
        # A failed pack leaves the packer's buffer half-written: start the next one afresh.
        del local.stack[depth:]
        local.depth = depth
        raise


def decode(payload: bytes) -> tuple[int, int, Any]:
    try:
        obj = msgpack.unpackb(payload, ext_hook=_ext_hook, raw=False)
    except ProtocolError:
        raise
    except Exception as e:  # msgpack raises several unrelated types on garbage
        raise ProtocolError(f"undecodable frame: {type(e).__name__}: {e}") from None
    if not (isinstance(obj, list) and len(obj) == 3 and isinstance(obj[0], int) and isinstance(obj[1], int)):
        raise ProtocolError("frame is not [kind, request_id, body]")
    return obj[0], obj[1], obj[2]
