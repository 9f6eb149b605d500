"""Env overhead: time per env step versus the simulator's own interval, side by side.

    python -m experiments.bench_env

The env may add at most 25% to the simulator's interval time. Both loops run the same batches on
the same scenario; they alternate in rounds so that machine load affects both alike, and the fastest
round of each is compared.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import hydra
import numpy as np
from hydra.utils import to_absolute_path
from omegaconf import DictConfig

from dynamix_gym.envs.hetero_cluster import HeteroClusterEnv
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


def measure(
    workers: int, scenario: str, iterations: int, seconds: float, seed: int, rounds: int = 10
) -> dict:
    env = HeteroClusterEnv(workers=workers, scenario=scenario, interval=iterations, max_decisions=None)
    env.reset(seed=seed)
    env.time_budget_s = float("inf")  # keep stepping: we time steps, not episodes
    sim = env.backend.sim
    hold = np.full(workers, 2)  # delta index 2 = 0: batches unchanged
    batches = env.batches.copy()

    def env_step():
        _, _, terminated, _, _ = env.step(hold)
        if terminated:
            env.reset(seed=seed)

    def sim_step():
        sim.run_interval(batches, iterations)

    env_times, sim_times = [], []
    for _ in range(rounds):
        sim_times.append(_time_loop(sim_step, seconds / rounds))
        env_times.append(_time_loop(env_step, seconds / rounds))
    # The fastest round of each is the least disturbed by other load on the machine.
    sim_s, env_s = float(np.min(sim_times)), float(np.min(env_times))
    return {
        "workers": workers,
        "sim_us_per_interval": 1e6 * sim_s,
        "env_us_per_step": 1e6 * env_s,
        "overhead_ratio": env_s / sim_s,
    }


def run(cfg: DictConfig) -> dict:
    rows = [
        measure(int(n), cfg.scenario, int(cfg.iterations), float(cfg.seconds), int(cfg.seed))
        for n in cfg.workers
    ]
    print(
        f"Env overhead, K = {cfg.iterations}, scenario {cfg.scenario} (target: env step <= 1.25 x sim interval)"
    )
    print(f"{'workers':>8}{'sim us/interval':>18}{'env us/step':>14}{'ratio':>8}")
    for r in rows:
        print(
            f"{r['workers']:>8}{r['sim_us_per_interval']:>18.0f}{r['env_us_per_step']:>14.0f}{r['overhead_ratio']:>8.3f}"
        )
    result = {"K": int(cfg.iterations), "scenario": cfg.scenario, "rows": rows, "target_ratio": 1.25}
    out = Path(to_absolute_path(cfg.out))
    atomic_write_text(out, json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(f"wrote {out}")
    return result


@hydra.main(version_base=None, config_path="../conf", config_name="bench_env")
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    main()
