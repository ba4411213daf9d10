"""The paper's workloads in ``lumos.examples`` run briefly on a real cluster and do their job.

Each runs a few iterations on the shared 2-CPU cluster: ES and PPO improve on the
random policy's return, allreduce leaves the sum in every actor, serving reports
latencies, the search stops some trials early. ``lumos demo`` (a subprocess) runs each.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any

import numpy as np
import pytest

import lumos
from lumos.examples import WORKLOADS, allreduce, es, hpo, load, ppo, serving

LUMOS = os.path.join(os.path.dirname(sys.executable), "lumos")


def test_es_learns_cartpole_with_a_shared_noise_table(cluster: Any) -> None:
    seen: list[dict[str, Any]] = []
    r = es.run(lumos, workers=2, iterations=8, noise_size=50_000, report=seen.append)
    assert [s["iteration"] for s in seen] == list(range(1, 9))
    assert len(r.rewards) == 8 and r.episodes == 8 * 64
    assert max(r.rewards[-3:]) > 2 * r.rewards[0], r.rewards  # a random policy scores ~10-20
    assert r.timesteps > 0 and r.timesteps_per_s > 0 and r.workers == 2
    assert any("timesteps/s" in line for line in r.summary())
    assert len(r.overhead_s) == 8 and all(0 <= x < r.wall_s for x in r.overhead_s)
    assert any("system overhead" in line for line in r.summary())


def test_es_rank_transform_is_centered() -> None:
    ranks = es.centered_ranks(np.array([[3.0, 1.0], [2.0, 10.0]]))
    assert ranks.tolist() == [[pytest.approx(1 / 6), -0.5], [pytest.approx(-1 / 6), 0.5]]


def test_ppo_parameter_server_applies_every_asynchronous_update(cluster: Any) -> None:
    r = ppo.run(lumos, workers=2, iterations=30, steps_per_rollout=300)
    assert r.updates == 30 and r.timesteps == 30 * 300
    assert np.abs(r.params).sum() > 0
    assert max(r.rewards[-10:]) > r.rewards[0], r.rewards


def test_allreduce_ring_and_gather_leave_the_sum_in_every_actor(cluster: Any) -> None:
    r = allreduce.run(lumos, workers=3, iterations=2, size_mb=0.5)
    assert r.correct and len(r.ring_s) == len(r.naive_s) == 2
    assert "ring allreduce" in "\n".join(r.summary())


def test_ring_allreduce_chunks_sum_in_process() -> None:
    # The ring's index arithmetic, with plain objects passed by hand.
    n = 3
    peers = [allreduce.Peer(i, n, 10) for i in range(n)]
    for phase in ("reduce", "gather"):
        for s in range(n - 1):
            outs = [p.send(phase, s).copy() for p in peers]
            for i, p in enumerate(peers):
                p.receive(phase, s, outs[(i - 1) % n])
    for p in peers:
        assert p.buffer.tolist() == [6.0] * 10


def test_serving_reports_latency_percentiles_for_both_inputs(cluster: Any) -> None:
    r = serving.run(lumos, workers=1, requests=50, warmup_s=0.05)
    assert set(r.stats) == {"small", "large"}
    for s in r.stats.values():
        assert 0 < s["p50_ms"] <= s["p99_ms"] and s["requests_per_s"] > 0


def test_hpo_stops_bad_trials_early_and_finds_a_good_one(cluster: Any) -> None:
    seen: list[dict[str, Any]] = []
    r = hpo.run(lumos, workers=2, iterations=10, epochs=4, report=seen.append)
    assert r.trials == 10 and 0 < r.stopped_early < 10
    assert r.best_loss < 0.4 and r.history[r.best_trial]["accuracy"] > 0.8
    assert seen and seen[-1]["trials_done"] == 10


def test_workloads_refuse_bad_arguments() -> None:
    with pytest.raises(ValueError, match="workers and iterations must be >= 1"):
        es.run(lumos, workers=0)
    with pytest.raises(ValueError, match="workers >= 2"):
        allreduce.run(lumos, workers=1)
    with pytest.raises(ValueError, match="unknown workload 'chess'; choose one of es, ppo"):
        load("chess")


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", [w for w in WORKLOADS if w != "es"])
def test_lumos_demo_runs_each_workload(name: str) -> None:
    # Short: Unix socket paths under the session directory must stay < 108 bytes.
    root = tempfile.mkdtemp(prefix="le", dir="/tmp")
    env = dict(os.environ, LUMOS_TMPDIR=root)
    env.pop("LUMOS_ADDRESS", None)
    try:
        iterations = "1" if name == "serving" else "2"
        out = subprocess.run([LUMOS, "demo", name, "--iterations", iterations, "--num-cpus", "2"], env=env,
                             capture_output=True, text=True, timeout=240)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert out.returncode == 0, out.stderr
    assert f"lumos demo {name}:" in out.stdout and "wall time:" in out.stdout, out.stdout


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_lumos_demo_dashboard_flag_prints_the_live_dashboard_link() -> None:
    root = tempfile.mkdtemp(prefix="le", dir="/tmp")
    env = dict(os.environ, LUMOS_TMPDIR=root)
    env.pop("LUMOS_ADDRESS", None)
    try:
        out = subprocess.run([LUMOS, "demo", "hpo", "--iterations", "2", "--workers", "1", "--dashboard"],
                             env=env, capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert out.returncode == 0, out.stderr
    assert "dashboard: http://127.0.0.1:" in out.stdout and "token=" in out.stdout, out.stdout
    assert "with 1 workers" in out.stdout
