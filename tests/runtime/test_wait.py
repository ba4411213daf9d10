"""wait/get on ready and pending sets: readiness wakes them, not a poll."""

from __future__ import annotations

import time

import pytest

import lumos
from lumos.exceptions import GetTimeoutError


@lumos.remote
def sleep_then(t, value=None):
    time.sleep(t)
    return value


@pytest.mark.timeout(60)
def test_wait_wakes_on_completion_not_on_a_poll_slice(fresh_cluster):
    """wait/get block in slices only so Ctrl-C works: readiness wakes them, a deadline
    ends them, and a ready set returns without blocking at all. With hour-long slices, a
    wait that polled per slice would hang here."""
    fresh_cluster(_system_config={"wait_slice_s": 3600.0})
    ready_refs = [lumos.put(i) for i in range(1000)]
    for fetch_local in (True, False):
        assert lumos.wait(ready_refs, num_returns=1000, fetch_local=fetch_local) == (ready_refs, [])
        ready, rest = lumos.wait(ready_refs, num_returns=10, fetch_local=fetch_local)
        assert ready == ready_refs[:10] and rest == ready_refs[10:]
    slow = sleep_then.remote(0.3, "done")
    ready, rest = lumos.wait([slow, ready_refs[0]], num_returns=2)  # wakes on the completion
    assert set(ready) == {slow, ready_refs[0]} and rest == []
    assert lumos.get(sleep_then.remote(0.2, "got")) == "got"
    never = sleep_then.remote(30, "never")
    assert lumos.wait([never], num_returns=1, timeout=0.2) == ([], [never])  # the deadline ends it
    with pytest.raises(GetTimeoutError):
        lumos.get(never, timeout=0.2)
    lumos.cancel(never, force=True)


@lumos.remote
def fail_after(t, name):
    time.sleep(t)
    raise ValueError(name)


@pytest.mark.timeout(60)
def test_wait_keeps_the_order_the_refs_were_given_in(fresh_cluster):
    """As Ray documents: if A precedes B in the input and both are ready, A precedes B in
    ready (code zipping refs with get(ready) pairs them right). The refs here finish in
    the reverse of the order given."""
    fresh_cluster(num_cpus=3)
    refs = [sleep_then.remote(1.0, "A"), sleep_then.remote(0.5, "B"), sleep_then.remote(0.0, "C")]
    ready, rest = lumos.wait(refs, num_returns=2, timeout=30)
    assert ready == refs[1:] and rest == refs[:1]
    assert lumos.get(ready) == ["B", "C"]
    ready, rest = lumos.wait(refs, num_returns=3, timeout=30)
    assert ready == refs and rest == []


@pytest.mark.timeout(60)
def test_get_of_several_raises_the_first_error_without_waiting_for_the_rest(fresh_cluster):
    """As in Ray: a get of a list raises as soon as one of them failed (it waited for the
    slowest), and the error raised is the first to happen, not the first in the list."""
    fresh_cluster(num_cpus=3)
    slow = sleep_then.remote(600, "slow")  # (waiting for it, the get would time out instead)
    with pytest.raises(ValueError, match="early"):
        lumos.get([slow, fail_after.remote(0.2, "early")], timeout=20)
    with pytest.raises(ValueError, match="early"):
        lumos.get([fail_after.remote(1.5, "late"), fail_after.remote(0.0, "early")], timeout=30)
    # One that failed already: the get raises at once.
    done = fail_after.remote(0, "done")
    with pytest.raises(ValueError):
        lumos.get(done)
    with pytest.raises(ValueError, match="done"):
        lumos.get([slow, done], timeout=20)
    lumos.cancel(slow, force=True)
    # All of them done: the first error in the list, as before.
    late, early = fail_after.remote(0.3, "late"), fail_after.remote(0.0, "early")
    lumos.wait([late, early], num_returns=2, timeout=30)
    with pytest.raises(ValueError, match="late"):
        lumos.get([late, early], timeout=30)
