"""Allreduce among actors through the object store (the paper's Fig. 12 in miniature).

N actors each hold a float32 buffer; afterwards every actor holds the element-wise sum.

- **Ring** (bandwidth-optimal): the buffer is cut into N chunks. In N-1 reduce-scatter
  steps actor i sends one chunk to actor i+1, which adds it to its own; after them each
  actor holds one fully reduced chunk. N-1 allgather steps pass the reduced chunks on.
  Every actor sends 2(N-1)/N of a buffer in total, whatever N is. The driver submits the
  whole ring at once: each chunk is an ``ObjectRef`` returned by one actor and passed to
  the next, so the steps chain through the object store without the driver waiting.
- **Gather/broadcast** (naive): every buffer goes to actor 0, which sums and sends the
  result to all: actor 0 moves 2(N-1) buffers, which grows with N.

    import lumos as ray            # or: import ray
    from lumos.examples import allreduce
    result = allreduce.run(ray, workers=4, size_mb=8, iterations=5)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lumos.examples._common import Report, connect


class Peer:
    """One participant: a buffer, cut into ``n`` chunks for the ring."""

    def __init__(self, rank: int, n: int, size: int) -> None:
        self.rank, self.n = rank, n
        self.buffer = np.full(size, float(rank + 1), dtype=np.float32)
        self.chunks = np.array_split(self.buffer, n)  # views: updating a chunk updates the buffer

    def reset(self) -> None:
        self.buffer[:] = self.rank + 1

    # ring: step s of phase "reduce" sends chunk (rank - s) % n, of phase "gather" (rank + 1 - s) % n
    def send(self, phase: str, s: int) -> np.ndarray:
        k = (self.rank - s) % self.n if phase == "reduce" else (self.rank + 1 - s) % self.n
        return self.chunks[k]

    def receive(self, phase: str, s: int, chunk: np.ndarray) -> None:
        src = (self.rank - 1) % self.n
        k = (src - s) % self.n if phase == "reduce" else (src + 1 - s) % self.n
        if phase == "reduce":
            self.chunks[k] += chunk
        else:
            self.chunks[k][:] = chunk

    # gather/broadcast
    def get_buffer(self) -> np.ndarray:
        return self.buffer

    def sum_buffers(self, *others: np.ndarray) -> np.ndarray:
        for o in others:
            self.buffer += o
        return self.buffer

    def set_buffer(self, value: np.ndarray) -> None:
        self.buffer[:] = value

    def checksum(self) -> float:
        return float(self.buffer[0]) + float(self.buffer[-1])


def ring_allreduce(ray: Any, peers: list[Any]) -> None:
    """Submit the whole ring; returns when every peer holds the sum."""
    n = len(peers)
    for phase in ("reduce", "gather"):
        for s in range(n - 1):
            outs = [p.send.remote(phase, s) for p in peers]
            for i, p in enumerate(peers):
                p.receive.remote(phase, s, outs[(i - 1) % n])
    ray.get([p.checksum.remote() for p in peers], timeout=300)


def gather_broadcast(ray: Any, peers: list[Any]) -> None:
    total = peers[0].sum_buffers.remote(*[p.get_buffer.remote() for p in peers[1:]])
    ray.get([p.set_buffer.remote(total) for p in peers[1:]], timeout=300)


@dataclass
class Result:
    workers: int
    size_mb: float
    #: seconds per allreduce, one per iteration
    ring_s: list[float] = field(default_factory=list)
    naive_s: list[float] = field(default_factory=list)
    correct: bool = False
    wall_s: float = 0.0

    @property
    def ring_gb_per_s(self) -> float:
        """Algorithm bandwidth of the median ring allreduce (buffer bytes / time)."""
        return self.size_mb * 2**20 / float(np.median(self.ring_s)) / 1e9

    def summary(self) -> list[str]:
        ring, naive = float(np.median(self.ring_s)), float(np.median(self.naive_s))
        return [f"{self.workers} actors x {self.size_mb:g} MiB float32, median of {len(self.ring_s)} runs:",
                f"ring allreduce:   {ring * 1e3:8.1f} ms  ({self.ring_gb_per_s:.2f} GB/s)",
                f"gather/broadcast: {naive * 1e3:8.1f} ms  (ring is {naive / ring:.2f}x as fast)",
                f"every actor holds the sum: {self.correct}",
                f"wall time: {self.wall_s:.2f} s with {self.workers} workers"]


def run(ray: Any = None, *, workers: int = 4, iterations: int = 5, size_mb: float = 8.0,
        report: Report | None = None) -> Result:
    """Time ring allreduce and gather/broadcast of ``size_mb`` MiB among ``workers`` actors.

    Args:
        ray: ``lumos`` (default) or ``ray``; a local cluster is started if none is connected.
        report: called after each iteration with ``{"iteration", "ring_s", "naive_s", "elapsed_s"}``.
    """
    if workers < 2 or iterations < 1 or size_mb <= 0:
        raise ValueError(f"need workers >= 2, iterations >= 1, size_mb > 0; got {workers}, {iterations}, {size_mb}")
    ray = connect(ray)
    size = max(workers, int(size_mb * 2**20 / 4))
    expected = workers * (workers + 1) / 2
    result = Result(workers=workers, size_mb=size * 4 / 2**20)
    t0 = time.perf_counter()
    # Actors need no CPU of their own to hold buffers: all of them fit on a small machine.
    peer_cls = ray.remote(num_cpus=0)(Peer)
    peers = [peer_cls.remote(i, workers, size) for i in range(workers)]
    try:
        for it in range(1, iterations + 1):
            ray.get([p.reset.remote() for p in peers], timeout=300)
            t = time.perf_counter()
            ring_allreduce(ray, peers)
            result.ring_s.append(time.perf_counter() - t)
            sums = ray.get([p.checksum.remote() for p in peers], timeout=300)
            result.correct = all(abs(c - 2 * expected) < 1e-3 for c in sums)

            ray.get([p.reset.remote() for p in peers], timeout=300)
            t = time.perf_counter()
            gather_broadcast(ray, peers)
            result.naive_s.append(time.perf_counter() - t)
            sums = ray.get([p.checksum.remote() for p in peers], timeout=300)
            result.correct = result.correct and all(abs(c - 2 * expected) < 1e-3 for c in sums)
            if report is not None:
                report({"iteration": it, "ring_s": result.ring_s[-1], "naive_s": result.naive_s[-1],
                        "elapsed_s": time.perf_counter() - t0})
    finally:
        for p in peers:
            ray.kill(p)
    result.wall_s = time.perf_counter() - t0
    return result
