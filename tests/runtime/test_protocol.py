"""The wire protocol: frames, messages, and hostile peers on every listening socket.

The first half tests ``protocol.framing`` and ``protocol.messages`` as pure code. The
second half starts a private cluster, finds every socket its processes listen on (the
GCS's TCP port and Unix socket, the raylet's, the driver's and each worker's core
worker) and attacks each one with a tiny client written here on plain sockets: random
bytes, oversized length prefixes, a wrong HMAC proof, a reflected or replayed proof,
silence, and malformed msgpack after a correct handshake. Each time the peer must be dropped, the drop logged in that
process's log, every lumos process must keep running and the next task must work.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import hmac
import logging
import os
import random
import socket
import struct
import time
from typing import Any, Iterator

import msgpack
import psutil
import pytest

import lumos
from lumos._private import worker_context
from lumos._private.config import Config
from lumos._private.protocol import auth
from lumos._private.protocol import messages as m
from lumos._private.protocol.framing import HEADER, FrameDecoder, ProtocolError, frame
from lumos._private.protocol.vocab import WIRE_ENUMS

from ..conftest import check_no_leaks, lumos_children, process_gone, start, wait_for

# --------------------------------------------------------------------------- pure: framing


def test_frame_is_little_endian_length_then_payload():
    assert frame(b"abc") == b"\x03\x00\x00\x00abc"
    assert frame(b"") == b"\x00\x00\x00\x00"


def test_decoder_returns_whole_frames_in_order():
    d = FrameDecoder(1024)
    data = frame(b"one") + frame(b"") + frame(b"three")
    assert d.feed(data) == [b"one", b"", b"three"]
    assert d.buffered_bytes == 0


def test_decoder_reassembles_frames_split_at_every_byte():
    payloads = [b"a" * 10, b"", bytes(range(200)), b"xyz"]
    data = b"".join(frame(p) for p in payloads)
    for cut in range(len(data) + 1):
        d = FrameDecoder(1024)
        got = d.feed(data[:cut]) + d.feed(data[cut:])
        assert got == payloads, cut
    d = FrameDecoder(1024)
    got = []
    for i in range(len(data)):
        got += d.feed(data[i:i + 1])
    assert got == payloads
    assert d.buffered_bytes == 0


def test_decoder_joins_a_large_frame_from_its_reads_into_bytes():
    big, small = bytes(range(256)) * 4096, b"next"
    data = frame(big) + frame(small) + HEADER.pack(3)
    d = FrameDecoder(1 << 20)
    got: list[bytes] = []
    for i in range(0, len(data), 65536):
        got += d.feed(data[i:i + 65536])
        assert d.buffered_bytes == min(i + 65536, len(data)) - sum(len(g) + 4 for g in got)
    assert got == [big, small] and all(type(g) is bytes for g in got)
    assert d.buffered_bytes == 4
    assert d.feed(bytearray(b"abc")) == [b"abc"] and d.buffered_bytes == 0


def test_decoder_keeps_incomplete_tail_buffered():
    d = FrameDecoder(1024)
    assert d.feed(frame(b"done") + HEADER.pack(5) + b"ab") == [b"done"]
    assert d.buffered_bytes == 4 + 2
    assert d.feed(b"cde") == [b"abcde"]


def test_decoder_rejects_oversized_length_before_the_body_arrives():
    d = FrameDecoder(100)
    assert d.feed(frame(b"x" * 100)) == [b"x" * 100]  # exactly the limit is fine
    with pytest.raises(ProtocolError, match="exceeds the limit"):
        d.feed(HEADER.pack(101))  # header only: rejected without waiting for 101 bytes
    d = FrameDecoder(1024)
    with pytest.raises(ProtocolError, match="4294967295"):
        d.feed(b"\xff\xff\xff\xff")


def test_decoder_rejects_oversized_frame_split_inside_the_header():
    d = FrameDecoder(1024)
    assert d.feed(b"\x00\x00") == []
    with pytest.raises(ProtocolError):
        d.feed(b"\x10\x00")  # 0x00100000 = 1 MiB > 1024


def test_decoder_limit_can_be_raised_after_auth():
    d = FrameDecoder(8)
    d.max_frame_bytes = 1 << 20
    assert d.feed(frame(b"y" * 5000)) == [b"y" * 5000]


# --------------------------------------------------------------------------- pure: messages


_ID_TYPES = {"JobID", "NodeID", "WorkerID", "ActorID", "TaskID", "ObjectID", "PlacementGroupID"}


def _sample(tp: Any, name: str) -> Any:
    """A non-default value of a message field's annotated type."""
    t = str(tp)
    for enum_name, enum_cls in WIRE_ENUMS.items():
        if t.startswith(enum_name):
            return list(enum_cls)[-1]
    if t.split(" ")[0] in _ID_TYPES:
        return name.encode() + b"\x00\xff"
    if t.startswith("list[ObjectID]"):
        return [b"a", b"b"]
    if t.startswith("Address"):
        return m.Address(b"n" * 16, b"w" * 16, "/tmp/x.sock", "127.0.0.1", 4242)
    if t.startswith("bytes"):
        return name.encode() + b"\x00\xff"
    if t.startswith("str"):
        return f"{name}-ü"
    if t.startswith("int"):
        return 7
    if t.startswith("float"):
        return 1.5
    if t.startswith("bool"):
        return True
    if t.startswith("dict[str, float]"):
        return {"CPU": 1.0, "GPU": 0.5}
    if t.startswith("dict[str, str]"):
        return {"zone": "a"}
    if t.startswith("dict[bytes, int]"):
        return {b"node": 12}
    if t.startswith("dict[str, list"):
        return {"GPU": [[0, 0.5]]}
    if t.startswith("list[bytes]"):
        return [b"a", b"b"]
    if t.startswith("list[bool]"):
        return [True, False]
    if t.startswith("list[int]"):
        return [1, 2]
    if t.startswith("list[float]"):
        return [0.5]
    if t.startswith("list[dict"):
        return [{"CPU": 2.0}]
    if t.startswith("list[Dep]"):
        return [m.Dep(b"o" * 16, _sample("Address", "owner"), b"inline", None)]
    if t.startswith("list[ReturnObject]"):
        return [m.ReturnObject(b"r" * 16, None, 10, b"n" * 16, [])]
    if t.startswith("ReturnObject"):
        return m.ReturnObject(b"r" * 16, b"inline", 6, None, [[b"o" * 16, _sample("Address", "owner")]])
    if t.startswith("RequestWorkerLease"):
        return _instance(m.RequestWorkerLease)
    if t.startswith("list[TaskEvent]"):
        return [m.TaskEvent(b"t" * 16, 0, "RUNNING", 1.0, b"j" * 4)]
    if t.startswith("TaskSpec"):
        return _instance(m.TaskSpec)
    if t.startswith("NodeInfo"):
        return _instance(m.NodeInfo)
    if t.startswith("WorkerInfo"):
        return _instance(m.WorkerInfo)
    if t.startswith("list"):
        return [[b"id", "text", 3]]
    return {"any": [1, "two", None, b"\x00"]}


