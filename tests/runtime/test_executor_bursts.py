"""Several pushes in one read of a worker's main thread (``Executor._read_task``), all
tasks it may run: it runs the first and queues the others itself
(``Executor._own_tasks``). Handed to the io thread, every such read cost two wake-ups
across threads: the io thread's, then the main thread's for the queue."""

from __future__ import annotations

from typing import Any

import pytest

import lumos

pytestmark = pytest.mark.timeout(120)


@lumos.remote
def leaf(x: int) -> int:
    return x


@lumos.remote
def count_tasks_handed_to_the_io_thread() -> int:
    """Install (once) a count of the tasks among the frames this worker's main thread
    reads and hands to its io thread; return the count so far."""
    from lumos._private.protocol import messages as m
    from lumos._private.transport.connection import SharedReader

    spy = SharedReader.hand_to_loop
    if not hasattr(spy, "counted"):
        hand = spy
        counts = [0]

        def counting(self: SharedReader, frames: list[bytes]) -> None:
            counts[0] += sum(type(m.decode(f)[2]) is m.PushTask for f in frames)
            hand(self, frames)

        counting.counted = counts  # type: ignore[attr-defined]
        SharedReader.hand_to_loop = counting  # type: ignore[method-assign]
        spy = counting
    return spy.counted[0]  # type: ignore[attr-defined, no-any-return]


def test_tasks_read_in_a_burst_stay_with_the_main_thread(fresh_cluster: Any) -> None:
    fresh_cluster(num_cpus=1)
    assert lumos.get(count_tasks_handed_to_the_io_thread.remote(), timeout=60) == 0
    for _ in range(5):
        assert lumos.get([leaf.remote(i) for i in range(400)], timeout=60) == list(range(400))
    assert lumos.get(count_tasks_handed_to_the_io_thread.remote(), timeout=60) == 0
