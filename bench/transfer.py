"""Object transfer between two nodes on this machine (loopback TCP).

    python bench/transfer.py [--mib 100] [--repeat 3]

A task pinned to the second node creates a numpy array of ``--mib`` MiB in that node's
store; the driver (on the head) then ``get``s it, which pulls it into the head's store
in chunks over TCP. Prints the pull bandwidth of each repeat and the best.
Target (issue 4): >= 1 GB/s for 100 MiB.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import lumos
from lumos.testing import Cluster


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=int, default=100)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    store = max(4 * args.mib, 256) * 1024 * 1024
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "object_store_memory": store})
    try:
        cluster.add_node(num_cpus=1, resources={"source": 1}, object_store_memory=store)
        cluster.connect()

        @lumos.remote(resources={"source": 1})
        def make(n: int, seed: int) -> np.ndarray:
            a = np.empty(n, dtype=np.uint8)
            a[::4096] = seed  # touch every page; content need not be random
            return a

        size = args.mib * 1024 * 1024
        rates = []
        for i in range(args.repeat):
            ref = make.remote(size, i)
            lumos.wait([ref], timeout=120, fetch_local=False)  # created on the source node, not yet here
            t0 = time.perf_counter()
            value = lumos.get(ref, timeout=120)
            dt = time.perf_counter() - t0
            assert value.nbytes == size
            rates.append(size / dt / 1e9)
            print(f"pull {i + 1}: {args.mib} MiB in {dt * 1000:.1f} ms = {rates[-1]:.2f} GB/s")
            del value, ref
        print(f"best: {max(rates):.2f} GB/s (target >= 1 GB/s)")
    finally:
        cluster.shutdown()


if __name__ == "__main__":
    main()
