"""The msgpack codec of lumos messages: the message registry, ``encode`` and ``decode``.

Every message is a ``@dataclass(slots=True)`` registered under a one-byte code with
``@message(code)``. Registration also generates, from the dataclass fields, one encoder
(message -> list of its field values) and one decoder (list -> message, checked) per
class, so a whole frame is packed and unpacked by one msgpack call.

A frame's payload is one of:

- ``[kind, request_id, code, fields]``: the body is message ``code`` (``REQUEST`` and
  ``NOTIFY`` always, ``REPLY`` when the reply is a message);
- ``[kind, request_id, body]``: any msgpack value (``REPLY``; ``[type_name, text]`` for
  ``ERROR``).

``fields`` is the list of the message's field values in declaration order; trailing
defaulted fields may be left out (a peer that predates them). A field whose annotation
names a message class (``Address``, ``Address | None``, ``list[Dep]``) holds that
message's own ``fields`` list, without a code. A message anywhere else (in a field typed
``Any``, inside a reply's list) travels as a msgpack extension type: code, and the
packed ``fields`` list as payload, so messages nest; frames of that form from older
peers (every nested message an extension type) decode too.

Decoding checks every message's arity, that a message-typed field holds that message
(or None where the annotation allows it) and, for fields annotated with one of the
enums of ``vocab.py`` (``TaskKind``, ``ErrorKind | None``, ...), that the value is one
of the enum's wire values; it turns that value into the member. Anything else is a
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
#: Registered classes by name, to resolve message-typed field annotations.
_BY_NAME: dict[str, type] = {}
#: class -> generated encoder (message -> list of field values).
_ENCODERS: dict[type, Callable[[Any], list[Any]]] = {}
#: code -> generated decoder (list of field values -> message; ``ProtocolError``).
_DECODERS: dict[int, Callable[[Any], Any]] = {}


#: An enum-typed field: (position, wire type, value -> member, None allowed).
_EnumField = tuple[int, type, dict[Any, Any], bool]


def _annotation_parts(f: dataclasses.Field[Any]) -> tuple[list[str], bool]:
    """The non-None alternatives of a field's annotation, and whether None is allowed."""
    ann = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")
    parts = [p.strip() for p in ann.split("|")]
    names = [p for p in parts if p != "None"]
    return names, len(names) < len(parts)


def _enum_fields(cls: type) -> tuple[_EnumField, ...]:
    """The fields of ``cls`` annotated with a ``vocab`` enum (``TaskKind``, ``ErrorKind | None``)."""
    out: list[_EnumField] = []
    for i, f in enumerate(dataclasses.fields(cls)):
        names, optional = _annotation_parts(f)
        if len(names) == 1 and names[0] in WIRE_ENUMS:
            enum_cls = WIRE_ENUMS[names[0]]
            wire_type = int if issubclass(enum_cls, int) else str
            out.append((i, wire_type, dict(enum_cls._value2member_map_), optional))
    return tuple(out)


def _message_field(f: dataclasses.Field[Any]) -> tuple[type, bool, bool] | None:
    """(message class, is a list of them, None allowed) for a field annotated ``X``,
    ``X | None`` or ``list[X]`` with ``X`` a message class registered before; else None."""
    names, optional = _annotation_parts(f)
    if len(names) != 1:
        return None
    name = names[0]
    is_list = name.startswith("list[") and name.endswith("]")
    if is_list:
        name = name[5:-1].strip()
    cls = _BY_NAME.get(name)
    return None if cls is None else (cls, is_list, optional)


