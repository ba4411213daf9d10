"""torch tensors as values: a dense CPU tensor travels as its storage's bytes out of band
(one copy into the store, none through ``torch.save``), comes back equal in dtype, shape,
strides, offset and ``requires_grad``, with storages shared as they were, and, read from
another process's object, on the store's own pages copy-on-write: a write to it stays in
the tensor and never reaches the object or a later read of it."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
import torch

import lumos
from lumos._private import serialization as ser
from lumos._private import worker_context
from lumos._private.protocol import messages as m
from tests.conftest import raylet_log, wait_for

pytestmark = pytest.mark.timeout(120)
MiB = 1024 * 1024


def _round_trip(value: Any) -> Any:
    return ser.deserialize(ser.serialize(value).to_bytes())[1]


def _same(a: torch.Tensor, b: torch.Tensor) -> None:
    assert type(b) is type(a)
    assert b.dtype == a.dtype and b.shape == a.shape
    assert b.stride() == a.stride() and b.storage_offset() == a.storage_offset()
    assert b.requires_grad == a.requires_grad
    assert torch.equal(b.detach(), a.detach())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16,
                                   torch.int8, torch.uint8, torch.int64, torch.bool,
                                   torch.complex64])
def test_each_dtype_comes_back_equal(dtype: torch.dtype) -> None:
    t = (torch.arange(24) % 5).to(dtype).reshape(2, 3, 4)
    _same(t, _round_trip(t))


def test_a_tensor_goes_as_its_storage_out_of_band() -> None:
    t = torch.arange(MiB // 4, dtype=torch.float32)
    sv = ser.serialize(t)
    assert [b.nbytes for b in sv.buffers] == [MiB]
    assert len(sv.pickled) < 1024   # torch's own pickling carries the MiB in band
    assert len(pickle.dumps(t, protocol=5)) > MiB


def test_shapes_views_and_gradients() -> None:
    base = torch.randn(6, 8)
    for t in (torch.tensor(3.5), torch.empty(0), base.t(), base[:, 1], base[2:, ::3],
              base.reshape(-1)[5:17]):
        _same(t, _round_trip(t))
    leaf = torch.randn(3, requires_grad=True)
    _same(leaf, _round_trip(leaf))
    derived = _round_trip(leaf * 2)   # as torch pickles it: a leaf that requires grad
    assert derived.requires_grad and derived.is_leaf
    p = torch.nn.Parameter(torch.randn(4), requires_grad=False)
    _same(p, _round_trip(p))


def test_tensors_sharing_a_storage_share_it_when_rebuilt() -> None:
    base = torch.zeros(4, 4)
    a, row, again = _round_trip((base, base[1], base))
    assert again is a
    a[1, 2] = 7
    assert row[2] == 7
    assert row.untyped_storage().data_ptr() == a.untyped_storage().data_ptr()


def test_a_module_and_a_state_dict() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    copy = _round_trip(model)
    x = torch.randn(5, 8)
    assert torch.equal(copy(x), model(x))
    state = _round_trip(model.state_dict())
    assert list(state) == list(model.state_dict())
    for k, v in model.state_dict().items():
        _same(v, state[k])


def test_what_the_fast_path_does_not_take_is_left_to_torch() -> None:
    tagged = torch.randn(3)
    tagged.tag = "kept"   # a Python attribute: torch's own reduction keeps it
    got = _round_trip(tagged)
    assert got.tag == "kept" and torch.equal(got, tagged)
    sparse = torch.eye(3).to_sparse()
    assert torch.equal(_round_trip(sparse).to_dense(), torch.eye(3))
    conj = torch.tensor([1 + 2j]).conj()
    assert torch.equal(_round_trip(conj), conj)


def _store_path_of(t: torch.Tensor) -> str:
    """The file (or "") whose mapping holds this tensor's first byte, from /proc/self/maps."""
    address = t.untyped_storage().data_ptr()
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if lo <= address < hi:
                return fields[5].strip() if len(fields) > 5 else ""
    return ""


@lumos.remote
def _ones(n: int) -> torch.Tensor:
    return torch.ones(n)


@lumos.remote
def _total(t: torch.Tensor) -> float:
    return float(t.sum())


@lumos.remote
def _first_w(d: dict[str, torch.Tensor]) -> float:
    return float(d["w"][0])


@lumos.remote
def _scale_in_place(t: torch.Tensor) -> float:
    t.mul_(3)   # the task's own argument, changed in place
    return float(t.sum())


@lumos.remote
class _Holder:
    def __init__(self) -> None:
        self.kept: list[torch.Tensor] = []

    def keep(self, t: torch.Tensor) -> float:
        t.add_(1)
        self.kept.append(t)
        return float(t[0])

    def look(self, t: torch.Tensor) -> float:
        return float(t[0])

    def firsts(self) -> list[float]:
        return [float(t[0]) for t in self.kept]


def _objects_in_store() -> int:
    return int(worker_context.require().call_raylet(m.GetNodeStats())["store"]["num_objects"])


