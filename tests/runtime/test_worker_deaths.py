"""Workers hear of other workers' deaths only once they lend an object (a borrower that
dies must stop holding it): a driver from the start, a worker from its first borrower on.
Killing many actors then tells only the processes that need to know, not every worker."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import lumos
from lumos._private import worker_context
from tests.conftest import wait_for

pytestmark = pytest.mark.timeout(120)


@lumos.remote(num_cpus=0)
class Holder:
    def __init__(self) -> None:
        self.kept: list[Any] = []

    def worker_id(self) -> str:
        return lumos.get_runtime_context().get_worker_id()

    def keep(self, refs: list[Any]) -> int:
        self.kept.extend(refs)  # borrowed refs that outlive the call
        return len(self.kept)


@lumos.remote(num_cpus=0)
class Owner:
    def __init__(self) -> None:
        self.oid = b""

    def follows(self) -> bool:
        return bool(worker_context.require().follows_deaths)

    def lend(self, holder: Any) -> bytes:
        ref = lumos.put(np.ones(1 << 20))
        self.oid = ref.binary()
        lumos.get(holder.keep.remote([ref]), timeout=30)
        return self.oid

    def lend_to_the_dead(self, worker_id_hex: str) -> bytes:
        """Record a borrower that died before this worker followed deaths (the window
        between a borrower's registration and the subscription, made certain)."""
        from lumos._private.protocol import messages as m
        cw = worker_context.require()
        ref = lumos.put(np.ones(1 << 20))
        self.oid = ref.binary()
        gone = m.Address(cw.node_id, bytes.fromhex(worker_id_hex), "", "127.0.0.1", 1)
        assert cw.objects.add_borrower(self.oid, gone)
        return self.oid

    def still_owns(self) -> bool:
        cw = worker_context.require()
        cw.drain_refs()
        return self.oid in cw.objects.entries


def test_a_worker_follows_deaths_once_it_lends_and_frees_what_a_dead_borrower_held(cluster: Any) -> None:
    owner, holder, bystander = Owner.remote(), Holder.remote(), Owner.remote()
    assert lumos.get([owner.follows.remote(), bystander.follows.remote()], timeout=30) == [False, False]
    assert worker_context.core_worker is not None and worker_context.core_worker.follows_deaths  # the driver
    lumos.get(owner.lend.remote(holder), timeout=30)
    assert lumos.get(owner.follows.remote(), timeout=30)
    assert lumos.get(owner.still_owns.remote(), timeout=30)  # its own ref is gone; the borrower keeps it
    lumos.kill(holder)
    wait_for(lambda: not lumos.get(owner.still_owns.remote(), timeout=30), 20)
    assert not lumos.get(bystander.follows.remote(), timeout=30)  # never lent: never told
    for a in (owner, bystander):
        lumos.kill(a)


def test_a_borrower_dead_before_its_owner_listened_is_dropped(cluster: Any) -> None:
    holder, owner = Holder.remote(), Owner.remote()
    dead = lumos.get(holder.worker_id.remote(), timeout=30)
    lumos.kill(holder)
    wait_for(lambda: any(w["worker_id"] == dead and w["state"] == "DEAD" for w in lumos.state.list_workers()), 20)
    lumos.get(owner.lend_to_the_dead.remote(dead), timeout=30)
    # The owner asks the GCS which workers are dead when it starts to follow deaths.
    wait_for(lambda: not lumos.get(owner.still_owns.remote(), timeout=30), 20)
    lumos.kill(owner)
