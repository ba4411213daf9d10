"""Ray's ``ray.util.register_serializer``: a class that cannot be pickled travels as what
its serializer makes of it, rebuilt by its deserializer in a process that registered
nothing; ``deregister_serializer`` undoes it, also for types lumos pickles on a fast path."""

from __future__ import annotations

import io
import threading
from typing import Any

import pytest

import lumos
from lumos._private import serialization as ser
from lumos._private.serialization import SerializationError

pytestmark = pytest.mark.timeout(120)


class Guarded:
    """A value with a lock: pickle refuses it."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.lock = threading.Lock()


def _rebuild_guarded(n: int) -> Guarded:
    return Guarded(n)


@lumos.remote
def _double(g: Guarded) -> int:
    return 2 * g.n   # (this worker registered nothing)


@pytest.fixture
def registered() -> Any:
    lumos.util.register_serializer(Guarded, serializer=lambda g: g.n, deserializer=_rebuild_guarded)
    yield
    lumos.util.deregister_serializer(Guarded)


def test_an_unpicklable_class_travels_through_its_serializer(cluster: Any, registered: None) -> None:
    got = lumos.get(lumos.put(Guarded(21)), timeout=30)
    assert type(got) is Guarded and got.n == 21 and got.lock is not None
    assert lumos.get(_double.remote(Guarded(21)), timeout=60) == 42
    assert lumos.get(_double.remote([Guarded(5)][0]), timeout=60) == 10


def test_inspect_serializability_judges_as_lumos_sends(registered: None) -> None:
    ok, failures = lumos.util.inspect_serializability({"g": Guarded(1)}, print_file=io.StringIO())
    assert ok and not failures
    lumos.util.deregister_serializer(Guarded)
    ok, failures = lumos.util.inspect_serializability({"g": Guarded(1)}, print_file=io.StringIO())
    assert not ok and {f.name for f in failures} == {"lock"}


def test_deregistered_it_fails_as_before(cluster: Any) -> None:
    lumos.util.register_serializer(Guarded, serializer=lambda g: g.n, deserializer=_rebuild_guarded)
    lumos.util.deregister_serializer(Guarded)
    lumos.util.deregister_serializer(Guarded)   # (a second time: nothing)
    with pytest.raises(SerializationError, match="lock"):
        lumos.put(Guarded(1))


def test_a_type_of_the_plain_fast_path_takes_the_serializer_too() -> None:
    before = ser.serialize((1 + 2j, [3])).to_bytes()
    lumos.util.register_serializer(complex, serializer=lambda c: (c.real, c.imag),
                                   deserializer=lambda parts: ("rebuilt", parts))
    try:
        assert ser.deserialize(ser.serialize((1 + 2j, [3])).to_bytes())[1] == (("rebuilt", (1.0, 2.0)), [3])
    finally:
        lumos.util.deregister_serializer(complex)
    assert ser._plain_ok
    assert ser.serialize((1 + 2j, [3])).to_bytes() == before


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(TypeError, match="class"):
        lumos.util.register_serializer(Guarded(1), serializer=str, deserializer=str)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="callable"):
        lumos.util.register_serializer(Guarded, serializer=None, deserializer=str)  # type: ignore[arg-type]
