"""The elastic simulator as a backend: :class:`sim.elastic.ElasticJob` behind the backend protocol,
plus the calls an elastic env makes between intervals (change the held set, set the lr multiplier,
read the spend)."""

from __future__ import annotations

from typing import Any

import numpy as np

from dynamix_gym.backends.sim_backend import SimGroundTruth, simulator_spec
from dynamix_gym.elastic.pools import get_pool
from sim.elastic import ElasticJob
from sim.pool import PoolSpec
from sim.protocol import IntervalReport


class ElasticSimBackend:
    """A backend over every slot of ``pool``; the job holds some of them.

    Args:
        pool: a pool name (``sim/data/pool``), mapping or :class:`PoolSpec`.
        workload: as for :class:`sim.engine.Simulator`.
        scenario: as for :class:`sim.engine.Simulator`.
        initial_batch: local batch of every slot (default: the workload's, within each range).
        time_budget_s: the episode's wall-clock budget (default: the workload's).
        lr_tolerance: w of the learning-rate response (:mod:`sim.elastic`; ``None``: fitted).
        lr_exponent: a of the learning-rate response (:mod:`sim.elastic`; ``None``: fitted).
        **sim_kwargs: passed to the simulator.
    """

    def __init__(
        self,
        pool: str | dict | PoolSpec = "t4v100_spot",
        workload: Any = None,
        scenario: Any = "static_hetero",
        *,
        initial_batch: int | None = None,
        time_budget_s: float | None = None,
        lr_tolerance: float | None = None,
        lr_exponent: float | None = None,
        **sim_kwargs: Any,
    ) -> None:
        self.pool = get_pool(pool)
        self.job = ElasticJob(
            self.pool, workload, scenario, lr_tolerance=lr_tolerance, lr_exponent=lr_exponent, **sim_kwargs
        )
        sim = self.job.sim
        self.spec = simulator_spec(sim, initial_batch, time_budget_s)
        self.ground_truth = SimGroundTruth(sim)  # the slots' noise-free models, for oracles

    def reset(self, seed: int | None = None, *, rng: np.random.Generator | None = None) -> None:
        self.job.reset(seed=seed, rng=rng)

    def run_interval(self, local_batches: np.ndarray, iterations: int) -> IntervalReport:
        return self.job.run_interval(local_batches, iterations)

    def close(self) -> None:
        self.job.close()

    def ideal_throughput(self) -> float:
        """Samples/s of every slot at its memory cap with no barrier or sync (throughput_max)."""
        b = self.spec.max_batch
        return float(np.sum(b / self.job.sim.compute_time_s(b)))
