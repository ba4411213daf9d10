"""Evolution strategies (Salimans et al. 2017), the paper's first RL workload.

Each iteration the driver puts the policy parameters in the object store once; every
worker actor draws noise vectors from a **shared noise table** (one copy in the object
store, read zero-copy by all workers), evaluates each perturbation twice (``theta +
sigma*eps`` and ``theta - sigma*eps``: antithetic sampling) on CartPole, and returns only
the noise indices and the returns. The driver rebuilds the update from the same table
with centered ranks and an Adam step.

```
driver ── put(theta) ──► Worker.rollouts(theta, pairs) ×N  ── (indices, returns) ──► driver
             noise table: put once, read zero-copy by every worker
```

    import lumos as ray            # or: import ray
    from lumos.examples import es
    result = es.run(ray, workers=2, iterations=20)
    result.rewards                 # mean episode return per iteration
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lumos.examples._common import CartPole, Report, connect, mlp_forward, mlp_size, mlp_unpack

#: Policy network: observation (4) -> 16 tanh -> 1 (push right when > 0).
SIZES = (4, 16, 1)


def episode(params: np.ndarray, seed: int, max_steps: int) -> tuple[float, int]:
    """Return and length of one CartPole episode under the deterministic policy."""
    layers = mlp_unpack(params, SIZES)
    env = CartPole(seed, max_steps)
    obs = env.reset()
    total, done = 0.0, False
    while not done:
        action = 1 if mlp_forward(layers, np.asarray(obs))[0] > 0 else 0
        obs, reward, done = env.step(action)
        total += reward
    return total, env.steps


class Worker:
    """An ES worker: holds the shared noise table, evaluates antithetic pairs."""

    def __init__(self, noise: np.ndarray, seed: int, max_steps: int) -> None:
        self.noise = noise  # from the object store: read-only, not copied
        self.rng = np.random.default_rng(seed)
        self.max_steps = max_steps

    def rollouts(self, params: np.ndarray, pairs: int, sigma: float) -> dict[str, Any]:
        start = time.perf_counter()
        dim = params.size
        indices = self.rng.integers(0, self.noise.size - dim, size=pairs)
        returns = np.zeros((pairs, 2))
        steps = 0
        for k, i in enumerate(indices):
            eps = self.noise[i:i + dim]
            seed = int(self.rng.integers(1 << 31))
            returns[k, 0], s1 = episode(params + sigma * eps, seed, self.max_steps)
            returns[k, 1], s2 = episode(params - sigma * eps, seed, self.max_steps)
            steps += s1 + s2
        return {"indices": indices, "returns": returns, "steps": steps, "compute_s": time.perf_counter() - start}


def centered_ranks(x: np.ndarray) -> np.ndarray:
    """Ranks scaled to [-0.5, 0.5]: robust to the scale of returns."""
    ranks = np.empty(x.size, dtype=np.float64)
    ranks[x.ravel().argsort()] = np.arange(x.size)
    return (ranks / (x.size - 1) - 0.5).reshape(x.shape)


@dataclass
class Result:
    workers: int
    #: mean episode return of the population, per iteration
    rewards: list[float] = field(default_factory=list)
    #: best episode return, per iteration
    best: list[float] = field(default_factory=list)
    episodes: int = 0
    timesteps: int = 0
    #: seconds to start the workers (process start, noise table mapped), not in ``wall_s``
    startup_s: float = 0.0
    #: seconds of the iterations
    wall_s: float = 0.0
    #: per iteration: its wall time less its slowest worker's own rollout time (the
    #: driver's update is not in it): what the system spends putting the parameters,
    #: sending the calls, running and answering them: the part a framework controls
    overhead_s: list[float] = field(default_factory=list)
    params: Any = None

    @property
    def overhead_ms(self) -> float:
        """The median per-iteration system overhead (``overhead_s``), in milliseconds."""
        return float(np.median(self.overhead_s)) * 1e3 if self.overhead_s else 0.0

    @property
    def timesteps_per_s(self) -> float:
        return self.timesteps / self.wall_s if self.wall_s else 0.0

    def summary(self) -> list[str]:
        return [f"final mean reward: {self.rewards[-1]:.1f} (best episode {max(self.best):.0f})",
                f"episodes: {self.episodes:,}  timesteps: {self.timesteps:,}",
                f"throughput: {self.timesteps_per_s:,.0f} timesteps/s, "
                f"{self.episodes / self.wall_s:,.0f} episodes/s",
                f"wall time: {self.wall_s:.2f} s with {self.workers} workers "
                f"(+ {self.startup_s:.2f} s to start them)",
                f"system overhead: {self.overhead_ms:.2f} ms per iteration beyond the slowest worker's rollouts"]


def run(ray: Any = None, *, workers: int = 2, iterations: int = 20, pairs: int = 32,
        sigma: float = 0.1, learning_rate: float = 0.2, noise_size: int = 250_000, max_steps: int = 200,
        seed: int = 0, report: Report | None = None) -> Result:
    """Train the CartPole policy with ES for ``iterations`` iterations on ``workers`` actors.

    Args:
        ray: ``lumos`` (default) or ``ray``; a local cluster is started if none is connected.
        workers: worker actors; the ``pairs`` antithetic pairs of an iteration are split among them.
        report: called after each iteration with ``{"iteration", "reward", "best", "timesteps", "elapsed_s"}``.

    Returns:
        a ``Result`` with rewards per iteration, timesteps, wall time and final parameters.
    """
    if workers < 1 or iterations < 1:
        raise ValueError(f"workers and iterations must be >= 1, got {workers} and {iterations}")
    ray = connect(ray)
    rng = np.random.default_rng(seed)
    noise = rng.standard_normal(noise_size).astype(np.float32)
    dim = mlp_size(SIZES)
    params = np.zeros(dim)
    m, v = np.zeros(dim), np.zeros(dim)  # Adam moments
    result = Result(workers=workers)

    t0 = time.perf_counter()
    noise_ref = ray.put(noise)
    actors = [ray.remote(Worker).remote(noise_ref, seed + 1 + i, max_steps) for i in range(workers)]
    shares = [pairs // workers + (i < pairs % workers) for i in range(workers)]
    try:
        ray.get([a.rollouts.remote(params, 0, sigma) for a in actors], timeout=300)  # actors are up
        result.startup_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        for it in range(1, iterations + 1):
            t_iter = time.perf_counter()
            params_ref = ray.put(params)
            outs = ray.get([a.rollouts.remote(params_ref, k, sigma) for a, k in zip(actors, shares) if k],
                           timeout=300)
            result.overhead_s.append(time.perf_counter() - t_iter - max(o["compute_s"] for o in outs))
            indices = np.concatenate([o["indices"] for o in outs])
            returns = np.concatenate([o["returns"] for o in outs])
            ranks = centered_ranks(returns)
            eps = np.stack([noise[i:i + dim] for i in indices]).astype(np.float64)
            grad = (ranks[:, 0] - ranks[:, 1]) @ eps / (len(indices) * sigma) - 0.005 * params
            m = 0.9 * m + 0.1 * grad
            v = 0.999 * v + 0.001 * grad * grad
            step = learning_rate * np.sqrt(1 - 0.999 ** it) / (1 - 0.9 ** it)
            params = params + step * m / (np.sqrt(v) + 1e-8)

            result.rewards.append(float(returns.mean()))
            result.best.append(float(returns.max()))
            result.episodes += returns.size
            result.timesteps += sum(int(o["steps"]) for o in outs)
            if report is not None:
                report({"iteration": it, "reward": result.rewards[-1], "best": result.best[-1],
                        "timesteps": result.timesteps, "elapsed_s": time.perf_counter() - t0})
    finally:
        for a in actors:
            ray.kill(a)
    result.wall_s = time.perf_counter() - t0
    result.params = params
    return result
