"""The backend protocol: what the env needs from a training system, simulated or real.

A backend runs K synchronous data-parallel iterations at the local batches it is given and returns
an :class:`~sim.report.IntervalReport`. The env encodes observations and computes rewards from that
report alone, so the simulator and the real DDP adapter share every line of that code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from sim.report import WORKER_FIELDS, IntervalReport
from sim.workloads import ACCURACY, QualityMetric

__all__ = ["WORKER_FIELDS", "Backend", "BackendSpec", "IntervalReport"]


@dataclass(frozen=True, eq=False)
class BackendSpec:
    """Static facts about a backend's cluster and workload."""

    gpu_types: tuple[str, ...]
    node_of_worker: tuple[int, ...]
    min_batch: np.ndarray  # (N,) smallest local batch per worker
    max_batch: np.ndarray  # (N,) largest local batch per worker (memory cap)
    initial_batch: np.ndarray  # (N,) local batches of the first interval
    base_batch: int  # M0: the batch that progress and statistical efficiency are relative to
    target_accuracy: float  # validation quality (a rising fraction, sim.workloads) that ends an episode
    time_budget_s: float  # wall-clock budget of an episode
    num_classes: int
    workload: str
    deterministic: bool  # same seed, same reports
    #: the workload's validation metric: reports carry it as the quality ``val_accuracy``, tables
    #: show ``metric.from_quality(val_accuracy)`` in the metric's own units
    metric: QualityMetric = ACCURACY

    @property
    def num_workers(self) -> int:
        return len(self.gpu_types)

    def __post_init__(self) -> None:
        n = len(self.gpu_types)
        for name in ("min_batch", "max_batch", "initial_batch"):
            arr = np.asarray(getattr(self, name))
            if arr.shape != (n,):
                raise ValueError(f"BackendSpec.{name} must have shape ({n},), got {arr.shape}")
        if np.any(self.min_batch > self.max_batch):
            raise ValueError("BackendSpec.min_batch must not exceed max_batch")
        if np.any((self.initial_batch < self.min_batch) | (self.initial_batch > self.max_batch)):
            raise ValueError(
                f"BackendSpec.initial_batch {self.initial_batch.tolist()} must lie in "
                f"[min_batch, max_batch] = [{self.min_batch.tolist()}, {self.max_batch.tolist()}]"
            )


@runtime_checkable
class Backend(Protocol):
    """A training system the env can drive."""

    spec: BackendSpec

    def reset(self, seed: int | None = None, *, rng: np.random.Generator | None = None) -> None:
        """Start a fresh training run (fresh model, clock at zero)."""

    def run_interval(self, local_batches: np.ndarray, iterations: int) -> IntervalReport:
        """Run ``iterations`` synchronous iterations at ``local_batches`` (one per worker)."""

    def close(self) -> None:
        """Release processes and resources; safe to call twice."""
