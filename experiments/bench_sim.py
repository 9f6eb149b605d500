"""Simulator speed: intervals/s and worker-iterations/s for several cluster sizes, one core.

    python -m experiments.bench_sim

Prints a table and writes ``results/bench/sim.json`` ({"K": .., "intervals_per_s": {"4": ..}}).
The target is >= 2,000 intervals/s at 8 workers and K = 50, with cost per interval growing no
worse than linearly in the number of workers (the ``cost_ratio_vs_linear`` column: cost per
worker-iteration relative to the smallest cluster; <= 1 means sub-linear growth).

Beside each row, the batched engine (:class:`sim.batched.BatchedSimulator`, ``batched_clusters``
clusters of the same world with one noise stream for the batch) in cluster-intervals per second and
its speed-up over the SimPy engine (``batched_clusters=0`` skips it).

The pipeline row (``result["pipeline"]``): an interval of the pipeline mode (:mod:`sim.pipeline`,
8 stages x 16 micro-batches, 1F1B, K iterations, a generated 32-block model) against a
data-parallel interval of 8 workers measured right after it; target: at most 2x its cost.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import time
from pathlib import Path

import hydra
import numpy as np
from hydra.utils import to_absolute_path
from omegaconf import DictConfig

from experiments.common import atomic_write_text
from sim.batched import BatchedSimulator
from sim.cluster import default_cluster
from sim.engine import Simulator


def measure(workers: int, scenario: str, workload: str, iterations: int, seconds: float, seed: int) -> dict:
    sim = Simulator(default_cluster(workers), workload, scenario, seed=seed)
    sim.reset()
    batches = np.clip(np.full(workers, 128), sim.min_batch, sim.max_batch)
    for _ in range(20):  # warm-up: caches, first fault events
        sim.run_interval(batches, iterations)
    count = 0
    t0 = time.perf_counter()
    deadline = t0 + seconds
    while True:
        for _ in range(50):
            sim.run_interval(batches, iterations)
        count += 50
        now = time.perf_counter()
        if now >= deadline:
            break
    elapsed = now - t0
    per_s = count / elapsed
    return {
        "workers": workers,
        "scenario": scenario,
        "intervals_per_s": per_s,
        "worker_iterations_per_s": per_s * workers * iterations,
        "us_per_interval": 1e6 / per_s,
    }


def measure_batched(
    workers: int, scenario: str, workload: str, iterations: int, seconds: float, seed: int, clusters: int
) -> float:
    """Cluster-intervals per second of the batched engine stepping ``clusters`` copies of the world
    (seeds ``seed + i``) at the batches :func:`measure` holds."""
    sims = [Simulator(default_cluster(workers), workload, scenario) for _ in range(clusters)]
    batch = BatchedSimulator(sims, noise="batch", seed=seed)
    for i in range(clusters):
        batch.reset(i, np.random.default_rng(seed + i))
    batches = np.clip(np.full((clusters, workers), 128), batch.world.min_batch, batch.world.max_batch)
    for _ in range(3):
        batch.run_interval(batches, iterations)
    count, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        batch.run_interval(batches, iterations)
        count += 1
    return count * clusters / (time.perf_counter() - t0)


def measure_pipeline(scenario: str, iterations: int, seconds: float, seed: int) -> dict:
    from sim.pipeline.model import ModelShape, generate_model
    from sim.pipeline.simulator import PipelineSimulator

    model = generate_model(np.random.default_rng(seed), ModelShape(num_blocks=(32, 32)))
    sim = PipelineSimulator(default_cluster(8), model, scenario, stages=8, seed=seed)
    sim.reset()
    sizes = sim.default_sizes()
    for _ in range(20):
        sim.run_interval(sizes, 16, iterations)
    count, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(20):
            sim.run_interval(sizes, 16, iterations)
        count += 20
    pipe_us = 1e6 * (time.perf_counter() - t0) / count
    dp_us = measure(8, scenario, "cifar10", iterations, seconds, seed)["us_per_interval"]
    return {"stages": 8, "micro_batches": 16, "scenario": scenario, "us_per_interval": pipe_us,
            "dp_8_workers_us_per_interval": dp_us, "cost_vs_dp": pipe_us / dp_us, "target_cost_vs_dp": 2.0}  # fmt: skip


def run(cfg: DictConfig) -> dict:
    rows = []
    clusters = int(cfg.get("batched_clusters", 0))
    for scenario in cfg.scenarios:
        for n in cfg.workers:
            row = measure(
                int(n), scenario, cfg.workload, int(cfg.iterations), float(cfg.seconds), int(cfg.seed)
            )
            if clusters:
                row["batched_intervals_per_s"] = measure_batched(
                    int(n),
                    scenario,
                    cfg.workload,
                    int(cfg.iterations),
                    float(cfg.seconds),
                    int(cfg.seed),
                    clusters,
                )
                row["batched_speedup"] = row["batched_intervals_per_s"] / row["intervals_per_s"]
            rows.append(row)
    # Cost per worker-iteration relative to the smallest cluster of the same scenario.
    for scenario in cfg.scenarios:
        sub = [r for r in rows if r["scenario"] == scenario]
        base = sub[0]["worker_iterations_per_s"]
        for r in sub:
            r["cost_ratio_vs_linear"] = base / r["worker_iterations_per_s"]
    print(
        f"Simulator benchmark, K = {cfg.iterations}, one process ({platform.processor() or platform.machine()})"
    )
    print(
        f"{'scenario':<14}{'workers':>8}{'intervals/s':>14}{'worker-iter/s':>16}{'us/interval':>13}{'cost/linear':>13}"
        + (f"{f'batched x{clusters} /s':>18}{'speed-up':>10}" if clusters else "")
    )
    for r in rows:
        batched = f"{r['batched_intervals_per_s']:>18.0f}{r['batched_speedup']:>10.1f}" if clusters else ""
        print(
            f"{r['scenario']:<14}{r['workers']:>8}{r['intervals_per_s']:>14.0f}"
            f"{r['worker_iterations_per_s']:>16.3g}{r['us_per_interval']:>13.0f}{r['cost_ratio_vs_linear']:>13.2f}"
            + batched
        )
    primary = cfg.scenarios[0]
    result = {
        "K": int(cfg.iterations),
        "scenario": primary,
        "intervals_per_s": {
            str(r["workers"]): round(r["intervals_per_s"], 1) for r in rows if r["scenario"] == primary
        },
        "worker_iterations_per_s": {
            str(r["workers"]): round(r["worker_iterations_per_s"]) for r in rows if r["scenario"] == primary
        },
        "rows": rows,
        "target": {"workers": 8, "intervals_per_s": 2000},
        "batched_clusters": clusters,
        "date": datetime.date.today().isoformat(),
        "load_avg_1m": os.getloadavg()[0],  # other work on the machine: timings are noisy when high
        "machine": {"cpu_count": os.cpu_count(), "python": platform.python_version()},
        "pipeline": [
            measure_pipeline(sc, int(cfg.iterations), float(cfg.seconds), int(cfg.seed))
            for sc in cfg.scenarios
        ],
    }
    for p in result["pipeline"]:
        print(f"pipeline {p['scenario']}: 8 stages x 16 micro-batches {p['us_per_interval']:.0f} us/interval, "
              f"{p['cost_vs_dp']:.2f}x a data-parallel interval of 8 workers (target <= 2)")  # fmt: skip
    out = Path(to_absolute_path(cfg.out))
    atomic_write_text(out, json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(f"wrote {out}")
    return result


@hydra.main(version_base=None, config_path="../conf", config_name="bench_sim")
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    main()