def _generate(cls: type) -> tuple[Callable[[Any], list[Any]], Callable[[Any], Any]]:
    """The encoder and decoder of ``cls``, generated from its fields and compiled once.

    The decoder takes the unpacked ``fields`` list: it refuses anything but a list of the
    right arity (filling left-out defaulted fields), decodes message-typed fields with
    their class's decoder, checks and converts enum fields, then sets the slots of a new
    instance (``object.__new__``: no ``__init__`` call)."""
    fields = dataclasses.fields(cls)
    n = len(fields)
    required = sum(1 for f in fields if f.default is dataclasses.MISSING
                   and f.default_factory is dataclasses.MISSING)
    enums = {i: (wire_type, members, optional) for i, wire_type, members, optional in _enum_fields(cls)}
    ns: dict[str, Any] = {"_C": cls, "_new": object.__new__, "_pad": _pad, "_bad_enum": _bad_enum,
                          "_bad_field": _bad_field, "_not_list": _not_list, "_int": int, "_str": str,
                          "_list": list}
    enc_items: list[str] = []
    enc_pre: list[str] = []
    dec: list[str] = []
    loc = [f"v{i}" for i in range(n)]
    for i, f in enumerate(fields):
        v = loc[i]
        mf = _message_field(f)
        if i in enums:
            wire_type, members, optional = enums[i]
            ns[f"_M{i}"] = members
            dec.append(f"    m = _M{i}.get({v}) if {v}.__class__ is {'_int' if wire_type is int else '_str'} else None\n"
                       f"    if m is None{f' and {v} is not None' if optional else ''}:\n"
                       f"        _bad_enum(_C, {i}, {v})\n"
                       f"    {v} = m\n")
            enc_items.append(f"o.{f.name}")
        elif mf is not None:
            sub, is_list, optional = mf
            ns[f"_C{i}"], ns[f"_e{i}"], ns[f"_d{i}"] = sub, _ENCODERS[sub], _DECODERS[sub._code]  # type: ignore[attr-defined]
            none_ok = f" and {v} is not None" if optional else ""
            enc_pre.append(f"    {v} = o.{f.name}\n")
            if is_list:
                enc_items.append(f"([x if x.__class__ is not _C{i} else _e{i}(x) for x in {v}] "
                                 f"if {v}.__class__ is _list and {v} else {v})")
                dec.append(f"    if {v}.__class__ is _list:\n"
                           f"        if {v}:\n"
                           f"            {v} = [x if x.__class__ is _C{i} else _d{i}(x) for x in {v}]\n"
                           f"    elif True{none_ok}:\n"
                           f"        _bad_field(_C, {i}, {v})\n")
            else:
                enc_items.append(f"(_e{i}({v}) if {v}.__class__ is _C{i} else {v})")
                dec.append(f"    if {v}.__class__ is _list:\n"
                           f"        {v} = _d{i}({v})\n"
                           f"    elif {v}.__class__ is not _C{i}{none_ok}:\n"
                           f"        _bad_field(_C, {i}, {v})\n")
        else:
            enc_items.append(f"o.{f.name}")
    unpack = f"    ({', '.join(loc)},) = f\n" if n else ""
    src = ("def encode(o):\n" + "".join(enc_pre) + f"    return [{', '.join(enc_items)}]\n\n"
           "def decode(f):\n"
           "    if f.__class__ is not _list:\n"
           "        _not_list(_C, f)\n"
           f"    if len(f) != {n}:\n"
           f"        f = _pad(_C, f, {required})\n"
           + unpack + "".join(dec) +
           "    o = _new(_C)\n" + "".join(f"    o.{f.name} = {loc[i]}\n" for i, f in enumerate(fields)) +
           ("    o.__post_init__()\n" if hasattr(cls, "__post_init__") else "") +
           "    return o\n")
    exec(compile(src, f"<lumos codec of {cls.__name__}>", "exec"), ns)
    ns["encode"].__qualname__ = f"encode_{cls.__name__}"
    ns["decode"].__qualname__ = f"decode_{cls.__name__}"
    return ns["encode"], ns["decode"]


def _pad(cls: type, f: list[Any], required: int) -> list[Any]:
    """``f`` with its left-out defaulted fields filled in; ``ProtocolError`` on a wrong arity."""
    fields = dataclasses.fields(cls)
    if not required <= len(f) <= len(fields):
        raise ProtocolError(f"malformed {cls.__name__}: {len(f)} fields, expected "
                            f"{required if required == len(fields) else f'{required} to {len(fields)}'}")
    out = list(f)
    for fd in fields[len(f):]:
        value = fd.default if fd.default_factory is dataclasses.MISSING else fd.default_factory()
        # An enum default goes in as its wire value, which the enum check turns back.
        out.append(getattr(value, "value", value) if type(value) in WIRE_ENUMS.values() else value)
    return out


def _not_list(cls: type, f: Any) -> None:
    raise ProtocolError(f"malformed {cls.__name__}: fields are a {type(f).__name__}, not a list")


def _bad_field(cls: type, i: int, value: Any) -> None:
    f = dataclasses.fields(cls)[i]
    raise ProtocolError(f"malformed {cls.__name__}: {f.name}={value!r:.40} is not a {f.type}")


