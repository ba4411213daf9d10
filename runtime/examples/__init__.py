"""The paper's workloads, small and fast, reusable from Python, notebooks and ``lumos demo``.

Each module runs one workload of "Ray: A Distributed Framework for Emerging AI
Applications" in numpy, with no dependency beyond numpy, against whichever Ray-like module
it is given: ``run(ray=None, ...)`` uses ``lumos`` by default and runs the identical code
on Ray with ``import ray; es.run(ray)``. A cluster is started (``ray.init()``) only if
none is connected; the caller shuts it down.

| module | workload |
|---|---|
| ``lumos.examples.es`` | evolution strategies: antithetic sampling, a shared noise table in the object store |
| ``lumos.examples.ppo`` | PPO-style rollout actors and a parameter server, ``wait``-driven asynchronous updates |
| ``lumos.examples.allreduce`` | ring allreduce among actors through the object store, against gather/broadcast |
| ``lumos.examples.serving`` | a low-latency serving loop: requests/s and p50/p99 latency, small and larger inputs |
| ``lumos.examples.hpo`` | hyperparameter search: many short trials, early stopping via ``wait`` |

    >>> import lumos
    >>> from lumos.examples import es
    >>> lumos.init(num_cpus=2)
    >>> result = es.run(workers=2, iterations=10)
    >>> result.rewards[-1]
"""

from __future__ import annotations

import importlib
from typing import Any

#: name -> one line shown by ``lumos demo --list``.
WORKLOADS: dict[str, str] = {
    "es": "evolution strategies on CartPole: antithetic sampling, shared noise table (the default)",
    "ppo": "PPO-style rollout actors + a parameter server, asynchronous updates driven by wait()",
    "allreduce": "ring allreduce among actors through the object store, against gather/broadcast",
    "serving": "low-latency serving loop: requests/s and p50/p99 latency for small and larger inputs",
    "hpo": "hyperparameter search: many short trials, median early stopping via wait()",
}

__all__ = ["WORKLOADS", "load"]


def load(name: str) -> Any:
    """The module of workload ``name`` (one of ``WORKLOADS``)."""
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; choose one of {', '.join(WORKLOADS)}")
    return importlib.import_module(f"lumos.examples.{name}")