def test_a_tensor_from_the_store_is_written_in_place_and_the_object_stays(fresh_cluster: Any) -> None:
    ctx = fresh_cluster(num_cpus=2, include_dashboard=False)
    store_dir = worker_context.require().store.directory
    n = MiB // 4
    ref = _ones.remote(n)
    t = lumos.get(ref, timeout=60)
    # On the store's pages (no copy), a private mapping of the object's file.
    assert _store_path_of(t).startswith(store_dir), (_store_path_of(t), store_dir)
    t.mul_(2)
    assert float(t.sum()) == 2 * n
    # The object, a later read of it here and a task reading it are as they were.
    again = lumos.get(ref, timeout=60)
    assert float(again.sum()) == n and float(t.sum()) == 2 * n
    assert lumos.get(_total.remote(ref), timeout=60) == n
    # A task changing its argument changes nothing outside it.
    assert lumos.get(_scale_in_place.remote(ref), timeout=60) == 3 * n
    assert lumos.get(_total.remote(ref), timeout=60) == n
    # The tensor outlives its ref; once it goes too, so does the object.
    before = _objects_in_store()
    del ref, again
    assert float(t.sum()) == 2 * n
    del t
    wait_for(lambda: _objects_in_store() < before, 10)
    assert ctx is not None


def test_a_tensor_this_process_put_is_read_on_a_private_mapping_of_its_file(fresh_cluster: Any) -> None:
    """The put's own mapping is shared and writable (the store's bytes): the tensor gets a
    copy-on-write mapping of the object's file of its own. Put, read, change and free in
    a loop: every value stays what it was, and the freed slots are reused safely."""
    fresh_cluster(num_cpus=1, include_dashboard=False)
    store_dir = worker_context.require().store.directory
    n = MiB // 4
    before = _objects_in_store()
    for i in range(20):
        ref = lumos.put({"w": torch.full((n,), float(i)), "b": torch.full((n,), -float(i))})
        got = lumos.get(ref, timeout=60)
        assert _store_path_of(got["w"]).startswith(store_dir)
        assert got["w"].untyped_storage().data_ptr() != got["b"].untyped_storage().data_ptr()
        got["w"].add_(5)
        got["b"].zero_()
        again = lumos.get(ref, timeout=60)
        assert float(again["w"][0]) == i and float(again["b"][-1]) == -i
        assert lumos.get(_first_w.remote(ref), timeout=60) == i   # (another process reads it)
        assert float(got["w"][0]) == i + 5 and float(got["b"].sum()) == 0
        del ref, got, again
    wait_for(lambda: _objects_in_store() <= before, 10)


@pytest.mark.parametrize("lend", [True, False], ids=["lent", "objects"])
def test_tensors_an_actor_keeps_and_changes_keep_their_values(fresh_cluster: Any, lend: bool) -> None:
    """By-value tensor arguments the actor changes and keeps past its call, among calls whose
    arguments take the store files freed since."""
    fresh_cluster(num_cpus=2, include_dashboard=False, _system_config={"lend_args": lend})
    h = _Holder.remote()
    for i in range(12):
        assert lumos.get(h.keep.remote(torch.full((MiB // 4,), float(i))), timeout=60) == i + 1
        assert lumos.get(h.look.remote(torch.full((MiB // 4,), 100.0 + i)), timeout=60) == 100 + i
    assert lumos.get(h.firsts.remote(), timeout=60) == [i + 1.0 for i in range(12)]


def test_in_place_reads_can_be_turned_off(fresh_cluster: Any) -> None:
    fresh_cluster(num_cpus=1, include_dashboard=False, _system_config={"torch_in_place_min_bytes": 0})
    store_dir = worker_context.require().store.directory
    ref = _ones.remote(MiB // 4)
    t = lumos.get(ref, timeout=60)
    assert not _store_path_of(t).startswith(store_dir)
    t.add_(1)
    assert float(lumos.get(ref, timeout=60).sum()) == MiB // 4


# A probe defined outside any module a worker could import (this one imports torch): its
# class travels by value, so "torch" in a worker's sys.modules says what the worker had.
_PROBE: dict[str, Any] = {"__name__": "lumos_probe"}
exec("class Probe:\n"
     "    def has_torch(self):\n"
     "        import sys\n"
     "        return 'torch' in sys.modules\n", _PROBE)


@pytest.mark.parametrize("warm", ["auto", ""])
def test_a_driver_that_imported_torch_gets_workers_that_have_it(fresh_cluster: Any, warm: str) -> None:
    """``worker_warm_modules="auto"``: the fork server imports torch once it is idle, since
    the process that started the node had it; workers forked after that skip the import.
    With "" it does not (the test suite's default: most test clusters need no torch)."""
    # (No prestarted workers: the actor's is forked after the warm-up.)
    ctx = fresh_cluster(num_cpus=1, include_dashboard=False,
                        _system_config={"worker_warm_modules": warm, "num_prestart_workers": 0})
    probe = lumos.remote(num_cpus=0)(_PROBE["Probe"])
    wait_for(lambda: "fork server pre-imported" in raylet_log(ctx), 30)
    assert ("psutil, torch" in raylet_log(ctx)) == (warm == "auto")
    actor = probe.remote()
    assert lumos.get(actor.has_torch.remote(), timeout=60) == (warm == "auto")


def test_a_users_serializer_for_tensors_wins_and_goes() -> None:
    t = torch.arange(4.0)
    lumos.util.register_serializer(torch.Tensor, serializer=lambda x: x.tolist(),
                                   deserializer=lambda values: ("mine", values))
    try:
        assert _round_trip(t) == ("mine", [0.0, 1.0, 2.0, 3.0])
    finally:
        lumos.util.deregister_serializer(torch.Tensor)
    assert len(ser.serialize(t).buffers) == 1   # lumos's own way again
    _same(t, _round_trip(t))
