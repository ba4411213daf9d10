"""A low-latency serving/control loop (the shape of the paper's Table 3).

A policy is served by replica actors that keep the model in memory. A client sends
observations and waits for actions: one request at a time gives the latency (p50/p99) of
the loop a controller would run; many requests in flight across replicas give the
throughput. Two input sizes: a small state vector (16 floats) and a larger observation
(a 128x128x4 uint8 frame, 64 KiB).

    import lumos as ray            # or: import ray
    from lumos.examples import serving
    result = serving.run(ray, workers=2, requests=2000)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lumos.examples._common import Report, connect, percentile

INPUTS: dict[str, tuple[tuple[int, ...], Any]] = {
    "small": ((16,), np.float32),
    "large": ((128, 128, 4), np.uint8),
}


class PolicyServer:
    """A replica: a two-layer policy over a (pooled) observation."""

    def __init__(self, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.w1 = rng.standard_normal((64, 32)).astype(np.float32) * 0.1
        self.w2 = rng.standard_normal((32, 4)).astype(np.float32) * 0.1
        self.served = 0

    def act(self, obs: np.ndarray) -> int:
        x = np.asarray(obs, dtype=np.float32).reshape(-1)
        if x.size != 64:  # pool any observation down to 64 features
            x = np.resize(x, (64, -(-x.size // 64))).mean(axis=1) if x.size > 64 else np.resize(x, 64)
        self.served += 1
        return int(np.argmax(np.tanh(x @ self.w1) @ self.w2))

    def count(self) -> int:
        return self.served


@dataclass
class Result:
    workers: int
    requests: int
    #: input name -> {"p50_ms", "p99_ms", "requests_per_s"}
    stats: dict[str, dict[str, float]] = field(default_factory=dict)
    wall_s: float = 0.0

    def summary(self) -> list[str]:
        lines = [f"{'input':<28}{'p50 (ms)':>10}{'p99 (ms)':>10}{'requests/s':>12}"]
        for name, s in self.stats.items():
            shape, dtype = INPUTS[name]
            label = f"{name} {'x'.join(map(str, shape))} {np.dtype(dtype).name}"
            lines.append(f"{label:<28}{s['p50_ms']:>10.3f}{s['p99_ms']:>10.3f}{s['requests_per_s']:>12,.0f}")
        lines.append(f"wall time: {self.wall_s:.2f} s with {self.workers} replicas")
        return lines


def run(ray: Any = None, *, workers: int = 2, requests: int = 2000, iterations: int = 1,
        in_flight: int = 8, warmup_s: float = 0.3, report: Report | None = None) -> Result:
    """Latency of ``requests`` sequential requests, and throughput with ``in_flight`` per replica.

    Args:
        ray: ``lumos`` (default) or ``ray``; a local cluster is started if none is connected.
        iterations: repeat the measurement; the stats kept are the last run's.
        report: called after each input size with ``{"iteration", "input", "p50_ms", "p99_ms",
            "requests_per_s", "elapsed_s"}``.
    """
    if workers < 1 or requests < 10 or iterations < 1:
        raise ValueError(f"need workers >= 1, requests >= 10, iterations >= 1; got {workers}, {requests}, {iterations}")
    ray = connect(ray)
    rng = np.random.default_rng(0)
    result = Result(workers=workers, requests=requests)
    t0 = time.perf_counter()
    replicas = [ray.remote(PolicyServer).remote(i) for i in range(workers)]
    try:
        ray.get([r.count.remote() for r in replicas], timeout=300)
        for it in range(1, iterations + 1):
            for name, (shape, dtype) in INPUTS.items():
                obs = (rng.standard_normal(shape) * 50).astype(dtype)
                server = replicas[0]
                t_end = time.perf_counter() + warmup_s  # wake the path up before timing it
                while time.perf_counter() < t_end:
                    ray.get(server.act.remote(obs), timeout=60)
                lat = []
                for _ in range(requests):
                    t = time.perf_counter()
                    ray.get(server.act.remote(obs), timeout=60)
                    lat.append(time.perf_counter() - t)
                lat.sort()
                t = time.perf_counter()
                pending: list[Any] = []
                for k in range(requests):
                    pending.append(replicas[k % workers].act.remote(obs))
                    if len(pending) >= in_flight * workers:
                        ray.get(pending, timeout=60)
                        pending = []
                ray.get(pending, timeout=60)
                rate = requests / (time.perf_counter() - t)
                result.stats[name] = {"p50_ms": percentile(lat, 50) * 1e3, "p99_ms": percentile(lat, 99) * 1e3,
                                      "requests_per_s": rate}
                if report is not None:
                    report({"iteration": it, "input": name, **result.stats[name],
                            "elapsed_s": time.perf_counter() - t0})
    finally:
        for r in replicas:
            ray.kill(r)
    result.wall_s = time.perf_counter() - t0
    return result