def _instance(cls: type) -> Any:
    return cls(*[_sample(f.type, f.name) for f in dataclasses.fields(cls)])


ALL_MESSAGES = sorted(m._REGISTRY.items())


@pytest.mark.parametrize("code,cls", ALL_MESSAGES, ids=[c.__name__ for _, c in ALL_MESSAGES])
def test_every_message_class_round_trips(code, cls):
    msg = _instance(cls)
    for kind in (m.REQUEST, m.NOTIFY):
        k, rid, body = m.decode(m.encode(kind, 123456, msg))
        assert (k, rid) == (kind, 123456)
        assert type(body) is cls and body == msg
    # Nested in a reply, and with every defaulted field left at its default.
    required = [f for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    minimal = cls(*[_sample(f.type, f.name) for f in required])
    assert m.decode(m.encode(m.REPLY, 1, [minimal, {"k": minimal}]))[2] == [minimal, {"k": minimal}]


def test_messages_module_names_every_message_and_the_codec():
    # ``m.X`` works for every message class, wherever its area module defines it.
    for cls in m._REGISTRY.values():
        assert getattr(m, cls.__name__) is cls and cls.__name__ in m.__all__
    for name in ("REQUEST", "REPLY", "ERROR", "NOTIFY", "MAX_MESSAGE_NESTING", "encode", "decode", "message",
                 "TaskKind", "RetryPolicy", "ErrorKind", "TaskState"):
        assert hasattr(m, name) and name in m.__all__, name
    assert all(hasattr(m, name) for name in m.__all__)


def test_message_codes_are_unique_and_in_range():
    assert all(0 <= code <= 127 for code in m._REGISTRY)
    assert len({c.__name__ for c in m._REGISTRY.values()}) == len(m._REGISTRY)
    with pytest.raises(RuntimeError, match="used twice"):
        m.message(1)(type("Clash", (), {"__annotations__": {"x": int}}))


def test_encode_rejects_values_that_are_not_messages():
    with pytest.raises(TypeError, match="cannot encode object"):
        m.encode(m.REQUEST, 1, object())
    # The failed pack must not poison the reused packer for the next message.
    assert m.decode(m.encode(m.REQUEST, 2, m.GetAllNodes())) == (m.REQUEST, 2, m.GetAllNodes())


def test_sets_travel_as_lists():
    assert m.decode(m.encode(m.REPLY, 1, {1, 2}))[2] in ([1, 2], [2, 1])


# --------------------------------------------------------------------------- pure: enum fields

#: Every message field annotated with a wire enum: (class, field, enum, None allowed).
ENUM_FIELDS = [(cls, f.name, WIRE_ENUMS[str(f.type).split(" ")[0]], optional)
               for _, cls in ALL_MESSAGES for i, _t, _members, optional in cls._enum_fields
               for f in [dataclasses.fields(cls)[i]]]
_ENUM_IDS = [f"{cls.__name__}.{name}" for cls, name, _e, _o in ENUM_FIELDS]


def test_the_wire_enums_are_declared_on_their_fields():
    assert {(cls.__name__, name, e.__name__) for cls, name, e, _o in ENUM_FIELDS} == {
        ("TaskSpec", "kind", "TaskKind"), ("TaskSpec", "retry_exceptions", "RetryPolicy"),
        ("TaskReply", "error_kind", "ErrorKind"), ("TaskEvent", "state", "TaskState"),
        ("PackedTaskRow", "state", "TaskState"), ("ObjectStatus", "status", "ObjectState"),
        ("WorkerInfo", "exit_type", "WorkerExitType"), ("KillWorker", "exit_type", "WorkerExitType"),
        ("ReturnWorker", "exit_type", "WorkerExitType")}


def test_enum_members_are_their_wire_values():
    # Values of today's wire format: an older peer and a not-yet-converted comparison agree.
    assert [int(k) for k in m.TaskKind] == [0, 1, 2]
    assert [int(p) for p in m.RetryPolicy] == [0, 1, 2]
    assert [int(s) for s in m.ObjectState] == [0, 1, 2, 3]
    assert m.ErrorKind.ACTOR_DIED == "actor_died" and m.TaskState.RUNNING == "RUNNING"
    assert msgpack.packb(m.TaskKind.ACTOR_TASK) == msgpack.packb(2)
    assert msgpack.packb(m.TaskState.FAILED) == msgpack.packb("FAILED")


def _with(cls: type, name: str, value: Any) -> Any:
    msg = _instance(cls)
    setattr(msg, name, value)
    return msg


@pytest.mark.parametrize("cls,name,enum_cls,optional", ENUM_FIELDS, ids=_ENUM_IDS)
def test_enum_field_round_trips_every_member_as_the_enum(cls, name, enum_cls, optional):
    for member in enum_cls:
        for sent in (member, member.value):  # a plain wire value decodes to the member too
            body = m.decode(m.encode(m.REQUEST, 1, _with(cls, name, sent)))[2]
            got = getattr(body, name)
            assert type(got) is enum_cls and got is member
    if optional:
        assert getattr(m.decode(m.encode(m.REQUEST, 1, _with(cls, name, None)))[2], name) is None


@pytest.mark.parametrize("cls,name,enum_cls,optional", ENUM_FIELDS, ids=_ENUM_IDS)
def test_enum_field_rejects_unknown_and_ill_typed_values(cls, name, enum_cls, optional):
    wrong = [99, -1, "bogus", True, 1.0, b"RUNNING", [0], {"k": 1}] + ([] if optional else [None])
    # The other wire type's spelling of a member is ill-typed too ("0" for 0, 1 for "x").
    wrong.append(str(next(iter(enum_cls)).value) if issubclass(enum_cls, int) else 1)
    for value in wrong:
        with pytest.raises(ProtocolError, match=f"{cls.__name__}: {name}="):
            m.decode(m.encode(m.REQUEST, 1, _with(cls, name, value)))
    # Also nested inside another message (a TaskSpec inside a PushTask).
    if cls is m.TaskSpec:
        with pytest.raises(ProtocolError):
            m.decode(m.encode(m.REQUEST, 1, m.PushTask(_with(cls, name, 99), {})))


def _nested_ext(levels: int) -> bytes:
    """A message whose only field is a message whose only field is ... (``levels`` deep).

    200 levels is 721 bytes; before nesting was bounded it overflowed the C stack of any
    process that decoded it (SIGSEGV)."""
    inner = msgpack.packb(None)
    for _ in range(levels):
        inner = msgpack.packb(msgpack.ExtType(m.Address._code, inner))
    return msgpack.packb([0, 1, msgpack.ExtType(m.Address._code, inner)])


def _ext_in_deep_arrays(levels: int) -> bytes:
    """Messages nested inside one-element arrays inside messages, ``levels`` times."""
    inner = msgpack.packb(None)
    for _ in range(levels):
        inner = msgpack.packb([[msgpack.ExtType(m.KvGet._code, inner)]])
    return msgpack.packb([0, 1, msgpack.ExtType(m.KvGet._code, inner)])


MALFORMED_PAYLOADS = {
    "reserved_byte": b"\xc1",
    "empty": b"",
    "truncated_array": b"\x93\x00",
    "trailing_garbage": msgpack.packb([0, 1, None]) + b"\x00",
    "not_a_list": msgpack.packb({"kind": 0}),
    "short_list": msgpack.packb([0, 1]),
    "string_kind": msgpack.packb(["0", 1, None]),
    "unknown_ext_code": msgpack.packb([0, 1, msgpack.ExtType(127, msgpack.packb([]))]),
    "ext_fields_not_a_list": msgpack.packb([0, 1, msgpack.ExtType(m.Address._code, msgpack.packb(5))]),
    "ext_wrong_arity": msgpack.packb([0, 1, msgpack.ExtType(m.GetAllNodes._code, msgpack.packb([1, 2, 3]))]),
    "ext_garbage": msgpack.packb([0, 1, msgpack.ExtType(m.KvGet._code, b"\xc1\xc1")]),
    "huge_declared_bin": b"\x93\x00\x01\xc6\xff\xff\xff\xff",
    "deep_nesting": b"\x93\x00\x01" + b"\x91" * 200_000 + b"\xc0",
    "nested_ext": _nested_ext(200),
    "nested_ext_deep": _nested_ext(5000),
    "ext_in_deep_arrays": _ext_in_deep_arrays(2000),
    "deep_array_in_ext": msgpack.packb([0, 1, msgpack.ExtType(m.KvGet._code, b"\x91" * 200_000 + b"\xc0")]),
    "random": random.Random(7).randbytes(512),
    # A TaskReply whose error_kind is no ErrorKind (the enum fields are checked on decode).
    "unknown_enum_value": msgpack.packb([0, 1, msgpack.ExtType(m.TaskReply._code, msgpack.packb(
        [b"t", [], False, False, [], b"w", 0.0, 0.0, "x", "no-such-kind"]))]),
}


@pytest.mark.parametrize("name", sorted(MALFORMED_PAYLOADS))
def test_decode_turns_any_malformed_frame_into_protocol_error(name):
    with pytest.raises(ProtocolError):
        m.decode(MALFORMED_PAYLOADS[name])


def test_decode_survives_random_garbage():
    rng = random.Random(1234)
    for i in range(3000):
        data = rng.randbytes(rng.randrange(1, 64))
        try:
            m.decode(data)
        except ProtocolError:
            pass
        # Anything else (a msgpack exception type, RecursionError, ...) fails the test.


# --------------------------------------------------------------------------- pure: the flat frame form


def _flat(code: Any, fields: Any, kind: Any = 0, rid: Any = 1) -> bytes:
    """A ``[kind, request_id, code, fields]`` frame, packed by plain msgpack."""
    return msgpack.packb([kind, rid, code, fields], use_bin_type=True)


def _wire_fields(msg: Any) -> list[Any]:
    """A message's fields as the codec writes them (nested messages as lists)."""
    return msgpack.unpackb(m.encode(m.REQUEST, 1, msg), raw=False)[3]


def _push_fields() -> list[Any]:
    return _wire_fields(_instance(m.PushTask))


def test_a_message_body_is_one_flat_list_with_nested_messages_as_field_lists():
    msg = _instance(m.PushTask)
    raw = msgpack.unpackb(m.encode(m.REQUEST, 7, msg), raw=False)  # no ext_hook: none may be needed
    assert raw[:3] == [m.REQUEST, 7, m.PushTask._code]
    spec = raw[3][0]
    assert spec[0] == msg.spec.task_id and spec[15] == list(m.Address._fields_of(msg.spec.owner))
    assert spec[8] == [[d.object_id, list(m.Address._fields_of(d.owner)), d.data, d.node_id, d.slot]
                       for d in msg.spec.deps]
    # A message in an open field (here a reply's list) stays an extension type.
    reply = msgpack.unpackb(m.encode(m.REPLY, 1, [msg.spec.owner]), raw=False)
    assert reply[2][0].code == m.Address._code


def test_frames_with_every_nested_message_an_extension_type_still_decode():
    # What earlier codecs wrote (and a GCS table in Redis may still hold).
    def old(obj: Any) -> Any:
        if dataclasses.is_dataclass(obj):
            return msgpack.ExtType(obj._code, msgpack.packb(list(type(obj)._fields_of(obj)), default=old,
                                                            use_bin_type=True))
        raise TypeError(obj)
    for msg in (_instance(m.PushTask), _instance(m.TaskReply), _instance(m.RegisterNode)):
        assert m.decode(msgpack.packb([m.NOTIFY, 0, msg], default=old, use_bin_type=True))[2] == msg


def test_left_out_defaulted_fields_take_their_defaults():
    full = _instance(m.PlacementGroupInfo)
    fields = _wire_fields(full)
    a = m.decode(_flat(m.PlacementGroupInfo._code, fields[:-4]))[2]
    b = m.decode(_flat(m.PlacementGroupInfo._code, fields[:-4]))[2]
    assert (a.detail, a.version, a.bundle_gpu_ids, a.bundle_labels) == ("", 0, [], [])
    assert a.bundle_gpu_ids is not b.bundle_gpu_ids  # a default_factory runs per message
    reply = m.decode(_flat(m.TaskReply._code, _wire_fields(_instance(m.TaskReply))[:-3]))[2]
    assert reply.system_error is None and reply.error_kind is None and reply.kept is None


def _spec_with(i: int, value: Any) -> list[Any]:
    fields = _push_fields()
    fields[0][i] = value
    return fields


#: Flat frames each check of the generated decoders must refuse.
MALFORMED_FLAT = {
    "unknown_code": _flat(127, []),
    "code_not_an_int": _flat("60", _push_fields()),
    "kind_not_an_int": _flat(m.PushTask._code, _push_fields(), kind="0"),
    "rid_is_a_float": _flat(m.PushTask._code, _push_fields(), rid=1.0),
    "fields_not_a_list": _flat(m.PushTask._code, {"spec": 1}),
    "too_few_fields": _flat(m.PushTask._code, _push_fields()[:1]),
    "too_many_fields": _flat(m.PushTask._code, _push_fields() + [None]),
    "no_fields_for_a_message_with_required_ones": _flat(m.KvGet._code, []),
    "fields_for_a_message_without_any": _flat(m.GetAllNodes._code, [1]),
    "nested_message_not_a_list": _flat(m.PushTask._code, [5, {}]),
    "nested_message_is_none": _flat(m.PushTask._code, [None, {}]),
    "nested_message_wrong_arity": _flat(m.PushTask._code, [_push_fields()[0][:5], {}]),
    "nested_message_of_another_class": msgpack.packb([0, 1, m.PushTask._code, [msgpack.ExtType(
        m.Address._code, msgpack.packb(_push_fields()[0][15])), {}]]),
    "address_not_a_list": _flat(m.PushTask._code, _spec_with(15, "127.0.0.1:1")),
    "address_wrong_arity": _flat(m.PushTask._code, _spec_with(15, [b"n", b"w", "", "h"])),
    "address_is_none": _flat(m.PushTask._code, _spec_with(15, None)),
    "deps_not_a_list": _flat(m.PushTask._code, _spec_with(8, {"a": 1})),
    "dep_not_a_list": _flat(m.PushTask._code, _spec_with(8, [b"object-id"])),
    "dep_wrong_arity": _flat(m.PushTask._code, _spec_with(8, [[b"object-id"]])),
    "dep_owner_bad": _flat(m.PushTask._code, _spec_with(8, [[b"o", 1, None, None]])),
    "enum_in_nested_message": _flat(m.PushTask._code, _spec_with(3, 99)),
    "enum_bool_in_nested_message": _flat(m.PushTask._code, _spec_with(13, True)),
    "optional_address_wrong": _flat(m.GetObjectStatus._code, [b"o", False, "x"]),
    "reply_item_wrong": _flat(m.TaskReply._code, [b"t", [[b"o"]], False, False, [], b"w", 0.0, 0.0]),
    "returns_none": _flat(m.TaskReply._code, [b"t", None, False, False, [], b"w", 0.0, 0.0]),
    "enum_of_a_top_level_message": _flat(m.TaskReply._code, [b"t", [], False, False, [], b"w", 0.0, 0.0, None, 5]),
    "open_field_nests_too_deep": _flat(m.PushTask._code, _spec_with(18, msgpack.ExtType(
        m.KvGet._code, _nested_ext(5000)))),
    "typed_field_holds_deeply_nested_exts": _flat(m.PushTask._code, [msgpack.ExtType(
        m.TaskSpec._code, _nested_ext(300)), {}]),
    "five_elements": msgpack.packb([0, 1, m.PushTask._code, _push_fields(), None]),
}


@pytest.mark.parametrize("name", sorted(MALFORMED_FLAT))
def test_flat_frames_with_any_malformed_part_are_protocol_errors(name):
    with pytest.raises(ProtocolError):
        m.decode(MALFORMED_FLAT[name])


def _mutate(rng: random.Random, value: Any, depth: int = 0) -> Any:
    """``value`` with one random part replaced, dropped or duplicated."""
    if isinstance(value, list) and value and depth < 6 and rng.random() < 0.7:
        i = rng.randrange(len(value))
        out = list(value)
        r = rng.random()
        if r < 0.1:
            del out[i]
        elif r < 0.2:
            out.insert(i, out[i])
        else:
            out[i] = _mutate(rng, value[i], depth + 1)
        return out
    return rng.choice([None, True, 0, -1, 99, 2**40, 1.5, "", "RUNNING", "x" * 40, b"", b"id", [], [None],
                       [[]], {}, {"k": [1]}, msgpack.ExtType(m.Address._code, b"\xc1"),
                       msgpack.ExtType(m.Address._code, msgpack.packb([b"n", b"w", "", "h", 1]))])


def test_flat_frames_with_random_parts_replaced_decode_or_raise_protocol_error():
    rng = random.Random(19)
    bases = [msgpack.unpackb(m.encode(m.REQUEST, 1, _instance(cls)), raw=False)
             for cls in (m.PushTask, m.TaskReply, m.RegisterNode, m.GeneratorItem, m.RequestSpilledLease,
                         m.ObjectStatus, m.GetObjectStatus, m.ActorInfo)]
    refused = 0
    for _ in range(3000):
        data = msgpack.packb(_mutate(rng, rng.choice(bases)), use_bin_type=True)
        try:
            m.decode(data)
        except ProtocolError:
            refused += 1
        # Anything else (ValueError from a wrong arity, TypeError, ...) fails the test.
    assert 300 < refused < 2900  # both outcomes were exercised


def test_the_flat_checks_name_the_message_and_field():
    with pytest.raises(ProtocolError, match="malformed PushTask: 1 fields, expected 2"):
        m.decode(MALFORMED_FLAT["too_few_fields"])
    with pytest.raises(ProtocolError, match="malformed TaskSpec: owner=None is not a Address"):
        m.decode(MALFORMED_FLAT["address_is_none"])
    with pytest.raises(ProtocolError, match="malformed Dep: fields are a bytes"):
        m.decode(MALFORMED_FLAT["dep_not_a_list"])
    with pytest.raises(ProtocolError, match="TaskSpec: kind=99 is not a TaskKind"):
        m.decode(MALFORMED_FLAT["enum_in_nested_message"])
    # And the well-formed frame they were made from decodes.
    assert m.decode(_flat(m.PushTask._code, _push_fields()))[2] == _instance(m.PushTask)
    ok = m.decode(_flat(m.GetObjectStatus._code, [b"o", False, None]))[2]
    assert ok.borrower is None and ok.lost_node is None


def test_auth_proofs_check_token_both_nonces_direction_and_length():
    cn = auth.new_nonce()
    assert len(cn) == auth.NONCE_BYTES and cn != auth.new_nonce()
    hello, sn = auth.server_hello(b"token-a", cn)
    assert auth.check_server_hello(b"token-a", cn, hello) == sn
    assert auth.check_server_hello(b"token-b", cn, hello) is None
    assert auth.check_server_hello(b"token-a", auth.new_nonce(), hello) is None
    assert auth.check_server_hello(b"token-a", cn, hello[:-1]) is None
    proof = auth.client_proof(b"token-a", cn, sn)
    assert auth.check_client_proof(b"token-a", cn, sn, proof)
    assert not auth.check_client_proof(b"token-b", cn, sn, proof)
    assert not auth.check_client_proof(b"token-a", cn, auth.new_nonce(), proof)
    assert not auth.check_client_proof(b"token-a", auth.new_nonce(), sn, proof)
    assert not auth.check_client_proof(b"token-a", cn, sn, proof[:-1])
    assert not auth.check_client_proof(b"token-a", cn, sn, b"")
    # Direction labels: the server's proof is never a client's proof, and back.
    assert not auth.check_client_proof(b"token-a", cn, sn, hello[auth.NONCE_BYTES:])
    assert auth.check_server_hello(b"token-a", cn, sn + proof) is None


# --------------------------------------------------------------------------- a raw client


class RawPeer:
    """A hand-written protocol client on a plain socket."""

    def __init__(self, ep: "Endpoint") -> None:
        if ep.transport == "unix":
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(5)
            self.sock.connect(ep.address)
        else:
            self.sock = socket.create_connection(ep.address, timeout=5)
        self.buf = b""

    def __enter__(self) -> "RawPeer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.sock.close()

    def _read(self, n: int) -> bytes:
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError(f"closed after {len(self.buf)} bytes")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def recv_frame(self) -> bytes:
        (n,) = HEADER.unpack(self._read(4))
        return self._read(n)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_frame(self, payload: bytes) -> None:
        self.send(frame(payload))

    def hello(self, client_nonce: bytes | None = None) -> tuple[bytes, bytes, bytes]:
        """Send a client nonce; return it with the server's nonce and proof (unchecked)."""
        cn = auth.new_nonce() if client_nonce is None else client_nonce
        self.send_frame(auth.client_hello(cn))
        hello = self.recv_frame()
        assert len(hello) == auth.SERVER_HELLO_BYTES
        return cn, hello[:auth.NONCE_BYTES], hello[auth.NONCE_BYTES:]

    def handshake(self, token: bytes) -> None:
        cn, sn, proof = self.hello()
        assert auth.check_server_hello(token, cn, sn + proof) == sn, "the server's proof does not hold"
        self.send_frame(auth.client_proof(token, cn, sn))
        assert self.recv_frame() == auth.OK

    def call(self, msg: Any, rid: int = 1) -> tuple[int, int, Any]:
        self.send_frame(m.encode(m.REQUEST, rid, msg))
        return m.decode(self.recv_frame())

    def expect_closed(self, timeout_s: float = 5.0) -> bytes:
        """Wait for the server to close; return whatever it still sent first."""
        self.sock.settimeout(0.2)
        got = self.buf
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                chunk = self.sock.recv(65536)
            except socket.timeout:
                continue
            except (ConnectionResetError, BrokenPipeError):
                return got
            if not chunk:
                return got
            got += chunk
        raise AssertionError(f"the server did not drop the connection within {timeout_s}s")


# --------------------------------------------------------------------------- the cluster


@dataclasses.dataclass
class Endpoint:
    role: str          # gcs, raylet, driver, worker
    transport: str     # unix, tcp
    address: Any       # path or (host, port)
    pid: int
    log: str | None    # the process's log file (None: the driver, checked through caplog)

    @property
    def id(self) -> str:
        return f"{self.role}-{self.transport}"


#: A short handshake deadline so silent peers are dropped quickly; every drop logged.
PROTOCOL_CONFIG = {"handshake_timeout_s": 1.0, "peer_warning_interval_s": 0.0}


@pytest.fixture(scope="class")
def proto_cluster() -> Iterator[dict[str, Any]]:
    ctx = start(num_cpus=2, _system_config=PROTOCOL_CONFIG)
    session = ctx.address_info["session_dir"]
    try:
        assert lumos.get(echo.remote(0), timeout=30) == 0
        _wait_for_two_workers(session)
        with open(os.path.join(session, "token"), "rb") as f:
            token = f.read().strip()
        yield {"ctx": ctx, "session": session, "token": token,
               "pids": {p.pid for p in lumos_children()}}
    finally:
        lumos.shutdown()
        check_no_leaks(session)


@lumos.remote
def echo(x):
    return x


def _wait_for_two_workers(session: str) -> None:
    """The fresh cluster's two pre-started workers are known to the GCS; if not, fail
    with what the GCS and the raylet's process table say (the summary line shows it)."""
    try:
        wait_for(lambda: len(_workers()) >= 2, 60)
    except AssertionError:
        cw = worker_context.require()
        table = [(w.state, w.pid, w.is_driver) for w in cw.call_gcs(m.GetAllWorkers())]
        procs = [p.pid for p in lumos_children() if "lumos._private.worker.main" in " ".join(p.cmdline())]
        outs = sorted(glob.glob(os.path.join(session, "logs", "worker-*.out")))
        raise AssertionError(f"fewer than 2 workers after 60 s: GCS table {table}, worker processes {procs}, "
                             f"{len(outs)} worker logs") from None


def _workers() -> list[m.WorkerInfo]:
    cw = worker_context.require()
    return [w for w in cw.call_gcs(m.GetAllWorkers())
            if w.state == "ALIVE" and not w.is_driver and psutil.pid_exists(w.pid)]


def _pid_of(module: str) -> int:
    (p,) = [p for p in lumos_children() if module in " ".join(p.cmdline())]
    return p.pid


def endpoints(session: str) -> list[Endpoint]:
    """Every socket a lumos process of this cluster listens on, found from the GCS tables."""
    cw = worker_context.require()
    logs = os.path.join(session, "logs")
    gcs_host, gcs_port = worker_context.context.address_info["gcs_address"].rsplit(":", 1)
    gcs_pid = _pid_of("lumos._private.gcs.server")
    (node,) = lumos.nodes()
    raylet_pid = _pid_of("lumos._private.raylet.server")
    raylet_log = os.path.join(logs, f"raylet-{node['NodeID'][:12]}.log")
    out = [
        Endpoint("gcs", "tcp", (gcs_host, int(gcs_port)), gcs_pid, os.path.join(logs, "gcs.log")),
        Endpoint("gcs", "unix", os.path.join(session, "sockets", "gcs.sock"), gcs_pid,
                 os.path.join(logs, "gcs.log")),
        Endpoint("raylet", "unix", node["RayletSocketName"], raylet_pid, raylet_log),
        Endpoint("raylet", "tcp", (node["NodeManagerAddress"], node["NodeManagerPort"]), raylet_pid, raylet_log),
        Endpoint("driver", "unix", cw.address.unix_path, os.getpid(), None),
        Endpoint("driver", "tcp", (cw.address.host, cw.address.port), os.getpid(), None),
    ]
    # The object manager's data channel: a raw (unframed) TCP protocol on another raylet port.
    for c in psutil.Process(raylet_pid).net_connections(kind="inet"):
        if c.status == psutil.CONN_LISTEN and c.laddr.port != node["NodeManagerPort"]:
            out.append(Endpoint("raylet-data", "tcp", (c.laddr.ip, c.laddr.port), raylet_pid, raylet_log))
    for i, w in enumerate(sorted(_workers(), key=lambda w: w.pid)):
        log = os.path.join(logs, f"worker-{w.worker_id.hex()[:12]}.log")
        out.append(Endpoint(f"worker{i}", "unix", w.address.unix_path, w.pid, log))
        out.append(Endpoint(f"worker{i}", "tcp", (w.address.host, w.address.port), w.pid, log))
    return out


def _log_drops(ep: Endpoint, caplog: pytest.LogCaptureFixture) -> int:
    if ep.log is None:
        return sum(1 for r in caplog.records if "dropping connection" in r.getMessage())
    try:
        with open(ep.log, errors="replace") as f:
            return f.read().count("dropping connection")
    except FileNotFoundError:
        return 0


def _attack(name: str, peer: RawPeer, token: bytes) -> None:
    """Do one hostile thing to ``peer``'s server."""
    if name == "random_bytes":
        peer.send(random.Random(11).randbytes(4096))
    elif name == "random_bytes_before_the_nonce_is_read":
        peer.send(random.Random(12).randbytes(64))
    elif name == "random_frame_as_auth_answer":
        peer.hello()
        peer.send_frame(random.Random(13).randbytes(auth.DIGEST_BYTES))
    elif name == "oversized_length_before_auth":
        peer.send(struct.pack("<I", 0xFFFFFFF0) + b"x" * 100)
    elif name == "length_just_above_preauth_limit":
        peer.send(struct.pack("<I", Config.max_preauth_frame_bytes + 1))
    elif name == "short_client_nonce":
        peer.send_frame(b"n" * (auth.NONCE_BYTES - 1))
    elif name == "wire_version_tag_cut_short":
        peer.send_frame(auth.client_hello(auth.new_nonce())[:-1])
    elif name == "another_wire_version":
        peer.send_frame(auth.new_nonce() + b"lumos-wire" + (auth.WIRE_VERSION + 1).to_bytes(2, "big"))
    elif name == "wrong_token":
        cn, sn, _ = peer.hello()
        peer.send_frame(auth.client_proof(b"not-the-cluster-token", cn, sn))
    elif name == "answer_for_another_nonce":
        cn, _, _ = peer.hello()
        peer.send_frame(auth.client_proof(token, cn, auth.new_nonce()))
    elif name == "servers_proof_reflected":
        _, _, proof = peer.hello()
        peer.send_frame(proof)  # the server's own proof, sent back as the client's
    elif name == "old_one_way_answer":
        _, sn, _ = peer.hello()
        peer.send_frame(hmac.new(token, sn, hashlib.sha256).digest())
    elif name == "recorded_proof_replayed":
        # A proof seen on another (real) connection, replayed with that connection's nonce.
        cn = b"r" * auth.NONCE_BYTES
        peer.hello(cn)
        peer.send_frame(auth.client_proof(token, cn, b"s" * auth.NONCE_BYTES))
    elif name == "message_before_auth":
        peer.send_frame(m.encode(m.REQUEST, 1, m.GetAllNodes()))
    elif name == "message_after_nonce_before_proof":
        peer.hello()
        peer.send_frame(m.encode(m.REQUEST, 1, m.GetAllNodes()))
    elif name == "silence":
        pass  # nothing at all: the handshake deadline drops us
    elif name == "silence_after_nonce":
        peer.hello()
    elif name == "half_a_header":
        peer.hello()
        peer.send(b"\x20\x00")
    elif name == "oversized_length_after_auth":
        peer.handshake(token)
        peer.send(struct.pack("<I", 0xFFFFFFFF))
    elif name.startswith("malformed:"):
        peer.handshake(token)
        peer.send_frame(MALFORMED_PAYLOADS[name.split(":", 1)[1]])
    elif name == "unknown_frame_kind":
        peer.handshake(token)
        peer.send_frame(msgpack.packb([9, 1, None]))
    elif name == "message_the_server_does_not_handle":
        peer.handshake(token)
        peer.send_frame(m.encode(m.REQUEST, 1, m.DropSlots([1])))  # only core-worker->raylet clients get it
    else:
        raise AssertionError(name)


ATTACKS = [
    "random_bytes", "random_bytes_before_the_nonce_is_read", "random_frame_as_auth_answer",
    "oversized_length_before_auth", "length_just_above_preauth_limit", "short_client_nonce", "wire_version_tag_cut_short",
    "another_wire_version", "wrong_token",
    "answer_for_another_nonce", "servers_proof_reflected", "old_one_way_answer", "recorded_proof_replayed",
    "message_before_auth", "message_after_nonce_before_proof", "silence", "silence_after_nonce", "half_a_header",
    "oversized_length_after_auth", "unknown_frame_kind", "message_the_server_does_not_handle",
] + [f"malformed:{k}" for k in sorted(MALFORMED_PAYLOADS) if k != "empty"]

POST_AUTH = {a for a in ATTACKS if a.startswith("malformed:")} | {
    "oversized_length_after_auth", "unknown_frame_kind", "message_the_server_does_not_handle"}

ROLES = ["gcs-tcp", "gcs-unix", "raylet-unix", "raylet-tcp", "driver-unix", "driver-tcp",
         "worker0-unix", "worker0-tcp", "worker1-unix", "worker1-tcp"]


def _frames(data: bytes) -> list[bytes]:
    """The whole frames in ``data``."""
    out = []
    while len(data) >= 4:
        (n,) = HEADER.unpack(data[:4])
        if len(data) < 4 + n:
            break
        out.append(data[4:4 + n])
        data = data[4 + n:]
    return out


def _check_still_serving(proto_cluster: dict[str, Any], nonce: int) -> None:
    gone = [pid for pid in proto_cluster["pids"] if process_gone(pid)]
    assert not gone, f"lumos processes died: {gone}"
    assert lumos.get(echo.remote(nonce), timeout=30) == nonce


class TestHostilePeers:
    """One cluster (class scope) attacked on every socket; torn down before other clusters start."""

    def test_endpoints_cover_every_listening_socket(self, proto_cluster):
        """No socket of the cluster escapes the attacks below. (Read again until the
        cluster is settled: a worker the pool is starting listens before the GCS lists it
        alive, as the loaded full suite once met.)"""
        seen: dict[str, Any] = {}

        def settled() -> bool:
            eps = endpoints(proto_cluster["session"])
            assert {e.role for e in eps} >= {"gcs", "raylet", "raylet-data", "driver", "worker0", "worker1"}
            seen["unix"] = {e.address for e in eps if e.transport == "unix"}
            seen["files"] = set(glob.glob(os.path.join(proto_cluster["session"], "sockets", "*")))
            seen["tcp"] = {(e.pid, e.address[1]) for e in eps if e.transport == "tcp"}
            procs = [psutil.Process()] + [p for p in lumos_children() if "dashboard" not in " ".join(p.cmdline())]
            listening = set()
            for p in procs:
                try:
                    conns = p.net_connections(kind="inet")
                except psutil.NoSuchProcess:
                    continue
                for c in conns:
                    if c.status == psutil.CONN_LISTEN:
                        listening.add((p.pid, c.laddr.port))
                        assert c.laddr.ip == "127.0.0.1", f"pid {p.pid} listens on {c.laddr.ip}"
            seen["listening"] = listening
            return seen["files"] == seen["unix"] and listening == seen["tcp"]

        deadline = time.time() + 20
        while not settled() and time.time() < deadline:
            time.sleep(0.2)
        unix, files = seen["unix"], seen["files"]
        assert files == unix, f"socket files nobody attacks: {files - unix}; missing: {unix - files}"
        assert seen["listening"] == seen["tcp"], f"TCP ports nobody attacks: {seen['listening'] - seen['tcp']}"

    @pytest.mark.parametrize("attack", ATTACKS)
    @pytest.mark.parametrize("target", ROLES)
    def test_hostile_peer_is_dropped_logged_and_cluster_keeps_working(self, proto_cluster, caplog, target, attack):
        caplog.set_level(logging.WARNING)
        (ep,) = [e for e in endpoints(proto_cluster["session"]) if e.id == target]
        before = _log_drops(ep, caplog)
        with RawPeer(ep) as peer:
            _attack(attack, peer, proto_cluster["token"])
            sent_back = peer.expect_closed()
        if attack not in POST_AUTH:
            assert auth.OK not in _frames(sent_back), "an unauthenticated peer was told ok"
        wait_for(lambda: _log_drops(ep, caplog) > before, 5)
        _check_still_serving(proto_cluster, hash((target, attack)) & 0xFFFF)

    @pytest.mark.parametrize("target", ROLES)
    def test_correct_handshake_is_accepted_on_every_socket(self, proto_cluster, target):
        """The control for the attacks: the same client with the right token gets served."""
        (ep,) = [e for e in endpoints(proto_cluster["session"]) if e.id == target]
        probe = {"gcs": m.GetAllNodes(), "raylet": m.GetNodeStats()}.get(ep.role, m.GetCoreWorkerStats())
        with RawPeer(ep) as peer:
            peer.handshake(proto_cluster["token"])
            kind, rid, body = peer.call(probe, rid=77)
            assert (kind, rid) == (m.REPLY, 77)
            assert body
            # A request for an unknown id's reply is ignored; the connection stays usable.
            peer.send_frame(m.encode(m.REPLY, 999, None))
            kind, rid, _ = peer.call(probe, rid=78)
            assert (kind, rid) == (m.REPLY, 78)

    def test_many_concurrent_unauthenticated_peers_do_not_starve_the_cluster(self, proto_cluster):
        eps = [e for e in endpoints(proto_cluster["session"]) if e.role in ("gcs", "raylet")]
        peers = [RawPeer(e) for e in eps for _ in range(25)]
        try:
            for p in peers:
                p.send(b"\x01")  # a started header, then silence
            assert lumos.get([echo.remote(i) for i in range(20)], timeout=30) == list(range(20))
            for p in peers:
                p.expect_closed(10)
        finally:
            for p in peers:
                p.sock.close()
        _check_still_serving(proto_cluster, 5)


class TestObjectTransferDataChannel:
    """The raylet's data channel: the handshake of ``protocol.auth`` as raw bytes, then
    ``[n][object id][offset, length]`` requests answered with a signed length and the
    bytes (no msgpack framing)."""

    @staticmethod
    def _ep(proto_cluster: dict[str, Any]) -> Endpoint:
        (ep,) = [e for e in endpoints(proto_cluster["session"]) if e.role == "raylet-data"]
        return ep

    @staticmethod
    def _hello(peer: RawPeer) -> tuple[bytes, bytes, bytes]:
        cn = auth.new_nonce()
        peer.send(cn)
        hello = peer._read(auth.SERVER_HELLO_BYTES)
        return cn, hello[:auth.NONCE_BYTES], hello[auth.NONCE_BYTES:]

    @classmethod
    def _auth(cls, peer: RawPeer, token: bytes) -> None:
        cn, sn, proof = cls._hello(peer)
        assert auth.check_server_hello(token, cn, sn + proof) == sn
        peer.send(auth.client_proof(token, cn, sn))
        assert peer._read(len(auth.OK)) == auth.OK

    @staticmethod
    def _request(peer: RawPeer, object_id: bytes, offset: int, length: int) -> bytes | None:
        peer.send(bytes([len(object_id)]) + object_id + struct.pack("<QQ", offset, length))
        (n,) = struct.unpack("<q", peer._read(8))
        return None if n < 0 else peer._read(n)

    def test_authenticated_reads_serve_store_bytes(self, proto_cluster):
        import numpy as np
        ref = lumos.put(np.arange(1_000_000, dtype=np.int64))
        path = os.path.join(glob.glob(f"/dev/shm/lumos-{os.path.basename(proto_cluster['session'])}-*")[0],
                            ref.hex())
        with open(path, "rb") as f:
            content = f.read()
        with RawPeer(self._ep(proto_cluster)) as peer:
            self._auth(peer, proto_cluster["token"])
            assert self._request(peer, ref.binary(), 0, 4096) == content[:4096]
            assert self._request(peer, ref.binary(), len(content) - 10, 10) == content[-10:]
            # Out of range and unknown objects are refused; the connection stays usable.
            assert self._request(peer, ref.binary(), 0, len(content) + 1) is None
            assert self._request(peer, ref.binary(), 2 ** 64 - 1, 1) is None
            assert self._request(peer, b"\x07" * 20, 0, 1) is None
            assert self._request(peer, b"../../../../etc/passwd"[:20], 0, 1) is None
            assert self._request(peer, ref.binary(), 8, 8) == content[8:16]
        _check_still_serving(proto_cluster, 41)

    @pytest.mark.parametrize("attack", ["random_bytes", "wrong_token", "silence", "oversized_id",
                                        "request_before_auth", "servers_proof_reflected"])
    def test_hostile_peer_is_dropped_and_logged(self, proto_cluster, attack):
        ep = self._ep(proto_cluster)
        before = _log_drops_any(ep.log)
        with RawPeer(ep) as peer:
            if attack == "random_bytes":
                peer.send(random.Random(5).randbytes(4096))
            elif attack == "wrong_token":
                cn, sn, _ = self._hello(peer)
                peer.send(auth.client_proof(b"wrong", cn, sn))
            elif attack == "silence":
                self._hello(peer)
            elif attack == "servers_proof_reflected":
                _, _, proof = self._hello(peer)
                peer.send(proof)
            elif attack == "oversized_id":
                self._auth(peer, proto_cluster["token"])
                peer.send(bytes([200]) + b"x" * 200)
            elif attack == "request_before_auth":
                self._hello(peer)
                peer.send(bytes([20]) + b"\x01" * 20 + struct.pack("<QQ", 0, 100))
            sent_back = peer.expect_closed()
        if attack != "oversized_id":
            assert auth.OK not in sent_back
        wait_for(lambda: _log_drops_any(ep.log) > before, 5)
        _check_still_serving(proto_cluster, 42)

    def test_many_silent_peers_are_all_dropped(self, proto_cluster):
        ep = self._ep(proto_cluster)
        peers = [RawPeer(ep) for _ in range(50)]
        try:
            assert lumos.get([echo.remote(i) for i in range(10)], timeout=30) == list(range(10))
            for p in peers:
                p.expect_closed(10)
        finally:
            for p in peers:
                p.sock.close()
        _check_still_serving(proto_cluster, 43)


def _log_drops_any(path: str | None) -> int:
    """Lines that record a dropped peer on the data channel."""
    assert path is not None
    with open(path, errors="replace") as f:
        return sum(1 for line in f if "data channel" in line and "drop" in line)


# --------------------------------------------------------------------------- ill-typed messages

#: Messages that legitimately stop the process they are sent to.
_DESTRUCTIVE = {m.ShutdownNode, m.ExitWorker}


@pytest.mark.timeout(120)
@pytest.mark.slow
@pytest.mark.parametrize("filler", [None, {"x": [1]}], ids=["none", "dict"])
@pytest.mark.parametrize("role", ["gcs", "raylet", "driver", "worker0"])
def test_authenticated_ill_typed_messages_never_kill_a_process(fresh_cluster, role, filler):
    """Every message class with every field of the wrong type, to one server.

    A handler may answer with an error or drop the peer; no process may die, and the
    cluster must still run tasks (its invariants are checked: ``validate=True``).
    """
    ctx = fresh_cluster(_system_config=PROTOCOL_CONFIG)
    session = ctx.address_info["session_dir"]
    assert lumos.get(echo.remote(1), timeout=30) == 1
    _wait_for_two_workers(session)
    with open(os.path.join(session, "token"), "rb") as f:
        token = f.read().strip()
    state = {"pids": {p.pid for p in lumos_children()}}
    (ep,) = [e for e in endpoints(session) if e.id == f"{role}-unix"]
    for code, cls in ALL_MESSAGES:
        if cls in _DESTRUCTIVE:
            continue
        msg = cls(*[filler for _ in dataclasses.fields(cls)])
        for kind in (m.REQUEST, m.NOTIFY):
            with RawPeer(ep) as peer:
                try:
                    peer.handshake(token)
                except ConnectionError as e:
                    raise AssertionError(f"{ep.id} stopped serving after {last}: {e}") from None
                peer.send_frame(m.encode(kind, 5, msg))
                last = f"{cls.__name__}({filler!r}, ...) as {'request' if kind == m.REQUEST else 'notify'}"
                if kind == m.REQUEST:
                    try:
                        reply = m.decode(peer.recv_frame())
                    except (ConnectionError, socket.timeout):
                        continue  # dropped, or the handler waits: both acceptable
                    assert reply[0] in (m.REPLY, m.ERROR), (ep.id, cls.__name__, reply)
    time.sleep(0.3)  # let notifications be handled before checking
    _check_still_serving(state, 3)
