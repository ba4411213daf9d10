"""Shared by the example workloads: the Ray-like module to use, and CartPole in numpy.

``connect(ray)`` picks ``lumos`` unless another module with Ray's API is given and starts a
local cluster only when none is connected. ``CartPole`` is the classic-control task
(Barto, Sutton and Anderson 1983, the dynamics of gymnasium's ``CartPole-v1``) in plain
Python floats: one step costs about a microsecond, so workers spend their time in the
workload rather than in an environment library.
"""

from __future__ import annotations

import importlib
import math
import random
from typing import Any, Callable

import numpy as np

Report = Callable[[dict[str, Any]], None]


def connect(ray: Any = None) -> Any:
    """The Ray-like module to run on (``lumos`` by default), connected to a cluster."""
    if ray is None:
        ray = importlib.import_module("lumos")
    if not ray.is_initialized():
        ray.init()
    return ray


def percentile(sorted_values: list[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of an ascending list, nearest rank."""
    if not sorted_values:
        return float("nan")
    i = min(len(sorted_values) - 1, max(0, math.ceil(q / 100 * len(sorted_values)) - 1))
    return sorted_values[i]


class CartPole:
    """A pole on a cart: push left (0) or right (1); reward 1 per step while it stays up.

    An episode ends when the pole leans past 12 degrees, the cart leaves [-2.4, 2.4], or
    after ``max_steps`` steps.
    """

    obs_size = 4
    num_actions = 2

    def __init__(self, seed: int = 0, max_steps: int = 200) -> None:
        self.rng = random.Random(seed)
        self.max_steps = max_steps
        self.state = (0.0, 0.0, 0.0, 0.0)
        self.steps = 0

    def reset(self, seed: int | None = None) -> tuple[float, float, float, float]:
        if seed is not None:
            self.rng.seed(seed)
        u = self.rng.uniform
        self.state = (u(-0.05, 0.05), u(-0.05, 0.05), u(-0.05, 0.05), u(-0.05, 0.05))
        self.steps = 0
        return self.state

    def step(self, action: int) -> tuple[tuple[float, float, float, float], float, bool]:
        x, x_dot, theta, theta_dot = self.state
        force = 10.0 if action == 1 else -10.0
        cos, sin = math.cos(theta), math.sin(theta)
        # gravity 9.8, cart 1.0 kg, pole 0.1 kg, half-length 0.5 m, 20 ms per step
        temp = (force + 0.05 * theta_dot * theta_dot * sin) / 1.1
        theta_acc = (9.8 * sin - cos * temp) / (0.5 * (4.0 / 3.0 - 0.1 * cos * cos / 1.1))
        x_acc = temp - 0.05 * theta_acc * cos / 1.1
        x += 0.02 * x_dot
        x_dot += 0.02 * x_acc
        theta += 0.02 * theta_dot
        theta_dot += 0.02 * theta_acc
        self.state = (x, x_dot, theta, theta_dot)
        self.steps += 1
        done = (x < -2.4 or x > 2.4 or theta < -0.20943951 or theta > 0.20943951
                or self.steps >= self.max_steps)
        return self.state, 1.0, done


def mlp_size(sizes: tuple[int, ...]) -> int:
    """Number of parameters of a dense network with these layer sizes."""
    return sum(a * b + b for a, b in zip(sizes, sizes[1:]))


def mlp_unpack(flat: np.ndarray, sizes: tuple[int, ...]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Weights and biases per layer, as views of ``flat``."""
    layers, i = [], 0
    for a, b in zip(sizes, sizes[1:]):
        w = flat[i:i + a * b].reshape(a, b)
        i += a * b
        layers.append((w, flat[i:i + b]))
        i += b
    return layers


def mlp_forward(layers: list[tuple[np.ndarray, np.ndarray]], x: np.ndarray) -> np.ndarray:
    """tanh hidden layers, linear output."""
    for w, b in layers[:-1]:
        x = np.tanh(x @ w + b)
    w, b = layers[-1]
    return x @ w + b
