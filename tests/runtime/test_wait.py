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
