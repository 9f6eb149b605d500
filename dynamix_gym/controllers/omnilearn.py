"""OmniLearn: a proportional controller that equalises the workers' compute times."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from dynamix_gym.controllers.base import BaseController, check_fraction
from dynamix_gym.controllers.split import fill_to_total, round_to_total
from sim.protocol import BackendSpec


class OmniLearnController(BaseController):
    """OmniLearn-style dynamic batching: proportional control of each worker's batch.

    Source: S. Tyagi and P. Sharma, "OmniLearn: A Framework for Distributed Deep Learning over
    Heterogeneous Clusters", IEEE TPDS 2025 (arXiv:2503.17469), building on their "Taming
    Resource Heterogeneity in Distributed ML Training with Dynamic Batching" (ACSOS 2020). A
    proportional controller moves each worker's mini-batch against its deviation from the mean
    compute time, so that all workers reach the synchronisation barrier together, at a fixed
    global batch; a deadband stops it from chasing noise, and the memory cap bounds every batch.

    Rules, every interval, over the live workers:

        e_i  = (mean_j T_j - T_i) / T_i             # relative deviation of worker i's compute time
        if max_i |mean_j T_j - T_i| / mean_j T_j <= deadband: keep the batches
        b_i' = b_i * (1 + gain * e_i)               # P-control: gain 1 is one proportional step
        b'   = b' rescaled to sum to M, clipped to [min_i, max_i] (excess re-shared), whole samples

    The global batch is the user's choice; its default follows the workload and cluster, never
    an absolute CIFAR-10 batch: ``global_fraction`` of the cluster's memory capacity,

        M = max(round(global_fraction * sum_i max_batch_i), sum_i min_batch_i)

    (the rule and tuning DLB uses; results/baselines/TUNING.md).

    Args:
        gain: proportional gain K_p, in (0, 2).
        deadband: relative deviation from the mean compute time tolerated without change, [0, 1).
        global_batch: M, held fixed (samples); ``None`` uses the rule above. It must lie within the
            backend's [sum of min_batch, sum of max_batch] (checked at reset).
        global_fraction: fraction of the memory capacity the default M takes, in (0, 1].
    """

    name: ClassVar[str] = "omnilearn"

    def __init__(
        self,
        gain: float = 1.5,
        deadband: float = 0.1,
        global_batch: int | None = None,
        global_fraction: float = 0.25,
    ) -> None:
        if not 0.0 < gain < 2.0:
            raise ValueError(f"OmniLearnController.gain must be in (0, 2), got {gain!r}")
        if not 0.0 <= deadband < 1.0:
            raise ValueError(f"OmniLearnController.deadband must be in [0, 1), got {deadband!r}")
        if global_batch is not None and (
            isinstance(global_batch, bool) or int(global_batch) != global_batch or global_batch < 1
        ):
            raise ValueError(
                f"OmniLearnController.global_batch must be None or an integer >= 1, got {global_batch!r}"
            )
        self.gain = float(gain)
        self.deadband = float(deadband)
        self.global_batch = None if global_batch is None else int(global_batch)
        self.global_fraction = check_fraction("OmniLearnController", "global_fraction", global_fraction)

    def reset(self, spec: BackendSpec, rng: np.random.Generator | None = None) -> None:
        super().reset(spec, rng)
        self.target_global_batch = self.fixed_global_batch(self.global_batch, self.global_fraction)

    def predict(
        self, observation: np.ndarray, info: dict[str, Any], deterministic: bool = True
    ) -> tuple[np.ndarray, None]:
        report = info["report"]
        current = np.asarray(info["local_batches"], dtype=np.int64)
        alive = report.alive & (report.compute_time_s > 0)
        if not alive.any():
            return current.astype(np.float32), None
        lo, hi = self.spec.min_batch[alive], self.spec.max_batch[alive]
        t = report.compute_time_s[alive]
        b = report.local_batch[alive].astype(np.float64)
        t_mean = t.mean()
        if np.max(np.abs(t_mean - t)) / t_mean <= self.deadband and b.sum() == self.target_global_batch:
            return current.astype(np.float32), None
        proposal = b * (1.0 + self.gain * (t_mean - t) / t)
        split = fill_to_total(np.maximum(proposal, 1e-9), self.target_global_batch, lo, hi)
        target = current.copy()
        target[alive] = round_to_total(split, self.target_global_batch, lo, hi)
        return target.astype(np.float32), None
