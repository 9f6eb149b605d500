"""Env overhead: time per env step versus the simulator's own interval, side by side.

    python -m experiments.bench_env

The env may add at most 10% to the simulator's interval time (issue 39). Both loops play the same episodes:
same scenario, same seed (so the same fault history), same batches (the env holds them), and both
start a new episode when validation accuracy reaches the target, the sim loop with a bare
``reset`` plus warm-up interval, the env loop with ``env.reset``. Simulated state therefore costs
both alike (intervals that straddle fault events are dearer; an episode's early intervals differ
from its late ones). The loops alternate in rounds so that machine load affects both alike, and
the fastest round of each is compared.

A second figure splits the env loop itself: the time spent inside the backend's ``run_interval``
versus everything else the env does (encoding, reward, action checks, bookkeeping, resets).

Then (``batched.enabled``) the batched vector env against the per-cluster env on the same worlds,
env steps/s over batch sizes and the memory taken (:mod:`experiments.bench_batched`), written to
``batched.out`` with its plot ``batched.plot``.
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
from gymnasium.utils import seeding
from hydra.utils import to_absolute_path
from omegaconf import DictConfig

from dynamix_gym.envs.hetero_cluster import HeteroClusterEnv
from experiments import bench_batched
from experiments.common import atomic_write_text


def _time_loop(fn, seconds: float) -> float:
    """Mean seconds per call of ``fn`` over about ``seconds``."""
    count = 0
    t0 = time.perf_counter()
    while True:
        for _ in range(20):
            fn()
        count += 20
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds:
            return elapsed / count


class _TimedBackend:
    """Wraps a backend and sums the time its ``run_interval`` takes."""

    def __init__(self, backend) -> None:
        self.inner, self.spent_s, self.calls = backend, 0.0, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def run_interval(self, local_batches, iterations):
        t0 = time.perf_counter()
        report = self.inner.run_interval(local_batches, iterations)
        self.spent_s += time.perf_counter() - t0
        self.calls += 1
        return report


def measure(
    workers: int, scenario: str, iterations: int, seconds: float, seed: int, rounds: int = 10
) -> dict:
    env = HeteroClusterEnv(workers=workers, scenario=scenario, interval=iterations, max_decisions=None)
    env.reset(seed=seed)
    env.time_budget_s = float("inf")  # episodes end at the target only, in both loops
    backend = env.backend
    target = backend.spec.target_accuracy
    hold = np.full(workers, 2)  # delta index 2 = 0: batches unchanged
    batches = env.batches.copy()

    def env_step():
        _, _, terminated, _, _ = env.step(hold)
        if terminated:
            env.reset(seed=seed)

    def sim_step():
        report = backend.run_interval(batches, iterations)
        if report.val_accuracy >= target:
            backend.reset(rng=seeding.np_random(seed)[0])  # what env.reset(seed=seed) seeds it with
            backend.run_interval(batches, iterations)  # the env's warm-up interval

    backend.reset(rng=seeding.np_random(seed)[0])
    backend.run_interval(batches, iterations)
    env_times, sim_times = [], []
    for _ in range(rounds):
        sim_times.append(_time_loop(sim_step, seconds / rounds))
        env_times.append(_time_loop(env_step, seconds / rounds))
    # The fastest round of each is the least disturbed by other load on the machine.
    sim_s, env_s = float(np.min(sim_times)), float(np.min(env_times))

    # Inside the env loop: backend time versus the env's own work.
    timed = _TimedBackend(backend)
    env.backend = timed
    env.reset(seed=seed)
    timed.spent_s = 0.0
    steps = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds / 2:
        env_step()
        steps += 1
    total = time.perf_counter() - t0
    env.backend = backend
    env.close()
    return {
        "workers": workers,
        "sim_us_per_interval": 1e6 * sim_s,
        "env_us_per_step": 1e6 * env_s,
        "overhead_ratio": env_s / sim_s,
        "in_loop_backend_us_per_step": 1e6 * timed.spent_s / steps,
        "in_loop_env_own_us_per_step": 1e6 * (total - timed.spent_s) / steps,
        "in_loop_ratio": total / timed.spent_s,
    }


def run(cfg: DictConfig) -> dict:
    if not cfg.get("overhead", True):  # the batched comparison alone
        return {"batched": run_batched(cfg)}
    rows = [
        measure(int(n), cfg.scenario, int(cfg.iterations), float(cfg.seconds), int(cfg.seed))
        for n in cfg.workers
    ]
    print(
        f"Env overhead, K = {cfg.iterations}, scenario {cfg.scenario} (target: env step <= 1.10 x sim interval)"
    )
    print(
        f"{'workers':>8}{'sim us/interval':>18}{'env us/step':>14}{'ratio':>8}"
        f"{'in-loop backend us':>21}{'env own us':>12}{'in-loop ratio':>15}"
    )
    for r in rows:
        print(
            f"{r['workers']:>8}{r['sim_us_per_interval']:>18.0f}{r['env_us_per_step']:>14.0f}"
            f"{r['overhead_ratio']:>8.3f}{r['in_loop_backend_us_per_step']:>21.0f}"
            f"{r['in_loop_env_own_us_per_step']:>12.0f}{r['in_loop_ratio']:>15.3f}"
        )
    result = {
        "K": int(cfg.iterations),
        "scenario": cfg.scenario,
        "rows": rows,
        "target_ratio": 1.10,
        "date": datetime.date.today().isoformat(),
        "load_avg_1m": os.getloadavg()[0],  # other work on the machine: timings are noisy when high
    }
    out = Path(to_absolute_path(cfg.out))
    atomic_write_text(out, json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(f"wrote {out}")
    if cfg.batched.enabled:
        result["batched"] = run_batched(cfg)
    return result


def run_batched(cfg: DictConfig) -> dict:
    """The batched vector env against the per-cluster env (``cfg.batched``), table, JSON and plot.
    One BLAS/OpenMP thread (numpy's elementwise work is single-threaded anyway): one core."""
    from threadpoolctl import threadpool_limits

    b = cfg.batched
    load_before, started = os.getloadavg(), time.time()
    with threadpool_limits(1):
        results = [
            {
                "scenario": scenario,
                **bench_batched.measure(
                    n,
                    scenario,
                    int(cfg.iterations),
                    [int(x) for x in sizes],
                    float(b.seconds),
                    int(cfg.seed),
                    int(b.rounds),
                    int(b.per_cluster_envs),
                    [int(x) for x in b.stream_sizes if int(x) in sizes],
                ),
            }
            for scenario in b.scenarios
            for n, sizes in ((int(n), list(sizes)) for n, sizes in b.batch_sizes.items())
        ]
    print(f"\nBatched vector env vs per-cluster env, K = {cfg.iterations}, one core")
    print(f"(load average {load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after, on {os.cpu_count()} cores; "
          "speed-ups by wall clock, then by CPU time, then the bound of the random draws alone)")  # fmt: skip
    print(f"{'scenario':<15}{'workers':>8}{'batch':>7}{'per-cluster/s':>15}{'batched/s':>12}{'speed-up':>10}"
          f"{'cpu':>7}{'draws':>7}{'own streams/s':>15}{'speed-up':>10}{'peak MiB':>10}{'RSS MiB':>9}")  # fmt: skip
    for res in results:
        for r in res["rows"]:
            stream = "-" if r["stream_steps_per_s"] is None else f"{r['stream_steps_per_s']:.0f}"
            stream_up = "-" if r["stream_speedup"] is None else f"{r['stream_speedup']:.1f}"
            print(
                f"{res['scenario']:<15}{res['workers']:>8}{r['batch']:>7}{res['per_cluster_steps_per_s']:>15.0f}"
                f"{r['batched_steps_per_s']:>12.0f}{r['speedup']:>10.1f}{r['speedup_cpu']:>7.1f}"
                f"{r['draws_bound_speedup_cpu']:>7.1f}{stream:>15}{stream_up:>10}{r['peak_mib']:>10.0f}"
                f"{r['rss_growth_mib']:>9.0f}"
            )
    targets = {8: 50, 64: 20}
    out = {
        "K": int(cfg.iterations),
        "scenarios": list(b.scenarios),
        "date": datetime.date.today().isoformat(),
        "machine": {
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
            "numpy": np.__version__,
            "threads": 1,
            # other work on the shared machine: [1, 5, 15]-minute load averages before and after
            "load_avg_before": list(load_before),
            "load_avg_after": list(os.getloadavg()),
            "load_avg_1m": os.getloadavg()[0],
            "seconds": time.time() - started,
        },
        "targets": {"speedup_8_workers": targets[8], "speedup_64_workers": targets[64], "peak_gib": 2},
        "results": results,
    }
    path = Path(to_absolute_path(b.out))
    atomic_write_text(path, json.dumps(out, indent=2, sort_keys=True) + "\n")
    bench_batched.plot(results, Path(to_absolute_path(b.plot)), targets)
    print(f"wrote {path} and {b.plot}")
    return out


@hydra.main(version_base=None, config_path="../conf", config_name="bench_env")
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    main()
