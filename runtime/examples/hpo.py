"""Hyperparameter search: many short trials, early stopping decided as results arrive.

Each trial trains a logistic-regression model with minibatch SGD on a synthetic data set
(put in the object store once, read zero-copy by every runner) under its own learning
rate, batch size and L2 penalty. ``workers`` runner actors each train one trial at a
time, an epoch per call. The driver takes results with ``wait`` in whatever order they
finish and stops a trial whose validation loss is worse than the median of earlier
trials at the same epoch (the median stopping rule); that runner starts a new trial at
once.

    import lumos as ray            # or: import ray
    from lumos.examples import hpo
    result = hpo.run(ray, workers=2, iterations=24)     # 24 trials
    result.best_config
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lumos.examples._common import Report, connect


def make_data(n: int = 4000, d: int = 20, seed: int = 0) -> dict[str, np.ndarray]:
    """A linearly separable-ish classification problem, split 3:1 into train and validation."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d)).astype(np.float64)
    w = rng.standard_normal(d)
    y = (x @ w + 0.5 * rng.standard_normal(n) > 0).astype(np.float64)
    cut = n * 3 // 4
    return {"x": x[:cut], "y": y[:cut], "x_val": x[cut:], "y_val": y[cut:]}


def sample_config(rng: np.random.Generator) -> dict[str, float]:
    return {"lr": float(10 ** rng.uniform(-4, 0.5)), "batch_size": int(rng.choice([16, 64, 256])),
            "l2": float(10 ** rng.uniform(-5, -1))}


class Runner:
    """Trains one trial at a time, an epoch per ``train`` call."""

    def __init__(self, data: dict[str, np.ndarray]) -> None:
        self.data = data
        self.start(-1, {"lr": 0.0, "batch_size": 1, "l2": 0.0})

    def start(self, trial_id: int, config: dict[str, float]) -> None:
        self.trial_id, self.config = trial_id, config
        self.w = np.zeros(self.data["x"].shape[1])
        self.rng = np.random.default_rng(trial_id + 1)
        self.epoch = 0

    def train(self) -> dict[str, Any]:
        x, y = self.data["x"], self.data["y"]
        lr, bs, l2 = self.config["lr"], int(self.config["batch_size"]), self.config["l2"]
        order = self.rng.permutation(len(y))
        for i in range(0, len(y), bs):
            idx = order[i:i + bs]
            p = 1 / (1 + np.exp(-(x[idx] @ self.w)))
            self.w -= lr * (x[idx].T @ (p - y[idx]) / len(idx) + l2 * self.w)
        self.epoch += 1
        p = np.clip(1 / (1 + np.exp(-(self.data["x_val"] @ self.w))), 1e-7, 1 - 1e-7)
        yv = self.data["y_val"]
        loss = float(-np.mean(yv * np.log(p) + (1 - yv) * np.log(1 - p)))
        return {"trial": self.trial_id, "epoch": self.epoch, "loss": loss,
                "accuracy": float(np.mean((p > 0.5) == yv))}


@dataclass
class Result:
    workers: int
    trials: int = 0
    stopped_early: int = 0
    epochs: int = 0
    #: trial id -> its config and validation losses per epoch
    history: dict[int, dict[str, Any]] = field(default_factory=dict)
    best_trial: int = -1
    wall_s: float = 0.0

    @property
    def best_config(self) -> dict[str, float]:
        return self.history[self.best_trial]["config"]

    @property
    def best_loss(self) -> float:
        return min(self.history[self.best_trial]["losses"])

    def summary(self) -> list[str]:
        best = self.history[self.best_trial]
        cfg = ", ".join(f"{k}={v:.3g}" for k, v in best["config"].items())
        return [f"trials: {self.trials} ({self.stopped_early} stopped early), epochs trained: {self.epochs}",
                f"best: trial {self.best_trial} ({cfg}): validation loss {self.best_loss:.4f}, "
                f"accuracy {best['accuracy']:.3f}",
                f"throughput: {self.epochs / self.wall_s:,.1f} trial-epochs/s",
                f"wall time: {self.wall_s:.2f} s with {self.workers} workers"]


def run(ray: Any = None, *, workers: int = 2, iterations: int = 24, epochs: int = 8, grace_epochs: int = 2,
        seed: int = 0, report: Report | None = None) -> Result:
    """Search ``iterations`` trials of up to ``epochs`` epochs, ``workers`` at a time.

    Args:
        ray: ``lumos`` (default) or ``ray``; a local cluster is started if none is connected.
        grace_epochs: epochs a trial always gets before the median rule may stop it.
        report: called after every epoch of every trial with ``{"trial", "epoch", "loss",
            "accuracy", "stopped", "finished", "trials_done", "elapsed_s"}``.
    """
    if workers < 1 or iterations < 1 or epochs < 1:
        raise ValueError(f"workers, iterations and epochs must be >= 1, got {workers}, {iterations}, {epochs}")
    ray = connect(ray)
    rng = np.random.default_rng(seed)
    result = Result(workers=workers)
    t0 = time.perf_counter()
    data = ray.put(make_data(seed=seed))
    runners = [ray.remote(Runner).remote(data) for _ in range(min(workers, iterations))]
    running: dict[Any, tuple[int, Any]] = {}  # pending ref -> (trial id, runner)
    losses_at: dict[int, list[float]] = {}    # epoch -> losses of all trials that reached it
    started = 0

    def start_trial(actor: Any) -> None:
        nonlocal started
        config = sample_config(rng)
        result.history[started] = {"config": config, "losses": [], "accuracy": 0.0, "stopped": False}
        actor.start.remote(started, config)  # one caller's calls run in order: before train()
        running[actor.train.remote()] = (started, actor)
        started += 1

    try:
        for actor in runners:
            start_trial(actor)
        while running:
            [done], _ = ray.wait(list(running), num_returns=1, timeout=300)
            trial_id, actor = running.pop(done)
            r = ray.get(done, timeout=300)
            hist = result.history[trial_id]
            hist["losses"].append(r["loss"])
            hist["accuracy"] = r["accuracy"]
            result.epochs += 1
            earlier = losses_at.setdefault(r["epoch"], [])
            stop = (r["epoch"] >= grace_epochs and len(earlier) >= 3 and r["loss"] > float(np.median(earlier)))
            earlier.append(r["loss"])
            finished = stop or r["epoch"] >= epochs
            if finished:
                hist["stopped"] = stop
                result.trials += 1
                result.stopped_early += stop
                if started < iterations:
                    start_trial(actor)
            else:
                running[actor.train.remote()] = (trial_id, actor)
            if report is not None:
                report({**r, "stopped": stop, "finished": finished, "trials_done": result.trials,
                        "elapsed_s": time.perf_counter() - t0})
    finally:
        for actor in runners:
            ray.kill(actor)
    result.best_trial = min(result.history, key=lambda t: min(result.history[t]["losses"] or [float("inf")]))
    result.wall_s = time.perf_counter() - t0
    return result
