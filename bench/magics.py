"""Overhead of ``%%remote`` in a real kernel, and bytes sent for a large value already shipped.

    python bench/magics.py [--iterations 100] [--mb 100]

1. p50 wall time of an empty ``%%remote`` cell minus that of an empty local cell, each
   measured from the client (execute request to reply) in a real ipykernel with a
   private 2-CPU cluster. Target: under 20 ms.
2. A cell reading a ``--mb`` MB numpy array that an earlier cell already shipped: what
   the extension serialized and put (its own counters), what the kernel process wrote
   to sockets and files (``/proc/self/io`` ``wchar``), and the object-store growth.
   Target: the array is not sent again (a few KB instead of ~100 MB).

Prints a table and one JSON line (``RESULT {...}``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

from jupyter_client.manager import KernelManager

MEASURE_SHIPPED = r"""
import json as _json
def _wchar():
    with open('/proc/self/io') as f:
        return int(next(l for l in f if l.startswith('wchar')).split()[1])
def _store_used():
    return sum(n['object_store_used_bytes'] for n in lumos.state.list_nodes())
_w0, _s0 = _wchar(), _store_used()
get_ipython().run_cell_magic('remote', '', 'total = float(big.sum())')
_w1, _s1 = _wchar(), _store_used()
_st = get_ipython()._lumos_magics.cells.last.stats
print('MEASURE', _json.dumps({'label': LABEL, 'wchar_bytes': _w1 - _w0, 'store_growth_bytes': _s1 - _s0,
      'put_bytes': _st.put_bytes, 'inline_bytes': _st.inline_bytes, 'reused_bytes': _st.reused_bytes,
      'total': total}))
"""


class Kernel:
    def __init__(self) -> None:
        self.km = KernelManager(kernel_name="python3")
        self.km.start_kernel()
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)

    def run(self, code: str, timeout: float = 120) -> tuple[float, list[str]]:
        out: list[str] = []
        errors: list[str] = []

        def hook(msg: dict[str, Any]) -> None:
            kind = msg["msg_type"]
            if kind == "stream":
                out.append(msg["content"]["text"])
            elif kind == "error":
                errors.append("\n".join(msg["content"]["traceback"]))

        t = time.perf_counter()
        reply = self.kc.execute_interactive(code, timeout=timeout, output_hook=hook)
        elapsed = time.perf_counter() - t
        if reply["content"]["status"] != "ok" or errors:
            raise RuntimeError(f"cell failed: {code[:60]!r}: {''.join(errors)}")
        return elapsed, out

    def close(self) -> None:
        try:
            self.run("lumos.shutdown()", timeout=60)
        finally:
            self.kc.stop_channels()
            self.km.shutdown_kernel(now=False)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iterations", type=int, default=100)
    p.add_argument("--mb", type=int, default=100)
    a = p.parse_args()
    os.environ.pop("LUMOS_ADDRESS", None)
    k = Kernel()
    try:
        k.run("%load_ext lumos\nimport lumos\nimport numpy as np\n"
              f"lumos.init(num_cpus=2, object_store_memory={max(a.mb * 4, 512)} * 1024 * 1024)")
        for _ in range(10):  # warm up: worker pool, function export, code paths
            k.run("%%remote\npass")
            k.run("pass")
        local, remote = [], []
        for _ in range(a.iterations):
            local.append(k.run("pass")[0])
            remote.append(k.run("%%remote\npass")[0])
        p50_local = statistics.median(local) * 1e3
        p50_remote = statistics.median(remote) * 1e3
        overhead = p50_remote - p50_local

        k.run(f"big = np.ones({a.mb} * 1024 * 1024 // 8)")
        measures = {}
        for label in ("first", "again"):
            _, out = k.run(f"LABEL = {label!r}\n" + MEASURE_SHIPPED)
            line = next(x for x in "".join(out).splitlines() if x.startswith("MEASURE "))
            measures[label] = json.loads(line[len("MEASURE "):])
    finally:
        k.close()

    first, again = measures["first"], measures["again"]
    print(f"empty local cell     p50 {p50_local:7.2f} ms")
    print(f"empty %%remote cell  p50 {p50_remote:7.2f} ms")
    print(f"overhead             p50 {overhead:7.2f} ms   (target < 20 ms)")
    print(f"{a.mb} MB array, first cell : put {first['put_bytes']:>12,} B, kernel wrote "
          f"{first['wchar_bytes']:>12,} B, store +{first['store_growth_bytes']:>12,} B")
    print(f"{a.mb} MB array, next cell  : put {again['put_bytes']:>12,} B, kernel wrote "
          f"{again['wchar_bytes']:>12,} B, store +{again['store_growth_bytes']:>12,} B "
          f"(reused {again['reused_bytes']:,} B)")
    result = {"iterations": a.iterations, "p50_local_ms": round(p50_local, 3),
              "p50_remote_ms": round(p50_remote, 3), "overhead_p50_ms": round(overhead, 3),
              "array_mb": a.mb, "first": first, "again": again,
              "overhead_ok": overhead < 20, "not_resent": again["put_bytes"] == 0}
    print("RESULT " + json.dumps(result))
    sys.exit(0)


if __name__ == "__main__":
    main()
