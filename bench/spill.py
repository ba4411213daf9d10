"""Spilling throughput: put 3x the object store's capacity, then read it all back.

    python bench/spill.py [--store-mib 256] [--object-mib 16] [--factor 3] [--compare]

Puts ``factor`` x ``store-mib`` MiB as ``object-mib`` MiB numpy arrays into a node whose
store holds ``store-mib`` MiB, so most of it is spilled to the spill directory (the
session dir, on the disk holding /tmp), then ``get``s every array in random order and
reads all of it (each read restores one). Reports:

- put MiB/s: end to end, including waiting for spills to make room;
- spill / restore MiB/s: the copies themselves (``lumos.state.spill_stats()``);
- get MiB/s: end to end, restores included.

``--compare`` runs the same workload against Ray when ``import ray`` works (Ray
restores into its store too; its spill directory is its own default).
Prints a table and one JSON line (``RESULT {...}``).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from typing import Any

import numpy as np


def run(mod: Any, name: str, store_mib: int, object_mib: int, factor: int) -> dict[str, Any]:
    mib = 1024 * 1024
    if name == "lumos":
        mod.init(num_cpus=1, object_store_memory=store_mib * mib, include_dashboard=False)
    else:
        mod.init(num_cpus=1, object_store_memory=store_mib * mib, include_dashboard=False)
    try:
        n = factor * store_mib // object_mib
        arrays = [np.full(object_mib * mib, i % 251, dtype=np.uint8) for i in range(min(n, 4))]
        mod.put(arrays[0])  # warm-up: worker and store paths
        t0 = time.perf_counter()
        refs = [mod.put(arrays[i % len(arrays)]) for i in range(n)]
        put_s = time.perf_counter() - t0
        order = list(range(n))
        random.Random(0).shuffle(order)
        t0 = time.perf_counter()
        for i in order:
            a = mod.get(refs[i], timeout=300)
            if int(a[-1]) != i % len(arrays) % 251 or int(a.sum(dtype=np.uint64)) != (i % len(arrays) % 251) * a.size:
                raise AssertionError(f"object {i} came back different")
            del a
        get_s = time.perf_counter() - t0
        total = n * object_mib
        row: dict[str, Any] = {"system": name, "objects": n, "total_mib": total,
                               "put_mib_s": total / put_s, "get_mib_s": total / get_s}
        if name == "lumos":
            stats = mod.state.spill_stats()[0]
            row.update(spilled_mib=stats["spilled_bytes"] / mib, restored_mib=stats["restored_bytes"] / mib,
                       spill_mib_s=stats["spill_mib_s"], restore_mib_s=stats["restore_mib_s"],
                       restored_from_disk=stats["restored_from_disk"])
        del refs
        return row
    finally:
        mod.shutdown()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--store-mib", type=int, default=256)
    p.add_argument("--object-mib", type=int, default=16)
    p.add_argument("--factor", type=int, default=3)
    p.add_argument("--compare", action="store_true", help="also run against Ray if it is installed")
    args = p.parse_args()
    import lumos
    import lumos.state
    rows = [run(lumos, "lumos", args.store_mib, args.object_mib, args.factor)]
    if args.compare:
        try:
            import ray
        except ImportError:
            print("--compare: ray is not installed here; lumos only")
        else:
            rows.append(run(ray, "ray", args.store_mib, args.object_mib, args.factor))
    keys = ["system", "total_mib", "put_mib_s", "get_mib_s", "spill_mib_s", "restore_mib_s"]
    print("  ".join(f"{k:>14}" for k in keys))
    for r in rows:
        print("  ".join(f"{r[k]:>14.0f}" if isinstance(r.get(k), float) else f"{r.get(k, '-')!s:>14}" for k in keys))
    print("RESULT " + json.dumps(rows))


if __name__ == "__main__":
    main()
