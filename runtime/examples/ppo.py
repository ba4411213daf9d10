"""PPO-style asynchronous training: rollout actors and a parameter-server actor.

Each rollout actor keeps its own CartPole and, given the current weights, collects
``steps`` environment steps with a softmax policy, runs a few epochs of PPO's clipped
surrogate objective on them locally, and returns the weight change. The parameter server
(an actor) applies changes as they arrive. The driver never waits for the slowest
worker: ``wait`` hands it whichever rollout finished first, it forwards that result to the
parameter server and sends the worker the new weights as an ``ObjectRef`` (the worker
reads them when the server has produced them).

```
            ┌──── wait(pending, num_returns=1) ◄──── Rollout.run(weights) ×N
 driver ────┤
            └──► ParameterServer.apply(result) ──► new weights ref ──► Rollout.run(...)
```

    import lumos as ray            # or: import ray
    from lumos.examples import ppo
    result = ppo.run(ray, workers=2, iterations=40)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lumos.examples._common import CartPole, Report, connect

OBS, ACTIONS = CartPole.obs_size, CartPole.num_actions
DIM = OBS * ACTIONS + ACTIONS  # a linear softmax policy: logits = obs @ W + b


def _unpack(params: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return params[:OBS * ACTIONS].reshape(OBS, ACTIONS), params[OBS * ACTIONS:]


def _probs(params: np.ndarray, obs: np.ndarray) -> np.ndarray:
    w, b = _unpack(params)
    logits = obs @ w + b
    logits = logits - logits.max(axis=-1, keepdims=True)
    e = np.exp(logits)
    return e / e.sum(axis=-1, keepdims=True)


class Rollout:
    """Collects experience with the weights it is given and returns a PPO update."""

    def __init__(self, seed: int, max_steps: int = 200) -> None:
        self.env = CartPole(seed, max_steps)
        self.obs = self.env.reset()
        self.rng = np.random.default_rng(seed)
        self.episode_return = 0.0

    def run(self, params: np.ndarray, steps: int, gamma: float = 0.95, clip: float = 0.2,
            epochs: int = 8, learning_rate: float = 1.0) -> dict[str, Any]:
        params = np.array(params, dtype=np.float64)  # weights from the store are read-only
        obs_buf = np.zeros((steps, OBS))
        actions = np.zeros(steps, dtype=np.int64)
        rewards = np.zeros(steps)
        ends = np.zeros(steps, dtype=bool)
        finished: list[float] = []
        w, b = _unpack(params)
        for t in range(steps):
            obs = np.asarray(self.obs)
            logits = obs @ w + b
            p_right = 1.0 / (1.0 + np.exp(logits[0] - logits[1]))
            action = 1 if self.rng.random() < p_right else 0
            self.obs, reward, done = self.env.step(action)
            obs_buf[t], actions[t], rewards[t], ends[t] = obs, action, reward, done
            self.episode_return += reward
            if done:
                finished.append(self.episode_return)
                self.episode_return = 0.0
                self.obs = self.env.reset()
        # Discounted returns-to-go within each episode; advantages normalised.
        returns = np.zeros(steps)
        acc = 0.0
        for t in range(steps - 1, -1, -1):
            acc = rewards[t] + gamma * acc * (not ends[t])
            returns[t] = acc
        adv = (returns - returns.mean()) / (returns.std() + 1e-8)
        onehot = np.eye(ACTIONS)[actions]
        old = _probs(params, obs_buf)[np.arange(steps), actions]
        new_params = params.copy()
        for _ in range(epochs):
            probs = _probs(new_params, obs_buf)
            ratio = probs[np.arange(steps), actions] / old
            # The clipped surrogate's gradient is zero where the clip is active.
            active = ~(((adv > 0) & (ratio > 1 + clip)) | ((adv < 0) & (ratio < 1 - clip)))
            g = (adv * ratio * active)[:, None] * (onehot - probs)
            grad = np.concatenate([(obs_buf.T @ g).ravel(), g.sum(axis=0)]) / steps
            new_params += learning_rate * grad
        return {"delta": new_params - params, "episode_returns": finished, "steps": steps}


class ParameterServer:
    """Holds the weights; applies updates in the order they arrive."""

    def __init__(self, params: np.ndarray) -> None:
        self.params = np.array(params, dtype=np.float64)
        self.updates = 0

    def apply(self, result: dict[str, Any]) -> np.ndarray:
        self.params += result["delta"]
        self.updates += 1
        return self.params.copy()

    def get_weights(self) -> np.ndarray:
        return self.params.copy()


@dataclass
class Result:
    workers: int
    #: mean return of the episodes each update's rollout finished (the last known when none)
    rewards: list[float] = field(default_factory=list)
    updates: int = 0
    timesteps: int = 0
    wall_s: float = 0.0
    params: Any = None

    @property
    def timesteps_per_s(self) -> float:
        return self.timesteps / self.wall_s if self.wall_s else 0.0

    def summary(self) -> list[str]:
        return [f"final mean reward: {self.rewards[-1]:.1f}",
                f"updates: {self.updates}  timesteps: {self.timesteps:,}",
                f"throughput: {self.timesteps_per_s:,.0f} timesteps/s, {self.updates / self.wall_s:,.1f} updates/s",
                f"wall time: {self.wall_s:.2f} s with {self.workers} rollout workers + 1 parameter server"]


def run(ray: Any = None, *, workers: int = 2, iterations: int = 40, steps_per_rollout: int = 400,
        seed: int = 0, report: Report | None = None) -> Result:
    """``iterations`` asynchronous updates from ``workers`` rollout actors.

    Args:
        ray: ``lumos`` (default) or ``ray``; a local cluster is started if none is connected.
        report: called after each update with ``{"iteration", "reward", "timesteps", "elapsed_s"}``.
    """
    if workers < 1 or iterations < 1:
        raise ValueError(f"workers and iterations must be >= 1, got {workers} and {iterations}")
    ray = connect(ray)
    result = Result(workers=workers)
    t0 = time.perf_counter()
    ps = ray.remote(ParameterServer).remote(np.zeros(DIM))
    actors = [ray.remote(Rollout).remote(seed + 1 + i) for i in range(workers)]
    last_reward = 0.0
    try:
        weights = ps.get_weights.remote()
        pending = {a.run.remote(weights, steps_per_rollout): a for a in actors}
        submitted = len(pending)
        while result.updates < iterations:
            [done], _ = ray.wait(list(pending), num_returns=1, timeout=300)
            actor = pending.pop(done)
            weights = ps.apply.remote(done)  # the server reads the update from the store
            if submitted < iterations:
                pending[actor.run.remote(weights, steps_per_rollout)] = actor
                submitted += 1
            stats = ray.get(done, timeout=300)
            if stats["episode_returns"]:
                last_reward = float(np.mean(stats["episode_returns"]))
            result.updates += 1
            result.timesteps += int(stats["steps"])
            result.rewards.append(last_reward)
            if report is not None:
                report({"iteration": result.updates, "reward": last_reward, "timesteps": result.timesteps,
                        "elapsed_s": time.perf_counter() - t0})
        result.params = ray.get(ps.get_weights.remote(), timeout=300)
    finally:
        for a in [*actors, ps]:
            ray.kill(a)
    result.wall_s = time.perf_counter() - t0
    return result
