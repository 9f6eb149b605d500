"""The static baseline: one fixed local batch on every worker for the whole run."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from dynamix_gym.controllers.base import BaseController

#: The grid of static batches evaluated as baselines (the best of them is "best static").
STATIC_GRID: tuple[int, ...] = (32, 64, 128, 256, 512)


class StaticController(BaseController):
    """Every worker runs the same fixed local batch, clipped to its own range.

    What synchronous data-parallel training does by default (PyTorch DDP with a
    ``DistributedSampler``): no adaptation to heterogeneity, faults or training progress. Run as a
    grid over :data:`STATIC_GRID`; the best static batch (on the tuning seeds) is the strongest
    non-adaptive rival.

    Args:
        batch: the local batch of every worker (samples, >= 1); each worker's value is clipped to
            its [min_batch, max_batch].
        start_at_batch: run the warm-up interval at ``batch`` too (as a static job does from its
            first step; :func:`dynamix_gym.evaluation.run_episode` asks :meth:`initial_batches`),
            instead of the backend's initial batch that adaptive controllers start from.
    """

    name: ClassVar[str] = "static"

    def __init__(self, batch: int = 128, start_at_batch: bool = False) -> None:
        if isinstance(batch, bool) or int(batch) != batch or batch < 1:
            raise ValueError(f"StaticController.batch must be an integer >= 1, got {batch!r}")
        if not isinstance(start_at_batch, bool):
            raise ValueError(f"StaticController.start_at_batch must be true or false, got {start_at_batch!r}")
        self.batch = int(batch)
        self.start_at_batch = start_at_batch

    def initial_batches(self, spec) -> np.ndarray | None:
        if not self.start_at_batch:
            return None
        return np.clip(np.full(spec.num_workers, self.batch), spec.min_batch, spec.max_batch)

    def predict(
        self, observation: np.ndarray, info: dict[str, Any], deterministic: bool = True
    ) -> tuple[np.ndarray, None]:
        return self.clip(np.full(self.spec.num_workers, self.batch)).astype(np.float32), None
