"""torch tensors through the object store, on Ray and on lumos, with identical code.

    python bench/tensors.py --impl lumos
    python bench/tensors.py --compare          # Ray and lumos, one after the other, and the ratio

Needs torch (``pip install torch``; the test extra pins the CPU build this machine holds)
and, for ``--compare``, Ray (``pip install -e ".[bench]"``). Rows:

- put of a 100 MiB tensor, and the get of one a task returned (the same ref again
  and again, each result dropped before the next get);
- a task returning a 1 MiB tensor, in batches (returns per second);
- a task taking a 256 KiB tensor by value, in batches (tasks per second);
- a model's ``state_dict`` (about 5 MiB in 12 tensors) to an actor and back.
"""

from __future__ import annotations

import importlib
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from microbench import bench_main, init_with_retries  # noqa: E402  (the bench folder is not a package)

MiB = 1024 * 1024


def _median_ms(fn: Any, n: int) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2] * 1e3


def run(impl: str, num_cpus: int, quick: bool) -> dict[str, float]:
    import torch
    torch.set_num_threads(1)
    if impl == "ray":
        os.environ.setdefault("RAY_raylet_start_wait_time_s", "120")
    ray = importlib.import_module(impl)
    init_with_retries(ray, impl, num_cpus)
    reps = 3 if quick else 7
    batch = 100 if quick else 300
    results: dict[str, float] = {}
    try:
        @ray.remote
        def make(n: int) -> Any:
            return torch.ones(n)

        @ray.remote
        def total(t: Any) -> float:
            return float(t[0])

        @ray.remote
        class Learner:
            def step(self, state: dict[str, Any]) -> dict[str, Any]:
                return {k: v * 0.5 for k, v in state.items()}

        big = torch.randn(25 * MiB)   # 100 MiB of float32
        results["put 100 MiB tensor (ms)"] = _median_ms(lambda: ray.put(big), reps)
        ref = make.remote(big.numel())
        ray.get(ref)
        results["get 100 MiB tensor a task returned (ms)"] = _median_ms(lambda: ray.get(ref), reps)
        del ref

        ray.get([make.remote(MiB // 4) for _ in range(20)])   # workers import torch
        rates = []
        for _ in range(3):
            t = time.perf_counter()
            ray.get([make.remote(MiB // 4) for _ in range(batch)])
            rates.append(batch / (time.perf_counter() - t))
        results["1 MiB tensor returns (/s)"] = sorted(rates)[1]

        arg = torch.randn(64 * 1024)   # 256 KiB
        ray.get([total.remote(arg) for _ in range(20)])
        rates = []
        for _ in range(3):
            t = time.perf_counter()
            ray.get([total.remote(arg) for _ in range(batch)])
            rates.append(batch / (time.perf_counter() - t))
        results["256 KiB tensor argument tasks (/s)"] = sorted(rates)[1]

        model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(5)], torch.nn.Linear(512, 10))
        state = model.state_dict()
        learner = Learner.remote()
        ray.get(learner.step.remote(state))
        results["state_dict to an actor and back (ms)"] = _median_ms(
            lambda: ray.get(learner.step.remote(state)), reps * 3)
    finally:
        ray.shutdown()
    return results


def main() -> int:
    return bench_main(run, __doc__, __file__, "torch tensors", timeout_s=600)


if __name__ == "__main__":
    sys.exit(main())