def _bad_enum(cls: type, i: int, value: Any) -> None:
    f = dataclasses.fields(cls)[i]
    enum_cls = WIRE_ENUMS[_annotation_parts(f)[0][0]]
    raise ProtocolError(f"malformed {cls.__name__}: {f.name}={value!r:.40} is not a {enum_cls.__name__} "
                        f"(one of {', '.join(repr(e.value) for e in enum_cls)})")


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
        for i, _w, _m, optional in cls._enum_fields:  # type: ignore[attr-defined]
            default = dataclasses.fields(cls)[i].default  # type: ignore[arg-type]
            if default is None and not optional:
                raise RuntimeError(f"{cls.__name__}.{names[i]} defaults to None but its type does not allow it")
        _ENCODERS[cls], _DECODERS[code] = _generate(cls)
        _REGISTRY[code] = cls
        _BY_NAME[cls.__name__] = cls
        return cls

    return wrap


class _Packers(threading.local):
    """Reused packers, one per nesting depth and thread.

    ``msgpack.packb`` builds a new ``Packer`` per call; reusing one halves a small
    message's cost. Depth 0 packs frames; deeper ones the extension types of messages in
    open fields (``_default``), which are packed while the frame's packer is busy.
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
    """A message in an open field: an extension type (code, packed fields)."""
    enc = _ENCODERS.get(type(obj))
    if enc is None:
        if isinstance(obj, (set, frozenset)):
            return list(obj)
        raise TypeError(f"cannot encode {type(obj).__name__} in a lumos message")
    local = _packers
    local.depth += 1
    try:
        return msgpack.ExtType(obj._code, _packer(local.depth).pack(enc(obj)))
    finally:
        local.depth -= 1


#: Deepest nesting of messages inside open fields of messages a frame may carry. Real
#: messages nest a few levels; each extension type recurses through ``msgpack.unpackb``
#: on the C stack, and a few kilobytes of nested extension types used to overflow it
#: (SIGSEGV, issue 11). Message-typed fields nest only as deep as the classes do.
MAX_MESSAGE_NESTING = 16


class _Nesting(threading.local):
    def __init__(self) -> None:
        self.depth = 0


_nesting = _Nesting()
_unpackb = msgpack.unpackb


def _ext_hook(code: int, data: bytes) -> Any:
    dec = _DECODERS.get(code)
    if dec is None:
        raise ProtocolError(f"unknown message code {code}")
    local = _nesting
    if local.depth >= MAX_MESSAGE_NESTING:
        raise ProtocolError(f"messages nested more than {MAX_MESSAGE_NESTING} deep")
    local.depth += 1
    try:
        fields = _unpackb(data, ext_hook=_ext_hook, raw=False)
    finally:
        local.depth -= 1
    return dec(fields)


def encode(kind: int, request_id: int, body: Any) -> bytes:
    local = _packers
    depth = local.depth
    stack = local.stack
    try:
        packer = stack[depth] if len(stack) > depth else _packer(depth)
        enc = _ENCODERS.get(body.__class__)
        if enc is not None:
            return packer.pack((kind, request_id, body._code, enc(body)))  # type: ignore[no-any-return]
        return packer.pack((kind, request_id, body))  # type: ignore[no-any-return]
    except BaseException:
        # A failed pack leaves the packer's buffer half-written: start the next one afresh.
        del stack[depth:]
        local.depth = depth
        raise


def decode(payload: bytes) -> tuple[int, int, Any]:
    try:
        obj = _unpackb(payload, ext_hook=_ext_hook, raw=False)
    except ProtocolError:
        raise
    except Exception as e:  # msgpack raises several unrelated types on garbage
        raise ProtocolError(f"undecodable frame: {type(e).__name__}: {e}") from None
    if obj.__class__ is list:
        n = len(obj)
        if n == 4:
            kind, rid, code, fields = obj
            if kind.__class__ is int and rid.__class__ is int:
                dec = _DECODERS.get(code) if code.__class__ is int else None
                if dec is None:
                    raise ProtocolError(f"unknown message code {code!r:.40}")
                return kind, rid, dec(fields)
        elif n == 3:
            kind, rid, body = obj
            if isinstance(kind, int) and isinstance(rid, int):
                return kind, rid, body
    raise ProtocolError("frame is not [kind, request_id, body] or [kind, request_id, code, fields]")
