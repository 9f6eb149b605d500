"""Dynamic load balancing (DBS): local batches proportional to each worker's measured throughput."""

from __future__ import annotations

from collections import deque
from typing import Any, ClassVar

import numpy as np

from dynamix_gym.controllers.base import BaseController, check_fraction
from dynamix_gym.controllers.split import fill_to_total, round_to_total
from sim.protocol import BackendSpec


class DLBController(BaseController):
    """Throughput-proportional load balancing at a fixed global batch.

    Source: Ye et al., "DBS: Dynamic Batch Size for Distributed Deep Neural Network Training"
    (arXiv:2007.11831, 2020), the dynamic-batch-sizing rule also at the core of LB-BSP (Chen et
    al., "Semi-Dynamic Load Balancing", SoCC'20): after each measurement window, every worker's
    share of the global batch is set proportional to the throughput it achieved.

    Rules, every interval (one decision interval is the measurement window unit):

        X_i  = b_i / T_compute,i                    # samples per second of compute, worker i
        X̄_i  = mean of X_i over the last ``window`` intervals (live intervals only)
        b_i' = M * X̄_i / sum_j X̄_j                 # clipped to [min_i, max_i], excess re-shared,
                                                    # rounded to whole samples summing to M
    With affine compute times this is a fixed-point iteration whose fixed point equalises the
    workers' compute times. A split is applied only if some worker's batch moves by more than
    ``tolerance`` (relative): each change costs a reconfiguration pause. Lost workers keep their
    batch and are left out of M.

    The global batch is the user's choice in DBS. Its default follows the workload and cluster,
    never an absolute CIFAR-10 batch: ``global_fraction`` of the cluster's memory capacity,

        M = max(round(global_fraction * sum_i max_batch_i), sum_i min_batch_i)

    with ``global_fraction`` tuned jointly on the workload families' tuning seeds (CIFAR-10 and
    NCF in the simulator, the digits drop-in example on real DDP; results/baselines/TUNING.md).

    Args:
        global_batch: M, the global batch held fixed (samples); ``None`` uses the rule above. It
            must lie within the backend's [sum of min_batch, sum of max_batch] (checked at reset).
        global_fraction: fraction of the memory capacity the default M takes, in (0, 1].
        window: intervals of throughput averaged (>= 1).
        tolerance: smallest relative batch change worth a reconfiguration, in [0, 1).
    """

    name: ClassVar[str] = "dlb"

    def __init__(
        self,
        global_batch: int | None = None,
        global_fraction: float = 0.25,
        window: int = 1,
        tolerance: float = 0.02,
    ) -> None:
        if global_batch is not None and (
            isinstance(global_batch, bool) or int(global_batch) != global_batch or global_batch < 1
        ):
            raise ValueError(
                f"DLBController.global_batch must be None or an integer >= 1, got {global_batch!r}"
            )
        if isinstance(window, bool) or int(window) != window or window < 1:
            raise ValueError(f"DLBController.window must be an integer >= 1, got {window!r}")
        if not 0.0 <= tolerance < 1.0:
            raise ValueError(f"DLBController.tolerance must be in [0, 1), got {tolerance!r}")
        self.global_batch = None if global_batch is None else int(global_batch)
        self.global_fraction = check_fraction("DLBController", "global_fraction", global_fraction)
        self.window = int(window)
        self.tolerance = float(tolerance)

    def reset(self, spec: BackendSpec, rng: np.random.Generator | None = None) -> None:
        super().reset(spec, rng)
        self.target_global_batch = self.fixed_global_batch(self.global_batch, self.global_fraction)
        self._rates: deque[np.ndarray] = deque(maxlen=self.window)

    def predict(
        self, observation: np.ndarray, info: dict[str, Any], deterministic: bool = True
    ) -> tuple[np.ndarray, None]:
        report = info["report"]
        current = np.asarray(info["local_batches"], dtype=np.int64)
        alive = report.alive & (report.compute_time_s > 0)
        rate = np.full(current.shape, np.nan)
        rate[alive] = report.local_batch[alive] / report.compute_time_s[alive]
        self._rates.append(rate)
        if not alive.any():
            return current.astype(np.float32), None
        with np.errstate(invalid="ignore"):
            mean_rate = np.nanmean(np.stack(self._rates), axis=0)
        lo, hi = self.spec.min_batch[alive], self.spec.max_batch[alive]
        split = fill_to_total(mean_rate[alive], self.target_global_batch, lo, hi)
        target = current.copy()
        target[alive] = round_to_total(split, self.target_global_batch, lo, hi)
        if np.max(np.abs(target - current) / current) <= self.tolerance:
            target = current
        return target.astype(np.float32), None
